//! NeuronMoE's post-training analysis (methods.md §3.7): the neurons of an
//! MoE model's experts.
//! - An MoE upcycled from a dense model (every expert a copy of its FFN)
//!   has, per expert, exactly the dense FFN's pooled neurons and the dense
//!   attention neurons, whatever its router does, in a right-padded batch
//!   as one by one; the layout lists every expert and marks expert 0 frozen.
//! - In an MoE whose experts differ (noisy copies), each expert's columns
//!   come from that expert's own weights: with mean pooling a language's
//!   mean `up_proj` column is its mean FFN input times that expert's
//!   `up_proj` (the map is linear), which a mix-up of experts fails.
//! - `expert_counts` splits a layer's specific neurons per expert and, with
//!   attention, adds up to the layer's count.

use moe_shared::checkpoint::{open_model, DType, WriteOptions};
use moe_shared::methods::neurons::{
    analyze, average_precision_table, expert_counts, AnalysisOptions, CollectOptions, ExpertRef, NeuronCollector,
    NeuronLayout, PooledActivations,
};
use moe_shared::methods::{upcycle, CopyNoise, ExpertCounts, NoiseKind, RouterInit, UpcycleOptions};
use moe_shared::model::{load_model, Mlp, Pooling, Transformer};
use moe_shared::CpuBackend;

use crate::train_util;

type B = CpuBackend;

/// Texts of 3..40 tokens of stories260K's vocabulary, two "languages"
/// (`a` draws from the lower half of the ids, `b` from the upper half).
fn texts() -> Vec<(usize, Vec<u32>)> {
    let mut x = 12345u64;
    let mut next = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    (0..12)
        .map(|i| {
            let lang = i % 2;
            let len = 3 + next() % 38;
            (lang, (0..len).map(|_| 3 + (next() % 250) + 250 * lang as u32).collect())
        })
        .collect()
}

/// Pooled activations of `model` on [`texts`]: one right-padded batch, or
/// one text at a time.
fn collect(model: &Transformer<B>, pooling: Pooling, batched: bool) -> PooledActivations {
    let mut col =
        NeuronCollector::new(model, vec!["a".into(), "b".into()], CollectOptions { pooling, max_tokens: 64 }).unwrap();
    let t = texts();
    if batched {
        let all: Vec<(usize, &[u32])> = t.iter().map(|(l, ids)| (*l, ids.as_slice())).collect();
        col.add_texts(&all).unwrap();
    } else {
        for (l, ids) in &t {
            col.add_text(*l, ids).unwrap();
        }
    }
    col.finish().unwrap()
}

/// The flat column range of component `name` of `layer`.
fn columns(layout: &NeuronLayout, layer: usize, name: &str) -> std::ops::Range<usize> {
    let (start, _, _, units) = layout
        .segments()
        .into_iter()
        .find(|&(_, l, s, _)| l == layer && layout.layers[l][s].component == name)
        .unwrap_or_else(|| panic!("layer {layer} has no component {name}"));
    start..start + units
}

/// Largest relative difference between columns `a` of `p` and `b` of `q`
/// over all texts.
fn worst(p: &PooledActivations, a: std::ops::Range<usize>, q: &PooledActivations, b: std::ops::Range<usize>) -> f32 {
    assert_eq!(a.len(), b.len());
    let (np, nq) = (p.layout.num_neurons(), q.layout.num_neurons());
    let mut w = 0f32;
    for t in 0..p.num_texts() {
        for (i, j) in a.clone().zip(b.clone()) {
            let (x, y) = (p.data[t * np + i], q.data[t * nq + j]);
            w = w.max((x - y).abs() / x.abs().max(1.0));
        }
    }
    w
}

#[test]
fn upcycled_experts_have_the_dense_neurons() {
    let Some(dense) = train_util::stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let dense_model = load_model::<B>(&dense, &device).unwrap();
    // Router std 1: far from uniform, so the routing differs per token.
    let moe = load_model::<B>(&train_util::upcycled(&dense, dir.path(), 1.0), &device).unwrap();
    let (dl, ml) = (NeuronLayout::of_model(&dense_model), NeuronLayout::of_model(&moe));
    let c = &dense_model.config;
    let attn = 2 * c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim;
    let ffn = 2 * c.intermediate_size + c.hidden_size;
    assert_eq!(dl.num_neurons(), c.num_layers * (attn + ffn));
    assert_eq!(ml.num_neurons(), c.num_layers * (attn + 4 * ffn), "4 experts per layer");
    assert!(dl.frozen_experts.is_empty());
    assert_eq!(ml.frozen_experts, vec![vec![0]; c.num_layers]);
    assert!(ml.is_frozen(1, 0) && !ml.is_frozen(1, 1));
    assert_eq!(ml.layers[0][4].component, "experts.0.gate_proj");
    assert_eq!(ml.layers[0][4].expert(), Some(ExpertRef::Routed(0)));
    assert_eq!(ml.layers[0][4 + 3 * 3 + 2].component, "experts.3.down_proj");
    assert_eq!(ml.layers[0][4 + 3 * 3 + 2].base(), "down_proj");
    for pooling in [Pooling::Mean, Pooling::Max] {
        let d = collect(&dense_model, pooling, false);
        let m = collect(&moe, pooling, true);
        let mut w = 0f32;
        for l in 0..c.num_layers {
            for comp in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                w = w.max(worst(&d, columns(&dl, l, comp), &m, columns(&ml, l, comp)));
            }
            for e in 0..4 {
                for comp in ["gate_proj", "up_proj", "down_proj"] {
                    w = w.max(worst(&d, columns(&dl, l, comp), &m, columns(&ml, l, &format!("experts.{e}.{comp}"))));
                }
            }
        }
        eprintln!("{pooling:?}: largest relative difference dense vs upcycled expert neurons {w:e}");
        assert!(w < 1e-4, "{pooling:?}: {w}");
    }
}

