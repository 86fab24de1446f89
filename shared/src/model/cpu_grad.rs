//! Fused CPU kernels with their own backward pass, for training on
//! `Autodiff<CpuBackend>` (ARCHITECTURE.md, "The forward pass does no
//! avoidable work"; docs/benchmarks.md, the training step).
//!
//! Under Burn's autodiff every composed op is a node of the graph: SiLU is
//! `x * sigmoid(x)` (two nodes, a scalar `expf` per element), RMSNorm five
//! nodes plus the weight product, the cross-entropy a `log_softmax` over the
//! whole `[tokens, vocab]` logits (max, subtract, exp, sum, log, subtract)
//! and a gather, and attention the RoPE composition (`cat` of the halves,
//! two products, a sum) on transposed copies, a `repeat` of the shared
//! key/value heads, the scores, mask, softmax and two batched products.
//! Each node is one single-threaded pass forward and one or more backward,
//! and keeps its own copy of what its backward reads. Here each of those
//! layers is one node whose forward is the threaded kernel of
//! [`super::cpu_ops`] / [`super::cpu_attention`] and whose backward is the
//! closed-form derivative in one threaded pass (two gemm passes per head for
//! attention), so a training step spends its time in the matrix products.
//!
//! - [`gated_product`]: `y = act(g) * u`; `dg = dy * u * act'(g)`,
//!   `du = dy * act(g)` with `act` SiLU (`silu'(x) = s (1 + x (1 - s))`,
//!   `s = sigmoid(x)`) or tanh-GELU.
//! - [`rms_norm`]: `y = x r w`, `r = (mean(x²) + eps)^-1/2`;
//!   `dx = r (dy w) - x r³ mean(dy w x)`, `dw = Σ_rows dy x r`.
//! - [`cross_entropy`]: mean of `logsumexp(z) - z[target]` over rows; the
//!   gradient `(softmax(z) - onehot(target)) / n` is written over the logits
//!   in the forward pass (their buffer is not needed after it), so the
//!   backward is a scale by the upstream gradient — the cross-entropy of
//!   Liger-Kernel and Megatron's fused vocab cross-entropy, without the
//!   `[tokens, vocab]` log-probabilities ever existing.
//! - [`attention_rows`]: causal GQA attention with RoPE on the projections'
//!   row layout (the forward of [`super::cpu_attention::causal_attention_rows`]);
//!   the backward recomputes each head's probabilities `P` from the rotated
//!   `q, k` (FlashAttention-2 §3.1's recomputation, per head rather than per
//!   tile at these lengths): `dP = dO Vᵀ`, `dS = P ∘ (dP - rowsum(P ∘ dP))
//!   * scale`, `dQ = dS K`, `dK = dSᵀ Q`, `dV = Pᵀ dO`, then the inverse
//!   rotation of `dQ, dK` (RoPE with the sine negated).
//!
//! Each function returns its inputs unchanged (`Err`) off
//! `Autodiff<CpuBackend>` or for non-f32 dtypes; the caller then runs Burn's
//! composed ops. The tests compare every gradient with Burn's composition.

use std::any::{Any, TypeId};
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorPrimitive};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use super::cpu_ops::{
    contiguous, dispatch_simd, exp_f32, flex_from_vec, lane_max, lane_sum, rope_rows, tanh_f32, values_mut, LANES,
};
use crate::config::family::GateActivation;
use crate::CpuBackend;

/// The training backend these kernels serve: Burn's autodiff over the CPU
/// backend, with Burn's default (no) checkpointing.
pub type CpuAutodiff = Autodiff<CpuBackend>;

/// `CpuAutodiff`'s float tensor (the inner [`FlexTensor`] and its graph node).
type AdTensor = <CpuAutodiff as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive;

/// Elements per parallel task (below: the calling thread).
const PARALLEL_ELEMENTS: usize = 32 * 1024;

/// Whether `B` is [`CpuAutodiff`].
pub fn is_cpu_autodiff<B: Backend>() -> bool {
    TypeId::of::<B>() == TypeId::of::<CpuAutodiff>()
}

fn to_ad<B: Backend, const D: usize>(x: Tensor<B, D>) -> AdTensor {
    let p: Box<dyn Any> = Box::new(x.into_primitive().tensor());
    *p.downcast::<AdTensor>().expect("B is Autodiff<CpuBackend>")
}

