//! Delta grafting (DeltaMoE phase 2, methods.md §1) on real weights:
//! stories260K converted to safetensors (f32 and bf16) is the dense base, a
//! deterministic perturbation of it the "instruct" model, and the MoE is
//! upcycled from the base with `methods::upcycle`.
//!
//! Checked: every output tensor equals `moe + scale * (instruct - base)`
//! computed in f32 (bit for bit in f32; equal to the bf16 rounding of the
//! f32 result in bf16), all experts of a layer receive the same FFN delta,
//! routers are untouched, a zero delta leaves a dense model bit for bit
//! unchanged, and bad inputs fail with clear errors and no output.

use crate::common;

use std::path::{Path, PathBuf};

use moe_shared::checkpoint::export::export_dense;
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::methods::delta::{
    companion_files, delta_origin, graft, plan_graft, DeltaOrigin, GraftOptions, GraftReport,
};
use moe_shared::methods::{upcycle, CopyNoise, ExpertCounts, NoiseKind, RouterInit, UpcycleOptions};
use moe_shared::tensor_io::safetensors_io::SafetensorsModel;
use moe_shared::tensor_io::{DType, PlannedTensor, SafetensorsWriter, TensorSource, WriteOptions};

fn stories() -> Option<LoadedModel> {
    let p = common::data_file("models/stories260K/stories260K.bin")?;
    Some(open_model(&p).unwrap())
}

/// stories260K as a Hugging Face directory in `dtype`.
fn dense_dir(src: &LoadedModel, dir: &Path, dtype: DType) -> PathBuf {
    let out = dir.join(format!("base-{dtype}"));
    export_dense(src.source.as_ref(), &src.config, &out, Some(dtype), None, WriteOptions::default()).unwrap();
    out
}

/// A deterministic, position- and tensor-dependent perturbation.
fn bump(name: &str, i: usize, amp: f32) -> f32 {
    let h = name.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    amp * (((i as f32) * 0.618_034 + (h % 997) as f32).sin())
}

/// Writes a copy of the model in `src_dir` with every tensor transformed by
/// `f(name, index, value)` (and optionally one tensor reshaped), keeping
/// dtypes; config.json is copied.
fn rewrite(
    src_dir: &Path,
    out: &Path,
    f: impl Fn(&str, usize, f32) -> f32,
    reshape: Option<(&str, Vec<usize>)>,
) -> PathBuf {
    let m = SafetensorsModel::open_dir(src_dir).unwrap();
    let infos = m.tensors();
    let plan: Vec<PlannedTensor> = infos
        .iter()
        .map(|t| {
            let shape = match &reshape {
                Some((n, s)) if *n == t.name => s.clone(),
                _ => t.shape.clone(),
            };
            PlannedTensor { name: t.name.clone(), dtype: t.dtype, shape }
        })
        .collect();
    let mut w = SafetensorsWriter::create(out, plan.clone(), WriteOptions::default()).unwrap();
    for p in &plan {
        let v = m.read_f32(&p.name).unwrap();
        let n: usize = p.shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|i| f(&p.name, i, v[i % v.len()])).collect();
        w.write_f32(&p.name, &vals).unwrap();
    }
    w.finish(&[("config.json", std::fs::read(src_dir.join("config.json")).unwrap())]).unwrap();
    out.to_path_buf()
}

fn instruct_of(base: &Path, out: &Path) -> PathBuf {
    rewrite(base, out, |n, i, v| v + bump(n, i, 0.01), None)
}

fn upcycled(base: &Path, out: &Path, experts: ExpertCounts, noise: f64) -> PathBuf {
    let m = open_model(base).unwrap();
    let opts = UpcycleOptions {
        experts,
        router_init: RouterInit::Random { std: 0.02 },
        noise: CopyNoise { kind: NoiseKind::Additive, std: noise },
        seed: 7,
        ..Default::default()
    };
    upcycle(m.source.as_ref(), &m.config, &opts, out, None, WriteOptions::default()).unwrap();
    out.to_path_buf()
}

