//! MoE layouts (`shared/src/layout`) against transformers, and the
//! refusals.
//!
//! - Every public layout the studio writes (Mixtral, Qwen2-MoE with a dense
//!   layer, with q/k/v bias or without, with a router temperature folded)
//!   computes what transformers computes from the same export: the golden
//!   logits of `tests/reference/make_layout_golden.py` (which also checked
//!   that transformers loads each export with no missing/unexpected keys),
//!   against our logits on the export regenerated here (< 1e-4, f32).
//! - Checkpoints transformers wrote itself (Mixtral, Qwen2-MoE with a zero
//!   shared expert, `tests/reference/make_tiny_fixtures.py`) read exactly;
//!   a non-zero shared expert is refused naming the tensor.
//! - A named layout that cannot hold the model is refused, naming the field
//!   and the layouts that can, and nothing is written.
//! - Layout conversions round-trip bit for bit; the GGUF export reads back
//!   to the same function (f32 exactly, Q8_0 closely).

use std::path::{Path, PathBuf};

use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::export::export_moe;
use moe_shared::checkpoint::gguf_write::write_gguf;
use moe_shared::checkpoint::load::from_gguf_bytes;
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::config::{MoeConfig, MoeLayerSpec};
use moe_shared::layout::ExpertsFormat;
use moe_shared::layout::{by_name, LayoutRequest};
use moe_shared::methods::ridge::RouterWeights;
use moe_shared::methods::route::write_routed;
use moe_shared::methods::{
    upcycle, AllocationFile, CopyNoise, ExpertCounts, NoiseKind, RouterInit, SharedInit, UpcycleOptions,
};
use moe_shared::model::load_model;
use moe_shared::tensor_io::gguf::GgufFile;
use moe_shared::tensor_io::{Bytes, DType, PlannedTensor, SafetensorsWriter, TensorSource};
use moe_shared::CpuBackend;

use super::common;

type B = CpuBackend;

const TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures")).join(name)
}

fn logits_of(m: &LoadedModel, ids: &[u32]) -> Vec<f32> {
    let model = load_model::<B>(m, &Default::default()).unwrap_or_else(|e| panic!("{}: {e}", m.path));
    let v: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
    let t = Tensor::<B, 2, Int>::from_data(TensorData::new(v, [1, ids.len()]), &Default::default());
    model.forward(t, None).into_data().to_vec().unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

fn json_logits(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32))
        .collect()
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The `UpcycleOptions` of a golden case's CLI arguments (the subset
/// `make_layout_golden.py` uses).
fn options_of(args: &[String], allocation: &serde_json::Value) -> UpcycleOptions {
    let mut o = UpcycleOptions::default();
    let (mut std, mut noise, mut kind) = (0.02, 0.0, NoiseKind::Multiplicative);
    let mut random = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().unwrap().clone();
        match a.as_str() {
            "--experts" => o.experts = ExpertCounts::Uniform(val().parse().unwrap()),
            "--top-k" => o.top_k = val().parse().unwrap(),
            "--router-init" => random = val() == "random",
            "--router-std" => std = val().parse().unwrap(),
            "--noise" => noise = val().parse().unwrap(),
            "--noise-kind" => kind = if val() == "add" { NoiseKind::Additive } else { NoiseKind::Multiplicative },
            "--seed" => o.seed = val().parse().unwrap(),
            "--temperature" => o.temperature = val().parse().unwrap(),
            "--dtype" => o.dtype = DType::parse_float(&val()),
            "--layout" => o.layout = LayoutRequest::parse(&val()).unwrap(),
            "--shared-experts" => o.shared.count = val().parse().unwrap(),
            "--shared-gate" => o.shared.gate = true,
            "--shared-init" => o.shared.init = if val() == "copy" { SharedInit::Copy } else { SharedInit::Zero },
            "--granularity" => o.granularity = val().parse().unwrap(),
            "--norm-topk" => o.norm_topk_prob = val().parse().unwrap(),
            other => panic!("make_layout_golden.py uses `{other}`, which this test does not mirror"),
        }
    }
    if !allocation.is_null() {
        o.experts = AllocationFile::parse(&serde_json::to_vec(allocation).unwrap(), "allocation").unwrap();
    }
    o.router_init = if random { RouterInit::Random { std } } else { RouterInit::Zeros };
    o.noise = CopyNoise { kind, std: noise };
    o
}

