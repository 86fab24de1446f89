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
            _ => Err(StudioError::Invalid(format!(
                "weights dtype `{s}`: expected f32, bf16 or f16 (also float32, bfloat16, float16 or half; any case)"
            ))),
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
/// `name` when a finite value would round past f16's largest finite value,
/// 65504 (|w| ≥ 65520 becomes infinite), with the largest magnitude found.
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
            // Values below 65520 round to 65504 (f16's largest finite value);
            // from 65520 on they round to infinity.
            if let Some(max) = crate::tensor_io::dtype::f16_overflow(&values) {
                return Err(StudioError::tensor(
                    source,
                    name,
                    format!(
                        "holds |w| = {max:e}, past f16's largest finite value 65504 (it would become infinite): \
                         hold the weights in bf16 or f32 instead"
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
        convert_par(&t, &mut out);
        return super::cpu_ops::from_flex(super::cpu_ops::flex_from_vec(out, &dims));
    }
    w.cast(FloatDType::F32)
}

/// At most this many rows take [`small_rows_product`] (a decoding step has
/// one): reading each 16-bit weight once beats converting the matrix to f32
/// and multiplying.
pub const SMALL_ROWS: usize = 8;

/// Columns per parallel task of [`small_rows_product`].
#[cfg(not(target_arch = "wasm32"))]
const COLUMN_BLOCK: usize = 256;

/// `x · w` for `x: [rows, in]` (f32, contiguous) and a 16-bit `w: [in, out]`
/// (Burn's layout) with few rows ([`SMALL_ROWS`]): `[rows, out]` f32, read
/// straight from the 16-bit weights (each converted once, in column blocks
/// of [`COLUMN_BLOCK`] run in parallel), with no f32 copy of `w`. The sums
/// run over `in` in order, so they can differ from a gemm's by rounding.
/// `None` when `w` is not a contiguous bf16/f16 CPU tensor (the caller
/// converts and multiplies instead).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn small_rows_product(x: &[f32], rows: usize, w: &burn_flex::FlexTensor) -> Option<Vec<f32>> {
    use rayon::prelude::*;
    let [inp, out] = dims2(w)?;
    if x.len() != rows * inp {
        return None;
    }
    let (dtype, bits) = half_bits(w, inp * out)?;
    let blocks: Vec<(usize, Vec<f32>)> = (0..out.div_ceil(COLUMN_BLOCK))
        .into_par_iter()
        .map(|b| {
            let c0 = b * COLUMN_BLOCK;
            let width = COLUMN_BLOCK.min(out - c0);
            let mut acc = vec![0f32; rows * width];
            let mut buf = [0f32; COLUMN_BLOCK];
            for i in 0..inp {
                let src = &bits[i * out + c0..i * out + c0 + width];
                widen(src, dtype, &mut buf[..width]);
                for r in 0..rows {
                    axpy(&mut acc[r * width..(r + 1) * width], x[r * inp + i], &buf[..width]);
                }
            }
            (c0, acc)
        })
        .collect();
    let mut y = vec![0f32; rows * out];
    for (c0, acc) in blocks {
        let width = acc.len() / rows.max(1);
        for r in 0..rows {
            y[r * out + c0..r * out + c0 + width].copy_from_slice(&acc[r * width..(r + 1) * width]);
        }
    }
    Some(y)
}

/// `x · eᵀ` for `x: [rows, d]` (f32, contiguous) and a 16-bit `e: [n, d]`
/// (the token embedding, as a tied LM head reads it) with few rows: `[rows,
/// n]` f32, each row of `e` converted once and dotted with every row of `x`
/// (blocks of rows in parallel), with no f32 copy of `e`. `None` when `e` is
/// not a contiguous bf16/f16 CPU tensor.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn small_rows_product_t(x: &[f32], rows: usize, e: &burn_flex::FlexTensor) -> Option<Vec<f32>> {
    use rayon::prelude::*;
    let [n, d] = dims2(e)?;
    if x.len() != rows * d {
        return None;
    }
    let (dtype, bits) = half_bits(e, n * d)?;
    // yᵀ [n, rows], blocks of output rows in parallel, then transposed.
    let mut yt = vec![0f32; n * rows];
    yt.par_chunks_mut(COLUMN_BLOCK * rows).enumerate().for_each(|(b, chunk)| {
        let mut buf = vec![0f32; d];
        for (k, out) in chunk.chunks_mut(rows).enumerate() {
            let o = b * COLUMN_BLOCK + k;
            widen(&bits[o * d..(o + 1) * d], dtype, &mut buf);
            for (r, y) in out.iter_mut().enumerate() {
                *y = dot(&x[r * d..(r + 1) * d], &buf);
            }
        }
    });
    let mut y = vec![0f32; rows * n];
    for o in 0..n {
        for r in 0..rows {
            y[r * n + o] = yt[o * rows + r];
        }
    }
    Some(y)
}

#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
fn dot_generic(a: &[f32], b: &[f32], out: &mut f32) {
    // Eight partial sums: the compiler keeps them in one vector register.
    let mut acc = [0f32; 8];
    let (ac, ar) = a.split_at(a.len() / 8 * 8);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    *out = s;
}

#[cfg(not(target_arch = "wasm32"))]
super::cpu_ops::dispatch_simd!(fn dot_simd = dot_generic, (a: &[f32], b: &[f32], out: &mut f32));