fn run_graft(target: &Path, base: &Path, instruct: &Path, scale: f64, out: &Path) -> moe_shared::Result<GraftReport> {
    let t = open_model(target)?;
    let b = open_model(base)?;
    let i = open_model(instruct)?;
    let extra = companion_files(target, &t)?;
    graft(
        t.source.as_ref(),
        &t.config,
        t.moe.as_ref(),
        b.source.as_ref(),
        i.source.as_ref(),
        &GraftOptions { scale, ..Default::default() },
        out,
        &extra,
        WriteOptions::default(),
    )
}

fn round(dtype: DType, x: f32) -> u32 {
    match dtype {
        DType::F32 => x.to_bits(),
        DType::BF16 => u32::from(half::bf16::from_f32(x).to_bits()),
        DType::F16 => u32::from(half::f16::from_f32(x).to_bits()),
        _ => unreachable!(),
    }
}

fn stored_bits(m: &SafetensorsModel, name: &str) -> Vec<u32> {
    let (info, raw) = m.raw(name).unwrap();
    match info.dtype {
        DType::F32 => raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        _ => raw.chunks_exact(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))).collect(),
    }
}

/// Checks every tensor of `out` against `moe + scale * (instruct - base)`
/// in f32 rounded once; returns (grafted tensors, router tensors).
fn check_graft(moe: &Path, base: &Path, instruct: &Path, scale: f64, out: &Path) -> (usize, usize) {
    let [m, b, i, o] = [moe, base, instruct, out].map(|p| SafetensorsModel::open_dir(p).unwrap());
    let mut names: Vec<String> = m.tensors().into_iter().map(|t| t.name).collect();
    let mut out_names: Vec<String> = o.tensors().into_iter().map(|t| t.name).collect();
    names.sort();
    out_names.sort();
    assert_eq!(names, out_names, "the output has the target's tensors");
    let s = scale as f32;
    let (mut grafted, mut routers) = (0, 0);
    for name in &names {
        let info = m.info(name).unwrap();
        let oinfo = o.info(name).unwrap();
        assert_eq!((oinfo.dtype, &oinfo.shape), (info.dtype, &info.shape), "{name}: dtype and shape kept");
        let theta = m.read_f32(name).unwrap();
        let got = stored_bits(&o, name);
        match delta_origin(name) {
            DeltaOrigin::Router { .. } => {
                routers += 1;
                assert_eq!(got, stored_bits(&m, name), "{name}: routers get no delta");
            }
            origin => {
                grafted += 1;
                let dname = origin.delta_name().unwrap();
                let (bv, iv) = (b.read_f32(dname).unwrap(), i.read_f32(dname).unwrap());
                for (k, &g) in got.iter().enumerate() {
                    let sd = s * (iv[k] - bv[k]);
                    let want = if sd == 0.0 { theta[k] } else { theta[k] + sd };
                    assert_eq!(g, round(info.dtype, want), "{name}[{k}]: {} + {sd}", theta[k]);
                }
            }
        }
    }
    (grafted, routers)
}

