//! Streaming element-wise mean of one tensor over several models, with
//! shape alignment (DUME MoErging, methods.md §2: "tensors whose shapes
//! differ across models (e.g. grown vocabularies) must be aligned
//! (pad/truncate) before averaging").
//!
//! The output has the first model's shape. Another model's tensor is
//! truncated where it is larger and padded where it is smaller, and padded
//! elements are *absent*, not zeros: each output element is the mean over
//! the models that have it. (Zero padding would halve the embedding of a
//! token that only one of two models has.) Where all shapes agree this is
//! the plain mean. Sums are accumulated in f64, so the mean of identical
//! tensors is bit-exact and the mean of two is `(a + b) / 2` rounded once.

/// Accumulates tensors into an f64 sum of a fixed `shape`.
#[derive(Debug)]
pub struct MeanAccumulator {
    shape: Vec<usize>,
    sum: Vec<f64>,
    /// Per-element model counts, only once some shape differed.
    counts: Option<Vec<u32>>,
    added: u32,
}

impl MeanAccumulator {
    /// An empty accumulator for the output `shape`.
    pub fn new(shape: &[usize]) -> Self {
        MeanAccumulator { shape: shape.to_vec(), sum: vec![0.0; shape.iter().product()], counts: None, added: 0 }
    }

