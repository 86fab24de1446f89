//! Seeded, order-independent random numbers for the methods.
//!
//! Every random tensor (a router initialisation, the noise on one expert
//! copy) draws from its own generator, seeded from the user's seed and the
//! tensor's name. So a tensor's values depend only on `(seed, name)`: not on
//! the order tensors are written in, the shard size, or which other tensors
//! exist. Reproducible across runs and machines for one build of the studio
//! (the generator is rand's `StdRng`, pinned by `Cargo.lock`).

use rand::{rngs::StdRng, Rng, SeedableRng};

/// 64-bit FNV-1a hash of `s` (stable across Rust versions, unlike
/// `DefaultHasher`).
pub fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64 finaliser: spreads nearby seeds over the whole 64-bit space.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A generator of standard normal samples for the tensor `name` under
/// `seed` (Box-Muller on rand's uniform `f64`s).
pub struct NormalRng {
    rng: StdRng,
    spare: Option<f64>,
}

impl NormalRng {
    /// The generator for tensor `name` under the user's `seed`.
    pub fn for_tensor(seed: u64, name: &str) -> Self {
        NormalRng { rng: StdRng::seed_from_u64(mix(seed ^ mix(fnv1a(name)))), spare: None }
    }

    /// The next sample of `N(0, 1)`.
    pub fn next_normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        // u1 in (0, 1] so that ln(u1) is finite.
        let u1 = 1.0 - self.rng.random::<f64>();
        let u2: f64 = self.rng.random();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        self.spare = Some(r * t.sin());
        r * t.cos()
    }

    /// `n` samples of `N(0, std^2)` as f32.
    pub fn normals(&mut self, n: usize, std: f64) -> Vec<f32> {
        (0..n).map(|_| (self.next_normal() * std) as f32).collect()
    }
}

/// `m` distinct indices drawn uniformly from `0..n` (a partial
/// Fisher-Yates shuffle), sorted, seeded by `(seed, name)` like
/// [`NormalRng::for_tensor`]. `m` is clamped to `n`.
pub fn sample_indices(seed: u64, name: &str, n: usize, m: usize) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(mix(seed ^ mix(fnv1a(name))));
    let mut all: Vec<usize> = (0..n).collect();
    let m = m.min(n);
    for i in 0..m {
        let j = rng.random_range(i..n);
        all.swap(i, j);
    }
    all.truncate(m);
    all.sort_unstable();
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_depend_only_on_seed_and_name() {
        let a = NormalRng::for_tensor(7, "x").normals(5, 1.0);
        assert_eq!(a, NormalRng::for_tensor(7, "x").normals(5, 1.0));
        assert_ne!(a, NormalRng::for_tensor(8, "x").normals(5, 1.0));
        assert_ne!(a, NormalRng::for_tensor(7, "y").normals(5, 1.0));
    }

    #[test]
    fn index_samples_are_distinct_seeded_and_cover_the_range() {
        let a = sample_indices(3, "e", 100, 40);
        assert_eq!(a.len(), 40);
        assert!(a.windows(2).all(|w| w[0] < w[1]) && a[39] < 100);
        assert_eq!(a, sample_indices(3, "e", 100, 40));
        assert_ne!(a, sample_indices(3, "f", 100, 40));
        assert_eq!(sample_indices(1, "x", 5, 9), vec![0, 1, 2, 3, 4]);
        // Every index is drawn about equally often.
        let mut hits = [0usize; 10];
        for s in 0..2000 {
            for i in sample_indices(s, "u", 10, 3) {
                hits[i] += 1;
            }
        }
        assert!(hits.iter().all(|&h| (500..700).contains(&h)), "{hits:?}");
    }

    #[test]
    fn samples_are_standard_normal() {
        let v = NormalRng::for_tensor(1, "stats").normals(200_000, 2.0);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.02, "std {}", var.sqrt());
    }
}
