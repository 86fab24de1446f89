//! Fused projections (Phi-3's `self_attn.qkv_proj` and `mlp.gate_up_proj`):
//! split into the canonical `q_proj`/`k_proj`/`v_proj` and
//! `gate_proj`/`up_proj` on read ([`FusedSource`]), fused again on write
//! ([`fuse_plan`]).
//!
//! Source: transformers `modeling_phi3.py`: `qkv = qkv_proj(x)`, query rows
//! `[0, h·hd)`, key rows `[h·hd, (h + kv)·hd)`, value rows after;
//! `gate, up = gate_up_proj(x).chunk(2, dim=-1)` (gate the first `f` rows).

use crate::config::ModelConfig;
use crate::error::{Result, StudioError};
use crate::tensor_io::{TensorInfo, TensorSource};

/// One fused tensor: its name and the canonical tensors stacked in its rows
/// (each `(name, rows)`), in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused {
    /// The on-disk name (`model.layers.{l}.self_attn.qkv_proj.weight`, ...).
    pub name: String,
    /// The canonical parts and their row counts.
    pub parts: Vec<(String, usize)>,
}

/// The fused tensors of `c` (empty unless the family fuses them).
pub fn fused_tensors(c: &ModelConfig) -> Vec<Fused> {
    if !c.architecture.family().fused_projections {
        return Vec::new();
    }
    let (q, kv, f) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size);
    (0..c.num_layers)
        .flat_map(|l| {
            let p = format!("model.layers.{l}");
            [
                Fused {
                    name: format!("{p}.self_attn.qkv_proj.weight"),
                    parts: vec![
                        (format!("{p}.self_attn.q_proj.weight"), q),
                        (format!("{p}.self_attn.k_proj.weight"), kv),
                        (format!("{p}.self_attn.v_proj.weight"), kv),
                    ],
                },
                Fused {
                    name: format!("{p}.mlp.gate_up_proj.weight"),
                    parts: vec![(format!("{p}.mlp.gate_proj.weight"), f), (format!("{p}.mlp.up_proj.weight"), f)],
                },
            ]
        })
        .collect()
}

/// The write plan with every fused family's parts replaced by the fused
/// tensor (at the place of its first part): `(name, shape, parts)` where
/// `parts` is empty for a tensor written as it is.
pub fn fuse_plan(c: &ModelConfig, plan: &[(String, Vec<usize>)]) -> Vec<(String, Vec<usize>, Vec<String>)> {
    let fused = fused_tensors(c);
    let mut out = Vec::with_capacity(plan.len());
    for (name, shape) in plan {
        match fused.iter().find(|f| f.parts.iter().any(|(p, _)| p == name)) {
            None => out.push((name.clone(), shape.clone(), Vec::new())),
            Some(f) if f.parts[0].0 == *name => {
                let rows = f.parts.iter().map(|(_, r)| r).sum();
                let mut s = shape.clone();
                s[0] = rows;
                out.push((f.name.clone(), s, f.parts.iter().map(|(p, _)| p.clone()).collect()));
            }
            Some(_) => {}
        }
    }
    out
}

/// A [`TensorSource`] that shows a fused checkpoint's `qkv_proj` /
/// `gate_up_proj` as their canonical parts (row slices); every other tensor,
/// and a checkpoint already holding the parts, passes through.
pub struct FusedSource {
    inner: Box<dyn TensorSource + Send + Sync>,
    /// canonical name -> (fused name, first row, rows, columns)
    parts: Vec<(String, String, usize, usize, usize)>,
}

impl FusedSource {
    /// Wraps `inner` for `config`; returns `inner` unchanged when the family
    /// has no fused tensors or the file holds none of them.
    ///
    /// # Errors
    /// [`StudioError::Tensor`] naming a fused tensor whose row count is not
    /// the sum of its parts'.
    pub fn wrap(
        inner: Box<dyn TensorSource + Send + Sync>,
        config: &ModelConfig,
    ) -> Result<Box<dyn TensorSource + Send + Sync>> {
        let mut parts = Vec::new();
        for f in fused_tensors(config) {
            let Some(info) = inner.info(&f.name) else { continue };
            let want: usize = f.parts.iter().map(|(_, r)| r).sum();
            if info.shape.len() != 2 || info.shape[0] != want {
                return Err(StudioError::tensor(
                    inner.source_name(),
                    &f.name,
                    format!(
                        "shape {:?}, expected [{want}, {}] (the rows of {})",
                        info.shape,
                        config.hidden_size,
                        f.parts.iter().map(|(p, _)| p.rsplit('.').nth(1).unwrap_or(p)).collect::<Vec<_>>().join(" + ")
                    ),
                ));
            }
            let mut row = 0;
            for (p, r) in f.parts {
                parts.push((p, f.name.clone(), row, r, info.shape[1]));
                row += r;
            }
        }
        if parts.is_empty() {
            return Ok(inner);
        }
        Ok(Box::new(FusedSource { inner, parts }))
    }
}

impl TensorSource for FusedSource {
    fn source_name(&self) -> &str {
        self.inner.source_name()
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        let mut out = Vec::new();
        for t in self.inner.tensors() {
            let mine: Vec<_> = self.parts.iter().filter(|p| p.1 == t.name).collect();
            if mine.is_empty() {
                out.push(t);
            } else {
                out.extend(mine.into_iter().map(|(name, _, _, rows, cols)| TensorInfo {
                    name: name.clone(),
                    dtype: t.dtype,
                    shape: vec![*rows, *cols],
                }));
            }
        }
        out
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        match self.parts.iter().find(|p| p.0 == name) {
            Some((n, fused, _, rows, cols)) => {
                let dtype = self.inner.info(fused)?.dtype;
                Some(TensorInfo { name: n.clone(), dtype, shape: vec![*rows, *cols] })
            }
            None if self.parts.iter().any(|p| p.1 == name) => None,
            None => self.inner.info(name),
        }
    }

    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        match self.parts.iter().find(|p| p.0 == name) {
            Some((_, fused, row, rows, cols)) => self.inner.read_f32_range(fused, row * cols..(row + rows) * cols),
            None => self.inner.read_f32(name),
        }
    }

    fn read_f32_range(&self, name: &str, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        match self.parts.iter().find(|p| p.0 == name) {
            Some((_, fused, row, rows, cols)) => {
                crate::tensor_io::check_range(self.source_name(), name, rows * cols, &range)?;
                self.inner.read_f32_range(fused, row * cols + range.start..row * cols + range.end)
            }
            None => self.inner.read_f32_range(name, range),
        }
    }
}
