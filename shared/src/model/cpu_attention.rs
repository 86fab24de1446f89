//! Causal grouped-query attention on the CPU backend, threaded and
//! triangle-aware (ARCHITECTURE.md, "The forward pass does no avoidable
//! work").
//!
//! burn-flex 0.21's fused `attention` runs every `(batch, head)` pair one
//! after the other on the calling thread (single-threaded gemm calls), and
//! computes the full `seq × seq` score matrix before masking the causal
//! upper triangle; our GQA call site also had to copy each key/value head
//! `heads / kv_heads` times (`repeat_dim`) because it expects equal head
//! counts. Measured on SmolLM2-135M prefill of 512 tokens, attention was a
//! serial ~27 % of the forward's wall time while the second core idled
//! (docs/benchmarks.md, "Where the time goes").
//!
//! This kernel computes the same function (transformers
//! `eager_attention_forward` / `sdpa` with `is_causal`, bottom-right
//! aligned): `softmax(q kᵀ / sqrt(head_dim) + causal) v`, with
//!
//! - query blocks of [`QUERY_BLOCK`] rows as independent tasks (rayon
//!   natively, a loop in wasm32), each reading only the keys its last
//!   query may see (the causal triangle costs half the square);
//! - key/value head `h / (heads / kv_heads)` read in place (no copies);
//! - the output written directly in `[batch, seq, heads * head_dim]`
//!   order (no `swap_dims` + contiguous copy before `o_proj`).
//!
//! The per-row arithmetic is burn-flex's naive kernel's: scores from one
//! gemm, scaled after the product, the row maximum subtracted before `exp`,
//! normalised by one reciprocal of the sum; only the gemm blocking (and so
//! the summation order inside a dot product) differs.
//!
//! Only the CPU backend ([`crate::CpuBackend`]) in f32 takes this path; on
//! any other backend, under autodiff, or for other dtypes
//! [`causal_attention`] returns its inputs and the caller runs Burn's
//! `attention`.

use burn::tensor::{backend::Backend, DType, Tensor, TensorData};

/// Query rows per task: large enough for an efficient score gemm, small
/// enough that 512 tokens x 9 heads give the threads many tasks to balance.
pub const QUERY_BLOCK: usize = 64;

/// Below this many score entries (`batch * heads * seq * kv_seq`) the work
/// runs on the calling thread (one decoding step: thread hand-off costs more
/// than it saves).
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
const PARALLEL_SCORES: usize = 64 * 1024;

/// Causal attention of `q: [batch, heads, seq, head_dim]` over
/// `k, v: [batch, kv_heads, kv_seq, head_dim]` (`kv_seq >= seq`; query `i`
/// sits at absolute position `kv_seq - seq + i` and sees keys `0..=` that;
/// `heads` a multiple of `kv_heads`), returning `[batch, seq, heads *
/// head_dim]` (heads concatenated per position, `o_proj`'s input).
///
/// Scores are scaled by `scale` (`None`: `1 / sqrt(head_dim)`, as Burn's
/// `AttentionModuleOptions::scale`); no mask beyond causality (right padding
/// needs none: a real query never sees a later, padded key).
///
/// # Errors
/// Returns `Err((q, k, v))` unchanged when the backend is not
/// [`crate::CpuBackend`] or the dtype is not f32: run Burn's `attention`.
///
/// # Panics
/// If the shapes disagree as described above.
#[allow(clippy::type_complexity)]
pub fn causal_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    scale: Option<f64>,
) -> Result<Tensor<B, 3>, (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>)> {
    if !super::cpu_ops::is_cpu::<B>() || [q.dtype(), k.dtype(), v.dtype()].iter().any(|d| *d != DType::F32) {
        return Err((q, k, v));
    }
    let [b, h, s, hd] = q.dims();
    let [kb, kvh, t, khd] = k.dims();
    assert_eq!(v.dims(), [kb, kvh, t, khd], "attention: value shape {:?} vs key shape {:?}", v.dims(), k.dims());
    assert!(
        kb == b && khd == hd && kvh > 0 && h % kvh == 0 && t >= s,
        "attention: query {:?} and key {:?} do not match (equal batch and head_dim, heads a multiple of kv_heads, \
         kv_seq >= seq)",
        q.dims(),
        k.dims()
    );
    let device = q.device();
    // On the CPU backend these move the buffers when the tensor is unique and
    // contiguous, and copy otherwise (e.g. the KV cache keeps its own handle).
    let (qd, kd, vd) = (q.into_data(), k.into_data(), v.into_data());
    let (qs, ks, vs) = (f32s(&qd), f32s(&kd), f32s(&vd));
    let mut out = vec![0f32; b * s * h * hd];
    let scale = scale.unwrap_or_else(|| 1.0 / (hd as f64).sqrt()) as f32;
    attend(qs, ks, vs, &mut out, Shape { b, h, kvh, s, t, hd, rows: false }, scale);
    Ok(Tensor::from_data(TensorData::new(out, [b, s, h * hd]), &device))
}

