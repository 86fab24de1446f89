//! Where the methods stream their output tensors: the atomic safetensors
//! directory writer natively, or an in-memory file (the browser's download,
//! small models, tests).

use std::collections::BTreeMap;

use crate::error::{Result, StudioError};
use crate::tensor_io::dtype::f32_to_bytes;
use crate::tensor_io::writer::serialize_to_vec;
use crate::tensor_io::{DType, PlannedTensor};

/// A consumer of tensors in plan order.
pub trait TensorSink {
    /// Takes the next tensor's little-endian bytes (already in its planned
    /// dtype).
    ///
    /// # Errors
    /// Out-of-plan tensors, wrong byte counts, I/O.
    fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()>;
}

#[cfg(not(target_arch = "wasm32"))]
impl TensorSink for crate::tensor_io::SafetensorsWriter {
    fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        self.write(name, data)
    }
}

/// Converts f32 values of the tensor `name` to the bytes of a float
/// `dtype`.
///
/// # Errors
/// As [`f32_to_bytes`]: a dtype other than F32, F16 or BF16, a value past
/// f16's range.
pub fn to_bytes(dtype: DType, values: &[f32], name: &str) -> Result<Vec<u8>> {
    f32_to_bytes(dtype, values, "the output", name)
}

/// Writes f32 `values` as the next tensor in `dtype`. F32 on a
/// little-endian target is written straight from `values` (no byte copy),
/// which keeps the peak memory of streaming methods at about one tensor.
///
/// # Errors
/// As [`to_bytes`] and [`TensorSink::write_tensor`].
pub fn write_values(sink: &mut dyn TensorSink, name: &str, dtype: DType, values: &[f32]) -> Result<()> {
    if dtype == DType::F32 && cfg!(target_endian = "little") {
        return sink.write_tensor(name, bytemuck::cast_slice(values));
    }
    sink.write_tensor(name, &to_bytes(dtype, values, name)?)
}

/// Collects tensors in memory and serialises them as one safetensors file.
#[derive(Debug, Default)]
pub struct MemorySink {
    plan: Vec<PlannedTensor>,
    data: Vec<Vec<u8>>,
}

impl MemorySink {
    /// A sink expecting exactly `plan`, in order.
    pub fn new(plan: Vec<PlannedTensor>) -> Self {
        MemorySink { plan, data: Vec::new() }
    }

    /// The safetensors bytes (`__metadata__`: `format: pt`).
    ///
    /// # Errors
    /// [`StudioError::Invalid`] when not every planned tensor was written.
    pub fn into_safetensors(self) -> Result<Vec<u8>> {
        if self.data.len() != self.plan.len() {
            return Err(StudioError::Invalid(format!(
                "only {} of {} planned tensors were written",
                self.data.len(),
                self.plan.len()
            )));
        }
        let meta: BTreeMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let pairs: Vec<(PlannedTensor, &[u8])> =
            self.plan.iter().cloned().zip(self.data.iter().map(Vec::as_slice)).collect();
        serialize_to_vec(&pairs, &meta)
    }
}

impl TensorSink for MemorySink {
    fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let Some(next) = self.plan.get(self.data.len()) else {
            return Err(StudioError::Invalid(format!("tensor `{name}` was not planned")));
        };
        if next.name != name || next.byte_len() != data.len() {
            return Err(StudioError::Invalid(format!(
                "expected `{}` ({} bytes) next, got `{name}` ({} bytes)",
                next.name,
                next.byte_len(),
                data.len()
            )));
        }
        self.data.push(data.to_vec());
        Ok(())
    }
}
