//! Fused, threaded elementwise kernels of the forward pass on the CPU
//! backend (ARCHITECTURE.md, "The forward pass does no avoidable work";
//! docs/benchmarks.md, "Where the time goes").
//!
//! burn-flex 0.21 runs each elementwise op of a composed layer as its own
//! pass on the calling thread while the gemm threads idle: RMSNorm is five
//! passes (square, mean, add, sqrt, divide) plus the weight multiply, the
//! gated FFN's `act(gate) * up` three (SiLU as `x * sigmoid(x)` with a scalar
//! `expf`), and RoPE a `cat` of the two halves, two products and a sum after
//! a strided `swap_dims` copy. On SmolLM2-135M prefill these serial passes
//! were about a third of the wall time. Here each is one pass over the data,
//! split over row blocks (rayon natively, a loop in wasm32), in f32 with the
//! same formula as the composed version:
//!
//! - [`rms_norm`]: `y = x / sqrt(mean(x²) + eps) * w` (Zhang & Sennrich
//!   2019; transformers `LlamaRMSNorm`; Burn's `RmsNorm::forward`);
//! - [`gated_product`]: `act(g) * u` with `act` SiLU (`g / (1 + exp(-g))`,
//!   Shazeer 2020, SwiGLU) or tanh-approximated GELU (Gemma's GeGLU);
//! - [`rope_rows`]: rotary position embedding (Su et al. 2021, RoFormer
//!   §3.4.2, transformers' `rotate_half` convention) applied in place to
//!   `[batch, seq, heads * head_dim]` rows, the layout the projections
//!   produce, so no transpose precedes the attention kernel.
//!
//! `exp` is evaluated by [`exp_f32`], a branch-free Cephes-style polynomial
//! (relative error below 2e-7 over the f32 range) that the compiler
//! vectorises, where `f32::exp` is a scalar libm call.
//!
//! Only [`crate::CpuBackend`] in f32 takes these paths; training on the CPU
//! (`Autodiff<CpuBackend>`) takes the same kernels as single autodiff nodes
//! with their own backward ([`super::cpu_grad`]); any other backend or
//! dtype runs Burn's composed ops.

use std::any::{Any, TypeId};

use burn::nn::RmsNorm;
use burn::tensor::{backend::Backend, DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;

use crate::config::family::GateActivation;

/// Rows per parallel task: small tensors (a decoding step's single row)
/// stay on the calling thread, where a thread hand-off costs more than the
/// work.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
const PARALLEL_ELEMENTS: usize = 32 * 1024;

/// Whether `B` is the CPU backend (not autodiff, not a GPU backend).
pub fn is_cpu<B: Backend>() -> bool {
    TypeId::of::<B>() == TypeId::of::<crate::CpuBackend>()
}

/// The CPU backend's tensor behind `x` (no copy). `B` must be
/// [`crate::CpuBackend`] (callers check [`is_cpu`]).
pub(crate) fn to_flex<B: Backend, const D: usize>(x: Tensor<B, D>) -> FlexTensor {
    let p: Box<dyn Any> = Box::new(x.into_primitive().tensor());
    *p.downcast::<FlexTensor>().expect("the CPU backend's float tensor is a FlexTensor")
}

/// Wraps a CPU-backend tensor as a `Tensor<B, D>` (`B` = [`crate::CpuBackend`]).
pub(crate) fn from_flex<B: Backend, const D: usize>(t: FlexTensor) -> Tensor<B, D> {
    let p: Box<dyn Any> = Box::new(t);
    let p = *p.downcast::<B::FloatTensorPrimitive>().expect("B is the CPU backend");
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// A contiguous f32 tensor from a vector (moved, not copied).
pub(crate) fn flex_from_vec(data: Vec<f32>, dims: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(data, dims.to_vec()))
}

/// `t` as a contiguous f32 tensor: itself when it already is, else a copy.
pub(crate) fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

/// `t`'s values as a mutable slice: in place when `t` is unique and
/// contiguous, else after a copy.
pub(crate) fn values_mut(t: &mut FlexTensor) -> &mut [f32] {
    let n = t.layout().num_elements();
    if !(t.is_unique() && t.layout().contiguous_offsets() == Some((0, n))) {
        *t = t.to_contiguous();
    }
    &mut t.storage_mut::<f32>()[..n]
}

#[cfg(test)]
pub(crate) fn into_vec<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
    x.into_data().into_vec::<f32>().expect("an f32 tensor's data is f32")
}