fn from_ad<B: Backend, const D: usize>(t: AdTensor) -> Tensor<B, D> {
    let p: Box<dyn Any> = Box::new(t);
    Tensor::from_primitive(TensorPrimitive::Float(*p.downcast::<B::FloatTensorPrimitive>().expect("B is CpuAutodiff")))
}

/// Records `out` as the output of a prepared node: with its backward
/// `state` when the node is tracked (some input needs a gradient), as a
/// plain value otherwise.
fn node<BO, S, const N: usize>(
    kind: OpsKind<BO, CpuBackend, S, NoCheckpointing, N>,
    state: S,
    out: FlexTensor,
) -> AdTensor
where
    BO: Backward<CpuBackend, N, State = S>,
    S: Clone + Send + std::fmt::Debug + 'static,
{
    match kind {
        OpsKind::Tracked(prep) => prep.finish(state, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

fn slice(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("a contiguous f32 tensor")
}

/// Splits `a` and `b` (rows of `a_row` and `b_row` values) into the same
/// blocks of rows and runs `f(first_row, a_block, b_block)` on each, in
/// parallel for large inputs.
fn for_row_blocks2(
    a: &mut [f32],
    a_row: usize,
    b: &mut [f32],
    b_row: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
) {
    let rows = a.len().checked_div(a_row).unwrap_or(0);
    if rows == 0 {
        return;
    }
    if a.len() < PARALLEL_ELEMENTS || rows == 1 {
        return f(0, a, b);
    }
    let per = rows.div_ceil(rayon::current_num_threads().max(1) * 4).max(8.min(rows));
    a.par_chunks_mut(per * a_row)
        .zip(b.par_chunks_mut((per * b_row).max(1)))
        .enumerate()
        .for_each(|(i, (a, b))| f(i * per, a, b));
}

// ---------------------------------------------------------------- gated FFN

#[inline(always)]
fn silu_mul_backward_generic(dy_dg: &mut [f32], du: &mut [f32], g: &[f32], u: &[f32]) {
    for (((dy, du), &x), &u) in dy_dg.iter_mut().zip(du.iter_mut()).zip(g).zip(u) {
        let s = 1.0 / (1.0 + exp_f32(-x));
        *du = *dy * x * s;
        *dy = *dy * u * s * (1.0 + x * (1.0 - s));
    }
}

#[inline(always)]
fn gelu_tanh_mul_backward_generic(dy_dg: &mut [f32], du: &mut [f32], g: &[f32], u: &[f32]) {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    for (((dy, du), &x), &u) in dy_dg.iter_mut().zip(du.iter_mut()).zip(g).zip(u) {
        let t = tanh_f32(C * (x + 0.044715 * x * x * x));
        *du = *dy * 0.5 * x * (1.0 + t);
        let da = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C * (1.0 + 3.0 * 0.044715 * x * x);
        *dy = *dy * u * da;
    }
}

dispatch_simd!(fn silu_mul_backward = silu_mul_backward_generic, (dy_dg: &mut [f32], du: &mut [f32], g: &[f32], u: &[f32]));
dispatch_simd!(fn gelu_tanh_mul_backward = gelu_tanh_mul_backward_generic, (dy_dg: &mut [f32], du: &mut [f32], g: &[f32], u: &[f32]));

/// `(dy -> dg, du, g, u)`: one of the gated products' backward kernels.
type GatedBackwardKernel = fn(&mut [f32], &mut [f32], &[f32], &[f32]);

#[derive(Debug)]
struct GatedProductBackward;

impl Backward<CpuBackend, 2> for GatedProductBackward {
    /// The gate and up projections (contiguous) and the activation.
    type State = (FlexTensor, FlexTensor, GateActivation);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (g, u, act) = ops.state;
        let mut dg = grads.consume::<CpuBackend>(&ops.node);
        let dims = g.layout().shape().to_vec();
        let row = *dims.last().unwrap_or(&1);
        let mut du = vec![0f32; g.layout().num_elements()];
        let (gs, us) = (slice(&g), slice(&u));
        let kernel: GatedBackwardKernel = match act {
            GateActivation::Silu => silu_mul_backward,
            GateActivation::GeluTanh => gelu_tanh_mul_backward,
        };
        for_row_blocks2(values_mut(&mut dg), row, &mut du, row, |r0, dy, du| {
            let at = r0 * row;
            kernel(dy, du, &gs[at..][..dy.len()], &us[at..][..dy.len()])
        });
        let [pg, pu] = ops.parents;
        if let Some(n) = pg {
            grads.register::<CpuBackend>(n.id, dg);
        }
        if let Some(n) = pu {
            grads.register::<CpuBackend>(n.id, flex_from_vec(du, &dims));
        }
    }
}

/// `act(g) * u` for equal-shape `g, u: [..., f]` on [`CpuAutodiff`] in f32,
/// as one graph node with the closed-form backward (module docs).
///
/// # Errors
/// `Err((g, u))` unchanged on any other backend or dtype.
#[allow(clippy::type_complexity)]
pub fn gated_product<B: Backend, const D: usize>(
    g: Tensor<B, D>,
    u: Tensor<B, D>,
    act: GateActivation,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>)> {
    if !is_cpu_autodiff::<B>() || g.dtype() != DType::F32 || u.dtype() != DType::F32 {
        return Err((g, u));
    }
    let dims = g.dims();
    let row = dims[D - 1];
    let (ga, ua) = (to_ad(g), to_ad(u));
    let (gt, ut) = (contiguous(ga.primitive.clone()), contiguous(ua.primitive.clone()));
    let mut out = slice(&gt).to_vec();
    let us = slice(&ut);
    let fwd: fn(&mut [f32], &[f32]) = match act {
        GateActivation::Silu => super::cpu_ops::silu_mul,
        GateActivation::GeluTanh => super::cpu_ops::gelu_tanh_mul,
    };
    super::cpu_ops::for_row_blocks(&mut out, row, |r0, rows| fwd(rows, &us[r0 * row..][..rows.len()]));
    let out = flex_from_vec(out, &dims);
    let kind =
        GatedProductBackward.prepare::<NoCheckpointing>([ga.node.clone(), ua.node.clone()]).compute_bound().stateful();
    Ok(from_ad(node(kind, (gt, ut, act), out)))
}

// ------------------------------------------------------------------ RMSNorm

#[inline(always)]
fn rms_backward_rows_generic(dy: &mut [f32], x: &[f32], w: &[f32], eps: f32, dw: Option<&mut [f32]>) {
    let d = w.len();
    let mut dw = dw;
    for (g, row) in dy.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
        let r = 1.0 / (super::cpu_ops::lane_sum_sq(row) / d as f32 + eps).sqrt();
        if let Some(dw) = dw.as_deref_mut() {
            for ((a, &g), &v) in dw.iter_mut().zip(g.iter()).zip(row) {
                *a += g * v * r;
            }
        }
        // dot = Σ_j dy_j w_j x_j (16 lanes so the sum vectorises)
        let mut acc = [0f32; LANES];
        let mut j = 0;
        while j + LANES <= d {
            for l in 0..LANES {
                acc[l] += g[j + l] * w[j + l] * row[j + l];
            }
            j += LANES;
        }
        let mut dot: f32 = acc.iter().sum();
        while j < d {
            dot += g[j] * w[j] * row[j];
            j += 1;
        }
        let c = r * r * r * dot / d as f32;
        for ((g, &v), &w) in g.iter_mut().zip(row).zip(w) {
            *g = r * *g * w - v * c;
        }
    }
}

fn rms_backward_rows(dy: &mut [f32], x: &[f32], w: &[f32], eps: f32, dw: Option<&mut [f32]>) {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx(dy: &mut [f32], x: &[f32], w: &[f32], eps: f32, dw: Option<&mut [f32]>) {
            rms_backward_rows_generic(dy, x, w, eps, dw)
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            return unsafe { avx(dy, x, w, eps, dw) };
        }
    }
    rms_backward_rows_generic(dy, x, w, eps, dw)
}

