//! The dtype the model's large weights are held in: f32, or 16-bit (bf16 /
//! f16) for forward-only work (issue 38 item 3; docs/benchmarks.md,
//! "16-bit weights").
//!
//! A 16-bit model keeps the projection matrices (attention q/k/v/o, every
//! FFN and expert's gate/up/down, the untied LM head) and the token
//! embedding in 16 bits: half the memory of f32. Everything else stays f32:
//! the norms, the router (`[E, d]`, tiny, and the routing decisions should
//! not move), the shared-expert gate, biases, and every activation. A
//! product `x W` with a 16-bit `W` converts `W` to f32 (one matrix at a
//! time, transiently) and runs the f32 product, so the arithmetic is the
//! f32 model's on weights rounded to 16 bits — the same as transformers'
//! `torch_dtype=bfloat16` weights with f32 compute (autocast), not bf16
//! arithmetic. On the CPU backend the conversion is a threaded pass of our
//! own ([`weight_f32`]); other backends use Burn's `cast`.
//!
//! Sources: bfloat16 (Kalamkar et al., "A Study of BFLOAT16 for Deep
//! Learning Training", 2019, §2: the top 16 bits of an f32, round to
//! nearest even); IEEE 754-2008 binary16 for f16 (largest finite 65504).

use burn::tensor::{backend::Backend, DType, FloatDType, Tensor, TensorData};

use crate::error::{Result, StudioError};

/// The storage dtype of the model's large weights (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightsDtype {
    /// 32-bit float (4 bytes a weight).
    #[default]
    F32,
    /// bfloat16 (2 bytes; f32's range, 8 bits of mantissa).
    Bf16,
    /// IEEE half (2 bytes; 11 bits of mantissa, largest finite 65504).
    F16,
}

impl WeightsDtype {
    /// Every value, in the order the CLI lists them.
    pub const ALL: [WeightsDtype; 3] = [WeightsDtype::F32, WeightsDtype::Bf16, WeightsDtype::F16];

    /// Parses `f32`, `bf16` or `f16` (case-insensitive; `bfloat16`,
    /// `float16`, `float32` too).
    ///
    /// # Errors
    /// [`StudioError::Invalid`] naming the value and the accepted ones.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" | "half" => Ok(Self::F16),
            _ => Err(StudioError::Invalid(format!("weights dtype `{s}`: expected f32, bf16 or f16"))),
        }
    }

    /// The lower-case name (`f32`, `bf16`, `f16`).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }

    /// Bytes per weight.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }

    /// Burn's dtype for it.
    pub fn burn(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
            Self::F16 => DType::F16,
        }
    }
}

impl std::fmt::Display for WeightsDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WeightsDtype {
    type Err = StudioError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

/// A Burn tensor of shape `dims` holding `values` (f32) in `dtype`, rounded
/// to nearest even.
///
/// # Errors
/// For [`WeightsDtype::F16`], [`StudioError::Tensor`] naming `source` and
/// `name` when a finite value lies past f16's largest finite value (65504:
/// it would become infinite), with the largest magnitude found.
pub fn weight_tensor<B: Backend, const D: usize>(
    values: Vec<f32>,
    dims: [usize; D],
    dtype: WeightsDtype,
    source: &str,
    name: &str,
    device: &B::Device,
) -> Result<Tensor<B, D>> {
    let data = match dtype {
        WeightsDtype::F32 => TensorData::new(values, dims),
        WeightsDtype::Bf16 => {
            let mut out = vec![half::bf16::ZERO; values.len()];
            half::slice::HalfFloatSliceExt::convert_from_f32_slice(&mut out[..], &values);
            TensorData::new(out, dims)
        }
        WeightsDtype::F16 => {
            let max = values.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs()));
            if max > half::f16::MAX.to_f32() {
                return Err(StudioError::tensor(
                    source,
                    name,
                    format!(
                        "holds |w| = {max:e}, past f16's largest finite value 65504: \
                         use --weights-dtype bf16 or f32"
                    ),
                ));
            }
            let mut out = vec![half::f16::ZERO; values.len()];
            half::slice::HalfFloatSliceExt::convert_from_f32_slice(&mut out[..], &values);
            TensorData::new(out, dims)
        }
    };
    Ok(Tensor::from_data(data, (device, dtype.burn())))
}