/// Runs `f(row_block_index, rows)` over `data` split into blocks of whole
/// rows of `row_len` elements, in parallel when the tensor is large.
pub(crate) fn for_row_blocks(data: &mut [f32], row_len: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if row_len == 0 || data.is_empty() {
        return;
    }
    let rows = data.len() / row_len;
    #[cfg(not(target_arch = "wasm32"))]
    if data.len() >= PARALLEL_ELEMENTS && rows > 1 {
        use rayon::prelude::*;
        let threads = rayon::current_num_threads().max(1);
        // A few blocks per thread balance uneven rows; at least 8 rows each.
        let per = rows.div_ceil(threads * 4).max(8.min(rows));
        data.par_chunks_mut(per * row_len).enumerate().for_each(|(i, c)| f(i * per, c));
        return;
    }
    let _ = rows;
    f(0, data)
}

/// `exp(x)` in f32 without a libm call: `x = n ln2 + r` (Cody-Waite split
/// of ln 2), `exp(r)` by a degree-6 polynomial on `|r| <= ln2 / 2` (Cephes
/// `expf` coefficients), `2^n` by the exponent bits. Inputs are clamped to
/// `[-87.3, 88.7]` (below: a denormal-free tiny result; above: `f32::MAX`
/// region), which keeps the function branch-free.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let x = x.clamp(-87.33654, 88.72283);
    let n = (x * std::f32::consts::LOG2_E).round();
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let r2 = r * r;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5e-1;
    let e = p * r2 + r + 1.0;
    // n is in [-126, 128]; 2^n from the exponent field (n = 128 only for
    // x within 0.35 of the clamp: fold one factor 2 into the mantissa).
    let ni = n as i32;
    let half = ni >> 1;
    let a = f32::from_bits(((half + 127) as u32) << 23);
    let b = f32::from_bits(((ni - half + 127) as u32) << 23);
    e * a * b
}

/// `tanh(x)` through [`exp_f32`]: `1 - 2 / (exp(2x) + 1)` (exact limits ±1).
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    1.0 - 2.0 / (exp_f32(2.0 * x) + 1.0)
}

/// `$vis fn $name(args)`: runs `$generic` compiled for AVX2 + FMA when the
/// CPU has them (checked at run time), else the portable build of it.
macro_rules! dispatch_simd {
    ($(#[$doc:meta])* $vis:vis fn $name:ident = $generic:ident, ($($arg:ident : $ty:ty),*)) => {
        $(#[$doc])*
        $vis fn $name($($arg: $ty),*) {
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx($($arg: $ty),*) {
                    $generic($($arg),*)
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU supports AVX2 and FMA (checked above).
                    return unsafe { avx($($arg),*) };
                }
            }
            $generic($($arg),*)
        }
    };
}
#[cfg(not(target_arch = "wasm32"))]
pub(crate) use dispatch_simd;

#[inline(always)]
fn silu_mul_generic(g: &mut [f32], u: &[f32]) {
    for (g, u) in g.iter_mut().zip(u) {
        *g = *g / (1.0 + exp_f32(-*g)) * *u;
    }
}

#[inline(always)]
fn gelu_tanh_mul_generic(g: &mut [f32], u: &[f32]) {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    for (g, u) in g.iter_mut().zip(u) {
        let x = *g;
        *g = 0.5 * x * (1.0 + tanh_f32(C * (x + 0.044715 * x * x * x))) * *u;
    }
}

#[inline(always)]
fn rms_rows_generic(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let d = w.len();
    for (o, row) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
        let rms = (lane_sum_sq(row) / d as f32 + eps).sqrt();
        for ((o, v), w) in o.iter_mut().zip(row).zip(w) {
            *o = *v / rms * w;
        }
    }
}

dispatch_simd!(pub(crate) fn silu_mul = silu_mul_generic, (g: &mut [f32], u: &[f32]));
dispatch_simd!(pub(crate) fn gelu_tanh_mul = gelu_tanh_mul_generic, (g: &mut [f32], u: &[f32]));
dispatch_simd!(pub(crate) fn rms_rows = rms_rows_generic, (out: &mut [f32], x: &[f32], w: &[f32], eps: f32));

/// Lanes of the reductions below: independent partial maxima / sums that
/// the compiler keeps in one vector register (a plain `fold` is a serial
/// dependency chain, since f32 addition is not reassociated).
pub(crate) const LANES: usize = 16;

#[inline(always)]
pub(crate) fn lane_max(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            m[j] = if c[j] > m[j] { c[j] } else { m[j] };
        }
    }
    rest.iter().chain(m.iter()).fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
}

#[inline(always)]
pub(crate) fn lane_sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            acc[j] += c[j];
        }
    }
    acc.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

#[inline(always)]
pub(crate) fn lane_sum_sq(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            acc[j] += c[j] * c[j];
        }
    }
    acc.iter().sum::<f32>() + rest.iter().map(|v| v * v).sum::<f32>()
}

