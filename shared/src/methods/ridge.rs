//! DUME's closed-form router: ridge regression from FFN inputs to one-hot
//! domain labels, per MoE layer, with incremental statistics.
//!
//! Source: "Training-Free Dynamic Upcycling of Expert Language Models"
//! (DUME, 2026), router section; methods.md §2. For layer `l`, with `x` the
//! FFN input (post-attention RMSNorm output, what the router sees) and a
//! constant 1 appended when the router has a bias:
//! `A = Σ x xᵀ` (`[p, p]`, `p = d + 1`), `B = Σ x yᵀ` (`[p, E]`, `y` the
//! one-hot of the token's domain), then `W* = (A + λI)⁻¹ B` by a Cholesky
//! solve (faer), the last row split off as the bias, and every expert's
//! column of the weight part divided by its L2 norm (zero norms guarded by
//! 1e-6; the bias is divided by the same norm). Router weight = `Wᵀ`
//! (`[E, d]`). `A` and `B` are sums, so statistics of new batches or a new
//! domain are added without revisiting old data.
//!
//! Accumulation is in f64.

use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, Par, Side};
use serde::{Deserialize, Serialize};

use crate::error::{Result, StudioError};

/// Ridge statistics of one MoE layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RidgeStats {
    /// Hidden size `d`.
    pub dim: usize,
    /// Whether a constant-1 column (router bias) is appended.
    pub bias: bool,
    /// `A = Σ x xᵀ`, `[p, p]` row-major, `p = d + bias`.
    pub a: Vec<f64>,
    /// `B = Σ x yᵀ`, `[p, E]` row-major.
    pub b: Vec<f64>,
    /// Tokens accumulated per expert (domain).
    pub tokens: Vec<u64>,
}

/// A solved router: weight `[E, d]` row-major and optional bias `[E]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterWeights {
    /// Number of experts `E`.
    pub num_experts: usize,
    /// Hidden size `d`.
    pub dim: usize,
    /// `W_r`, `[E, d]` row-major.
    pub weight: Vec<f32>,
    /// `b_r`, `[E]`.
    pub bias: Option<Vec<f32>>,
}

impl RidgeStats {
    /// Empty statistics for hidden size `dim` and `num_experts` experts.
    pub fn new(dim: usize, num_experts: usize, bias: bool) -> Self {
        let p = dim + usize::from(bias);
        RidgeStats { dim, bias, a: vec![0.0; p * p], b: vec![0.0; p * num_experts], tokens: vec![0; num_experts] }
    }

    /// `p = d + 1` with a bias column, else `d`.
    pub fn p(&self) -> usize {
        self.dim + usize::from(self.bias)
    }

    /// Number of experts `E`.
    pub fn num_experts(&self) -> usize {
        self.tokens.len()
    }

    /// `tr(A) / p`, the mean diagonal of the Gram matrix: the scale `λ` is
    /// measured against (it grows with the statistics tokens, so a fixed
    /// `λ` regularises less the more tokens are collected; `route
    /// --lambda-sweep-relative r` solves with `λ = r · tr(A) / p`).
    pub fn mean_diagonal(&self) -> f64 {
        let p = self.p();
        (0..p).map(|i| self.a[i * p + i]).sum::<f64>() / p as f64
    }

    /// Adds `n` tokens of expert `expert`: `x` is `[n, d]` row-major.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] for a wrong length or expert index.
    pub fn accumulate(&mut self, x: &[f32], expert: usize) -> Result<()> {
        let (d, p, e) = (self.dim, self.p(), self.num_experts());
        if expert >= e {
            return Err(StudioError::Invalid(format!("ridge: expert {expert} does not exist ({e} experts)")));
        }
        if !x.len().is_multiple_of(d) {
            return Err(StudioError::Invalid(format!("ridge: {} values are not rows of d = {d}", x.len())));
        }
        let n = x.len() / d;
        if n == 0 {
            return Ok(());
        }
        let xm = Mat::<f64>::from_fn(n, p, |i, j| if j < d { x[i * d + j] as f64 } else { 1.0 });
        let mut a = Mat::<f64>::from_fn(p, p, |i, j| self.a[i * p + j]);
        matmul(a.as_mut(), Accum::Add, xm.transpose(), xm.as_ref(), 1.0, Par::Seq);
        for i in 0..p {
            for j in 0..p {
                self.a[i * p + j] = a[(i, j)];
            }
        }
        // B[:, expert] += Xᵀ 1 (column sums of X).
        for j in 0..p {
            let s: f64 = (0..n).map(|i| xm[(i, j)]).sum();
            self.b[j * e + expert] += s;
        }
        self.tokens[expert] += n as u64;
        Ok(())
    }

