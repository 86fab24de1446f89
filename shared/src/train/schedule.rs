//! Learning-rate schedule: linear warm-up then cosine decay.
//!
//! Source: Loshchilov & Hutter, "SGDR" (2017) for the cosine;
//! transformers `get_cosine_schedule_with_warmup` for the shape. One
//! difference: the update of step `t` (0-based) uses the rate at `t + 1`
//! during warm-up, so the first update is not wasted with a rate of 0.

use serde::{Deserialize, Serialize};

/// Warm-up + cosine schedule over `total` optimizer steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up steps (linear from `lr / warmup` to `lr`).
    pub warmup: usize,
    /// Total optimizer steps.
    pub total: usize,
    /// Final rate as a fraction of `lr` (0 = decay to zero).
    pub min_ratio: f64,
}

impl LrSchedule {
    /// The learning rate of the update at 0-based step `step`.
    pub fn lr(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (self.min_ratio + (1.0 - self.min_ratio) * cos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine() {
        let s = LrSchedule { lr: 1.0, warmup: 4, total: 14, min_ratio: 0.1 };
        assert_eq!(s.lr(0), 0.25);
        assert_eq!(s.lr(3), 1.0);
        assert!((s.lr(4) - 1.0).abs() < 1e-12);
        assert!((s.lr(9) - 0.55).abs() < 1e-12, "half way: min + (1-min)/2");
        assert!((s.lr(14) - 0.1).abs() < 1e-12);
        assert!((s.lr(100) - 0.1).abs() < 1e-12);
        let flat = LrSchedule { lr: 2.0, warmup: 0, total: 1, min_ratio: 0.0 };
        assert_eq!(flat.lr(0), 2.0);
    }
}
