//! The upcycling variants of the field on stories260K (methods.md
//! "Upcycling variants"): each one that claims to keep the dense function
//! does (< 1e-4 on the logits, random routers included), Drop-Upcycling
//! re-draws exactly `floor(r·f)` units of each non-frozen expert and leaves
//! expert 0 alone, and bad options fail before any output exists.

use crate::common;

use std::path::Path;

use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::layout::names::{expert_weight_name, shared_expert_weight_name, Proj};
use moe_shared::methods::upcycle::drop_columns;
use moe_shared::methods::{
    upcycle, AllocationFile, ExpertCounts, MoeReport, RouterInit, SharedExperts, SharedInit, UpcycleOptions,
};
use moe_shared::model::load_model;
use moe_shared::tensor_io::{DType, WriteOptions};
use moe_shared::CpuBackend;

type B = CpuBackend;

const SENTENCE: &str = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";

fn stories() -> Option<LoadedModel> {
    Some(open_model(&common::data_file("models/stories260K/stories260K.bin")?).unwrap())
}

fn logits(m: &LoadedModel, ids: &[u32]) -> Vec<f32> {
    let device = Default::default();
    let model = load_model::<B>(m, &device).unwrap();
    let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    let n = ids.len();
    model
        .forward(Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, n]), &device), None)
        .into_data()
        .to_vec()
        .unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn opts(router_init: RouterInit) -> UpcycleOptions {
    UpcycleOptions { router_init, dtype: Some(DType::F32), seed: 3, ..Default::default() }
}

fn run(m: &LoadedModel, o: &UpcycleOptions, out: &Path) -> MoeReport {
    upcycle(m.source.as_ref(), &m.config, o, out, None, WriteOptions::default()).unwrap()
}

/// Upcycles with `o` and returns the max |logit difference| to the dense
/// model and the report; the output directory is removed.
fn diff_to_dense(m: &LoadedModel, o: &UpcycleOptions, dir: &Path) -> (f32, MoeReport) {
    let ids = m.tokenizer.as_ref().unwrap().encode(SENTENCE, true).unwrap();
    let out = dir.join("moe");
    let report = run(m, o, &out);
    let moe = open_model(&out).unwrap();
    let d = max_abs_diff(&logits(&moe, &ids), &logits(m, &ids));
    drop(moe);
    std::fs::remove_dir_all(&out).unwrap();
    (d, report)
}

#[test]
fn zero_initialised_shared_experts_keep_the_dense_function() {
    let Some(m) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    for (count, gate, init) in [
        (1, false, SharedInit::Zero),
        (2, true, SharedInit::Zero),
        (1, true, SharedInit::Copy),
        (2, false, SharedInit::Copy),
    ] {
        let o = UpcycleOptions {
            shared: SharedExperts { count, gate, init, frozen: false },
            ..opts(RouterInit::Random { std: 0.5 })
        };
        let (d, report) = diff_to_dense(&m, &o, dir.path());
        eprintln!("shared experts {count} gate {gate} init {init:?}: max |dlogit| = {d:e}");
        assert!(d < 1e-4, "{count} {gate} {init:?}: {d}");
        // One gated shared expert is Qwen2-MoE's own (auto picks it for this
        // llama base); the others only fit the studio layout.
        if (count, gate) == (1, true) {
            assert_eq!((report.layout, report.layout_reason.as_deref()), ("qwen2_moe", None));
        } else {
            assert_eq!(report.layout, "moe_studio");
            let reason = report.layout_reason.unwrap();
            let field = if count > 1 { "`shared_experts`" } else { "`shared_expert_gate`" };
            assert!(reason.contains("mixtral:") && reason.contains("qwen2_moe:") && reason.contains(field), "{reason}");
        }
        let spec = report.moe.layers[0].clone().unwrap();
        assert_eq!((spec.shared_experts, spec.shared_expert_gate), (count, gate));
        // 5 layers of `count` shared FFNs of 3·64·172 (+ the gate rows).
        let extra = 5 * count * (3 * 64 * 172 + if gate { 64 } else { 0 });
        let plain = moe_shared::config::MoeConfig::uniform(
            5,
            moe_shared::config::MoeLayerSpec { num_experts: 4, top_k: 2, ..Default::default() },
        );
        assert_eq!(report.parameters, plain.num_parameters(&m.config) + extra);
    }
    // A zero shared expert really is zero (and its up projection a copy).
    let o = UpcycleOptions { shared: SharedExperts { count: 1, ..Default::default() }, ..opts(RouterInit::Zeros) };
    let out = dir.path().join("z");
    run(&m, &o, &out);
    let moe = open_model(&out).unwrap();
    assert!(moe.source.read_f32(&shared_expert_weight_name(2, 0, Proj::Down)).unwrap().iter().all(|&x| x == 0.0));
    assert_eq!(
        moe.source.read_f32(&shared_expert_weight_name(2, 0, Proj::Up)).unwrap(),
        m.source.read_f32("model.layers.2.mlp.up_proj.weight").unwrap()
    );
}