#[derive(Debug)]
struct RmsNormBackward;

impl Backward<CpuBackend, 2> for RmsNormBackward {
    /// The input and weight (contiguous) and epsilon.
    type State = (FlexTensor, FlexTensor, f32);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, w, eps) = ops.state;
        let [px, pw] = ops.parents;
        let mut dy = grads.consume::<CpuBackend>(&ops.node);
        let (xs, ws) = (slice(&x), slice(&w));
        let d = ws.len();
        let dys = values_mut(&mut dy);
        let rows = dys.len() / d.max(1);
        let want_dw = pw.is_some();
        // Row blocks in parallel; each block sums its own dw, added after.
        let per = if dys.len() < PARALLEL_ELEMENTS {
            rows.max(1)
        } else {
            rows.div_ceil(rayon::current_num_threads().max(1) * 4).max(8)
        };
        let partial: Vec<Vec<f32>> = dys
            .par_chunks_mut(per * d)
            .enumerate()
            .map(|(i, blk)| {
                let mut dw = if want_dw { vec![0f32; d] } else { Vec::new() };
                let xb = &xs[i * per * d..][..blk.len()];
                rms_backward_rows(blk, xb, ws, eps, want_dw.then_some(&mut dw[..]));
                dw
            })
            .collect();
        if let Some(n) = px {
            grads.register::<CpuBackend>(n.id, dy);
        }
        if let Some(n) = pw {
            let mut dw = vec![0f32; d];
            for p in &partial {
                dw.iter_mut().zip(p).for_each(|(a, b)| *a += b);
            }
            grads.register::<CpuBackend>(n.id, flex_from_vec(dw, &[d]));
        }
    }
}