#[inline(always)]
fn softmax_prefix_generic(row: &mut [f32], seen: usize, scale: f32) {
    let (live, masked) = row.split_at_mut(seen);
    live.iter_mut().for_each(|x| *x *= scale);
    let max = lane_max(live);
    live.iter_mut().for_each(|x| *x = exp_f32(*x - max));
    let inv = 1.0 / lane_sum(live);
    live.iter_mut().for_each(|x| *x *= inv);
    masked.fill(0.0);
}

dispatch_simd!(
    /// One attention score row in place: `row[..seen] = softmax(row[..seen] *
    /// scale)` (the maximum subtracted before `exp`, one reciprocal of the sum),
    /// `row[seen..] = 0` (keys the causal mask hides).
    ///
    /// # Panics
    /// If `seen > row.len()`.
    pub fn softmax_prefix = softmax_prefix_generic, (row: &mut [f32], seen: usize, scale: f32)
);

/// `norm.forward(x)` for `x: [..., d]`: RMSNorm over the last dimension,
/// `x / sqrt(mean(x²) + eps) * gamma` (`gamma: [d]`; Gemma's `(1 + w)` is
/// folded into `gamma` at load). One fused pass per row on the CPU backend
/// in f32; Burn's `RmsNorm::forward` elsewhere.
pub fn rms_norm<B: Backend, const D: usize>(norm: &RmsNorm<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    if !is_cpu::<B>() || x.dtype() != DType::F32 || norm.gamma.val().dtype() != DType::F32 {
        // Training on the CPU: the same kernel as one autodiff node.
        #[cfg(not(target_arch = "wasm32"))]
        let x = match super::cpu_grad::rms_norm(norm, x) {
            Ok(y) => return y,
            Err(x) => x,
        };
        return norm.forward(x);
    }
    let dims = x.dims();
    let gamma = contiguous(to_flex(norm.gamma.val()));
    let w = gamma.as_slice::<f32>().expect("contiguous");
    assert_eq!(w.len(), dims[D - 1], "RMSNorm weight of {} for rows of {}", w.len(), dims[D - 1]);
    let eps = norm.epsilon as f32;
    let xt = contiguous(to_flex(x));
    let xs = xt.as_slice::<f32>().expect("contiguous");
    let mut out = vec![0f32; xs.len()];
    let d = w.len();
    for_row_blocks(&mut out, d, |r0, rows| rms_rows(rows, &xs[r0 * d..][..rows.len()], w, eps));
    from_flex(flex_from_vec(out, &dims))
}

/// `act(g) * u` for equal-shape `g, u: [..., f]` (the gated FFN's hidden
/// state before `down_proj`): SiLU (SwiGLU) or tanh-approximated GELU
/// (GeGLU). One fused pass on the CPU backend in f32 (overwriting `g`'s
/// buffer); Burn's `silu` / `gelu_approximate` and a product elsewhere.
///
/// # Panics
/// If the shapes differ.
pub fn gated_product<B: Backend, const D: usize>(
    g: Tensor<B, D>,
    u: Tensor<B, D>,
    act: GateActivation,
) -> Tensor<B, D> {
    assert_eq!(g.dims(), u.dims(), "gate {:?} and up {:?} projections differ", g.dims(), u.dims());
    if !is_cpu::<B>() || g.dtype() != DType::F32 || u.dtype() != DType::F32 {
        // Training on the CPU: the same kernel as one autodiff node.
        #[cfg(not(target_arch = "wasm32"))]
        let (g, u) = match super::cpu_grad::gated_product(g, u, act) {
            Ok(y) => return y,
            Err(gu) => gu,
        };
        let a = match act {
            GateActivation::Silu => burn::tensor::activation::silu(g),
            GateActivation::GeluTanh => burn::tensor::activation::gelu_approximate(g),
        };
        return a * u;
    }
    let row = g.dims()[D - 1];
    let mut gt = to_flex(g);
    let ut = contiguous(to_flex(u));
    let ud = ut.as_slice::<f32>().expect("contiguous");
    let kernel: fn(&mut [f32], &[f32]) = match act {
        GateActivation::Silu => silu_mul,
        GateActivation::GeluTanh => gelu_tanh_mul,
    };
    for_row_blocks(values_mut(&mut gt), row, |r0, rows| kernel(rows, &ud[r0 * row..][..rows.len()]));
    from_flex(gt)
}

