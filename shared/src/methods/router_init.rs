//! Initial router weights of a new MoE layer (`W_r: [E, d]`).
//!
//! Right after upcycling every expert of a layer is the same FFN, so any
//! router gives the dense model's output (the top-k weights sum to 1;
//! methods.md §1 "Invariant worth testing"). The router only starts to
//! matter once the experts diverge (noise on the copies, training), and the
//! three initialisations differ in how the first training steps route:
//!
//! - `zeros`: every expert ties; top-k picks the lowest indices.
//! - `random`: `N(0, std^2)` entries, seeded per tensor (DeltaMoE's "small
//!   random init"; mergekit's `random` gate mode).
//! - `hidden`: row `e` is the L2-normalised mean FFN input of prompts chosen
//!   for expert `e` (mergekit's `hidden` gate mode; see
//!   [`super::hidden`] for how the rows are computed).

use serde::Serialize;

use super::rng::NormalRng;
use crate::config::MoeConfig;
use crate::error::{Result, StudioError};

/// How router weights are initialised.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum RouterInit {
    /// All zeros.
    Zeros,
    /// Independent `N(0, std^2)` entries, seeded by the run's seed and the
    /// router tensor's name.
    Random {
        /// Standard deviation (reference 0.02).
        std: f64,
    },
    /// Row `e` of layer `l` is `rows[l][e]` divided by its L2 norm (norms
    /// below 1e-8 are clamped, as mergekit). `rows[l]` needs at least `E_l`
    /// vectors of length `d` for every MoE layer `l`; extra rows are ignored.
    Hidden {
        /// `[L][>= E_l][d]` raw (unnormalised) router rows.
        #[serde(skip)]
        rows: Vec<Vec<Vec<f32>>>,
    },
}

impl RouterInit {
    /// The CLI / report name: `zeros`, `random` or `hidden`.
    pub fn kind(&self) -> &'static str {
        match self {
            RouterInit::Zeros => "zeros",
            RouterInit::Random { .. } => "random",
            RouterInit::Hidden { .. } => "hidden",
        }
    }

    /// Checks the options against the layout before anything is written.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming `source_name`: a negative or
    /// non-finite `std`; hidden rows of the wrong layer count, too few
    /// experts for a layer, or a row whose length is not `d`.
    pub fn validate(&self, moe: &MoeConfig, d: usize, source_name: &str) -> Result<()> {
        let err = |what: String| Err(StudioError::config(source_name, what));
        match self {
            RouterInit::Zeros => Ok(()),
            RouterInit::Random { std } if !(std.is_finite() && *std >= 0.0) => {
                err(format!("router std must be a finite number >= 0 (got {std})"))
            }
            RouterInit::Random { .. } => Ok(()),
            RouterInit::Hidden { rows } => {
                if rows.len() != moe.layers.len() {
                    return err(format!(
                        "hidden router: {} layers of hidden states for a model with {} layers",
                        rows.len(),
                        moe.layers.len()
                    ));
                }
                for (l, (spec, r)) in moe.layers.iter().zip(rows).enumerate() {
                    let Some(spec) = spec else { continue };
                    if r.len() < spec.num_experts {
                        return err(format!(
                            "hidden router: layer {l} has {} experts but prompts were given for only {} \
                             (give one prompt set per expert)",
                            spec.num_experts,
                            r.len()
                        ));
                    }
                    if let Some(bad) = r.iter().find(|v| v.len() != d) {
                        return err(format!(
                            "hidden router: layer {l}: a row has {} values, expected d = {d}",
                            bad.len()
                        ));
                    }
                }
                Ok(())
            }
        }
    }

    /// Router weight of layer `layer` with `num_experts` experts, row-major
    /// `[E, d]`, each entry multiplied by `scale` (the folded `1 / T` of the
    /// Mixtral layout, else 1). `name` and `seed` seed the random mode.
    ///
    /// Call [`RouterInit::validate`] first; hidden rows are indexed
    /// unchecked.
    pub fn weight(&self, layer: usize, num_experts: usize, d: usize, seed: u64, name: &str, scale: f64) -> Vec<f32> {
        match self {
            RouterInit::Zeros => vec![0.0; num_experts * d],
            RouterInit::Random { std } => NormalRng::for_tensor(seed, name).normals(num_experts * d, std * scale),
            RouterInit::Hidden { rows } => {
                let mut out = Vec::with_capacity(num_experts * d);
                for row in &rows[layer][..num_experts] {
                    let norm = row.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt().max(1e-8);
                    out.extend(row.iter().map(|&x| (f64::from(x) / norm * scale) as f32));
                }
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MoeLayerSpec;

    fn moe(e: usize) -> MoeConfig {
        MoeConfig::uniform(2, MoeLayerSpec { num_experts: e, top_k: 1, ..Default::default() })
    }

    #[test]
    fn hidden_rows_are_normalised_and_scaled() {
        let init = RouterInit::Hidden { rows: vec![vec![vec![3.0, 4.0], vec![0.0, 0.0]]; 2] };
        init.validate(&moe(2), 2, "x").unwrap();
        let w = init.weight(1, 2, 2, 0, "w", 0.5);
        assert_eq!(w, vec![0.3, 0.4, 0.0, 0.0]);
        let e = init.validate(&moe(3), 2, "prompts.json").unwrap_err().to_string();
        assert!(e.contains("prompts.json") && e.contains("layer 0 has 3 experts"), "{e}");
    }

    #[test]
    fn random_rows_follow_seed_and_std() {
        let init = RouterInit::Random { std: 0.02 };
        let a = init.weight(0, 4, 8, 3, "g", 1.0);
        assert_eq!(a, init.weight(0, 4, 8, 3, "g", 1.0));
        let b = init.weight(0, 4, 8, 3, "g", 0.5);
        assert!(a.iter().zip(&b).all(|(x, y)| (x * 0.5 - y).abs() < 1e-9));
        assert!(RouterInit::Random { std: -1.0 }.validate(&moe(2), 8, "x").is_err());
    }
}