/// RMSNorm over the last dimension, `x / sqrt(mean(x²) + eps) * gamma`
/// (`x: [..., d]`, `gamma: [d]`), on [`CpuAutodiff`] in f32 as one graph
/// node with the closed-form backward (module docs).
///
/// # Errors
/// `Err(x)` unchanged on any other backend or dtype.
pub fn rms_norm<B: Backend, const D: usize>(
    norm: &burn::nn::RmsNorm<B>,
    x: Tensor<B, D>,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    let gamma = norm.gamma.val();
    if !is_cpu_autodiff::<B>() || x.dtype() != DType::F32 || gamma.dtype() != DType::F32 {
        return Err(x);
    }
    let dims = x.dims();
    let (xa, wa) = (to_ad(x), to_ad(gamma));
    let (xt, wt) = (contiguous(xa.primitive.clone()), contiguous(wa.primitive.clone()));
    let (xs, ws) = (slice(&xt), slice(&wt));
    let d = ws.len();
    assert_eq!(d, dims[D - 1], "RMSNorm weight of {d} for rows of {}", dims[D - 1]);
    let eps = norm.epsilon as f32;
    let mut out = vec![0f32; xs.len()];
    super::cpu_ops::for_row_blocks(&mut out, d, |r0, rows| {
        super::cpu_ops::rms_rows(rows, &xs[r0 * d..][..rows.len()], ws, eps)
    });
    let out = flex_from_vec(out, &dims);
    let kind =
        RmsNormBackward.prepare::<NoCheckpointing>([xa.node.clone(), wa.node.clone()]).compute_bound().stateful();
    Ok(from_ad(node(kind, (xt, wt, eps), out)))
}

// ------------------------------------------------------------ cross-entropy

/// `logsumexp(row) - row[target]` for one row; with `grad`, the row is
/// overwritten by `(softmax(row) - onehot(target)) * inv_n`.
#[inline(always)]
fn ce_row_generic(row: &mut [f32], target: usize, inv_n: f32, grad: bool) -> f64 {
    let m = lane_max(row);
    let zt = row[target];
    let sum = if grad {
        row.iter_mut().for_each(|x| *x = exp_f32(*x - m));
        lane_sum(row)
    } else {
        let mut acc = [0f32; LANES];
        let chunks = row.chunks_exact(LANES);
        let rest: f32 = chunks.remainder().iter().map(|&x| exp_f32(x - m)).sum();
        for c in chunks {
            for l in 0..LANES {
                acc[l] += exp_f32(c[l] - m);
            }
        }
        acc.iter().sum::<f32>() + rest
    };
    if grad {
        let s = inv_n / sum;
        row.iter_mut().for_each(|x| *x *= s);
        row[target] -= inv_n;
    }
    f64::from(m) + f64::from(sum).ln() - f64::from(zt)
}