/// RoPE plus causal attention straight from the projections, with no
/// transpose: `q: [batch, seq, heads * head_dim]` and `k, v: [batch, seq,
/// kv_heads * head_dim]` (the outputs of `q_proj` / `k_proj` / `v_proj`,
/// after any per-head q/k norm), positions `0..seq` of `rope` (no KV cache:
/// `kv_seq = seq`). RoPE is applied to `q` and `k` in place
/// ([`super::cpu_ops::rope_rows`]), then the kernel of [`causal_attention`]
/// reads each head at its row stride. Returns `[batch, seq, heads *
/// head_dim]`, the same values as `Rope::apply` + `swap_dims` +
/// [`causal_attention`] (the arithmetic is the same, element by element).
///
/// # Errors
/// Returns `Err((q, k, v))` unchanged off the CPU backend or for non-f32
/// dtypes (the caller takes the composed path).
///
/// # Panics
/// If the shapes disagree with `heads`, `kv_heads`, `head_dim` or `rope`.
#[allow(clippy::type_complexity)]
pub fn causal_attention_rows<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    rope: &super::rope::RopeTables<B>,
    heads: usize,
    kv_heads: usize,
    scale: Option<f64>,
) -> Result<Tensor<B, 3>, (Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 3>)> {
    if !super::cpu_ops::is_cpu::<B>() || [q.dtype(), k.dtype(), v.dtype()].iter().any(|d| *d != DType::F32) {
        return Err((q, k, v));
    }
    let (b, s, hd) = rows_shape(q.dims(), k.dims(), v.dims(), heads, kv_heads, rope.len);
    use super::cpu_ops::{contiguous, flex_from_vec, from_flex, rope_rows, to_flex, values_mut};
    let (mut qt, mut kt, vt) = (to_flex(q), to_flex(k), contiguous(to_flex(v)));
    let qs = values_mut(&mut qt);
    rope_rows(qs, s, heads, hd, &rope.cos_host, &rope.sin_host);
    let ks = values_mut(&mut kt);
    rope_rows(ks, s, kv_heads, hd, &rope.cos_host, &rope.sin_host);
    let scale = scale.unwrap_or_else(|| 1.0 / (hd as f64).sqrt()) as f32;
    let out = attend_rows(
        qt.as_slice::<f32>().expect("contiguous"),
        kt.as_slice::<f32>().expect("contiguous"),
        vt.as_slice::<f32>().expect("contiguous"),
        b,
        s,
        heads,
        kv_heads,
        hd,
        scale,
    );
    Ok(from_flex(flex_from_vec(out, &[b, s, heads * hd])))
}