/// One row of docs/compatibility.md, appended to `$MOE_STUDIO_COMPAT_OUT`
/// (JSON lines) when set (`tests/reference/compat_matrix.py` collects them).
fn record(row: serde_json::Value) {
    if let Some(p) = std::env::var_os("MOE_STUDIO_COMPAT_OUT") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(p).unwrap();
        writeln!(f, "{row}").unwrap();
    }
}

#[test]
fn every_public_layout_export_matches_transformers() {
    let Some(golden) = common::golden_json("layouts.json") else { return };
    let dir = tempfile::tempdir().unwrap();
    let cases = golden.as_object().unwrap().iter().filter(|(k, _)| !k.starts_with('_'));
    let mut n = 0;
    for (name, case) in cases {
        let info = case["loading_info"].as_object().unwrap();
        assert!(info.values().all(|v| v.as_array().unwrap().is_empty()), "{name}: transformers reported {info:?}");
        let args: Vec<String> = case["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().into()).collect();
        let opts = options_of(&args, &case["allocation"]);
        let src = open_model(&fixture(case["fixture"].as_str().unwrap())).unwrap();
        let out = dir.path().join(name);
        let report = upcycle(src.source.as_ref(), &src.config, &opts, &out, None, Default::default()).unwrap();
        assert_eq!(report.layout, case["model_type"].as_str().unwrap(), "{name}");
        let m = open_model(&out).unwrap();
        assert_eq!(m.layout.map(|l| l.name()), Some(report.layout));
        let ours = logits_of(&m, &ids_of(&case["ids"]));
        let diff = max_diff(&ours, &json_logits(&case["logits"]));
        eprintln!("{name}: {} vs ours max |dlogit| = {diff:.2e}", case["class"]);
        record(serde_json::json!({"layout": report.layout, "loader": "transformers", "case": name,
            "class": case["class"], "max_abs_diff": diff, "loads": true}));
        assert!(diff < TOL, "{name}: transformers vs ours differ by {diff}");
        n += 1;
    }
    assert!(n >= 8, "golden cases: {n}");
}

#[test]
fn zero_noise_qwen2_upcycle_equals_the_dense_model_through_the_qwen2_moe_export() {
    let Some(golden) = common::golden_json("layouts.json") else { return };
    let case = &golden["qwen2-qwen2moe-zero-noise"];
    let d = case["max_abs_diff_vs_dense"].as_f64().unwrap();
    assert!(d < 1e-4, "transformers: upcycled vs dense {d}");
    let dense = open_model(&fixture("tiny-qwen2")).unwrap();
    let ids = ids_of(&case["ids"]);
    let ours_dense = logits_of(&dense, &ids);
    let diff = max_diff(&ours_dense, &json_logits(&case["logits"]));
    assert!(diff < TOL, "our dense model vs transformers' upcycled export: {diff}");
}

#[test]
fn transformers_written_mixtral_and_qwen2_moe_read_exactly() {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/golden/tiny_fixtures.json");
    let g: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    for (name, layout, dense_layers) in [("tiny-mixtral", "mixtral", 0), ("tiny-qwen2-moe", "qwen2_moe", 1)] {
        let m = open_model(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m.layout.map(|l| l.name()), Some(layout));
        let moe = m.moe.as_ref().unwrap();
        assert_eq!(moe.layers.iter().filter(|s| s.is_none()).count(), dense_layers, "{name}");
        assert!(moe.layers.iter().flatten().all(|s| s.num_experts == 4 && s.top_k == 2));
        // The zero shared expert is checked and hidden: canonical names only.
        assert!(m.source.tensors().iter().all(|t| !t.name.contains("shared_expert")), "{name}");
        let diff = max_diff(&logits_of(&m, &ids_of(&g[name]["ids"])), &json_logits(&g[name]["logits"]));
        eprintln!("{name}: transformers-written {layout}, ours vs transformers max |dlogit| = {diff:.2e}");
        assert!(diff < TOL, "{name}: {diff}");
    }
}

/// A copy of `src_dir`'s single safetensors file with tensor `name`
/// replaced by `values`, plus its config.json.
fn with_tensor(src_dir: &Path, out: &Path, name: &str, values: Vec<f32>) {
    let m = moe_shared::tensor_io::safetensors_io::SafetensorsModel::open_dir(src_dir).unwrap();
    let plan: Vec<PlannedTensor> =
        m.tensors().into_iter().map(|t| PlannedTensor { name: t.name, dtype: DType::F32, shape: t.shape }).collect();
    let mut w = SafetensorsWriter::create(out, plan.clone(), Default::default()).unwrap();
    for p in &plan {
        let v = if p.name == name { values.clone() } else { m.read_f32(&p.name).unwrap() };
        w.write_f32(&p.name, &v).unwrap();
    }
    w.finish(&[("config.json", std::fs::read(src_dir.join("config.json")).unwrap())]).unwrap();
}

#[test]
fn a_non_zero_qwen2_moe_shared_expert_is_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("shared");
    let name = "model.layers.0.mlp.shared_expert.down_proj.weight";
    let mut v = vec![0.0f32; 32 * 8];
    v[5] = 0.25;
    with_tensor(&fixture("tiny-qwen2-moe"), &out, name, v);
    let e = open_model(&out).unwrap_err().to_string();
    assert!(e.contains(name) && e.contains("not zero") && e.contains("0.25"), "{e}");
}