#[test]
fn graft_f32_mixtral_moe_is_exact_and_experts_share_the_layer_delta() {
    let Some(src) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = dense_dir(&src, dir.path(), DType::F32);
    let instruct = instruct_of(&base, &dir.path().join("instruct"));
    // Noisy copies: the experts differ, so the exact check below shows each
    // received the layer's delta (not a copy of expert 0's result).
    let moe = upcycled(&base, &dir.path().join("moe"), ExpertCounts::Uniform(4), 0.01);
    let out = dir.path().join("grafted");
    let report = run_graft(&moe, &base, &instruct, 0.7, &out).unwrap();
    let (grafted, routers) = check_graft(&moe, &base, &instruct, 0.7, &out);
    let c = &src.config;
    assert_eq!(routers, c.num_layers);
    assert_eq!(report.routers, routers);
    assert_eq!(report.grafted, grafted);
    assert_eq!(report.expert_tensors, c.num_layers * 4 * 3);
    // One delta per dense tensor; each FFN delta went to all 4 experts.
    let dense_count = SafetensorsModel::open_dir(&base).unwrap().tensors().len();
    assert_eq!(report.deltas.len(), dense_count);
    for d in &report.deltas {
        let want = if d.name.contains(".mlp.") { 4 } else { 1 };
        assert_eq!(d.applied_to, want, "{}", d.name);
        assert!(d.delta_l2 > 0.0 && d.relative > 0.0 && d.max_abs <= 0.01 + 1e-6, "{d:?}");
    }
    // The config of the target is copied, so the output opens as the same MoE.
    let o = open_model(&out).unwrap();
    assert_eq!(o.moe, open_model(&moe).unwrap().moe);
    assert_eq!(std::fs::read(out.join("config.json")).unwrap(), std::fs::read(moe.join("config.json")).unwrap());
    // Experts of one layer: out_e - in_e is the same delta for every e (up to
    // the f32 rounding of adding it to different values).
    let (m, ob) = (SafetensorsModel::open_dir(&moe).unwrap(), SafetensorsModel::open_dir(&out).unwrap());
    for l in 0..c.num_layers {
        for w in ["w1", "w3", "w2"] {
            // (out_e - in_e, |out_e|) per element.
            let diff = |e: usize| -> Vec<(f32, f32)> {
                let n = format!("model.layers.{l}.block_sparse_moe.experts.{e}.{w}.weight");
                let (a, b) = (ob.read_f32(&n).unwrap(), m.read_f32(&n).unwrap());
                a.iter().zip(&b).map(|(x, y)| (x - y, x.abs())).collect()
            };
            let d0 = diff(0);
            for e in 1..4 {
                for (k, (a, b)) in d0.iter().zip(&diff(e)).enumerate() {
                    let tol = f32::EPSILON * (a.1 + b.1);
                    assert!(
                        (a.0 - b.0).abs() <= tol,
                        "layer {l} {w}[{k}]: expert {e}'s delta {} vs expert 0's {}",
                        b.0,
                        a.0
                    );
                }
            }
        }
    }
}

/// mergekit-moe's Qwen output of Llama experts carries all-zero q/k/v
/// biases (`qkv_bias: true`) that neither the base nor the instruct model
/// has: a missing bias adds zero, so its delta is zero and graft copies it;
/// every other tensor gets its delta as on the Mixtral target.
#[test]
fn a_bias_neither_dense_model_has_is_copied_with_a_zero_delta() {
    let Some(src) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = dense_dir(&src, dir.path(), DType::F32);
    let instruct = instruct_of(&base, &dir.path().join("instruct"));
    let m = open_model(&base).unwrap();
    let opts = UpcycleOptions {
        experts: ExpertCounts::Uniform(2),
        layout: moe_shared::layout::LayoutRequest::parse("qwen2_moe").unwrap(),
        ..Default::default()
    };
    let plain = dir.path().join("qwen2moe");
    upcycle(m.source.as_ref(), &m.config, &opts, &plain, None, WriteOptions::default()).unwrap();
    // The same MoE with zero q/k/v biases, as mergekit-moe writes it.
    let moe = dir.path().join("qwen2moe-bias");
    let t = SafetensorsModel::open_dir(&plain).unwrap();
    let c = &src.config;
    let mut plan: Vec<PlannedTensor> = t
        .tensors()
        .iter()
        .map(|i| PlannedTensor { name: i.name.clone(), dtype: i.dtype, shape: i.shape.clone() })
        .collect();
    let mut biases = Vec::new();
    for l in 0..c.num_layers {
        for (p, n) in [("q", c.num_heads), ("k", c.num_kv_heads), ("v", c.num_kv_heads)] {
            let name = format!("model.layers.{l}.self_attn.{p}_proj.bias");
            plan.push(PlannedTensor { name: name.clone(), dtype: DType::F32, shape: vec![n * c.head_dim] });
            biases.push(name);
        }
    }
    let mut w = SafetensorsWriter::create(&moe, plan.clone(), WriteOptions::default()).unwrap();
    for p in &plan {
        let v = if biases.contains(&p.name) { vec![0.0; p.shape[0]] } else { t.read_f32(&p.name).unwrap() };
        w.write_f32(&p.name, &v).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(plain.join("config.json")).unwrap()).unwrap();
    cfg["qkv_bias"] = true.into();
    w.finish(&[("config.json", serde_json::to_vec(&cfg).unwrap())]).unwrap();
    assert!(open_model(&moe).unwrap().config.attention_bias);

    let out = dir.path().join("grafted");
    let report = run_graft(&moe, &base, &instruct, 1.0, &out).unwrap();
    let (o, before) = (SafetensorsModel::open_dir(&out).unwrap(), SafetensorsModel::open_dir(&moe).unwrap());
    for b in &biases {
        assert_eq!(o.read_f32(b).unwrap(), vec![0.0; before.read_f32(b).unwrap().len()], "{b}");
    }
    assert!(report.deltas.iter().all(|d| !d.name.ends_with(".bias")));
    let q = "model.layers.0.self_attn.q_proj.weight";
    let (ob, bb, ib) = (
        o.read_f32(q).unwrap(),
        before.read_f32(q).unwrap(),
        SafetensorsModel::open_dir(&instruct).unwrap().read_f32(q).unwrap(),
    );
    let bs = SafetensorsModel::open_dir(&base).unwrap().read_f32(q).unwrap();
    assert!(ob.iter().zip(&bb).zip(ib.iter().zip(&bs)).all(|((o, t), (i, b))| (o - (t + (i - b))).abs() <= 1e-6));
}