/// `w` as f32: itself when it is f32, else converted (a new tensor; `w`'s
/// storage is untouched). On [`crate::CpuBackend`] a bf16/f16 tensor is
/// converted by a threaded pass (bf16: the 16 bits shifted into an f32's
/// top half, exact); other backends use Burn's `cast`.
pub fn weight_f32<B: Backend, const D: usize>(w: Tensor<B, D>) -> Tensor<B, D> {
    let dtype = w.dtype();
    if dtype == DType::F32 {
        return w;
    }
    #[cfg(not(target_arch = "wasm32"))]
    if super::cpu_ops::is_cpu::<B>() && matches!(dtype, DType::BF16 | DType::F16) {
        let dims = w.dims();
        let t = super::cpu_ops::to_flex(w);
        let t = if t.is_contiguous() { t } else { t.to_contiguous() };
        let n = t.layout().num_elements();
        let mut out = vec![0f32; n];
        convert_par(&t, dtype, &mut out);
        return super::cpu_ops::from_flex(super::cpu_ops::flex_from_vec(out, &dims));
    }
    w.cast(FloatDType::F32)
}

/// Converts the contiguous 16-bit tensor `t` into `out` (same length),
/// in parallel chunks.
#[cfg(not(target_arch = "wasm32"))]
fn convert_par(t: &burn_flex::FlexTensor, dtype: DType, out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let n = out.len();
    match dtype {
        DType::BF16 => {
            let src = &t.storage::<half::bf16>()[..n];
            out.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(o, s)| s.convert_to_f32_slice(o));
        }
        DType::F16 => {
            let src = &t.storage::<half::f16>()[..n];
            out.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(o, s)| s.convert_to_f32_slice(o));
        }
        _ => unreachable!("convert_par is called for 16-bit tensors"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend as B;

    #[test]
    fn parse_accepts_the_names_and_refuses_others() {
        assert_eq!(WeightsDtype::parse("BF16").unwrap(), WeightsDtype::Bf16);
        assert_eq!(WeightsDtype::parse("float16").unwrap(), WeightsDtype::F16);
        assert_eq!(WeightsDtype::parse("f32").unwrap(), WeightsDtype::F32);
        let e = WeightsDtype::parse("q8").unwrap_err().to_string();
        assert!(e.contains("`q8`") && e.contains("bf16"), "{e}");
    }

    #[test]
    fn bf16_and_f16_round_to_nearest_and_convert_back_exactly() {
        let dev = Default::default();
        // 1 + 2^-9 is halfway between two bf16 values (1 and 1 + 2^-7 are
        // neighbours): ties to even -> 1. 3.0 and -0.5 are exact.
        let v = vec![1.0 + 2f32.powi(-9), 3.0, -0.5, 1.0 + 2f32.powi(-7)];
        let t = weight_tensor::<B, 1>(v.clone(), [4], WeightsDtype::Bf16, "s", "w", &dev).unwrap();
        assert_eq!(t.dtype(), DType::BF16);
        let back: Vec<f32> = weight_f32(t).into_data().to_vec().unwrap();
        assert_eq!(back, vec![1.0, 3.0, -0.5, 1.0 + 2f32.powi(-7)]);
        let t = weight_tensor::<B, 1>(v.clone(), [4], WeightsDtype::F16, "s", "w", &dev).unwrap();
        assert_eq!(t.dtype(), DType::F16);
        let back: Vec<f32> = weight_f32(t).into_data().to_vec().unwrap();
        // f16 has 10 mantissa bits: 1 + 2^-9 is exact.
        assert_eq!(back, v);
        // f32 stays f32, untouched.
        let t = weight_tensor::<B, 1>(v.clone(), [4], WeightsDtype::F32, "s", "w", &dev).unwrap();
        assert_eq!(weight_f32(t).into_data().to_vec::<f32>().unwrap(), v);
    }

    #[test]
    fn a_large_tensor_converts_like_the_scalar_rule() {
        // More than one parallel chunk, both 16-bit dtypes.
        let n = (1 << 17) + 7;
        let v: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        for dt in [WeightsDtype::Bf16, WeightsDtype::F16] {
            let t = weight_tensor::<B, 2>(v.clone(), [n, 1], dt, "s", "w", &Default::default()).unwrap();
            let back: Vec<f32> = weight_f32(t).into_data().to_vec().unwrap();
            let want: Vec<f32> = match dt {
                WeightsDtype::Bf16 => v.iter().map(|x| half::bf16::from_f32(*x).to_f32()).collect(),
                _ => v.iter().map(|x| half::f16::from_f32(*x).to_f32()).collect(),
            };
            assert_eq!(back, want, "{dt}");
        }
    }

    #[test]
    fn f16_refuses_a_value_past_its_range_naming_the_tensor() {
        let e = weight_tensor::<B, 1>(
            vec![1.0, 70000.0],
            [2],
            WeightsDtype::F16,
            "m.safetensors",
            "lm_head.weight",
            &Default::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("m.safetensors") && e.contains("lm_head.weight") && e.contains("65504"), "{e}");
        // bf16 holds it.
        weight_tensor::<B, 1>(vec![1.0, 70000.0], [2], WeightsDtype::Bf16, "m", "w", &Default::default()).unwrap();
    }
}