/// Rotary position embedding in place on `x: [batch, seq, heads * hd]`
/// (row `(b, i)` at table position `i`), with the tables of
/// [`super::rope::Rope::tables`]: `cos, sin: [seq * hd]`, where
/// `x'[j] = x[j] cos[j] + x[(j + hd/2) mod hd] sin[j]` (the sign of
/// `rotate_half` lives in `sin`'s first half).
///
/// # Panics
/// If the lengths do not match `batch * seq * heads * hd`.
pub fn rope_rows(x: &mut [f32], seq: usize, heads: usize, hd: usize, cos: &[f32], sin: &[f32]) {
    assert_eq!(cos.len(), seq * hd, "RoPE tables for {} positions, rows of {seq}", cos.len() / hd.max(1));
    assert_eq!(sin.len(), cos.len());
    let row = heads * hd;
    assert_eq!(x.len() % (seq * row).max(1), 0, "RoPE input of {} values is not [batch, {seq}, {row}]", x.len());
    let half = hd / 2;
    for_row_blocks(x, row, |r0, rows| {
        let mut tmp = vec![0f32; hd];
        for (i, r) in rows.chunks_exact_mut(row).enumerate() {
            let p = (r0 + i) % seq;
            let (c, s) = (&cos[p * hd..][..hd], &sin[p * hd..][..hd]);
            for head in r.chunks_exact_mut(hd) {
                tmp.copy_from_slice(head);
                for j in 0..hd {
                    let other = if j < half { tmp[j + half] } else { tmp[j - half] };
                    head[j] = tmp[j] * c[j] + other * s[j];
                }
            }
        }
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::CpuBackend as B;
    use burn::module::Param;

    /// A Llama config of `heads` x `head_dim` (RoPE base 1e4, no scaling)
    /// for the kernel tests here and in `cpu_attention`.
    pub(crate) fn llama_config(heads: usize, kv_heads: usize, head_dim: usize) -> crate::config::ModelConfig {
        crate::config::ModelConfig {
            architecture: crate::config::Architecture::Llama,
            vocab_size: 4,
            hidden_size: heads * head_dim,
            intermediate_size: 8,
            num_layers: 1,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            rope_scaling: crate::config::RopeScaling::Default,
            max_position_embeddings: 256,
            tie_word_embeddings: true,
            attention_bias: false,
            bos_token_id: None,
            eos_token_id: None,
            family_params: Default::default(),
        }
    }

    #[test]
    fn exp_matches_libm() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp_f32(x) as f64, (x as f64).exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 2e-7, "relative error {worst}");
        assert_eq!(exp_f32(-1000.0), exp_f32(-87.33654));
        assert!(exp_f32(1000.0).is_finite());
        assert_eq!(exp_f32(0.0), 1.0);
    }

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            })
            .collect()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs() / y.abs().max(1.0)).fold(0.0, f32::max)
    }

    #[test]
    fn rms_norm_matches_burn() {
        let dev = Default::default();
        // 300 rows: exercises the threaded split with a ragged last block.
        let (rows, d) = (300, 96);
        let x = Tensor::<B, 2>::from_data(TensorData::new(rand(rows * d, 1), [rows, d]), &dev);
        let mut norm = burn::nn::RmsNormConfig::new(d).with_epsilon(1e-5).init::<B>(&dev);
        norm.gamma = Param::from_tensor(Tensor::from_data(TensorData::new(rand(d, 2), [d]), &dev));
        let want = into_vec(norm.forward(x.clone()));
        let got = into_vec(rms_norm(&norm, x));
        assert!(max_diff(&got, &want) < 1e-5, "{}", max_diff(&got, &want));
    }

    #[test]
    fn gated_products_match_burn() {
        let dev = Default::default();
        let (rows, f) = (257, 160);
        let g = Tensor::<B, 2>::from_data(TensorData::new(rand(rows * f, 3), [rows, f]), &dev);
        let u = Tensor::<B, 2>::from_data(TensorData::new(rand(rows * f, 4), [rows, f]), &dev);
        for act in [GateActivation::Silu, GateActivation::GeluTanh] {
            let want = match act {
                GateActivation::Silu => burn::tensor::activation::silu(g.clone()),
                GateActivation::GeluTanh => burn::tensor::activation::gelu_approximate(g.clone()),
            } * u.clone();
            let got = gated_product(g.clone(), u.clone(), act);
            let d = max_diff(&into_vec(got), &into_vec(want));
            assert!(d < 1e-5, "{act:?}: {d}");
        }
    }

    #[test]
    fn rope_rows_matches_rope_apply() {
        let dev = Default::default();
        let (b, s, h, hd) = (2, 37, 3, 16);
        let cfg = llama_config(h, h, hd);
        let rope = super::super::rope::Rope::new(&cfg);
        let t = rope.tables::<B>(5, s, &dev);
        let x = rand(b * s * h * hd, 5);
        let xt = Tensor::<B, 4>::from_data(TensorData::new(x.clone(), [b, s, h, hd]), &dev);
        let want = into_vec(super::super::rope::Rope::apply(xt.swap_dims(1, 2), &t).swap_dims(1, 2));
        let mut got = x;
        rope_rows(&mut got, s, h, hd, &t.cos_host, &t.sin_host);
        assert!(max_diff(&got, &want) < 1e-6, "{}", max_diff(&got, &want));
    }
}
