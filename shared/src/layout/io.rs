//! The two borders where a layout's names meet the canonical ones: a
//! renaming read view ([`LayoutSource`]) and a renaming write sink
//! ([`LayoutSink`]).

use std::collections::{HashMap, HashSet};

use super::names::{self, TensorRole};
use super::{ExpertsFormat, MoeLayout};
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};
use crate::tensor_io::sink::{to_bytes, TensorSink};
use crate::tensor_io::{PlannedTensor, TensorInfo, TensorSource};

/// An on-disk MoE checkpoint seen with canonical names: each tensor is
/// renamed by [`MoeLayout::role_of`] + [`names::canonical`], and the
/// layout's zero tensors (a Qwen2-MoE zero shared expert) are checked by
/// [`MoeLayout::check_dropped`] at construction and then hidden.
pub struct LayoutSource {
    inner: Box<dyn TensorSource + Send + Sync>,
    tensors: Vec<TensorInfo>,
    disk: HashMap<String, String>,
}

impl LayoutSource {
    /// Wraps the on-disk `inner` of layout `layout` holding `moe` on `base`.
    ///
    /// # Errors
    /// Those of [`MoeLayout::check_dropped`]; [`StudioError::Format`] when
    /// two on-disk tensors map to one canonical name.
    pub fn new(
        inner: Box<dyn TensorSource + Send + Sync>,
        layout: &dyn MoeLayout,
        base: &ModelConfig,
        moe: &MoeConfig,
    ) -> Result<Self> {
        layout.check_dropped(inner.as_ref(), base, moe)?;
        let dropped: HashSet<TensorRole> = layout.zero_tensors(base, moe).into_iter().map(|(r, _)| r).collect();
        let mut tensors = Vec::new();
        let mut disk = HashMap::new();
        for t in inner.tensors() {
            let role = layout.role_of(&t.name);
            if dropped.contains(&role) {
                continue;
            }
            let name = names::canonical(&role);
            if disk.insert(name.clone(), t.name.clone()).is_some() {
                return Err(StudioError::format(
                    inner.source_name(),
                    "safetensors",
                    format!(
                        "tensor `{}` maps to `{name}` in the {} layout, which another tensor already does",
                        t.name,
                        layout.name()
                    ),
                ));
            }
            tensors.push(TensorInfo { name, ..t });
        }
        Ok(LayoutSource { inner, tensors, disk })
    }
}

impl TensorSource for LayoutSource {
    fn source_name(&self) -> &str {
        self.inner.source_name()
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.tensors.clone()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        let disk = self.disk.get(name)?;
        self.inner.info(disk).map(|t| TensorInfo { name: name.to_string(), ..t })
    }

    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        match self.disk.get(name) {
            Some(disk) => self.inner.read_f32(disk),
            None => Err(StudioError::tensor(self.inner.source_name(), name, "not found")),
        }
    }

    fn read_f32_range(&self, name: &str, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        match self.disk.get(name) {
            Some(disk) => self.inner.read_f32_range(disk, range),
            None => Err(StudioError::tensor(self.inner.source_name(), name, "not found")),
        }
    }
}

/// The canonical view of an on-disk source of `layout`, and how it stores
/// its experts: packed experts are first shown per expert
/// ([`super::packed::unpack_source`]); then `inner` itself when no name
/// changes (Mixtral, studio, as written by the studio), else a
/// [`LayoutSource`].
///
/// # Errors
/// Those of [`super::packed::find_packed`] (a layer in neither expert
/// layout, a packed tensor that disagrees with the configuration) and
/// [`LayoutSource::new`].
pub fn wrap_source(
    inner: Box<dyn TensorSource + Send + Sync>,
    layout: &dyn MoeLayout,
    base: &ModelConfig,
    moe: &MoeConfig,
) -> Result<(Box<dyn TensorSource + Send + Sync>, ExpertsFormat)> {
    let (inner, format) = super::packed::unpack_source(inner, layout, base, moe)?;
    let renames =
        layout.renames() || inner.tensors().iter().any(|t| names::canonical(&layout.role_of(&t.name)) != t.name);
    if !renames && layout.zero_tensors(base, moe).is_empty() {
        return Ok((inner, format));
    }
    Ok((Box::new(LayoutSource::new(inner, layout, base, moe)?), format))
}

/// A sink that takes canonical names, writes them under the layout's
/// names, and at [`LayoutSink::finish`] writes the layout's zero tensors
/// (the tail of [`super::LayoutChoice::disk_plan`]).
pub struct LayoutSink<'a> {
    inner: &'a mut dyn TensorSink,
    layout: &'a dyn MoeLayout,
    zeros: &'a [PlannedTensor],
}

impl<'a> LayoutSink<'a> {
    /// Wraps `inner`; `zeros` are the plan entries after the canonical ones.
    pub fn new(inner: &'a mut dyn TensorSink, layout: &'a dyn MoeLayout, zeros: &'a [PlannedTensor]) -> Self {
        LayoutSink { inner, layout, zeros }
    }

    /// Writes the zero tensors.
    ///
    /// # Errors
    /// Sink errors; a non-float dtype.
    pub fn finish(self) -> Result<()> {
        for p in self.zeros {
            let n: usize = p.shape.iter().product();
            self.inner.write_tensor(&p.name, &to_bytes(p.dtype, &vec![0.0; n], &p.name)?)?;
        }
        Ok(())
    }
}

impl TensorSink for LayoutSink<'_> {
    fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let disk = self.layout.disk_name(&names::parse(name));
        self.inner.write_tensor(&disk, data)
    }
}
