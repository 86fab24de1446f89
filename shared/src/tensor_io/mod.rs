//! Tensor I/O: the bytes of a file (memory-mapped natively, owned in the
//! browser), storage dtypes and their conversion to f32, reading
//! safetensors files, the [`TensorSource`] view every reader exposes, and
//! writing tensors ([`sink::TensorSink`], the atomic [`SafetensorsWriter`]).
//!
//! This is the bottom room of the crate: it knows nothing of model
//! configurations, layouts or methods (format spec: safetensors,
//! <https://github.com/huggingface/safetensors#format>).

pub mod bytes;
pub mod card;
pub mod dtype;
pub mod gguf;
pub mod quant;
pub mod safetensors_io;
pub mod sink;
pub mod writer;

pub use bytes::Bytes;
pub use dtype::DType;
#[cfg(not(target_arch = "wasm32"))]
pub use writer::SafetensorsWriter;
pub use writer::{PlannedTensor, WriteOptions};

use crate::error::Result;

/// Name, storage dtype and shape of one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Hugging Face tensor name.
    pub name: String,
    /// Storage dtype in the source file.
    pub dtype: DType,
    /// Shape, outermost dimension first (PyTorch order).
    pub shape: Vec<usize>,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Read access to the tensors of one checkpoint, by Hugging Face name.
///
/// Implementations hold the file bytes (memory-mapped natively, owned in the
/// browser) and convert one tensor at a time, so a consumer can stream a
/// model tensor by tensor.
pub trait TensorSource {
    /// A human-readable name for errors (usually the file path).
    fn source_name(&self) -> &str;
    /// All tensors, in file order.
    fn tensors(&self) -> Vec<TensorInfo>;
    /// One tensor's info, or `None` if absent.
    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.tensors().into_iter().find(|t| t.name == name)
    }
    /// Reads and converts one tensor to f32 (row-major, shape of
    /// [`TensorSource::info`]).
    ///
    /// # Errors
    /// [`crate::StudioError::Tensor`] when the tensor is missing,
    /// [`crate::StudioError::UnsupportedDType`] when it cannot be converted.
    fn read_f32(&self, name: &str) -> Result<Vec<f32>>;

    /// Reads the flat element range `range` of one tensor (row-major) as
    /// f32: the same values as `read_f32(name)?[range]`. Safetensors
    /// sources convert only those bytes, so a packed expert tensor
    /// (`layout::packed`) is read one expert at a time without converting
    /// or copying the rest; the default reads the whole tensor and slices it.
    ///
    /// # Errors
    /// Those of [`TensorSource::read_f32`]; [`crate::StudioError::Tensor`]
    /// when `range` runs past the tensor.
    fn read_f32_range(&self, name: &str, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        let v = self.read_f32(name)?;
        check_range(self.source_name(), name, v.len(), &range)?;
        Ok(v[range].to_vec())
    }
}

/// Checks that the element range `range` lies within a tensor of `numel`
/// elements.
///
/// # Errors
/// [`crate::StudioError::Tensor`] naming `source` and the tensor.
pub fn check_range(source: &str, name: &str, numel: usize, range: &std::ops::Range<usize>) -> Result<()> {
    if range.start <= range.end && range.end <= numel {
        return Ok(());
    }
    Err(crate::StudioError::tensor(
        source,
        name,
        format!("elements {}..{} requested of a tensor of {numel} elements", range.start, range.end),
    ))
}