fn ce_rows(rows: &mut [f32], v: usize, targets: &[usize], inv_n: f32, grad: bool) -> f64 {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx(rows: &mut [f32], v: usize, targets: &[usize], inv_n: f32, grad: bool) -> f64 {
            rows.chunks_exact_mut(v).zip(targets).map(|(r, &t)| ce_row_generic(r, t, inv_n, grad)).sum()
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            return unsafe { avx(rows, v, targets, inv_n, grad) };
        }
    }
    rows.chunks_exact_mut(v).zip(targets).map(|(r, &t)| ce_row_generic(r, t, inv_n, grad)).sum()
}

/// Sum over rows of `logsumexp - z[target]`; overwrites `z` by the mean
/// loss's gradient when `grad`.
fn ce_all(z: &mut [f32], v: usize, targets: &[usize], grad: bool) -> f64 {
    let n = targets.len();
    let inv_n = 1.0 / n as f32;
    let per = n.div_ceil(rayon::current_num_threads().max(1) * 4).max(1);
    z.par_chunks_mut(per * v).zip(targets.par_chunks(per)).map(|(rows, t)| ce_rows(rows, v, t, inv_n, grad)).sum()
}

#[derive(Debug)]
struct CrossEntropyBackward;

impl Backward<CpuBackend, 1> for CrossEntropyBackward {
    /// The mean loss's gradient with respect to the logits, `[n, V]`.
    type State = FlexTensor;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let up = contiguous(grads.consume::<CpuBackend>(&ops.node));
        let scale = slice(&up)[0];
        let [p] = ops.parents;
        let Some(n) = p else { return };
        let mut g = ops.state;
        if scale != 1.0 {
            let v = *g.layout().shape().last().unwrap_or(&1);
            super::cpu_ops::for_row_blocks(values_mut(&mut g), v, |_, rows| rows.iter_mut().for_each(|x| *x *= scale));
        }
        grads.register::<CpuBackend>(n.id, g);
    }
}

/// Mean next-token negative log-likelihood (nats) of `logits: [n, V]`
/// against `targets: [n]` (`[1]` tensor), fused: one threaded pass per row
/// (max, `exp` by [`exp_f32`], sum), on the CPU backend (no gradient) and on
/// [`CpuAutodiff`] (one graph node; the gradient is written over the logits
/// during the forward pass, module docs).
///
/// # Errors
/// `Err((logits, targets))` unchanged on any other backend or dtype.
///
/// # Panics
/// If a target is outside `0..V` or the row counts differ.
#[allow(clippy::type_complexity)]
pub fn cross_entropy<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Result<Tensor<B, 1>, (Tensor<B, 2>, Tensor<B, 1, Int>)> {
    let ad = is_cpu_autodiff::<B>();
    if !(ad || super::cpu_ops::is_cpu::<B>()) || logits.dtype() != DType::F32 {
        return Err((logits, targets));
    }
    let [n, v] = logits.dims();
    let t: Vec<usize> = targets
        .into_data()
        .iter::<i64>()
        .map(|t| {
            usize::try_from(t)
                .ok()
                .filter(|&t| t < v)
                .unwrap_or_else(|| panic!("target token {t} outside the vocabulary of {v}"))
        })
        .collect();
    assert_eq!(t.len(), n, "{} targets for {n} rows of logits", t.len());
    if !ad {
        let mut z = contiguous(super::cpu_ops::to_flex(logits));
        let loss = ce_all(values_mut(&mut z), v, &t, false) / n as f64;
        return Ok(super::cpu_ops::from_flex(flex_from_vec(vec![loss as f32], &[1])));
    }
    let za = to_ad(logits);
    let kind = CrossEntropyBackward.prepare::<NoCheckpointing>([za.node.clone()]).compute_bound().stateful();
    // Tracked: the gradient is written over the logits, which become the state.
    let tracked = matches!(kind, OpsKind::Tracked(_));
    let mut z = za.primitive;
    let loss = ce_all(values_mut(&mut z), v, &t, tracked) / n as f64;
    Ok(from_ad(node(kind, z, flex_from_vec(vec![loss as f32], &[1]))))
}

// ---------------------------------------------------------------- attention

/// The dimensions of one attention call in the projections' row layout.
#[derive(Debug, Clone, Copy)]
struct AttnShape {
    b: usize,
    s: usize,
    h: usize,
    kvh: usize,
    hd: usize,
}

