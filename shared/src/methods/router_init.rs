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
//! - `cheap_embed`: row `e` is the L2-normalised sum of the input
//!   embeddings of every token of the prompts chosen for `e`, the same row
//!   in every layer (mergekit-moe's `cheap_embed` gate mode; no forward
//!   pass: [`cheap_embed_row`], docs/methods.md §6.1 "mergekit recipes").

use serde::Serialize;

use crate::config::MoeConfig;
use crate::error::{Param, Result, StudioError};
use crate::rng::NormalRng;

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
    /// Row `e` of every MoE layer is `rows[e]` divided by its L2 norm
    /// (mergekit-moe's `cheap_embed`: one embedding-space vector per
    /// expert, shared by all layers; see [`cheap_embed_row`]). Needs at
    /// least `E_l` rows of length `d`.
    CheapEmbed {
        /// `[>= E][d]` raw router rows.
        #[serde(skip)]
        rows: Vec<Vec<f32>>,
    },
}

impl RouterInit {
    /// The CLI / report name: `zeros`, `random`, `hidden` or `cheap-embed`.
    pub fn kind(&self) -> &'static str {
        match self {
            RouterInit::Zeros => "zeros",
            RouterInit::Random { .. } => "random",
            RouterInit::Hidden { .. } => "hidden",
            RouterInit::CheapEmbed { .. } => "cheap-embed",
        }
    }

    /// Checks the options against the layout before anything is written.
    ///
    /// # Errors
    /// [`StudioError::Param`] ([`Param::Router`]) naming `source_name`: a negative or
    /// non-finite `std`; hidden rows of the wrong layer count, too few
    /// experts for a layer, or a row whose length is not `d`.
    pub fn validate(&self, moe: &MoeConfig, d: usize, source_name: &str) -> Result<()> {
        let err = |what: String| Err(StudioError::param(source_name, Param::Router, what));
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
            RouterInit::CheapEmbed { rows } => {
                let need = moe.layers.iter().flatten().map(|s| s.num_experts).max().unwrap_or(0);
                if rows.len() < need {
                    return err(format!(
                        "cheap_embed router: {need} experts but prompts were given for only {} \
                         (give one prompt set per expert)",
                        rows.len()
                    ));
                }
                if let Some(bad) = rows.iter().find(|v| v.len() != d) {
                    return err(format!("cheap_embed router: a row has {} values, expected d = {d}", bad.len()));
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
            RouterInit::Hidden { rows } => normalised_rows(&rows[layer][..num_experts], d, scale),
            RouterInit::CheapEmbed { rows } => normalised_rows(&rows[..num_experts], d, scale),
        }
    }
}

/// `rows` (each of length `d`) each divided by its L2 norm (clamped below
/// at 1e-8, as mergekit) and multiplied by `scale`, concatenated `[E, d]`.
fn normalised_rows(rows: &[Vec<f32>], d: usize, scale: f64) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * d);
    for row in rows {
        let norm = row.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt().max(1e-8);
        out.extend(row.iter().map(|&x| (f64::from(x) / norm * scale) as f32));
    }
    out
}

/// The unit vector of `Σ_t E[t]` over every token `t` of every prompt
/// (the sum of the input-embedding rows, L2-normalised with the norm
/// clamped at 1e-8): mergekit-moe's `cheap_embed` vector of one prompt set
/// (`mergekit/moe/router.py`, `get_cheap_embedding`). `embed` is the
/// `[V, d]` row-major `model.embed_tokens.weight`.
///
/// With negative prompts the expert's row is
/// `cheap_embed_row(positive) - cheap_embed_row(negative)` (both unit
/// vectors; [`RouterInit::CheapEmbed`] normalises the difference again), as
/// mergekit computes it. Sums are in f64.
///
/// # Errors
/// [`StudioError::Invalid`] for no prompts, an empty prompt, a token id
/// outside `[0, V)`, or an `embed` whose length is not a multiple of `d`.
pub fn cheap_embed_row(embed: &[f32], d: usize, prompts: &[Vec<u32>]) -> Result<Vec<f32>> {
    if d == 0 || !embed.len().is_multiple_of(d) {
        return Err(StudioError::Invalid(format!(
            "cheap_embed router: the embedding has {} values, not a multiple of d = {d}",
            embed.len()
        )));
    }
    let v = embed.len() / d;
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(StudioError::Invalid("cheap_embed router: an expert has no prompt tokens".into()));
    }
    let mut acc = vec![0f64; d];
    for &t in prompts.iter().flatten() {
        let t = t as usize;
        if t >= v {
            return Err(StudioError::Invalid(format!(
                "cheap_embed router: token id {t} is outside the vocabulary ({v})"
            )));
        }
        acc.iter_mut().zip(&embed[t * d..(t + 1) * d]).for_each(|(a, &x)| *a += f64::from(x));
    }
    let norm = acc.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-8);
    Ok(acc.into_iter().map(|x| (x / norm) as f32).collect())
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
    fn cheap_embed_sums_token_embeddings_and_shares_the_row_across_layers() {
        // V = 3, d = 2: rows (1,0), (0,2), (3,4).
        let embed = [1.0, 0.0, 0.0, 2.0, 3.0, 4.0];
        // Tokens 0, 1, 1 -> (1, 4) / sqrt(17); a repeated token counts twice.
        let r = cheap_embed_row(&embed, 2, &[vec![0, 1], vec![1]]).unwrap();
        let n = 17f64.sqrt();
        assert_eq!(r, vec![(1.0 / n) as f32, (4.0 / n) as f32]);
        let init = RouterInit::CheapEmbed { rows: vec![r.clone(), vec![0.0, 5.0]] };
        init.validate(&moe(2), 2, "x").unwrap();
        let w0 = init.weight(0, 2, 2, 0, "a", 1.0);
        assert_eq!(w0, init.weight(1, 2, 2, 0, "b", 1.0), "the same rows in every layer");
        assert_eq!(&w0[2..], &[0.0, 1.0]);
        assert!(init.validate(&moe(3), 2, "x").unwrap_err().to_string().contains("only 2"));
        let e = cheap_embed_row(&embed, 2, &[vec![3]]).unwrap_err().to_string();
        assert!(e.contains("token id 3") && e.contains("(3)"), "{e}");
        assert!(cheap_embed_row(&embed, 2, &[vec![]]).is_err());
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