/// `(batch, seq, head_dim)` of attention inputs in the projections' row
/// layout: `q: [b, s, heads * hd]`, `k, v: [b, s, kv_heads * hd]`, RoPE
/// tables of `rope_len = s` positions.
///
/// # Panics
/// If the shapes disagree with each other, `heads`, `kv_heads` or `rope_len`.
pub(crate) fn rows_shape(
    q: [usize; 3],
    k: [usize; 3],
    v: [usize; 3],
    heads: usize,
    kv_heads: usize,
    rope_len: usize,
) -> (usize, usize, usize) {
    let [b, s, qw] = q;
    let hd = qw / heads.max(1);
    assert!(
        heads > 0 && kv_heads > 0 && heads.is_multiple_of(kv_heads) && qw == heads * hd,
        "attention: query rows of {qw} for {heads} heads over {kv_heads} kv heads"
    );
    assert_eq!(k, [b, s, kv_heads * hd], "attention: key shape {k:?}");
    assert_eq!(v, [b, s, kv_heads * hd], "attention: value shape {v:?}");
    assert_eq!(rope_len, s, "RoPE tables for {rope_len} positions, input has {s}");
    (b, s, hd)
}

/// Causal attention, no cache, on rotated `q: [b, s, h * hd]` and
/// `k, v: [b, s, kvh * hd]` slices (the projections' row layout), returning
/// `[b, s, h * hd]` values (also the forward of the training kernel,
/// `cpu_grad::attention_rows`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_rows(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    b: usize,
    s: usize,
    h: usize,
    kvh: usize,
    hd: usize,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0f32; b * s * h * hd];
    attend(q, k, v, &mut out, Shape { b, h, kvh, s, t: s, hd, rows: true }, scale);
    out
}

fn f32s(d: &TensorData) -> &[f32] {
    d.as_slice::<f32>().expect("an f32 tensor's data is f32")
}

#[derive(Clone, Copy)]
struct Shape {
    b: usize,
    h: usize,
    kvh: usize,
    s: usize,
    t: usize,
    hd: usize,
    /// Inputs stored `[batch, seq, heads, head_dim]` (the projections'
    /// rows) instead of `[batch, heads, seq, head_dim]`.
    rows: bool,
}

impl Shape {
    /// `(offset of (batch, head, position 0), stride between positions)`
    /// of a `heads`-head, `len`-position tensor in this layout.
    fn at(&self, bi: usize, head: usize, heads: usize, len: usize) -> (usize, usize) {
        if self.rows {
            ((bi * len * heads + head) * self.hd, heads * self.hd)
        } else {
            ((bi * heads + head) * len * self.hd, self.hd)
        }
    }
}

/// A raw output pointer shared by tasks that write disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes its own `(batch, query rows, head)` block of the
// output and nothing reads it until all tasks have finished.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `out[b, i, h, :] = softmax_j<=t-s+i(q[b,h,i]·k[b,h/rep,j] * scale) v[b,h/rep,:]`.
fn attend(q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], sh: Shape, scale: f32) {
    assert_eq!(q.len(), sh.b * sh.h * sh.s * sh.hd);
    assert_eq!(k.len(), sh.b * sh.kvh * sh.t * sh.hd);
    assert_eq!(v.len(), k.len());
    assert_eq!(out.len(), q.len());
    let blocks = sh.s.div_ceil(QUERY_BLOCK);
    let tasks = sh.b * sh.h * blocks;
    let ptr = OutPtr(out.as_mut_ptr());
    let run = |task: usize| {
        let (bh, blk) = (task / blocks, task % blocks);
        // SAFETY: see `OutPtr`; `run_block` stays inside `out`'s bounds.
        unsafe { run_block(q, k, v, ptr, sh, scale, bh / sh.h, bh % sh.h, blk) }
    };
    #[cfg(not(target_arch = "wasm32"))]
    if sh.b * sh.h * sh.s * sh.t >= PARALLEL_SCORES && tasks > 1 {
        use rayon::prelude::*;
        // Later blocks see more keys: hand them out first for balance.
        (0..tasks).into_par_iter().with_max_len(1).rev().for_each(run);
        return;
    }
    (0..tasks).for_each(run);
}

