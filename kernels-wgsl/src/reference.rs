//! CPU references of the WGSL kernels (the ground truth their GPU tests
//! compare against): the same f32 operations in the same order as the
//! kernels and as the CLI (`shared/src/methods/delta.rs`,
//! `shared/src/methods/merge.rs`), with f16/bf16 decoded and rounded by the
//! `half` crate.

use half::{bf16, f16};

use crate::ElemDtype;

/// Decodes little-endian `dtype` bytes to f32 (exact).
///
/// # Panics
/// If `bytes` is not whole elements.
pub fn decode(dtype: ElemDtype, bytes: &[u8]) -> Vec<f32> {
    assert!(bytes.len().is_multiple_of(dtype.size_bytes()), "decode: partial element");
    match dtype {
        ElemDtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        ElemDtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        ElemDtype::Bf16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
    }
}

/// Encodes f32 values as little-endian `dtype` bytes, rounding to nearest,
/// ties to even (`half`'s `from_f32`).
pub fn encode(dtype: ElemDtype, values: &[f32]) -> Vec<u8> {
    match dtype {
        ElemDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ElemDtype::F16 => values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
        ElemDtype::Bf16 => values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
    }
}

/// `Σ_k w_k x_k` in f32 as `((0 + x_0 w_0) + x_1 w_1) + ...` (the CLI's
/// linear merge), rounded once to `dtype`. Reference of
/// [`crate::Gpu::weighted_sum`].
///
/// # Panics
/// If there are no inputs, the weight count differs, or lengths differ.
pub fn weighted_sum(inputs: &[&[u8]], weights: &[f32], dtype: ElemDtype) -> Vec<u8> {
    assert!(!inputs.is_empty() && inputs.len() == weights.len(), "weighted_sum: one weight per input");
    let mut acc = vec![0f32; inputs[0].len() / dtype.size_bytes()];
    for (x, &w) in inputs.iter().zip(weights) {
        let x = decode(dtype, x);
        assert_eq!(x.len(), acc.len(), "weighted_sum: length mismatch");
        for (a, v) in acc.iter_mut().zip(&x) {
            *a += v * w;
        }
    }
    encode(dtype, &acc)
}

/// The CLI graft over `dtype` bytes: `sd = scale * (instruct - base)`,
/// `target + sd` where `sd != 0`, else `target` unchanged; in f32, rounded
/// once to `dtype`. Reference of [`crate::Gpu::graft`].
///
/// # Panics
/// If lengths differ.
pub fn graft(target: &[u8], instruct: &[u8], base: &[u8], scale: f32, dtype: ElemDtype) -> Vec<u8> {
    let (mut t, i, b) = (decode(dtype, target), decode(dtype, instruct), decode(dtype, base));
    assert!(t.len() == i.len() && i.len() == b.len(), "graft: length mismatch");
    for ((t, i), b) in t.iter_mut().zip(&i).zip(&b) {
        let sd = scale * (i - b);
        if sd != 0.0 {
            *t += sd;
        }
    }
    encode(dtype, &t)
}

/// `A += xᵀ x` (`[p, p]`) and `B += xᵀ y` (`[p, e]`) in f64, `x` `[n, p]`
/// and `y` `[n, e]` row-major: the ridge statistics (methods.md §2).
/// Reference of [`crate::GramAccumulator`].
///
/// # Panics
/// If the lengths are not `n` rows of `p`, `e`, or `a`/`b` have the wrong size.
pub fn gram_accumulate(a: &mut [f64], b: &mut [f64], x: &[f32], y: &[f32], p: usize, e: usize) {
    let n = x.len() / p;
    assert!(x.len() == n * p && y.len() == n * e && a.len() == p * p && b.len() == p * e, "gram: shapes");
    for r in 0..n {
        let xr = &x[r * p..(r + 1) * p];
        let yr = &y[r * e..(r + 1) * e];
        for i in 0..p {
            let xi = f64::from(xr[i]);
            if xi == 0.0 {
                continue;
            }
            for (aj, &xj) in a[i * p..(i + 1) * p].iter_mut().zip(xr) {
                *aj += xi * f64::from(xj);
            }
            for (bj, &yj) in b[i * e..(i + 1) * e].iter_mut().zip(yr) {
                *bj += xi * f64::from(yj);
            }
        }
    }
}

/// `out[i] = target[i] + scale * (instruct[i] - base[i])`.
///
/// # Panics
/// If the slices differ in length.
pub fn graft_f32(target: &[f32], instruct: &[f32], base: &[f32], scale: f32) -> Vec<f32> {
    assert!(target.len() == instruct.len() && instruct.len() == base.len(), "graft: length mismatch");
    target.iter().zip(instruct).zip(base).map(|((t, i), b)| t + scale * (i - b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_references_round_once_and_keep_zero_deltas() {
        for dtype in [ElemDtype::F32, ElemDtype::F16, ElemDtype::Bf16] {
            let t = encode(dtype, &[1.0, -0.0, 3.0]);
            let i = encode(dtype, &[2.0, 5.0, 7.0]);
            let b = encode(dtype, &[1.0, 5.0, 7.0]);
            assert_eq!(decode(dtype, &graft(&t, &i, &b, 0.5, dtype)), vec![1.5, -0.0, 3.0]);
            assert_eq!(decode(dtype, &graft(&t, &i, &b, 0.5, dtype))[1].to_bits(), (-0.0f32).to_bits());
            assert_eq!(decode(dtype, &weighted_sum(&[&i, &b], &[1.0, -1.0], dtype)), vec![1.0, 0.0, 0.0]);
        }
        // 1 + 2^-9 is not a bf16: the sum rounds once (ties to even -> 1.0).
        let one = encode(ElemDtype::Bf16, &[1.0]);
        let tiny = encode(ElemDtype::Bf16, &[2f32.powi(-9)]);
        assert_eq!(decode(ElemDtype::Bf16, &weighted_sum(&[&one, &tiny], &[1.0, 1.0], ElemDtype::Bf16)), vec![1.0]);
    }

    #[test]
    fn gram_reference_is_xtx_and_xty() {
        let (mut a, mut b) = (vec![0f64; 4], vec![0f64; 2]);
        gram_accumulate(&mut a, &mut b, &[1.0, 2.0, 3.0, 4.0], &[1.0, 0.0], 2, 1);
        assert_eq!(a, vec![10.0, 14.0, 14.0, 20.0]);
        assert_eq!(b, vec![1.0, 2.0]);
    }

    #[test]
    fn graft_is_the_per_element_arithmetic() {
        let out = graft_f32(&[1.0, 2.0, -3.0], &[0.5, 0.5, 1.0], &[0.25, 1.0, 1.0], 2.0);
        assert_eq!(out, vec![1.5, 1.0, -3.0]);
        // A zero delta leaves the target bit-identical.
        let t = [0.1f32, -7.25, 3.0e-8];
        assert_eq!(
            graft_f32(&t, &t, &t, 1.0).iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            t.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}