#[test]
fn each_expert_reads_its_own_weights() {
    let Some(dense) = train_util::stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("noisy");
    let opts = UpcycleOptions {
        experts: ExpertCounts::Uniform(3),
        top_k: 2,
        router_init: RouterInit::Random { std: 1.0 },
        noise: CopyNoise { kind: NoiseKind::Multiplicative, std: 0.3 },
        dtype: Some(DType::F32),
        seed: 11,
        ..Default::default()
    };
    upcycle(dense.source.as_ref(), &dense.config, &opts, &out, None, WriteOptions::default()).unwrap();
    let device = Default::default();
    let moe = load_model::<B>(&open_model(&out).unwrap(), &device).unwrap();
    let p = collect(&moe, Pooling::Mean, true);
    let layout = &p.layout;
    let d = moe.config.hidden_size;
    let counts = p.texts_per_language();
    let mut worst_rel = 0f64;
    let mut spread = 0f64;
    for (l, block) in moe.layers.iter().enumerate() {
        let Mlp::Moe(m) = &block.mlp else { panic!("layer {l} is dense") };
        let mut means: Vec<Vec<f64>> = Vec::new();
        for (e, expert) in m.experts.iter().enumerate() {
            // Burn's weight is [d, f]: column j is unit j's input weights.
            let w = expert.up_proj.weight.val();
            let f = w.dims()[1];
            let w: Vec<f32> = w.into_data().to_vec().unwrap();
            let cols = columns(layout, l, &format!("experts.{e}.up_proj"));
            let n = layout.num_neurons();
            for (lang, &texts) in counts.iter().enumerate() {
                let x = &p.hidden_means[lang][l * d..(l + 1) * d];
                let got: Vec<f64> = cols
                    .clone()
                    .map(|c| {
                        (0..p.num_texts())
                            .filter(|&t| p.labels[t] == lang)
                            .map(|t| f64::from(p.data[t * n + c]))
                            .sum::<f64>()
                            / texts as f64
                    })
                    .collect();
                let want: Vec<f64> =
                    (0..f).map(|j| (0..d).map(|i| x[i] * f64::from(w[i * f + j])).sum::<f64>()).collect();
                for (g, v) in got.iter().zip(&want) {
                    worst_rel = worst_rel.max((g - v).abs() / v.abs().max(1.0));
                }
                if lang == 0 {
                    means.push(got);
                }
            }
        }
        // The experts really differ (else a mix-up could not be seen).
        for e in 1..means.len() {
            let diff = means[0].iter().zip(&means[e]).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
            spread = spread.max(diff);
        }
    }
    eprintln!("mean up_proj column vs mean input x W_up: largest relative difference {worst_rel:e}; experts differ by up to {spread:.3}");
    assert!(worst_rel < 1e-4, "{worst_rel}");
    assert!(spread > 0.05, "the noisy experts do not differ ({spread})");

    // Per-expert counts add up, with attention, to the layer's count.
    let table = average_precision_table(&p, 1).unwrap();
    let report =
        analyze(&p, &table, &AnalysisOptions { top_n: 300, include_bottom: false, new_languages: vec!["b".into()] })
            .unwrap();
    let experts = expert_counts(&report.layout, &report.union_counts);
    assert_eq!(experts.len(), 3 * moe.layers.len());
    let f = moe.config.intermediate_size;
    for (l, c) in report.union_counts.iter().enumerate() {
        let in_experts: f64 = experts.iter().filter(|e| e.layer == l).map(|e| e.specific).sum();
        let in_attention: f64 = report.layout.layers[l]
            .iter()
            .zip(&c.per_component)
            .filter(|(x, _)| x.expert().is_none())
            .map(|(_, n)| n)
            .sum();
        assert!(
            (in_experts + in_attention - c.total).abs() < 1e-9,
            "layer {l}: {in_experts} + {in_attention} vs {}",
            c.total
        );
    }
    for e in &experts {
        assert_eq!(e.units, 2 * f + d);
        assert_eq!(e.frozen, e.expert == 0, "{e:?}");
        assert!(!e.shared);
    }
    let total: f64 = experts.iter().map(|e| e.specific).sum();
    assert!(total > 0.0, "no specific neuron in any expert");
}
