//! A Hugging Face safetensors directory read with positioned reads
//! (`pread`) instead of through the memory map, for the streaming methods
//! (graft, merges) on native targets.
//!
//! [`SafetensorsModel`] memory-maps its files, and every page of an input
//! that a merge reads stays mapped into the process until the end, so the
//! process's resident set grows to the size of all its inputs (file-backed
//! pages of the page cache, reclaimable, but counted in RSS). Reading each
//! tensor with `read_exact_at` into a buffer that is dropped after use keeps
//! the resident set at the few tensors a method holds. The headers are
//! parsed and validated by [`SafetensorsModel`] (only the header pages of
//! the map are touched); tensor data offsets follow from the validated
//! layout (tensors are contiguous in file order, see the safetensors
//! format).

#![cfg(unix)]

use std::collections::HashMap;
use std::os::unix::fs::FileExt;

use crate::checkpoint::{LoadedModel, ModelFormat};
use crate::error::{Result, StudioError};
use crate::tensor_io::dtype::floats_to_f32;
use crate::tensor_io::safetensors_io::SafetensorsModel;
use crate::tensor_io::{TensorInfo, TensorSource};

/// Bytes read per `pread` call (converted to f32 chunk by chunk).
const CHUNK: usize = 8 << 20;

/// A safetensors directory whose tensors are read with positioned reads.
#[derive(Debug)]
pub struct PreadSafetensors {
    name: String,
    files: Vec<(String, std::fs::File)>,
    /// Tensor name -> (file index, absolute byte offset, byte length, info).
    index: HashMap<String, (usize, u64, usize, TensorInfo)>,
    order: Vec<String>,
}

impl PreadSafetensors {
    /// Opens a Hugging Face model directory (`model.safetensors` or the
    /// shards of `model.safetensors.index.json`), validating every header.
    ///
    /// # Errors
    /// Those of [`SafetensorsModel::open_dir`]; I/O errors opening the
    /// shards.
    pub fn open_dir(dir: &std::path::Path) -> Result<Self> {
        let model = SafetensorsModel::open_dir(dir)?;
        let mut files = Vec::new();
        let mut index = HashMap::new();
        let mut order = Vec::new();
        for (fi, f) in model.files().iter().enumerate() {
            let path = f.source_name().to_string();
            let file = std::fs::File::open(&path).map_err(|e| StudioError::io(&path, e))?;
            let mut len8 = [0u8; 8];
            file.read_exact_at(&mut len8, 0).map_err(|e| StudioError::io(&path, e))?;
            let mut offset = 8 + u64::from_le_bytes(len8);
            // `tensors()` is in file order and the validated data section
            // holds the tensors back to back.
            for t in f.tensors() {
                let len = f.raw(&t.name).map(|(_, r)| r.len()).unwrap_or(0);
                order.push(t.name.clone());
                index.insert(t.name.clone(), (fi, offset, len, t));
                offset += len as u64;
            }
            files.push((path, file));
        }
        Ok(PreadSafetensors { name: dir.display().to_string(), files, index, order })
    }
}

impl TensorSource for PreadSafetensors {
    fn source_name(&self) -> &str {
        &self.name
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        self.order.iter().map(|n| self.index[n].3.clone()).collect()
    }
    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.index.get(name).map(|t| t.3.clone())
    }
    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let n = self.index.get(name).map_or(0, |t| t.2);
        self.read_bytes_as_f32(name, 0, n)
    }
    /// Reads only the range's bytes (a packed expert tensor is read one
    /// expert at a time).
    fn read_f32_range(&self, name: &str, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        let (_, _, len, info) =
            self.index.get(name).ok_or_else(|| StudioError::tensor(&self.name, name, "not present in any shard"))?;
        let size = info.dtype.float_size().unwrap_or(1);
        crate::tensor_io::check_range(&self.name, name, len / size, &range)?;
        self.read_bytes_as_f32(name, range.start * size, (range.end - range.start) * size)
    }
}

impl PreadSafetensors {
    /// Reads `len` bytes of tensor `name` from byte `start` of its data and
    /// converts them to f32, in chunks of [`CHUNK`] bytes.
    fn read_bytes_as_f32(&self, name: &str, start: usize, len: usize) -> Result<Vec<f32>> {
        let (fi, offset, _, info) =
            self.index.get(name).ok_or_else(|| StudioError::tensor(&self.name, name, "not present in any shard"))?;
        let (path, file) = &self.files[*fi];
        let size = info.dtype.float_size().ok_or_else(|| StudioError::UnsupportedDType {
            file: path.clone(),
            tensor: name.to_string(),
            dtype: info.dtype.to_string(),
            hint: "model weights must be F32, F16 or BF16".into(),
        })?;
        let mut out = Vec::with_capacity(len / size);
        let mut buf = vec![0u8; len.min(CHUNK)];
        let mut done = 0usize;
        let offset = offset + start as u64;
        while done < len {
            let n = (len - done).min(buf.len());
            file.read_exact_at(&mut buf[..n], offset + done as u64).map_err(|e| StudioError::io(path, e))?;
            out.extend(floats_to_f32(info.dtype, &buf[..n]).expect("float dtype"));
            done += n;
        }
        Ok(out)
    }
}

/// Makes `model` (opened from `path` by [`crate::checkpoint::open_model`])
/// read its tensors with positioned reads when it is a safetensors
/// directory; other formats keep their own source (GGUF and llama2.c
/// tensors are converted on read anyway).
///
/// # Errors
/// Those of [`PreadSafetensors::open_dir`].
pub fn use_positioned_reads(path: &std::path::Path, model: &mut LoadedModel) -> Result<()> {
    if model.format == ModelFormat::Safetensors && path.is_dir() {
        model.source = crate::checkpoint::load::layout_view(
            Box::new(PreadSafetensors::open_dir(path)?),
            model.layout,
            &model.config,
            model.moe.as_ref(),
        )?
        .0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_io::{DType, PlannedTensor, SafetensorsWriter, WriteOptions};

    #[test]
    fn reads_the_same_values_as_the_memory_map_across_shards() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m");
        let plan = vec![
            PlannedTensor { name: "a".into(), dtype: DType::F32, shape: vec![3, 5] },
            PlannedTensor { name: "b".into(), dtype: DType::BF16, shape: vec![7] },
            PlannedTensor { name: "c".into(), dtype: DType::F16, shape: vec![2, 2] },
        ];
        let opts = WriteOptions { max_shard_bytes: 40, ..Default::default() };
        let mut w = SafetensorsWriter::create(&out, plan.clone(), opts).unwrap();
        for p in &plan {
            let n: usize = p.shape.iter().product();
            w.write_f32(&p.name, &(0..n).map(|i| i as f32 * 0.5 - 1.0).collect::<Vec<_>>()).unwrap();
        }
        w.finish(&[]).unwrap();
        let (mm, pr) = (SafetensorsModel::open_dir(&out).unwrap(), PreadSafetensors::open_dir(&out).unwrap());
        assert!(mm.files().len() > 1, "sharded");
        assert_eq!(mm.tensors().len(), pr.tensors().len());
        for t in mm.tensors() {
            assert_eq!(pr.info(&t.name), Some(t.clone()));
            assert_eq!(pr.read_f32(&t.name).unwrap(), mm.read_f32(&t.name).unwrap(), "{}", t.name);
        }
    }
}