#[test]
fn graft_bf16_studio_moe_rounds_once_and_dense_layers_get_their_own_delta() {
    let Some(src) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = dense_dir(&src, dir.path(), DType::BF16);
    let instruct = instruct_of(&base, &dir.path().join("instruct"));
    // Layers 1 and 4 stay dense: the studio layout.
    let counts = ExpertCounts::PerLayer(vec![Some(4), None, Some(2), Some(3), None]);
    let moe = upcycled(&base, &dir.path().join("moe"), counts, 0.0);
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(moe.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "moe_studio");
    let out = dir.path().join("grafted");
    let report = run_graft(&moe, &base, &instruct, 1.0, &out).unwrap();
    let (grafted, routers) = check_graft(&moe, &base, &instruct, 1.0, &out);
    assert_eq!(routers, 3);
    assert_eq!(report.expert_tensors, (4 + 2 + 3) * 3);
    assert_eq!(grafted, report.grafted);
    let ob = SafetensorsModel::open_dir(&out).unwrap();
    assert!(ob.info("model.layers.1.mlp.down_proj.weight").is_some(), "dense layer kept");
    assert_eq!(ob.info("model.layers.0.mlp.up_proj.weight"), None);
    // Identical expert copies (no noise) stay identical after the graft.
    for (l, e_count) in [(0usize, 4usize), (2, 2), (3, 3)] {
        for w in ["w1", "w3", "w2"] {
            let first = stored_bits(&ob, &format!("model.layers.{l}.block_sparse_moe.experts.0.{w}.weight"));
            for e in 1..e_count {
                let n = format!("model.layers.{l}.block_sparse_moe.experts.{e}.{w}.weight");
                assert_eq!(stored_bits(&ob, &n), first, "{n}");
            }
        }
    }
}

#[test]
fn zero_delta_leaves_a_dense_model_bit_for_bit_unchanged() {
    let Some(src) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    for dtype in [DType::F32, DType::BF16] {
        let base = dense_dir(&src, dir.path(), dtype);
        for (k, scale) in [1.0, 3.0].into_iter().enumerate() {
            let out = dir.path().join(format!("zero-{dtype}-{k}"));
            let report = run_graft(&base, &base, &base, scale, &out).unwrap();
            assert!(report.deltas.iter().all(|d| d.delta_l2 == 0.0));
            let (a, b) = (SafetensorsModel::open_dir(&base).unwrap(), SafetensorsModel::open_dir(&out).unwrap());
            let names: Vec<String> = a.tensors().into_iter().map(|t| t.name).collect();
            assert_eq!(names.len(), b.tensors().len());
            for n in &names {
                let (ia, ra) = a.raw(n).unwrap();
                let (ib, rb) = b.raw(n).unwrap();
                assert_eq!(ia, ib, "{n}: info");
                assert!(ra == rb, "{n}: bytes changed by a zero delta ({dtype})");
            }
            assert_eq!(
                std::fs::read(out.join("config.json")).unwrap(),
                std::fs::read(base.join("config.json")).unwrap()
            );
        }
    }
}