#[derive(Debug)]
struct AttentionBackward;

/// What the attention backward reads: the rotated queries and keys, the
/// values (all `[b, s, heads * hd]`, contiguous), the RoPE tables
/// (`[s * hd]`), the shape and the score scale.
type AttnState = (FlexTensor, FlexTensor, FlexTensor, Arc<[f32]>, Arc<[f32]>, AttnShape, f32);

/// A raw pointer shared by tasks writing disjoint rows.
#[derive(Clone, Copy)]
struct Ptr(*mut f32);
// SAFETY: each task writes only its own (batch, kv group) rows; nothing
// reads the buffers until every task has finished.
unsafe impl Send for Ptr {}
unsafe impl Sync for Ptr {}

/// `dst[m, n] (+)= lhs[m, k] · rhs[k, n]` with explicit strides (column
/// stride, row stride) for every operand; `accumulate` adds to `dst`.
///
/// # Safety
/// Every operand must be valid for the given sizes and strides.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_strided(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_s: (isize, isize),
    lhs: *const f32,
    lhs_s: (isize, isize),
    rhs: *const f32,
    rhs_s: (isize, isize),
    accumulate: bool,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_s.0,
            dst_s.1,
            accumulate,
            lhs,
            lhs_s.0,
            lhs_s.1,
            rhs,
            rhs_s.0,
            rhs_s.1,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Query rows per block of the attention backward: block `[q0, q0 + QB)`
/// reads keys `0..q0 + QB` only (the causal triangle, as the forward).
const QB: usize = 64;

/// The backward of one (batch `bi`, kv group `g`) block: the `rep` query
/// heads of the group, every position, in query blocks of [`QB`] rows.
///
/// # Safety
/// `dq` points to `[b, s, h * hd]`, `dk`/`dv` to zeroed `[b, s, kvh * hd]`
/// buffers; no other task writes the rows of this batch and group.
#[allow(clippy::too_many_arguments)]
unsafe fn attention_backward_block(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    (dq, dk, dv): (Ptr, Ptr, Ptr),
    sh: AttnShape,
    scale: f32,
    bi: usize,
    g: usize,
) {
    let AttnShape { s, h, kvh, hd, .. } = sh;
    let rep = h / kvh;
    let (qrs, kvrs) = ((h * hd) as isize, (kvh * hd) as isize);
    let kv_at = (bi * s * kvh + g) * hd;
    let (kp, vp) = (k[kv_at..].as_ptr(), v[kv_at..].as_ptr());
    let mut p = vec![0f32; QB.min(s) * s];
    let mut dp = vec![0f32; QB.min(s) * s];
    for hi in g * rep..(g + 1) * rep {
        let q_at = (bi * s * h + hi) * hd;
        for q0 in (0..s).step_by(QB) {
            let rows = QB.min(s - q0);
            let keys = q0 + rows;
            let ks = keys as isize;
            let at = q_at + q0 * h * hd;
            let (qp, dop) = (q[at..].as_ptr(), dout[at..].as_ptr());
            let (p, dp) = (&mut p[..rows * keys], &mut dp[..rows * keys]);
            // SAFETY: every operand below is a block of a [s, hd] head at
            // row stride qrs/kvrs inside its buffer, or a local [rows, keys]
            // matrix.
            unsafe {
                // P = softmax(Q Kᵀ * scale), causal: row i sees keys 0..=q0+i.
                gemm_strided(rows, keys, hd, p.as_mut_ptr(), (1, ks), qp, (1, qrs), kp, (kvrs, 1), false);
                for (i, row) in p.chunks_exact_mut(keys).enumerate() {
                    super::cpu_ops::softmax_prefix(row, q0 + i + 1, scale);
                }
                // dP = dO Vᵀ
                gemm_strided(rows, keys, hd, dp.as_mut_ptr(), (1, ks), dop, (1, qrs), vp, (kvrs, 1), false);
            }
            // dS = P ∘ (dP - rowsum(P ∘ dP)) * scale over each row's keys.
            for (i, (prow, drow)) in p.chunks_exact(keys).zip(dp.chunks_exact_mut(keys)).enumerate() {
                let live = q0 + i + 1;
                let dsum: f32 = prow[..live].iter().zip(&drow[..live]).map(|(a, b)| a * b).sum();
                for (d, &pv) in drow[..live].iter_mut().zip(&prow[..live]) {
                    *d = pv * (*d - dsum) * scale;
                }
                drow[live..].fill(0.0);
            }
            // SAFETY: as above; dq/dk/dv rows of (bi, group g) belong to
            // this task (dk, dv start at zero and accumulate).
            unsafe {
                // dQ_blk = dS K[..keys]
                gemm_strided(rows, hd, keys, dq.0.add(at), (1, qrs), dp.as_ptr(), (1, ks), kp, (1, kvrs), false);
                // dK[..keys] += dSᵀ Q_blk ; dV[..keys] += Pᵀ dO_blk
                gemm_strided(keys, hd, rows, dk.0.add(kv_at), (1, kvrs), dp.as_ptr(), (ks, 1), qp, (1, qrs), true);
                gemm_strided(keys, hd, rows, dv.0.add(kv_at), (1, kvrs), p.as_ptr(), (ks, 1), dop, (1, qrs), true);
            }
        }
    }
}