fn tiny_opts(experts: ExpertCounts, layout: &str) -> UpcycleOptions {
    UpcycleOptions {
        experts,
        router_init: RouterInit::Random { std: 0.5 },
        seed: 3,
        dtype: Some(DType::F32),
        layout: LayoutRequest::parse(layout).unwrap(),
        ..Default::default()
    }
}

#[test]
fn a_named_layout_that_cannot_hold_the_model_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let qwen2 = open_model(&fixture("tiny-qwen2")).unwrap();
    let out = dir.path().join("refused");
    // q/k/v bias into Mixtral
    let e = upcycle(
        qwen2.source.as_ref(),
        &qwen2.config,
        &tiny_opts(ExpertCounts::Uniform(4), "mixtral"),
        &out,
        None,
        Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`attention_bias`") && e.contains("layouts that can: qwen2_moe, moe_studio"), "{e}");
    assert!(!out.exists());
    // per-layer expert counts into Qwen2-MoE
    let per_layer = ExpertCounts::PerLayer(vec![Some(2), Some(3)]);
    let e = upcycle(
        qwen2.source.as_ref(),
        &qwen2.config,
        &tiny_opts(per_layer, "qwen2_moe"),
        &out,
        None,
        Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`num_experts`") && e.contains("layouts that can: moe_studio"), "{e}");
    assert!(!out.exists());
    // a router bias into Mixtral (a routed DUME model), on write and on convert
    let llama = open_model(&fixture("tiny-mistral")).unwrap();
    let studio = dir.path().join("studio");
    upcycle(
        llama.source.as_ref(),
        &llama.config,
        &tiny_opts(ExpertCounts::Uniform(2), "studio"),
        &studio,
        None,
        Default::default(),
    )
    .unwrap();
    let m = open_model(&studio).unwrap();
    let biased = MoeConfig {
        layers: m
            .moe
            .as_ref()
            .unwrap()
            .layers
            .iter()
            .map(|s| s.clone().map(|s| MoeLayerSpec { router_bias: true, ..s }))
            .collect(),
        ..m.moe.clone().unwrap()
    };
    let d = m.config.hidden_size;
    let routers: Vec<Option<RouterWeights>> = (0..m.config.num_layers)
        .map(|_| Some(RouterWeights { num_experts: 2, dim: d, weight: vec![0.1; 2 * d], bias: Some(vec![0.5, -0.5]) }))
        .collect();
    let mixtral = LayoutRequest::parse("mixtral").unwrap();
    let json = serde_json::json!({});
    let e = write_routed(
        m.source.as_ref(),
        &m.config,
        &biased,
        &routers,
        &out,
        vec![],
        json.clone(),
        mixtral,
        ExpertsFormat::PerExpert,
        Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`router_bias`") && e.contains("layouts that can: moe_studio"), "{e}");
    assert!(!out.exists());
    let routed = dir.path().join("routed");
    write_routed(
        m.source.as_ref(),
        &m.config,
        &biased,
        &routers,
        &routed,
        vec![],
        json,
        LayoutRequest::Auto,
        ExpertsFormat::PerExpert,
        Default::default(),
    )
    .unwrap();
    let r = open_model(&routed).unwrap();
    assert_eq!(r.layout.map(|l| l.name()), Some("moe_studio"), "auto falls back to the studio layout");
    let e = export_moe(
        r.source.as_ref(),
        &r.config,
        r.moe.as_ref().unwrap(),
        mixtral,
        ExpertsFormat::PerExpert,
        &out,
        None,
        None,
        Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`router_bias`"), "{e}");
    assert!(!out.exists());
}

#[test]
fn converting_between_layouts_round_trips_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let qwen2 = open_model(&fixture("tiny-qwen2")).unwrap();
    let a = dir.path().join("a");
    let opts = UpcycleOptions {
        temperature: 0.5,
        noise: CopyNoise { kind: NoiseKind::Additive, std: 0.05 },
        ..tiny_opts(ExpertCounts::PerLayer(vec![Some(4), None]), "auto")
    };
    let report = upcycle(qwen2.source.as_ref(), &qwen2.config, &opts, &a, None, Default::default()).unwrap();
    assert_eq!(report.layout, "qwen2_moe");
    let ma = open_model(&a).unwrap();
    let studio = by_name("studio").unwrap();
    let b = dir.path().join("b");
    export_moe(
        ma.source.as_ref(),
        &ma.config,
        ma.moe.as_ref().unwrap(),
        LayoutRequest::Named(studio),
        ExpertsFormat::PerExpert,
        &b,
        None,
        None,
        Default::default(),
    )
    .unwrap();
    let mb = open_model(&b).unwrap();
    let c = dir.path().join("c");
    export_moe(
        mb.source.as_ref(),
        &mb.config,
        mb.moe.as_ref().unwrap(),
        LayoutRequest::parse("qwen2_moe").unwrap(),
        ExpertsFormat::PerExpert,
        &c,
        None,
        None,
        Default::default(),
    )
    .unwrap();
    let mc = open_model(&c).unwrap();
    assert_eq!(mc.moe, ma.moe);
    for t in ma.source.tensors() {
        let (x, y) = (ma.source.read_f32(&t.name).unwrap(), mc.source.read_f32(&t.name).unwrap());
        assert!(x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()), "{}", t.name);
    }
    let on_disk = moe_shared::tensor_io::safetensors_io::SafetensorsModel::open_dir(&c).unwrap();
    let shared: Vec<String> =
        on_disk.tensors().into_iter().map(|t| t.name).filter(|n| n.contains("shared_expert")).collect();
    assert_eq!(shared.len(), 4, "one zero shared expert in the one MoE layer: {shared:?}");
    let ids = [1, 5, 17, 42, 3, 88];
    assert_eq!(logits_of(&ma, &ids), logits_of(&mb, &ids));
}

#[test]
fn gguf_export_reads_back_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [1, 5, 17, 42, 3, 88, 60, 7];
    for (fixture_name, experts, want_attn_bias) in [("tiny-qwen2", 4, true), ("tiny-mistral", 2, false)] {
        let src = open_model(&fixture(fixture_name)).unwrap();
        let moe_dir = dir.path().join(format!("{fixture_name}-moe"));
        let opts = UpcycleOptions {
            temperature: 0.5,
            noise: CopyNoise { kind: NoiseKind::Multiplicative, std: 0.2 },
            ..tiny_opts(ExpertCounts::Uniform(experts), "auto")
        };
        upcycle(src.source.as_ref(), &src.config, &opts, &moe_dir, None, Default::default()).unwrap();
        let m = open_model(&moe_dir).unwrap();
        let ours = logits_of(&m, &ids);
        // Q8_0: 8-bit weights of a random model with logits of std ~0.9.
        for (dtype, tol) in [(DType::F32, 1e-5f32), (DType::F16, 0.02), (DType::Q8_0, 0.2)] {
            let out = dir.path().join(format!("{fixture_name}-{dtype}.gguf"));
            let r = write_gguf(m.source.as_ref(), &m.config, m.moe.as_ref(), dtype, vec![], &out).unwrap();
            assert!(r.types.contains_key("F32"));
            let g = from_gguf_bytes(Bytes::map_file(&out).unwrap(), &out.display().to_string()).unwrap();
            assert_eq!(g.config.attention_bias, want_attn_bias);
            let gm = g.moe.as_ref().unwrap();
            assert!(gm
                .layers
                .iter()
                .flatten()
                .all(|s| s.num_experts == experts && s.top_k == 2 && s.frozen == vec![0]));
            let diff = max_diff(&logits_of(&g, &ids), &ours);
            eprintln!("{fixture_name} GGUF {dtype}: max |dlogit| vs the safetensors export {diff:.2e}");
            assert!(diff < tol, "{fixture_name} {dtype}: {diff}");
        }
    }
    // a dense layer has no place in llama.cpp's llama MoE: refused, nothing written
    let src = open_model(&fixture("tiny-qwen2")).unwrap();
    let moe_dir = dir.path().join("dense-layer");
    upcycle(
        src.source.as_ref(),
        &src.config,
        &tiny_opts(ExpertCounts::PerLayer(vec![Some(2), None]), "auto"),
        &moe_dir,
        None,
        Default::default(),
    )
    .unwrap();
    let m = open_model(&moe_dir).unwrap();
    let out = dir.path().join("refused.gguf");
    let e = write_gguf(m.source.as_ref(), &m.config, m.moe.as_ref(), DType::F32, vec![], &out).unwrap_err().to_string();
    assert!(e.contains("layer 1 stays dense"), "{e}");
    assert!(!out.exists());
}