    /// Adds another set of statistics (same `d`, bias and experts).
    ///
    /// # Errors
    /// [`StudioError::Invalid`] when the shapes differ.
    pub fn merge(&mut self, other: &RidgeStats) -> Result<()> {
        if other.dim != self.dim || other.bias != self.bias || other.num_experts() != self.num_experts() {
            return Err(StudioError::Invalid(format!(
                "ridge: cannot add statistics of d={} bias={} E={} to d={} bias={} E={}",
                other.dim,
                other.bias,
                other.num_experts(),
                self.dim,
                self.bias,
                self.num_experts()
            )));
        }
        self.a.iter_mut().zip(&other.a).for_each(|(x, y)| *x += y);
        self.b.iter_mut().zip(&other.b).for_each(|(x, y)| *x += y);
        self.tokens.iter_mut().zip(&other.tokens).for_each(|(x, y)| *x += y);
        Ok(())
    }

    /// Appends a new expert (a zero column of `B`: old tokens are not of
    /// the new domain) and returns its index.
    pub fn add_expert(&mut self) -> usize {
        let (p, e) = (self.p(), self.num_experts());
        let mut b = Vec::with_capacity(p * (e + 1));
        for j in 0..p {
            b.extend_from_slice(&self.b[j * e..(j + 1) * e]);
            b.push(0.0);
        }
        self.b = b;
        self.tokens.push(0);
        e
    }

    fn regularised(&self, lambda: f64) -> Result<Mat<f64>> {
        if !(lambda.is_finite() && lambda > 0.0) {
            return Err(StudioError::Invalid(format!("ridge: lambda must be > 0 (got {lambda})")));
        }
        let p = self.p();
        Ok(Mat::<f64>::from_fn(p, p, |i, j| self.a[i * p + j] + if i == j { lambda } else { 0.0 }))
    }

    /// The raw solution `W* = (A + λI)⁻¹ B`, `[p, E]` row-major (before the
    /// bias split and normalisation).
    ///
    /// # Errors
    /// [`StudioError::Invalid`] for `lambda <= 0`, no tokens, or a matrix
    /// that is not positive definite.
    pub fn solve_raw(&self, lambda: f64) -> Result<Vec<f64>> {
        if self.tokens.iter().all(|&t| t == 0) {
            return Err(StudioError::Invalid("ridge: no statistics were accumulated".into()));
        }
        let (p, e) = (self.p(), self.num_experts());
        let m = self.regularised(lambda)?;
        let llt = m
            .llt(Side::Lower)
            .map_err(|e| StudioError::Invalid(format!("ridge: A + lambda I is not positive definite ({e:?})")))?;
        let rhs = Mat::<f64>::from_fn(p, e, |i, j| self.b[i * e + j]);
        let w = faer::linalg::solvers::Solve::solve(&llt, rhs.as_ref());
        let mut out = vec![0.0; p * e];
        for i in 0..p {
            for j in 0..e {
                out[i * e + j] = w[(i, j)];
            }
        }
        Ok(out)
    }

    /// `W* = (A + λI)⁻¹ B` by Gaussian elimination with partial pivoting
    /// (f64, `O(p³)`, no factorisation reuse): an independent second method
    /// that checks [`RidgeStats::solve_raw`]; slower, use for verification.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] for `lambda <= 0` or a singular system.
    pub fn solve_raw_direct(&self, lambda: f64) -> Result<Vec<f64>> {
        let (p, e) = (self.p(), self.num_experts());
        let reg = self.regularised(lambda)?;
        let mut m: Vec<Vec<f64>> = (0..p)
            .map(|i| {
                let mut row: Vec<f64> = (0..p).map(|j| reg[(i, j)]).collect();
                row.extend_from_slice(&self.b[i * e..(i + 1) * e]);
                row
            })
            .collect();
        for c in 0..p {
            let piv = (c..p).max_by(|&x, &y| m[x][c].abs().total_cmp(&m[y][c].abs())).expect("non-empty range");
            if m[piv][c] == 0.0 {
                return Err(StudioError::Invalid("ridge: singular system".into()));
            }
            m.swap(c, piv);
            for r in 0..p {
                if r != c {
                    let f = m[r][c] / m[c][c];
                    if f != 0.0 {
                        let pivot_row = m[c].clone();
                        for (x, pv) in m[r][c..].iter_mut().zip(&pivot_row[c..]) {
                            *x -= f * pv;
                        }
                    }
                }
            }
        }
        Ok((0..p * e).map(|x| m[x / e][p + x % e] / m[x / e][x / e]).collect())
    }

    /// The router: solve, split the bias row, normalise each expert's
    /// column by its L2 norm (guarded by 1e-6), transpose to `[E, d]`.
    ///
    /// # Errors
    /// As [`RidgeStats::solve_raw`].
    pub fn solve(&self, lambda: f64) -> Result<RouterWeights> {
        let (d, e) = (self.dim, self.num_experts());
        let w = self.solve_raw(lambda)?;
        let mut weight = vec![0f32; e * d];
        let mut bias = self.bias.then(|| vec![0f32; e]);
        for x in 0..e {
            let norm = (0..d).map(|i| w[i * e + x] * w[i * e + x]).sum::<f64>().sqrt().max(1e-6);
            for i in 0..d {
                weight[x * d + i] = (w[i * e + x] / norm) as f32;
            }
            if let Some(b) = bias.as_mut() {
                b[x] = (w[d * e + x] / norm) as f32;
            }
        }
        Ok(RouterWeights { num_experts: e, dim: d, weight, bias })
    }

