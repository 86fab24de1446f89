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
}