#[test]
fn dense_target_is_task_arithmetic_on_one_model() {
    let Some(src) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = dense_dir(&src, dir.path(), DType::F32);
    let instruct = instruct_of(&base, &dir.path().join("instruct"));
    // Target: a third model of the same shapes.
    let target = rewrite(&base, &dir.path().join("target"), |n, i, v| v * 1.01 + bump(n, i + 5, 0.003), None);
    let out = dir.path().join("out");
    run_graft(&target, &base, &instruct, -0.5, &out).unwrap();
    let (grafted, routers) = check_graft(&target, &base, &instruct, -0.5, &out);
    assert_eq!((grafted, routers), (SafetensorsModel::open_dir(&base).unwrap().tensors().len(), 0));
}

/// `dir`'s parent holds no leftover temporary directory and `out` does not
/// exist.
fn assert_nothing_written(out: &Path) {
    assert!(!out.exists(), "{} must not exist after an error", out.display());
    let parent = out.parent().unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(parent)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary directories left: {leftovers:?}");
}

#[test]
fn bad_inputs_fail_clearly_and_write_nothing() {
    let Some(src) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = dense_dir(&src, dir.path(), DType::F32);
    let instruct = instruct_of(&base, &dir.path().join("instruct"));
    let moe = upcycled(&base, &dir.path().join("moe"), ExpertCounts::Uniform(2), 0.0);
    let outs = dir.path().join("outs");
    std::fs::create_dir(&outs).unwrap();
    let out = outs.join("out");
    let err = |target: &Path, b: &Path, i: &Path, scale: f64| -> String {
        let e = run_graft(target, b, i, scale, &out).unwrap_err().to_string();
        assert_nothing_written(&out);
        e
    };

    // Different vocabularies: the instruct model's embedding has 500 rows.
    let small_vocab = rewrite(
        &instruct,
        &dir.path().join("small-vocab"),
        |_, _, v| v,
        Some(("model.embed_tokens.weight", vec![500, 64])),
    );
    // (Its config says so too: a checkpoint that disagrees with its own
    // config is refused when it is opened, before any graft.)
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(small_vocab.join("config.json")).unwrap()).unwrap();
    cfg["vocab_size"] = 500.into();
    std::fs::write(small_vocab.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    let e = err(&moe, &base, &small_vocab, 1.0);
    assert!(
        e.contains("different vocabularies")
            && e.contains("512")
            && e.contains("500")
            && e.contains("model.embed_tokens.weight")
            && e.contains(&base.display().to_string())
            && e.contains(&small_vocab.display().to_string()),
        "{e}"
    );

    // Different shapes elsewhere: one attention projection.
    let bad_q = rewrite(
        &instruct,
        &dir.path().join("bad-q"),
        |_, _, v| v,
        Some(("model.layers.2.self_attn.q_proj.weight", vec![32, 64])),
    );
    let e = err(&moe, &base, &bad_q, 1.0);
    assert!(
        e.contains("model.layers.2.self_attn.q_proj.weight") && e.contains("[32, 64]") && e.contains("[64, 64]"),
        "{e}"
    );

    // An MoE whose dense source does not match the delta: the delta pair
    // has a smaller FFN (intermediate 100 instead of 172).
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(base.join("config.json")).unwrap()).unwrap();
    cfg["intermediate_size"] = 100.into();
    let small_ffn = |from: &Path, name: &str| -> PathBuf {
        let m = SafetensorsModel::open_dir(from).unwrap();
        let plan: Vec<PlannedTensor> = m
            .tensors()
            .into_iter()
            .map(|t| {
                let shape = match t.name.rsplit('.').nth(1) {
                    Some("gate_proj" | "up_proj") => vec![100, 64],
                    Some("down_proj") => vec![64, 100],
                    _ => t.shape.clone(),
                };
                PlannedTensor { name: t.name, dtype: t.dtype, shape }
            })
            .collect();
        let out = dir.path().join(name);
        let mut w = SafetensorsWriter::create(&out, plan.clone(), WriteOptions::default()).unwrap();
        for p in &plan {
            let v = m.read_f32(&p.name).unwrap();
            w.write_f32(&p.name, &v[..p.shape.iter().product::<usize>()]).unwrap();
        }
        w.finish(&[("config.json", serde_json::to_vec(&cfg).unwrap())]).unwrap();
        out
    };
    let (sb, si) = (small_ffn(&base, "small-base"), small_ffn(&instruct, "small-instruct"));
    let e = err(&moe, &sb, &si, 1.0);
    assert!(
        e.contains("block_sparse_moe.experts.0.")
            && e.contains("mlp.")
            && e.contains("does not match the delta")
            && e.contains("[100, 64]"),
        "{e}"
    );

    // A delta tensor the target has no place for (an untied LM head).
    let untied = {
        let m = SafetensorsModel::open_dir(&base).unwrap();
        let mut plan: Vec<PlannedTensor> =
            m.tensors().into_iter().map(|t| PlannedTensor { name: t.name, dtype: t.dtype, shape: t.shape }).collect();
        plan.push(PlannedTensor { name: "lm_head.weight".into(), dtype: DType::F32, shape: vec![512, 64] });
        let mk = |name: &str, amp: f32| {
            let out = dir.path().join(name);
            let mut w = SafetensorsWriter::create(&out, plan.clone(), WriteOptions::default()).unwrap();
            for p in &plan {
                let src_name = if p.name == "lm_head.weight" { "model.embed_tokens.weight" } else { &p.name };
                let v: Vec<f32> =
                    m.read_f32(src_name).unwrap().iter().enumerate().map(|(i, x)| x + bump(&p.name, i, amp)).collect();
                w.write_f32(&p.name, &v).unwrap();
            }
            w.finish(&[("config.json", std::fs::read(base.join("config.json")).unwrap())]).unwrap();
            out
        };
        (mk("untied-base", 0.0), mk("untied-instruct", 0.01))
    };
    let e = err(&moe, &untied.0, &untied.1, 1.0);
    assert!(e.contains("lm_head.weight") && e.contains("nowhere to put it"), "{e}");

    // A non-finite scale.
    let e = err(&moe, &base, &instruct, f64::NAN);
    assert!(e.contains("finite"), "{e}");
    // Finite in f64 but not in f32: every zero delta would become NaN.
    let e = err(&moe, &base, &instruct, 1e39);
    assert!(e.contains("finite f32"), "{e}");
    assert_nothing_written(&out);

    // An empty directory as any of the three models.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for (t, b, i) in [(&empty, &base, &instruct), (&moe, &empty, &instruct), (&moe, &base, &empty)] {
        let e = err(t, b, i, 1.0);
        assert!(e.contains("config.json") && e.contains(&empty.display().to_string()), "{e}");
    }
    // A directory with a config but no weights.
    std::fs::write(empty.join("config.json"), std::fs::read(base.join("config.json")).unwrap()).unwrap();
    let e = err(&moe, &base, &empty, 1.0);
    assert!(e.contains("model.safetensors"), "{e}");

    // plan_graft alone: the same checks without any file output.
    let (t, b, i) = (open_model(&moe).unwrap(), open_model(&base).unwrap(), open_model(&small_vocab).unwrap());
    let e = plan_graft(
        t.source.as_ref(),
        &t.config,
        t.moe.as_ref(),
        b.source.as_ref(),
        i.source.as_ref(),
        &GraftOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("different vocabularies"), "{e}");
    assert_eq!(std::fs::read_dir(&outs).unwrap().count(), 0, "no output of any kind");
}
