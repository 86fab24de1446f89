//! Storage data types of checkpoint tensors (safetensors dtypes and GGML
//! quantisation types).

use std::fmt;

/// A tensor's storage type.
///
/// Float types are those of safetensors; `Q*` are GGML block quantisations
/// (ggml `ggml_type`, see ggml's `ggml-common.h` for block layouts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16.
    BF16,
    /// GGML Q8_0: blocks of 32, one f16 scale.
    Q8_0,
    /// GGML Q4_0: blocks of 32, one f16 scale, 4-bit values offset by 8.
    Q4_0,
    /// GGML Q4_1: blocks of 32, f16 scale and minimum.
    Q4_1,
    /// GGML Q5_0.
    Q5_0,
    /// GGML Q5_1.
    Q5_1,
    /// GGML Q2_K super-blocks of 256.
    Q2K,
    /// GGML Q3_K super-blocks of 256.
    Q3K,
    /// GGML Q4_K super-blocks of 256.
    Q4K,
    /// GGML Q5_K super-blocks of 256.
    Q5K,
    /// GGML Q6_K super-blocks of 256.
    Q6K,
    /// GGML Q8_K super-blocks of 256.
    Q8K,
    /// Any other type, by name (cannot be converted).
    Other(&'static str),
}

impl DType {
    /// The safetensors dtype string, for float types.
    pub fn safetensors_name(self) -> Option<&'static str> {
        match self {
            DType::F32 => Some("F32"),
            DType::F16 => Some("F16"),
            DType::BF16 => Some("BF16"),
            _ => None,
        }
    }

    /// Bytes per element for float types.
    pub fn float_size(self) -> Option<usize> {
        match self {
            DType::F32 => Some(4),
            DType::F16 | DType::BF16 => Some(2),
            _ => None,
        }
    }

    /// The `torch_dtype` of a Hugging Face `config.json` for tensors stored
    /// as `self`: `bfloat16`, `float16`, else `float32` (what this project
    /// writes quantised inputs as).
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        }
    }

    /// Parses a user-facing name (`f32`, `f16`, `bf16`), case-insensitive.
    pub fn parse_float(s: &str) -> Option<DType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Some(DType::F32),
            "f16" | "float16" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::BF16),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q2K => "Q2_K",
            DType::Q3K => "Q3_K",
            DType::Q4K => "Q4_K",
            DType::Q5K => "Q5_K",
            DType::Q6K => "Q6_K",
            DType::Q8K => "Q8_K",
            DType::Other(s) => s,
        };
        f.write_str(s)
    }
}

/// Converts little-endian float bytes of `dtype` to f32.
///
/// # Panics
/// Never on well-formed input; callers check `bytes.len()` against the
/// element count first.
pub fn floats_to_f32(dtype: DType, bytes: &[u8]) -> Option<Vec<f32>> {
    match dtype {
        DType::F32 => Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
        DType::F16 => Some(bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
        DType::BF16 => Some(bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
        _ => None,
    }
}

/// The smallest magnitude f16 rounds to infinity: halfway between its
/// largest finite value, 65504, and the next binade's 65536 (round to
/// nearest even; IEEE 754-2008 binary16).
pub const F16_OVERFLOW: f32 = 65520.0;

/// The largest finite magnitude in `values` when it would round to
/// infinity in f16 (≥ [`F16_OVERFLOW`]); `None` when every finite value
/// fits. Values that are already infinite or NaN are not counted: they stay
/// what they are in every float dtype.
pub fn f16_overflow(values: &[f32]) -> Option<f32> {
    let max = values.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs()));
    (max >= F16_OVERFLOW).then_some(max)
}

/// Converts f32 values to little-endian bytes of a float `dtype`
/// (round-to-nearest-even for f16/bf16).
///
/// # Errors
/// [`crate::StudioError::Tensor`] naming `name` (the tensor) and `file`
/// (where it is written) when `dtype` is F16 and a finite value would round
/// to infinity (|w| ≥ 65520: past f16's largest finite value, 65504), with
/// the largest magnitude found: a writer never turns a weight into `inf`
/// silently; [`crate::StudioError::Invalid`] naming the tensor when `dtype`
/// is not F32, F16 or BF16.
pub fn f32_to_bytes(dtype: DType, values: &[f32], file: &str, name: &str) -> crate::Result<Vec<u8>> {
    Ok(match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => {
            if let Some(max) = f16_overflow(values) {
                return Err(crate::StudioError::tensor(
                    file,
                    name,
                    format!(
                        "holds |w| = {max:e}, past f16's largest finite value 65504 (it would become infinite): \
                         write it in bf16 or f32 instead (--dtype)"
                    ),
                ));
            }
            values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect()
        }
        DType::BF16 => values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        d => return Err(crate::StudioError::Invalid(format!("tensor `{name}`: cannot write dtype {d}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writing f16 never turns a finite weight into `inf`: 65519 rounds to
    /// 65504, f16's largest finite value, and is written; 65520 and more are
    /// refused with the tensor's name; values already infinite or NaN stay
    /// as they are. bf16 and f32 take every finite f32.
    #[test]
    fn f16_writes_refuse_values_that_would_become_infinite() {
        let b = f32_to_bytes(DType::F16, &[65519.0, -1.5, f32::INFINITY, f32::NAN], "out", "w").unwrap();
        assert_eq!(half::f16::from_le_bytes([b[0], b[1]]).to_f32(), 65504.0);
        let e = f32_to_bytes(DType::F16, &[1.0, -1e6], "out", "model.norm.weight").unwrap_err().to_string();
        assert!(
            e.contains("out") && e.contains("model.norm.weight") && e.contains("1e6") && e.contains("65504"),
            "{e}"
        );
        assert!(f32_to_bytes(DType::F16, &[65520.0], "out", "w").is_err());
        for d in [DType::BF16, DType::F32] {
            assert!(f32_to_bytes(d, &[1e30], "out", "w").is_ok());
        }
        assert!(f32_to_bytes(DType::Q8_0, &[1.0], "out", "w").is_err());
        let mut sink = crate::tensor_io::sink::MemorySink::new(vec![crate::tensor_io::PlannedTensor {
            name: "w".into(),
            dtype: DType::F16,
            shape: vec![1],
        }]);
        let e = crate::tensor_io::sink::write_values(&mut sink, "w", DType::F16, &[3e5]).unwrap_err().to_string();
        assert!(e.contains("`w`") || e.contains("w:"), "{e}");
    }
}
