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

/// Converts f32 values to little-endian bytes of a float `dtype`
/// (round-to-nearest-even for f16/bf16).
pub fn f32_to_bytes(dtype: DType, values: &[f32]) -> Option<Vec<u8>> {
    match dtype {
        DType::F32 => Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::F16 => Some(values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect()),
        DType::BF16 => Some(values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect()),
        _ => None,
    }
}