impl Backward<CpuBackend, 3> for AttentionBackward {
    type State = AttnState;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (qt, kt, vt, cos, sin, sh, scale) = ops.state;
        let AttnShape { b, s, h, kvh, hd } = sh;
        let dout = contiguous(grads.consume::<CpuBackend>(&ops.node));
        let mut dq = vec![0f32; b * s * h * hd];
        let mut dk = vec![0f32; b * s * kvh * hd];
        let mut dv = vec![0f32; b * s * kvh * hd];
        let ptrs = (Ptr(dq.as_mut_ptr()), Ptr(dk.as_mut_ptr()), Ptr(dv.as_mut_ptr()));
        let (qs, ks, vs, dos) = (slice(&qt), slice(&kt), slice(&vt), slice(&dout));
        (0..b * kvh).into_par_iter().with_max_len(1).for_each(move |task| {
            // SAFETY: task (bi, g) writes only its own rows (see the block).
            unsafe { attention_backward_block(qs, ks, vs, dos, ptrs, sh, scale, task / kvh, task % kvh) }
        });
        // The transpose of the rotation is the rotation with the sine negated.
        let neg: Vec<f32> = sin.iter().map(|x| -x).collect();
        rope_rows(&mut dq, s, h, hd, &cos, &neg);
        rope_rows(&mut dk, s, kvh, hd, &cos, &neg);
        let [pq, pk, pv] = ops.parents;
        for (p, d, w) in [(pq, dq, h * hd), (pk, dk, kvh * hd), (pv, dv, kvh * hd)] {
            if let Some(n) = p {
                grads.register::<CpuBackend>(n.id, flex_from_vec(d, &[b, s, w]));
            }
        }
    }
}

/// Causal grouped-query attention with RoPE on the projections' rows
/// (`q: [b, s, h * hd]`, `k, v: [b, s, kvh * hd]`, no cache), returning
/// `[b, s, h * hd]`, on [`CpuAutodiff`] in f32 as one graph node: the
/// forward is [`super::cpu_attention::causal_attention_rows`]'s kernel, the
/// backward the recomputation of the module docs.
///
/// # Errors
/// `Err((q, k, v))` unchanged on any other backend or dtype.
///
/// # Panics
/// If the shapes disagree with `heads`, `kv_heads` or `rope`.
#[allow(clippy::type_complexity)]
pub fn attention_rows<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    rope: &super::rope::RopeTables<B>,
    heads: usize,
    kv_heads: usize,
    scale: Option<f64>,
) -> Result<Tensor<B, 3>, (Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 3>)> {
    if !is_cpu_autodiff::<B>() || [q.dtype(), k.dtype(), v.dtype()].iter().any(|d| *d != DType::F32) {
        return Err((q, k, v));
    }
    let (b, s, hd) = super::cpu_attention::rows_shape(q.dims(), k.dims(), v.dims(), heads, kv_heads, rope.len);
    let (qa, ka, va) = (to_ad(q), to_ad(k), to_ad(v));
    let nodes = [qa.node.clone(), ka.node.clone(), va.node.clone()];
    let (mut qt, mut kt, vt) = (qa.primitive, ka.primitive, contiguous(va.primitive));
    rope_rows(values_mut(&mut qt), s, heads, hd, &rope.cos_host, &rope.sin_host);
    rope_rows(values_mut(&mut kt), s, kv_heads, hd, &rope.cos_host, &rope.sin_host);
    let scale = scale.unwrap_or_else(|| 1.0 / (hd as f64).sqrt()) as f32;
    let out = super::cpu_attention::attend_rows(slice(&qt), slice(&kt), slice(&vt), b, s, heads, kv_heads, hd, scale);
    let out = flex_from_vec(out, &[b, s, heads * hd]);
    let sh = AttnShape { b, s, h: heads, kvh: kv_heads, hd };
    let kind = AttentionBackward.prepare::<NoCheckpointing>(nodes).compute_bound().stateful();
    let state = (qt, kt, vt, rope.cos_host.clone(), rope.sin_host.clone(), sh, scale);
    Ok(from_ad(node(kind, state, out)))
}