/// Megatron's granular upcycling: G slices per copy with shared router rows
/// and the scale G on w2 keep the dense function for any router, in the
/// Mixtral layout (E·G experts, top-(k·G), intermediate_size f/G), and with
/// a per-layer allocation (studio layout).
#[test]
fn granular_upcycling_with_its_scale_keeps_the_dense_function() {
    let Some(m) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let per_layer = ExpertCounts::PerLayer(vec![Some(2), Some(4), None, Some(3), Some(2)]);
    for g in [2, 4] {
        for init in [RouterInit::Zeros, RouterInit::Random { std: 0.5 }, RouterInit::Random { std: 3.0 }] {
            for experts in [ExpertCounts::Uniform(4), per_layer.clone()] {
                let o = UpcycleOptions { granularity: g, experts: experts.clone(), ..opts(init.clone()) };
                let (d, report) = diff_to_dense(&m, &o, dir.path());
                eprintln!("granularity {g} {} {experts:?}: max |dlogit| = {d:e} ({:?})", init.kind(), report.layout);
                assert!(d < 1e-4, "G {g} {init:?} {experts:?}: {d}");
                let l0 = report.moe.layers[0].clone().unwrap();
                let e0 = if matches!(experts, ExpertCounts::Uniform(_)) { 4 } else { 2 };
                assert_eq!((l0.num_experts, l0.top_k, l0.expert_intermediate_size), (e0 * g, 2 * g, Some(172 / g)));
                assert_eq!(l0.frozen, (0..g).collect::<Vec<_>>(), "copy 0 is experts 0..G");
                // Same total FFN parameters as E full copies (plus wider routers).
                let plain = UpcycleOptions { experts: experts.clone(), ..opts(RouterInit::Zeros) };
                let plain = moe_shared::methods::plan_upcycle(m.source.as_ref(), &m.config, &plain).unwrap();
                let router_growth: usize =
                    plain.moe.layers.iter().flatten().map(|s| s.num_experts * (g - 1) * 64).sum();
                assert_eq!(report.parameters, plain.moe.num_parameters(&m.config) + router_growth);
            }
        }
    }
    let o = UpcycleOptions { granularity: 2, ..opts(RouterInit::Random { std: 0.5 }) };
    let out = dir.path().join("mixtral");
    assert_eq!(run(&m, &o, &out).layout, "mixtral");
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!((cfg["num_local_experts"].as_u64(), cfg["num_experts_per_tok"].as_u64()), (Some(8), Some(4)));
    assert_eq!(cfg["intermediate_size"], 86);
    // The slices of one copy share a router row, and expert 3 (copy 1,
    // slice 1) is columns 86.. of the dense down projection times 2.
    let moe = open_model(&out).unwrap();
    let gate = moe.source.read_f32("model.layers.1.block_sparse_moe.gate.weight").unwrap();
    assert_eq!(gate[2 * 64..3 * 64], gate[3 * 64..4 * 64]);
    assert_ne!(gate[..64], gate[2 * 64..3 * 64]);
    let dense = m.source.read_f32("model.layers.1.mlp.down_proj.weight").unwrap();
    let w2 = moe.source.read_f32(&expert_weight_name(1, 3, Proj::Down)).unwrap();
    for r in 0..64 {
        for c in 0..86 {
            assert_eq!(w2[r * 86 + c], 2.0 * dense[r * 172 + 86 + c]);
        }
    }
}