#[cfg(not(target_arch = "wasm32"))]
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut s = 0f32;
    dot_simd(a, b, &mut s);
    s
}

/// 16-bit values (their bits) to f32.
#[cfg(not(target_arch = "wasm32"))]
#[inline]
fn widen(src: &[u16], dtype: DType, dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    match dtype {
        // bf16 is the top half of an f32: exact, and vectorised.
        DType::BF16 => dst.iter_mut().zip(src).for_each(|(d, &b)| *d = f32::from_bits((b as u32) << 16)),
        _ => {
            let h: &[half::f16] = bytemuck::cast_slice(src);
            h.convert_to_f32_slice(dst)
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
fn axpy_generic(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * *x;
    }
}

#[cfg(not(target_arch = "wasm32"))]
super::cpu_ops::dispatch_simd!(fn axpy = axpy_generic, (y: &mut [f32], a: f32, x: &[f32]));

/// `[rows, cols]` of a contiguous 2-D tensor; `None` for any other.
#[cfg(not(target_arch = "wasm32"))]
fn dims2(t: &burn_flex::FlexTensor) -> Option<[usize; 2]> {
    let dims = t.layout().shape();
    (dims.len() == 2 && t.is_contiguous()).then(|| [dims[0], dims[1]])
}

/// The first `n` values of a bf16/f16 CPU tensor's storage as their bits,
/// with the dtype; `None` for any other dtype.
#[cfg(not(target_arch = "wasm32"))]
fn half_bits(t: &burn_flex::FlexTensor, n: usize) -> Option<(DType, &[u16])> {
    let bits: &[u16] = match t.dtype() {
        DType::BF16 => bytemuck::cast_slice(&t.storage::<half::bf16>()[..n]),
        DType::F16 => bytemuck::cast_slice(&t.storage::<half::f16>()[..n]),
        _ => return None,
    };
    Some((t.dtype(), bits))
}

/// Converts the contiguous 16-bit tensor `t` into `out` (same length),
/// in parallel chunks ([`widen`]).
#[cfg(not(target_arch = "wasm32"))]
fn convert_par(t: &burn_flex::FlexTensor, out: &mut [f32]) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let (dtype, src) = half_bits(t, out.len()).expect("convert_par is called for 16-bit tensors");
    out.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(o, s)| widen(s, dtype, o));
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
    fn the_few_rows_product_reads_16_bit_weights_like_the_converted_product() {
        // out = 600 spans three column blocks (the last partial); in = 37.
        let (rows, inp, out) = (3, 37, 600);
        let x: Vec<f32> = (0..rows * inp).map(|i| ((i as f32) * 0.71).cos()).collect();
        let w: Vec<f32> = (0..inp * out).map(|i| ((i as f32) * 0.013).sin() * 0.5).collect();
        for dt in [WeightsDtype::Bf16, WeightsDtype::F16] {
            let t = weight_tensor::<B, 2>(w.clone(), [inp, out], dt, "s", "w", &Default::default()).unwrap();
            let wf: Vec<f32> = weight_f32(t.clone()).into_data().to_vec().unwrap();
            let got = small_rows_product(&x, rows, &crate::model::cpu_ops::to_flex(t)).unwrap();
            for r in 0..rows {
                for o in 0..out {
                    let want: f64 = (0..inp).map(|i| x[r * inp + i] as f64 * wf[i * out + o] as f64).sum();
                    let g = got[r * out + o] as f64;
                    assert!((g - want).abs() < 1e-5, "{dt} [{r}, {o}]: {g} vs {want}");
                }
            }
        }
        // The transposed form (a tied head: e [n, d], y = x eᵀ), n = 600
        // rows of e over three parallel blocks.
        for dt in [WeightsDtype::Bf16, WeightsDtype::F16] {
            let e: Vec<f32> = (0..out * inp).map(|i| ((i as f32) * 0.029).cos() * 0.3).collect();
            let t = weight_tensor::<B, 2>(e, [out, inp], dt, "s", "e", &Default::default()).unwrap();
            let ef: Vec<f32> = weight_f32(t.clone()).into_data().to_vec().unwrap();
            let got = small_rows_product_t(&x, rows, &crate::model::cpu_ops::to_flex(t)).unwrap();
            for r in 0..rows {
                for o in 0..out {
                    let want: f64 = (0..inp).map(|i| x[r * inp + i] as f64 * ef[o * inp + i] as f64).sum();
                    let g = got[r * out + o] as f64;
                    assert!((g - want).abs() < 1e-5, "{dt} eᵀ [{r}, {o}]: {g} vs {want}");
                }
            }
        }
        // An f32 weight is not its job.
        let t = weight_tensor::<B, 2>(w, [inp, out], WeightsDtype::F32, "s", "w", &Default::default()).unwrap();
        assert!(small_rows_product(&x, rows, &crate::model::cpu_ops::to_flex(t)).is_none());
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
        // 65519 rounds to 65504, f16's largest finite value; 65520 rounds to infinity.
        let t = weight_tensor::<B, 1>(vec![-65519.0], [1], WeightsDtype::F16, "m", "w", &Default::default()).unwrap();
        assert_eq!(weight_f32(t).into_data().to_vec::<f32>().unwrap(), vec![-65504.0]);
        assert!(half::f16::from_f32(65520.0).is_infinite());
        assert!(weight_tensor::<B, 1>(vec![65520.0], [1], WeightsDtype::F16, "m", "w", &Default::default()).is_err());
    }
}
