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
//! - Granular experts (slices of the FFN) and shared experts are listed
//!   and captured in the layout's order: routed experts, then shared ones;
//!   copy 0's slices are the frozen experts; each slice has its part of the
//!   dense FFN's units.
//! - `expert_counts` splits a layer's specific neurons per expert and, with
//!   attention, adds up to the layer's count; NeuronMoE's allocation
//!   refuses such a report (it wants the dense model's counts).

use moe_shared::checkpoint::open_model;
use moe_shared::methods::allocate::{compare_allocations, ExpertRange};
use moe_shared::methods::neurons::{
    analyze, average_precision_table, expert_counts, expert_layer_means, AnalysisOptions, CollectOptions, ExpertRef,
    NeuronCollector, NeuronLayout, PooledActivations,
};
use moe_shared::methods::{
    upcycle, CopyNoise, ExpertCounts, NoiseKind, RouterInit, SharedExperts, SharedInit, UpcycleOptions,
};
use moe_shared::model::{load_model, Mlp, Pooling, Transformer};
use moe_shared::tensor_io::{DType, WriteOptions};
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
            for (proj, lin) in [("gate_proj", &expert.gate_proj), ("up_proj", &expert.up_proj)] {
                // Burn's weight is [d, f]: column j is unit j's input weights.
                let w = lin.weight.val();
                let f = w.dims()[1];
                let w: Vec<f32> = w.into_data().to_vec().unwrap();
                let cols = columns(layout, l, &format!("experts.{e}.{proj}"));
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
                    if lang == 0 && proj == "up_proj" {
                        means.push(got);
                    }
                }
            }
        }
        // The experts really differ (else a mix-up could not be seen).
        for e in 1..means.len() {
            let diff = means[0].iter().zip(&means[e]).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
            spread = spread.max(diff);
        }
    }
    eprintln!("mean gate/up_proj column vs mean input x W: largest relative difference {worst_rel:e}; experts differ by up to {spread:.3}");
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
    let e = compare_allocations(&report, None, ExpertRange::new(1, 6).unwrap(), None).unwrap_err().to_string();
    assert!(e.contains("MoE model") && e.contains("dense model"), "{e}");
}

#[test]
fn granular_and_shared_experts_are_listed_and_captured() {
    let Some(dense) = train_util::stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("granular");
    // 3 copies in 2 slices each (6 experts, copy 0 = experts 0 and 1
    // frozen), one shared expert whose down_proj is zero: the model equals
    // the dense one, so every FFN input is the dense model's.
    let opts = UpcycleOptions {
        experts: ExpertCounts::Uniform(3),
        granularity: 2,
        top_k: 1,
        shared: SharedExperts { count: 1, gate: false, init: SharedInit::Zero, frozen: false },
        router_init: RouterInit::Random { std: 1.0 },
        dtype: Some(DType::F32),
        seed: 4,
        ..Default::default()
    };
    upcycle(dense.source.as_ref(), &dense.config, &opts, &out, None, WriteOptions::default()).unwrap();
    let device = Default::default();
    let dense_model = load_model::<B>(&dense, &device).unwrap();
    let moe = load_model::<B>(&open_model(&out).unwrap(), &device).unwrap();
    let (dl, ml) = (NeuronLayout::of_model(&dense_model), NeuronLayout::of_model(&moe));
    let c = &dense_model.config;
    let (d, f, h) = (c.hidden_size, c.intermediate_size, c.intermediate_size / 2);
    assert_eq!(ml.frozen_experts, vec![vec![0, 1]; c.num_layers]);
    let mut want: Vec<(String, usize)> = vec![
        ("q_proj".into(), c.num_heads * c.head_dim),
        ("k_proj".into(), c.num_kv_heads * c.head_dim),
        ("v_proj".into(), c.num_kv_heads * c.head_dim),
        ("o_proj".into(), d),
    ];
    for e in 0..6 {
        want.extend([(format!("experts.{e}.gate_proj"), h), (format!("experts.{e}.up_proj"), h)]);
        want.push((format!("experts.{e}.down_proj"), d));
    }
    want.extend([("shared_experts.0.gate_proj".into(), f), ("shared_experts.0.up_proj".into(), f)]);
    want.push(("shared_experts.0.down_proj".into(), d));
    let got: Vec<(String, usize)> = ml.layers[2].iter().map(|x| (x.component.clone(), x.units)).collect();
    assert_eq!(got, want);
    assert_eq!(ml.layers[2].last().unwrap().expert(), Some(ExpertRef::Shared(0)));
    // The capture names every component in this order (the collector
    // checks) and each slice holds its half of the dense units.
    let p = collect(&dense_model, Pooling::Mean, false);
    let m = collect(&moe, Pooling::Mean, true);
    let mut w = 0f32;
    for l in 0..c.num_layers {
        for proj in ["gate_proj", "up_proj"] {
            let full = columns(&dl, l, proj);
            for e in 0..6 {
                let half = if e % 2 == 0 { full.start..full.start + h } else { full.start + h..full.end };
                w = w.max(worst(&p, half, &m, columns(&ml, l, &format!("experts.{e}.{proj}"))));
            }
            w = w.max(worst(&p, full, &m, columns(&ml, l, &format!("shared_experts.0.{proj}"))));
        }
    }
    eprintln!("granular slices and shared expert vs dense units: largest relative difference {w:e}");
    assert!(w < 1e-4, "{w}");
    let table = average_precision_table(&m, 1).unwrap();
    let report =
        analyze(&m, &table, &AnalysisOptions { top_n: 200, include_bottom: false, new_languages: vec!["b".into()] })
            .unwrap();
    let experts = expert_counts(&report.layout, &report.union_counts);
    assert_eq!(experts.len(), 7 * c.num_layers);
    for (i, x) in experts.iter().enumerate() {
        let slot = i % 7;
        assert_eq!((x.layer, x.shared, x.expert), (i / 7, slot == 6, if slot == 6 { 0 } else { slot }), "{x:?}");
        assert_eq!(x.frozen, !x.shared && x.expert < 2, "{x:?}");
        assert_eq!(x.units, if x.shared { 2 * f + d } else { 2 * h + d }, "{x:?}");
    }
    // Per-layer means: the frozen slices 0 and 1, the trainable 2..6.
    let means = expert_layer_means(&report.layout, &report.union_counts);
    assert_eq!(means.len(), c.num_layers);
    for (l, m) in means.iter().enumerate() {
        let of =
            |r: std::ops::Range<usize>| r.clone().map(|e| experts[7 * l + e].specific).sum::<f64>() / r.len() as f64;
        assert!((m.frozen - of(0..2)).abs() < 1e-12 && (m.trainable - of(2..6)).abs() < 1e-12, "layer {l}: {m:?}");
    }
}