/// Switch / Qwen2-MoE weights (softmax over all experts) with the zero
/// router: the routed output is scaled by E·G/k and equals the dense one.
#[test]
fn unnormalised_top_k_keeps_the_dense_function_for_the_zero_router() {
    let Some(m) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    for (g, shared) in [(1, 0), (2, 0), (1, 1)] {
        let o = UpcycleOptions {
            norm_topk_prob: false,
            granularity: g,
            shared: SharedExperts { count: shared, init: SharedInit::Copy, ..Default::default() },
            ..opts(RouterInit::Zeros)
        };
        let o = if shared == 0 { UpcycleOptions { shared: SharedExperts::default(), ..o } } else { o };
        let (d, report) = diff_to_dense(&m, &o, dir.path());
        eprintln!("norm_topk false, G {g}, {shared} copied shared: max |dlogit| = {d:e}");
        assert!(d < 1e-4, "G {g}: {d}");
        assert!(!report.moe.layers[0].as_ref().unwrap().norm_topk_prob);
        // Mixtral has no norm_topk_prob; Qwen2-MoE holds it (an ungated
        // shared expert it cannot).
        if shared == 0 {
            assert_eq!((report.layout, report.layout_reason.as_deref()), ("qwen2_moe", None));
        } else {
            let reason = report.layout_reason.unwrap();
            assert!(reason.contains("`shared_experts`") && reason.contains("`shared_expert_gate`"), "{reason}");
        }
    }
    // With a random router the scale cannot be exact, and the plan says so.
    let o = UpcycleOptions { norm_topk_prob: false, ..opts(RouterInit::Random { std: 0.5 }) };
    let plan = moe_shared::methods::plan_upcycle(m.source.as_ref(), &m.config, &o).unwrap();
    assert!(plan.warnings.iter().any(|w| w.contains("only for the zero router")), "{:?}", plan.warnings);
}

#[test]
fn drop_ratio_zero_is_the_plain_upcycle() {
    let Some(m) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    run(&m, &opts(RouterInit::Random { std: 0.5 }), &a);
    run(&m, &UpcycleOptions { drop_ratio: 0.0, ..opts(RouterInit::Random { std: 0.5 }) }, &b);
    let read = |p: &Path| std::fs::read(p.join("model.safetensors")).unwrap();
    assert!(read(&a) == read(&b), "--drop-ratio 0 writes the plain upcycle's bytes");
    let (d, _) =
        diff_to_dense(&m, &UpcycleOptions { drop_ratio: 0.0, ..opts(RouterInit::Random { std: 0.5 }) }, dir.path());
    assert!(d < 1e-4, "{d}");
}

/// The units of `0..f` whose row (`w1`, `w3`: `[f, d]`) or column (`w2`:
/// `[d, f]`) differs anywhere between `a` and `b`.
fn changed_units(a: &[f32], b: &[f32], f: usize, down: bool) -> Vec<usize> {
    let other = a.len() / f;
    (0..f)
        .filter(|&j| {
            (0..other).any(|i| {
                let k = if down { i * f + j } else { j * other + i };
                a[k] != b[k]
            })
        })
        .collect()
}