// ------------------------------------------------- frozen 16-bit weights

#[derive(Debug)]
struct FrozenProductBackward;

impl Backward<CpuBackend, 1> for FrozenProductBackward {
    /// The 16-bit weight as stored (`[a, b]`) and whether the product
    /// used its transpose.
    type State = (FlexTensor, bool);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (w16, transposed) = ops.state;
        let dy = grads.consume::<CpuBackend>(&ops.node);
        let [px] = ops.parents;
        if let Some(n) = px {
            // y = x M with M = S (or Sᵀ): dx = dy Mᵀ = dy Sᵀ (or dy S). The
            // f32 copy of S lives for this product only.
            let s = widened(&w16);
            let s = if transposed { s } else { s.transpose() };
            let dx = plain(dy).matmul(s);
            grads.register::<CpuBackend>(n.id, dx.into_primitive().tensor());
        }
    }
}

/// `t` (a 16-bit tensor) as an f32 tensor of the CPU backend: a new buffer
/// ([`super::weights::weight_f32`]'s threaded conversion).
fn widened(t: &FlexTensor) -> Tensor<CpuBackend, 2> {
    super::weights::weight_f32(plain(t.clone()))
}

fn plain<const D: usize>(t: FlexTensor) -> Tensor<CpuBackend, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// `x · M` for `x: [rows, in]` (f32) on [`CpuAutodiff`] and a frozen
/// 16-bit weight (bf16/f16, no gradient): `M = w` (`w: [in, out]`, a
/// `Linear` weight) or `M = wᵀ` when `transposed` (`w: [out, in]`, a tied
/// embedding used as the LM head). One graph node that keeps `w` itself,
/// 2 bytes per value, for its backward: each pass widens `w` to f32 for
/// its product only, so training holds a frozen weight in 16 bits between
/// and during steps instead of the f32 copy Burn's `cast` → `matmul` would
/// keep in the graph until the backward pass (issue 38 item 3; ARCHITECTURE.md).
///
/// # Errors
/// `Err((x, w))` unchanged off [`CpuAutodiff`], for an `x` that is not f32,
/// a `w` that is not bf16/f16, or a `w` that needs a gradient (the caller's
/// composed path handles those).
#[allow(clippy::type_complexity)]
pub fn frozen_product<B: Backend>(
    x: Tensor<B, 2>,
    w: Tensor<B, 2>,
    transposed: bool,
) -> Result<Tensor<B, 2>, (Tensor<B, 2>, Tensor<B, 2>)> {
    if !is_cpu_autodiff::<B>()
        || x.dtype() != DType::F32
        || !matches!(w.dtype(), DType::BF16 | DType::F16)
        || w.is_require_grad()
    {
        return Err((x, w));
    }
    let (xa, wa) = (to_ad(x), to_ad(w));
    let w16 = contiguous(wa.primitive);
    let m = widened(&w16);
    let m = if transposed { m.transpose() } else { m };
    let out = plain::<2>(xa.primitive.clone()).matmul(m).into_primitive().tensor();
    let kind = FrozenProductBackward.prepare::<NoCheckpointing>([xa.node.clone()]).compute_bound().stateful();
    Ok(from_ad(node(kind, (w16, transposed), out)))
}

#[cfg(test)]
mod tests;