/// What only llama.cpp's `deepseek` graph holds — a leading dense layer,
/// ungated shared experts (copies, so they matter), un-normalised top-k,
/// granular experts (one shared expert of width `f` written as two of the
/// expert width `f / 2`), no shared expert (a zero one is written) — goes
/// to the `deepseek` GGUF architecture and reads back to the same
/// configuration and function (f32 exactly, F16/Q8_0 closely); the
/// `deepseek_moe` safetensors layout is refused pointing to it; a model
/// neither architecture holds is refused naming both, and nothing is
/// written.
#[test]
fn gguf_deepseek_export_reads_back_to_the_same_model() {
    use moe_shared::checkpoint::gguf_write::gguf_arch;
    use moe_shared::methods::SharedExperts;
    let dir = tempfile::tempdir().unwrap();
    let ids = [1, 5, 17, 42, 3, 88, 60, 7];
    let cases = [
        ("tiny-qwen2", ExpertCounts::PerLayer(vec![None, Some(4)]), 2, 1, 1, 1),
        ("tiny-mistral", ExpertCounts::Uniform(3), 2, 0, 1, 1),
        ("tiny-mistral", ExpertCounts::Uniform(4), 1, 1, 2, 2),
    ];
    for (i, (fixture_name, experts, top_k, shared, granularity, shexp_count)) in cases.into_iter().enumerate() {
        let src = open_model(&fixture(fixture_name)).unwrap();
        let moe_dir = dir.path().join(format!("{fixture_name}-{i}"));
        let opts = UpcycleOptions {
            top_k,
            temperature: 0.5,
            noise: CopyNoise { kind: NoiseKind::Multiplicative, std: 0.2 },
            shared: if shared == 0 {
                SharedExperts::default()
            } else {
                SharedExperts { count: shared, gate: false, init: SharedInit::Copy, frozen: true }
            },
            granularity,
            norm_topk_prob: false,
            ..tiny_opts(experts, "auto")
        };
        upcycle(src.source.as_ref(), &src.config, &opts, &moe_dir, None, Default::default()).unwrap();
        let m = open_model(&moe_dir).unwrap();
        let moe = m.moe.clone().unwrap();
        assert_eq!(gguf_arch(&m.config, Some(&moe)).unwrap().name(), "deepseek", "{fixture_name} {i}");
        let e = export_moe(
            m.source.as_ref(),
            &m.config,
            &moe,
            LayoutRequest::parse("deepseek_moe").unwrap(),
            ExpertsFormat::PerExpert,
            &dir.path().join("refused"),
            None,
            None,
            Default::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`layout`") && e.contains("convert --to gguf"), "{e}");
        assert!(!dir.path().join("refused").exists());
        let ours = logits_of(&m, &ids);
        // the configuration as written: temperatures folded into the router
        let mut want = moe.clone();
        want.layers.iter_mut().flatten().for_each(|s| s.temperature = 1.0);
        for (dtype, tol) in [(DType::F32, 1e-5f32), (DType::F16, 0.02), (DType::Q8_0, 0.2)] {
            let out = dir.path().join(format!("{fixture_name}-{i}-{dtype}.gguf"));
            let r = write_gguf(m.source.as_ref(), &m.config, Some(&moe), dtype, vec![], &out).unwrap();
            assert_eq!(r.architecture, "deepseek");
            let g = GgufFile::parse(Bytes::map_file(&out).unwrap(), "g").unwrap();
            let u = |k: &str| g.get(k).and_then(|v| v.as_u64()).unwrap_or_else(|| panic!("{k}"));
            assert_eq!(u("deepseek.leading_dense_block_count"), u64::from(fixture_name == "tiny-qwen2"));
            assert_eq!(u("deepseek.expert_shared_count"), shexp_count);
            let width = 48 / granularity as u64;
            assert_eq!((u("deepseek.expert_feed_forward_length"), u("deepseek.feed_forward_length")), (width, 48));
            let down = g.tensor("blk.1.ffn_down_shexp.weight").unwrap();
            assert_eq!(down.ne, vec![width * shexp_count, 32]);
            let back = from_gguf_bytes(Bytes::map_file(&out).unwrap(), &out.display().to_string()).unwrap();
            assert_eq!(back.moe.as_ref(), Some(&want), "{fixture_name} {i} {dtype}");
            assert_eq!(back.config.attention_bias, fixture_name == "tiny-qwen2");
            let diff = max_diff(&logits_of(&back, &ids), &ours);
            eprintln!("{fixture_name} case {i} deepseek GGUF {dtype}: max |dlogit| vs the source {diff:.2e}");
            assert!(diff < tol, "{fixture_name} {i} {dtype}: {diff}");
        }
    }
    // renormalised top-k (k < E) with a dense layer: neither architecture
    let src = open_model(&fixture("tiny-mistral")).unwrap();
    let moe_dir = dir.path().join("neither");
    let opts = tiny_opts(ExpertCounts::PerLayer(vec![None, Some(4)]), "auto");
    upcycle(src.source.as_ref(), &src.config, &opts, &moe_dir, None, Default::default()).unwrap();
    let m = open_model(&moe_dir).unwrap();
    let out = dir.path().join("neither.gguf");
    let e = write_gguf(m.source.as_ref(), &m.config, m.moe.as_ref(), DType::F32, vec![], &out).unwrap_err().to_string();
    assert!(
        e.contains("llama: layer 0 stays dense") && e.contains("deepseek: ") && e.contains("`norm_topk_prob`"),
        "{e}"
    );
    assert!(!out.exists());
}

/// An expert count llama.cpp's backends handle badly is a warning, not a
/// refusal (as mergekit warns): the Mixtral export and the GGUF are written
/// and read back; a power of two gets no warning.
#[test]
fn expert_counts_llama_cpp_handles_badly_are_warned_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = open_model(&fixture("tiny-mistral")).unwrap();
    for (e, warned) in [(3, true), (4, false)] {
        let out = dir.path().join(format!("e{e}"));
        let report = upcycle(
            src.source.as_ref(),
            &src.config,
            &tiny_opts(ExpertCounts::Uniform(e), "mixtral"),
            &out,
            None,
            Default::default(),
        )
        .unwrap();
        let w: Vec<&String> = report.warnings.iter().filter(|w| w.contains("power of two")).collect();
        assert_eq!(w.len(), usize::from(warned), "{e} experts: {:?}", report.warnings);
        if warned {
            assert!(w[0].contains("3 experts") && w[0].contains("llama.cpp") && w[0].contains("mergekit"), "{}", w[0]);
        }
        let m = open_model(&out).unwrap();
        let g = dir.path().join(format!("e{e}.gguf"));
        let r = write_gguf(m.source.as_ref(), &m.config, m.moe.as_ref(), DType::F32, vec![], &g).unwrap();
        assert_eq!(r.warnings.iter().filter(|w| w.contains("power of two")).count(), usize::from(warned));
        let back = from_gguf_bytes(Bytes::map_file(&g).unwrap(), "g").unwrap();
        assert!(back.moe.unwrap().layers.iter().flatten().all(|s| s.num_experts == e));
    }
}