#[test]
fn drop_upcycling_redraws_exactly_r_of_each_non_frozen_expert() {
    let Some(m) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let f = 172;
    for (r, g) in [(0.5, 1), (0.25, 1), (1.0, 1), (0.5, 2)] {
        let out = dir.path().join(format!("drop-{r}-{g}"));
        let o = UpcycleOptions { drop_ratio: r, granularity: g, seed: 9, ..opts(RouterInit::Random { std: 0.1 }) };
        run(&m, &o, &out);
        let moe = open_model(&out).unwrap();
        let fe = f / g;
        let want = (r * fe as f64).floor() as usize;
        for l in 0..5 {
            let dense = |p: &str| m.source.read_f32(&format!("model.layers.{l}.mlp.{p}.weight")).unwrap();
            let (gate, up, down) = (dense("gate_proj"), dense("up_proj"), dense("down_proj"));
            for e in 0..4 * g {
                let w =
                    |p: &str| moe.source.read_f32(&expert_weight_name(l, e, Proj::from_mixtral(p).unwrap())).unwrap();
                // The slice of the dense FFN this expert was cut from.
                let s = e % g;
                let rows = |v: &[f32]| v[s * fe * 64..(s + 1) * fe * 64].to_vec();
                let cols: Vec<f32> =
                    (0..64).flat_map(|i| down[i * f + s * fe..i * f + (s + 1) * fe].to_vec()).collect();
                let scale = g as f32;
                let w2: Vec<f32> = w("w2").iter().map(|x| x / scale).collect();
                let changed = [
                    changed_units(&w("w1"), &rows(&gate), fe, false),
                    changed_units(&w("w3"), &rows(&up), fe, false),
                    changed_units(&w2, &cols, fe, true),
                ];
                if e < g {
                    assert!(changed.iter().all(Vec::is_empty), "r {r}: frozen expert {e} of layer {l} changed");
                    continue;
                }
                for c in &changed {
                    assert_eq!(c.len(), want, "r {r} G {g}: layer {l} expert {e}: {} units changed", c.len());
                }
                assert_eq!(changed[0], changed[1], "one unit set per expert");
                assert_eq!(changed[0], changed[2], "one unit set per expert");
                assert_eq!(changed[0], drop_columns(fe, r, 9, l, e));
            }
        }
        // The experts differ from each other (symmetry broken) and the
        // re-drawn values follow the original's statistics.
        if r == 0.5 && g == 1 {
            let e1 = moe.source.read_f32(&expert_weight_name(3, 1, Proj::Gate)).unwrap();
            let e2 = moe.source.read_f32(&expert_weight_name(3, 2, Proj::Gate)).unwrap();
            assert_ne!(e1, e2);
            let gate = m.source.read_f32("model.layers.3.mlp.gate_proj.weight").unwrap();
            let units = drop_columns(f, r, 9, 3, 1);
            let new: Vec<f64> = units.iter().flat_map(|&j| e1[j * 64..(j + 1) * 64].to_vec()).map(f64::from).collect();
            let old: Vec<f64> =
                units.iter().flat_map(|&j| gate[j * 64..(j + 1) * 64].to_vec()).map(f64::from).collect();
            let stats = |v: &[f64]| {
                let n = v.len() as f64;
                let mean = v.iter().sum::<f64>() / n;
                (mean, (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt())
            };
            let ((m1, s1), (m0, s0)) = (stats(&new), stats(&old));
            eprintln!(
                "drop-upcycled values: mean {m1:.4} std {s1:.4}; the replaced originals: mean {m0:.4} std {s0:.4}"
            );
            assert!((s1 / s0 - 1.0).abs() < 0.1 && (m1 - m0).abs() < 0.1 * s0, "{m1} {s1} vs {m0} {s0}");
        }
    }
}

/// Variants on a NeuronMoE allocation file: the counts are copies.
#[test]
fn allocation_files_work_with_every_variant() {
    let Some(m) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let alloc = AllocationFile::parse(br#"{"new_experts_per_layer": [1, null, 3, 1, 2]}"#, "alloc.json").unwrap();
    let o = UpcycleOptions {
        experts: alloc,
        experts_source: "alloc.json".into(),
        granularity: 2,
        shared: SharedExperts { count: 1, gate: true, ..Default::default() },
        ..opts(RouterInit::Random { std: 0.5 })
    };
    let (d, report) = diff_to_dense(&m, &o, dir.path());
    assert!(d < 1e-4, "{d}");
    assert_eq!(report.experts_per_layer, vec![4, 0, 8, 4, 6]);
    let o = UpcycleOptions { drop_ratio: 0.5, ..o };
    let (d, _) = diff_to_dense(&m, &o, dir.path());
    assert!(d > 1e-3, "dropping must change the function ({d})");
}

fn assert_refused(m: &LoadedModel, o: &UpcycleOptions, expect: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("moe");
    let e = upcycle(m.source.as_ref(), &m.config, o, &out, None, WriteOptions::default()).unwrap_err().to_string();
    for x in expect {
        assert!(e.contains(x), "`{x}` not in: {e}");
    }
    assert!(!out.exists() && std::fs::read_dir(dir.path()).unwrap().count() == 0, "output left after: {e}");
}

#[test]
fn bad_variant_options_fail_before_any_output() {
    let Some(m) = stories() else { return };
    let d = UpcycleOptions::default;
    for r in [-0.1, 1.5, f64::NAN] {
        assert_refused(&m, &UpcycleOptions { drop_ratio: r, ..d() }, &["--drop-ratio", "[0, 1]"]);
    }
    assert_refused(
        &m,
        &UpcycleOptions { granularity: 3, ..d() },
        &["--granularity", "G = 3", "intermediate_size 172", "2, 4, 43"],
    );
    assert_refused(&m, &UpcycleOptions { granularity: 0, ..d() }, &["--granularity", "G = 0"]);
    assert_refused(
        &m,
        &UpcycleOptions { shared: SharedExperts { gate: true, ..Default::default() }, ..d() },
        &["--shared-experts"],
    );
    assert_refused(&m, &UpcycleOptions { frozen: vec![4], granularity: 2, ..d() }, &["frozen expert"]);
}