    /// Condition number of `A + λI` (largest / smallest eigenvalue).
    ///
    /// # Errors
    /// [`StudioError::Invalid`] for `lambda <= 0` or when the eigenvalue
    /// solver fails.
    pub fn condition_number(&self, lambda: f64) -> Result<f64> {
        let m = self.regularised(lambda)?;
        let ev = m
            .self_adjoint_eigenvalues(Side::Lower)
            .map_err(|e| StudioError::Invalid(format!("ridge: eigenvalues failed ({e:?})")))?;
        let min = ev.first().copied().unwrap_or(f64::NAN);
        let max = ev.last().copied().unwrap_or(f64::NAN);
        Ok(max / min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    }

    fn data(n: usize, d: usize, seed: u64, shift: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n * d).map(|i| lcg(&mut s) + if i % d == 0 { shift } else { 0.0 }).collect()
    }

    #[test]
    fn cholesky_solve_matches_a_direct_solve() {
        let (d, e) = (12, 3);
        let mut st = RidgeStats::new(d, e, true);
        for x in 0..e {
            st.accumulate(&data(50, d, x as u64 + 1, x as f32), x).unwrap();
        }
        let lambda = 1e-2;
        let w = st.solve_raw(lambda).unwrap();
        let direct = st.solve_raw_direct(lambda).unwrap();
        let max_rel = w.iter().zip(&direct).map(|(x, y)| (x - y).abs() / y.abs().max(1e-12)).fold(0.0, f64::max);
        assert!(max_rel < 1e-8, "max relative difference {max_rel}");
    }

    #[test]
    fn halves_add_up_and_incremental_expert_equals_from_scratch() {
        let d = 8;
        let (x0, x1, x2) = (data(40, d, 1, 0.0), data(30, d, 2, 1.0), data(20, d, 3, -1.0));
        let mut once = RidgeStats::new(d, 2, true);
        once.accumulate(&x0, 0).unwrap();
        once.accumulate(&x1, 1).unwrap();
        let mut h1 = RidgeStats::new(d, 2, true);
        h1.accumulate(&x0[..20 * d], 0).unwrap();
        h1.accumulate(&x1[..10 * d], 1).unwrap();
        let mut h2 = RidgeStats::new(d, 2, true);
        h2.accumulate(&x0[20 * d..], 0).unwrap();
        h2.accumulate(&x1[10 * d..], 1).unwrap();
        h1.merge(&h2).unwrap();
        for (a, b) in h1.a.iter().zip(&once.a) {
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0));
        }
        assert_eq!(h1.tokens, once.tokens);
        // Add a third expert later vs. all three from scratch.
        let mut inc = once.clone();
        assert_eq!(inc.add_expert(), 2);
        inc.accumulate(&x2, 2).unwrap();
        let mut scratch = RidgeStats::new(d, 3, true);
        scratch.accumulate(&x0, 0).unwrap();
        scratch.accumulate(&x1, 1).unwrap();
        scratch.accumulate(&x2, 2).unwrap();
        let (a, b) = (inc.solve(1e-2).unwrap(), scratch.solve(1e-2).unwrap());
        let diff = a.weight.iter().zip(&b.weight).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-5, "incremental vs scratch {diff}");
    }

    #[test]
    fn separable_domains_route_to_their_expert_and_columns_are_unit_norm() {
        let d = 6;
        let mut st = RidgeStats::new(d, 2, true);
        st.accumulate(&data(100, d, 5, 2.0), 0).unwrap();
        st.accumulate(&data(100, d, 6, -2.0), 1).unwrap();
        let r = st.solve(1e-2).unwrap();
        for x in 0..2 {
            let n: f32 = r.weight[x * d..(x + 1) * d].iter().map(|v| v * v).sum::<f32>().sqrt();
            assert!((n - 1.0).abs() < 1e-5);
        }
        let probe = |v: &[f32]| -> usize {
            let s: Vec<f32> = (0..2)
                .map(|x| (0..d).map(|i| r.weight[x * d + i] * v[i]).sum::<f32>() + r.bias.as_ref().unwrap()[x])
                .collect();
            usize::from(s[1] > s[0])
        };
        let held0 = data(20, d, 50, 2.0);
        let held1 = data(20, d, 51, -2.0);
        let acc0 = (0..20).filter(|&t| probe(&held0[t * d..(t + 1) * d]) == 0).count();
        let acc1 = (0..20).filter(|&t| probe(&held1[t * d..(t + 1) * d]) == 1).count();
        assert_eq!((acc0, acc1), (20, 20));
        assert!(st.condition_number(1e-2).unwrap() > 1.0);
    }

    #[test]
    fn bad_lambda_and_empty_stats_are_errors() {
        let st = RidgeStats::new(4, 2, true);
        assert!(st.solve(1e-2).unwrap_err().to_string().contains("no statistics"));
        let mut st = st;
        st.accumulate(&[1.0; 8], 0).unwrap();
        assert!(st.solve(0.0).unwrap_err().to_string().contains("lambda must be > 0"));
        assert!(st.solve(-1.0).is_err());
    }
}