    /// Adds one model's tensor of shape `shape` (same rank as the output),
    /// aligned as in the module docs.
    ///
    /// # Panics
    /// When the ranks differ or `values.len()` does not match `shape`
    /// (callers check tensor infos first).
    pub fn add(&mut self, values: &[f32], shape: &[usize]) {
        assert_eq!(shape.len(), self.shape.len(), "rank mismatch");
        assert_eq!(values.len(), shape.iter().product::<usize>(), "value count vs shape");
        if shape == self.shape.as_slice() {
            self.sum.iter_mut().zip(values).for_each(|(s, &v)| *s += f64::from(v));
            if let Some(c) = &mut self.counts {
                c.iter_mut().for_each(|c| *c += 1);
            }
            self.added += 1;
            return;
        }
        let added = self.added;
        let counts = self.counts.get_or_insert_with(|| vec![added; self.sum.len()]);
        let rank = shape.len();
        if rank == 0 {
            return;
        }
        let overlap: Vec<usize> = shape.iter().zip(&self.shape).map(|(a, b)| *a.min(b)).collect();
        let inner = overlap[rank - 1];
        if overlap.contains(&0) {
            self.added += 1;
            return;
        }
        // Walk the outer indices of the overlap box in row-major order.
        let mut idx = vec![0usize; rank - 1];
        loop {
            let (mut dst, mut src) = (0usize, 0usize);
            for k in 0..rank - 1 {
                dst = dst * self.shape[k] + idx[k];
                src = src * shape[k] + idx[k];
            }
            let (dst, src) = (dst * self.shape[rank - 1], src * shape[rank - 1]);
            for j in 0..inner {
                self.sum[dst + j] += f64::from(values[src + j]);
                counts[dst + j] += 1;
            }
            // Next outer index.
            let mut k = rank - 1;
            loop {
                if k == 0 {
                    self.added += 1;
                    return;
                }
                k -= 1;
                idx[k] += 1;
                if idx[k] < overlap[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }

    /// The mean as f32 (elements no model had are 0).
    pub fn mean(&self) -> Vec<f32> {
        match &self.counts {
            None => {
                let n = f64::from(self.added.max(1));
                self.sum.iter().map(|s| (s / n) as f32).collect()
            }
            Some(c) => {
                self.sum.iter().zip(c).map(|(s, &c)| if c == 0 { 0.0 } else { (s / f64::from(c)) as f32 }).collect()
            }
        }
    }
}

/// Smallest magnitude `x` for which `x * 0.5` is a normal f32 (`2^-125`):
/// halving is then exact on every IEEE device, flushing or not.
const HALVES_EXACTLY: f32 = f32::MIN_POSITIVE * 2.0;

/// A mean that an f32 weighted sum computes bit for bit: the weights of
/// `((0 + x_0 w_0) + x_1 w_1) + ...`, one f32 operation each, rounded to
/// nearest even (fused or not) — the arithmetic of the WGSL `weighted_sum`
/// kernel (`kernels-wgsl`, `moe_kernels::reference::weighted_sum`) — that
/// equals [`MeanAccumulator::mean`] of the same tensors, given values that
/// pass [`WeightedMean::inputs_exact`] and a device result that passes
/// [`WeightedMean::output_exact`]. Made by [`weighted_mean`].
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedMean {
    /// One weight per input tensor, in input order.
    pub weights: Vec<f32>,
}

/// The [`WeightedMean`] of tensors of `shapes` averaged into `shapes[0]`
/// (as [`MeanAccumulator`] does), or `None` where the f32 weighted sum is
/// not the same arithmetic:
///
/// - two tensors of one shape: weights `[0.5, 0.5]`. The accumulator gives
///   `f32(f64(a + b) / 2)`, the kernel `f32(a/2 + b/2)`. With `a/2`, `b/2`
///   exact (see [`WeightedMean::inputs_exact`]) the kernel rounds the exact
///   `(a + b) / 2` once; the accumulator rounds `a + b` to f64 first, and
///   rounding to 53 bits and then to 24 equals rounding once to 24 for a
///   sum of two 24-bit numbers (53 ≥ 2·24 + 2), while `/ 2` is exact in f64.
///   Zeros: both give `+0` (`0 + (-0) = +0`).
/// - three or more tensors: `None`. The accumulator sums in f64 (exactly,
///   for ordinary weights) and divides once; the f32 sum rounds every
///   partial sum, and `1/n` is not an f32 unless `n` is a power of two.
/// - shapes that differ: `None`. Rows or columns only some models have are
///   averaged over those models (per-element counts: `a` alone where only
///   the first model has the element); one weight per input cannot say that.
pub fn weighted_mean(shapes: &[&[usize]]) -> Option<WeightedMean> {
    match shapes {
        [a, b] if a == b => Some(WeightedMean { weights: vec![0.5, 0.5] }),
        _ => None,
    }
}

impl WeightedMean {
    /// Whether one input tensor's `values` keep the weighted sum exact on any
    /// IEEE f32 device: finite (NaN payloads and infinities are left to the
    /// CPU), and zero or at least `2^-125` in magnitude, so that `x * 0.5`
    /// is an exact normal number (no subnormal a device might flush or round).
    pub fn inputs_exact(&self, values: &[f32]) -> bool {
        values.iter().all(|v| v.is_finite() && (*v == 0.0 || v.abs() >= HALVES_EXACTLY))
    }

    /// Whether a device's result `out` of the weighted sum of `inputs` (each
    /// passing [`WeightedMean::inputs_exact`]) is the mean bit for bit: every
    /// element a normal number, or `+0` where `a == -b`. A subnormal result
    /// (only after cancellation) may have been flushed to zero by the device
    /// (WGSL allows it), and `-0` is never the mean; either sends the tensor
    /// back to [`MeanAccumulator`].
    ///
    /// # Panics
    /// When `inputs` are not two tensors of `out`'s length.
    pub fn output_exact(&self, inputs: &[&[f32]], out: &[f32]) -> bool {
        let [a, b] = inputs else { panic!("output_exact: {} inputs, the weighted mean takes two", inputs.len()) };
        assert!(a.len() == out.len() && b.len() == out.len(), "output_exact: lengths differ");
        out.iter().zip(a.iter().zip(b.iter())).all(|(o, (a, b))| o.is_normal() || (o.to_bits() == 0 && *a == -*b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_shapes_give_the_exact_mean() {
        let mut m = MeanAccumulator::new(&[2, 2]);
        let a = [0.1f32, -3.0, 7.5, 1e-8];
        for _ in 0..3 {
            m.add(&a, &[2, 2]);
        }
        assert_eq!(m.mean(), a.to_vec());
        let mut m = MeanAccumulator::new(&[3]);
        m.add(&[1.0, 2.0, 3.0], &[3]);
        m.add(&[2.0, 2.0, 0.0], &[3]);
        assert_eq!(m.mean(), vec![1.5, 2.0, 1.5]);
    }

    #[test]
    fn grown_and_shrunk_rows_average_over_the_models_that_have_them() {
        // First model: 3 rows of 2. Second: 4 rows (one extra, truncated).
        // Third: 2 rows (row 2 absent there).
        let mut m = MeanAccumulator::new(&[3, 2]);
        m.add(&[1., 1., 2., 2., 3., 3.], &[3, 2]);
        m.add(&[3., 3., 4., 4., 5., 5., 9., 9.], &[4, 2]);
        m.add(&[5., 5., 6., 6.], &[2, 2]);
        assert_eq!(m.mean(), vec![3., 3., 4., 4., 4., 4.]);
        // Columns differ too.
        let mut m = MeanAccumulator::new(&[2, 2]);
        m.add(&[1., 2., 3., 4.], &[2, 2]);
        m.add(&[3., 9., 9., 5., 9., 9.], &[2, 3]);
        assert_eq!(m.mean(), vec![2., 5.5, 4., 6.5]);
    }

    /// xorshift64: deterministic test values.
    fn next(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Pairs over the whole f32 range: random bit patterns (wide exponent
    /// gaps), one exponent (ties to even half the time), cancellation into
    /// the subnormal range, zeros of both signs, and the `2^-125` boundary.
    fn pairs(n: usize) -> Vec<(f32, f32)> {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let m = HALVES_EXACTLY;
        let mut v = vec![(0.0, -0.0), (-0.0, -0.0), (-0.0, 0.0), (m, -m), (m, 1.5 * m), (-m, 1e30), (1.0, -1.0)];
        for i in 0..n {
            let (x, y) = (next(&mut s), next(&mut s));
            let a = f32::from_bits(x as u32);
            let b = match i % 4 {
                0 => f32::from_bits(y as u32),
                // Same exponent and sign as `a`, other mantissa.
                1 => f32::from_bits((x as u32 & 0xff80_0000) | (y as u32 & 0x007f_ffff)),
                // Nearly `-a`: the sum cancels to a few ulps.
                2 => -f32::from_bits((x as u32).wrapping_add((y % 7) as u32)),
                // Exponents a few binades apart.
                _ => a * f32::from_bits(0x3f80_0000 | (y as u32 & 0x007f_ffff)) * 2f32.powi((y >> 40) as i32 % 30 - 15),
            };
            v.push((a, b));
        }
        v
    }

    #[test]
    fn weighted_mean_is_offered_only_for_two_tensors_of_one_shape() {
        assert_eq!(weighted_mean(&[&[2, 3], &[2, 3]]).unwrap().weights, vec![0.5, 0.5]);
        assert_eq!(weighted_mean(&[&[4], &[4], &[4]]), None);
        assert_eq!(weighted_mean(&[&[4], &[4], &[4], &[4]]), None);
        assert_eq!(weighted_mean(&[&[3, 2], &[4, 2]]), None);
        assert_eq!(weighted_mean(&[&[3, 2]]), None);
    }

    #[test]
    fn the_f32_weighted_sum_equals_the_f64_mean_where_inputs_are_exact() {
        let w = weighted_mean(&[&[1], &[1]]).unwrap();
        let (mut checked, mut subnormal) = (0, 0);
        for (a, b) in pairs(400_000) {
            if !(w.inputs_exact(&[a]) && w.inputs_exact(&[b])) {
                continue;
            }
            let mut m = MeanAccumulator::new(&[1]);
            m.add(&[a], &[1]);
            m.add(&[b], &[1]);
            let cpu = m.mean()[0];
            // The kernel's arithmetic, unfused and fused.
            let plain = (0.0 + a * w.weights[0]) + b * w.weights[1];
            let fused = b.mul_add(w.weights[1], 0.0 + a * w.weights[0]);
            assert_eq!(cpu.to_bits(), plain.to_bits(), "a={a:e} b={b:e}: mean {cpu:e} vs weighted sum {plain:e}");
            assert_eq!(cpu.to_bits(), fused.to_bits(), "a={a:e} b={b:e} (fused)");
            if w.output_exact(&[&[a], &[b]], &[plain]) {
                checked += 1;
            } else {
                // Only subnormal results are refused (a device may flush them).
                assert!(plain.is_subnormal(), "a={a:e} b={b:e} -> {plain:e} refused");
                subnormal += 1;
            }
        }
        assert!(checked > 250_000 && subnormal > 0, "{checked} checked, {subnormal} subnormal");
    }

    #[test]
    fn inexact_inputs_and_flushed_outputs_are_refused() {
        let w = weighted_mean(&[&[2], &[2]]).unwrap();
        for bad in [f32::NAN, f32::INFINITY, f32::MIN_POSITIVE, 1e-45, -HALVES_EXACTLY / 2.0] {
            assert!(!w.inputs_exact(&[1.0, bad]), "{bad:e}");
        }
        assert!(w.inputs_exact(&[0.0, -0.0, HALVES_EXACTLY, -HALVES_EXACTLY, f32::MAX]));
        let (a, b) = ([HALVES_EXACTLY * 1.5, 1.0], [-HALVES_EXACTLY, -1.0]);
        // The exact mean of the first pair is subnormal: a flushed 0 and the
        // subnormal itself are refused; +0 for a == -b is accepted, -0 is not.
        assert!(!w.output_exact(&[&a, &b], &[0.0, 0.0]));
        assert!(!w.output_exact(&[&a, &b], &[HALVES_EXACTLY / 8.0, 0.0]));
        assert!(w.output_exact(&[&a[1..], &b[1..]], &[0.0]));
        assert!(!w.output_exact(&[&a[1..], &b[1..]], &[-0.0]));
    }
}