/// The upcycling variants of methods.md §5 (issue 15) through the layout
/// registry: the studio layout holds every one of them and reads back the
/// same configuration, tensors (bit for bit) and logits; a model with one
/// gated shared expert is written by `auto` in Qwen2-MoE with its own
/// shared expert (not the zero stand-in) and reads back the same.
#[test]
fn the_studio_layout_round_trips_shared_experts_gate_selection_bias_granular_and_norm_topk() {
    use moe_shared::methods::SharedExperts;
    use moe_shared::model::{save_model, Mlp};
    let dir = tempfile::tempdir().unwrap();
    let ids = [1, 5, 17, 42, 3, 88, 60, 7];
    let src = open_model(&fixture("tiny-qwen2")).unwrap();
    let up = dir.path().join("up");
    let opts = UpcycleOptions {
        shared: SharedExperts { count: 2, gate: true, init: SharedInit::Copy, frozen: true },
        granularity: 2,
        norm_topk_prob: false,
        ..tiny_opts(ExpertCounts::Uniform(4), "studio")
    };
    let report = upcycle(src.source.as_ref(), &src.config, &opts, &up, None, Default::default()).unwrap();
    assert_eq!(report.layout, "moe_studio");
    let m = open_model(&up).unwrap();
    // A selection bias that moves the choice (DeepSeek-V3 §2.1.2), as
    // `train --balance aux-free` leaves it.
    let mut model = load_model::<B>(&m, &Default::default()).unwrap();
    for block in model.layers.iter_mut() {
        if let Mlp::Moe(layer) = &mut block.mlp {
            let e = layer.num_experts();
            layer.selection_bias = Some((0..e).map(|i| 0.5 * i as f32 - 1.0).collect());
        }
    }
    let want = model.moe_config().unwrap();
    let s0 = want.layers[0].clone().unwrap();
    assert_eq!(
        (s0.shared_experts, s0.shared_expert_gate, s0.shared_frozen, s0.selection_bias, s0.norm_topk_prob),
        (2, true, true, true, false)
    );
    assert_eq!((s0.num_experts, s0.top_k, s0.expert_intermediate_size), (8, 4, Some(24)));
    let v: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
    let input = || Tensor::<B, 2, Int>::from_data(TensorData::new(v.clone(), [1, ids.len()]), &Default::default());
    let before: Vec<f32> = model.forward(input(), None).into_data().to_vec().unwrap();
    let plain = open_model(&up).unwrap();
    assert!(max_diff(&before, &logits_of(&plain, &ids)) > 1e-6, "the selection bias should change the logits");
    let saved = dir.path().join("saved");
    let studio = LayoutRequest::Named(by_name("studio").unwrap());
    save_model(&model, &saved, DType::F32, vec![], serde_json::json!({}), studio).unwrap();
    let back = open_model(&saved).unwrap();
    assert_eq!(back.layout.map(|l| l.name()), Some("moe_studio"));
    assert_eq!(back.moe.as_ref(), Some(&want));
    assert_eq!(back.config, m.config);
    for t in back.source.tensors() {
        let ours = moe_shared::model::save::tensor_values(&model, &t.name).unwrap();
        let read = back.source.read_f32(&t.name).unwrap();
        assert!(ours.iter().zip(&read).all(|(a, b)| a.to_bits() == b.to_bits()), "{}", t.name);
    }
    let names: Vec<String> = back.source.tensors().into_iter().map(|t| t.name).collect();
    for n in [
        "model.layers.1.block_sparse_moe.gate.e_score_correction_bias",
        "model.layers.1.block_sparse_moe.shared_expert_gate.weight",
        "model.layers.1.block_sparse_moe.shared_experts.1.w2.weight",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    assert_eq!(logits_of(&back, &ids), before);
    // Every public layout refuses it, naming a field; `auto` says why.
    for l in ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_moe"] {
        let e = export_moe(
            back.source.as_ref(),
            &back.config,
            &want,
            LayoutRequest::parse(l).unwrap(),
            ExpertsFormat::PerExpert,
            &dir.path().join(l),
            None,
            None,
            Default::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(&format!("the `{l}` layout cannot hold")) && e.contains("layouts that can: moe_studio"),
            "{e}"
        );
        assert!(!dir.path().join(l).exists());
    }

    // One gated shared expert (the model's own, copied) on a llama base:
    // `auto` writes Qwen2-MoE with it, and it reads back the same.
    let llama = open_model(&fixture("tiny-llama3")).unwrap();
    let q = dir.path().join("qwen2moe");
    let opts = UpcycleOptions {
        shared: SharedExperts { count: 1, gate: true, init: SharedInit::Copy, frozen: false },
        ..tiny_opts(ExpertCounts::Uniform(4), "auto")
    };
    let report = upcycle(llama.source.as_ref(), &llama.config, &opts, &q, None, Default::default()).unwrap();
    assert_eq!((report.layout, report.layout_reason.as_deref()), ("qwen2_moe", None));
    let on_disk = moe_shared::tensor_io::safetensors_io::SafetensorsModel::open_dir(&q).unwrap();
    let down = on_disk.read_f32("model.layers.0.mlp.shared_expert.down_proj.weight").unwrap();
    assert_eq!(on_disk.info("model.layers.0.mlp.shared_expert.down_proj.weight").unwrap().shape, vec![32, 48]);
    assert!(down.iter().any(|&x| x != 0.0), "the model's own shared expert, not the zero stand-in");
    let mq = open_model(&q).unwrap();
    assert_eq!(mq.moe.as_ref(), Some(&report.moe));
    let d = max_diff(&logits_of(&mq, &ids), &logits_of(&llama, &ids));
    assert!(d < TOL, "zero-noise upcycle with a copied gated shared expert vs dense: {d}");
}