/// One task: query rows `blk * QUERY_BLOCK ..` of head `hi` in batch `bi`.
///
/// # Safety
/// `out` points to a `[b, s, h, hd]` buffer that no other task writes in
/// this block's rows of head `hi`.
#[allow(clippy::too_many_arguments)]
unsafe fn run_block(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: OutPtr,
    sh: Shape,
    scale: f32,
    bi: usize,
    hi: usize,
    blk: usize,
) {
    let Shape { h, kvh, s, t, hd, .. } = sh;
    let rep = h / kvh;
    let (q_at, q_rs) = sh.at(bi, hi, h, s);
    let (kv_at, kv_rs) = sh.at(bi, hi / rep, kvh, t);
    let q0 = blk * QUERY_BLOCK;
    let rows = QUERY_BLOCK.min(s - q0);
    // Absolute position of query 0; the block's last query sees keys
    // 0..=offset + q0 + rows - 1.
    let offset = t - s;
    let keys = offset + q0 + rows;
    let q_blk = &q[q_at + q0 * q_rs..][..(rows - 1) * q_rs + hd];
    let (k_head, v_head) = (&k[kv_at..][..(keys - 1) * kv_rs + hd], &v[kv_at..][..(keys - 1) * kv_rs + hd]);
    let mut scores = vec![0f32; rows * keys];
    // SAFETY: all operands are in bounds for the given sizes and strides.
    unsafe {
        // scores[rows, keys] = q_blk[rows, hd] · k_head[keys, hd]ᵀ
        gemm::gemm(
            rows,
            keys,
            hd,
            scores.as_mut_ptr(),
            1,
            keys as isize,
            false,
            q_blk.as_ptr(),
            1,
            q_rs as isize,
            k_head.as_ptr(),
            kv_rs as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    for (i, row) in scores.chunks_exact_mut(keys).enumerate() {
        super::cpu_ops::softmax_prefix(row, offset + q0 + i + 1, scale);
    }
    // SAFETY: the destination rows `(bi, q0..q0+rows, hi, 0..hd)` lie inside
    // `out` (row stride h * hd) and belong to this task only.
    unsafe {
        let dst = out.0.add(((bi * s + q0) * h + hi) * hd);
        // out_blk[rows, hd] = scores[rows, keys] · v_head[keys, hd]
        gemm::gemm(
            rows,
            hd,
            keys,
            dst,
            1,
            (h * hd) as isize,
            false,
            scores.as_ptr(),
            1,
            keys as isize,
            v_head.as_ptr(),
            1,
            kv_rs as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Direct evaluation of the definition in f64.
    fn reference(q: &[f32], k: &[f32], v: &[f32], sh: Shape) -> Vec<f32> {
        let Shape { b, h, kvh, s, t, hd, .. } = sh;
        let mut out = vec![0f32; b * s * h * hd];
        for bi in 0..b {
            for hi in 0..h {
                let kh = hi / (h / kvh);
                for i in 0..s {
                    let qi = &q[((bi * h + hi) * s + i) * hd..][..hd];
                    let seen = t - s + i + 1;
                    let sc: Vec<f64> = (0..seen)
                        .map(|j| {
                            let kj = &k[((bi * kvh + kh) * t + j) * hd..][..hd];
                            qi.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hd {
                        let acc: f64 = (0..seen).map(|j| e[j] / z * v[((bi * kvh + kh) * t + j) * hd + d] as f64).sum();
                        out[((bi * s + i) * h + hi) * hd + d] = acc as f32;
                    }
                }
            }
        }
        out
    }

    /// `n` deterministic values in [-2, 2) (xorshift32 from `seed`), the
    /// inputs of this file's and `cpu_grad`'s kernel tests.
    pub(in crate::model) fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32) * 4.0 - 2.0
            })
            .collect()
    }

    #[test]
    fn matches_the_definition_with_gqa_blocks_and_a_cache_offset() {
        // seq 150 spans three query blocks (the last partial); kv_seq > seq
        // is a KV cache of 20 positions; 6 heads over 2 kv heads.
        for sh in [
            Shape { b: 2, h: 6, kvh: 2, s: 150, t: 170, hd: 16, rows: false },
            Shape { b: 1, h: 3, kvh: 3, s: 1, t: 9, hd: 8, rows: false },
            Shape { b: 1, h: 4, kvh: 1, s: 130, t: 130, hd: 32, rows: false },
        ] {
            let q = values(sh.b * sh.h * sh.s * sh.hd, 1);
            let k = values(sh.b * sh.kvh * sh.t * sh.hd, 2);
            let v = values(sh.b * sh.kvh * sh.t * sh.hd, 3);
            let mut got = vec![f32::NAN; q.len()];
            attend(&q, &k, &v, &mut got, sh, 1.0 / (sh.hd as f32).sqrt());
            let want = reference(&q, &k, &v, sh);
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(
                worst < 2e-5,
                "max |error| {worst} for shape b{} h{} kvh{} s{} t{}",
                sh.b,
                sh.h,
                sh.kvh,
                sh.s,
                sh.t
            );
        }
    }

    #[test]
    fn equals_burn_attention_on_the_cpu_backend() {
        use burn::tensor::module::attention;
        use burn::tensor::ops::AttentionModuleOptions;
        type B = crate::CpuBackend;
        let dev = Default::default();
        let (b, h, kvh, s, t, hd) = (1, 6, 2, 100, 100, 16);
        let q = Tensor::<B, 4>::from_data(TensorData::new(values(b * h * s * hd, 4), [b, h, s, hd]), &dev);
        let k = Tensor::<B, 4>::from_data(TensorData::new(values(b * kvh * t * hd, 5), [b, kvh, t, hd]), &dev);
        let v = Tensor::<B, 4>::from_data(TensorData::new(values(b * kvh * t * hd, 6), [b, kvh, t, hd]), &dev);
        let rep = |x: Tensor<B, 4>| x.reshape([b, kvh, 1, t, hd]).repeat_dim(2, h / kvh).reshape([b, h, t, hd]);
        let opts = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
        let want = attention(q.clone(), rep(k.clone()), rep(v.clone()), None, None, opts).swap_dims(1, 2).reshape([
            b,
            s,
            h * hd,
        ]);
        let got = causal_attention(q, k, v, None).unwrap_or_else(|_| panic!("the CPU backend takes the kernel"));
        let (g, w) = (got.into_data().to_vec::<f32>().unwrap(), want.into_data().to_vec::<f32>().unwrap());
        let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "max |error| {worst} against burn-flex's attention");
    }

    #[test]
    fn rows_layout_with_rope_equals_the_transposed_path() {
        type B = crate::CpuBackend;
        let dev = Default::default();
        let (b, h, kvh, s, hd) = (2, 6, 2, 90, 16);
        let cfg = super::super::cpu_ops::tests::llama_config(h, kvh, hd);
        let rope = super::super::rope::Rope::new(&cfg);
        let tables = rope.tables::<B>(0, s, &dev);
        let q = Tensor::<B, 3>::from_data(TensorData::new(values(b * s * h * hd, 7), [b, s, h * hd]), &dev);
        let k = Tensor::<B, 3>::from_data(TensorData::new(values(b * s * kvh * hd, 8), [b, s, kvh * hd]), &dev);
        let v = Tensor::<B, 3>::from_data(TensorData::new(values(b * s * kvh * hd, 9), [b, s, kvh * hd]), &dev);
        let heads = |x: Tensor<B, 3>, n: usize| x.reshape([b, s, n, hd]).swap_dims(1, 2);
        let qr = super::super::rope::Rope::apply(heads(q.clone(), h), &tables);
        let kr = super::super::rope::Rope::apply(heads(k.clone(), kvh), &tables);
        let want = causal_attention(qr, kr, heads(v.clone(), kvh), None).unwrap_or_else(|_| panic!("cpu"));
        let got = causal_attention_rows(q, k, v, &tables, h, kvh, None).unwrap_or_else(|_| panic!("cpu"));
        let (g, w) = (got.into_data().to_vec::<f32>().unwrap(), want.into_data().to_vec::<f32>().unwrap());
        let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-6, "max |error| {worst} between the row and head layouts");
    }
}
