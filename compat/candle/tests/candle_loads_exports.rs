//! candle-transformers (an independent Rust implementation of the Hugging
//! Face models) loads moe-studio's MoE exports and computes the studio's
//! logits: `mixtral::Model` on a Mixtral export, `qwen2_moe::Model` on a
//! Qwen2-MoE export (the zero shared expert included), both upcycled with a
//! random router, noise and a folded temperature so that routing matters.
//!
//! candle's configs differ from transformers' in ways the test works
//! around and reports (`docs/compatibility.md`): its `mixtral::Config`
//! needs `use_flash_attn` and a numeric `sliding_window`; both models read
//! `lm_head.weight` (no tied embeddings), use `head_dim = hidden / heads`
//! and the default RoPE, and candle's `qwen2_moe` has no `mlp_only_layers`
//! and always reads q/k/v biases. The fixtures are chosen inside those
//! limits: a tied base is untied exactly (`lm_head = embed_tokens`) first.
//!
//! Each candle forward returns the last position's logits; every position
//! is checked by feeding the prompt token by token through candle's KV
//! cache. With `MOE_STUDIO_COMPAT_OUT=FILE` a JSON line per case is
//! appended for the compatibility matrix.

use std::path::{Path, PathBuf};

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor as BTensor, TensorData};
use candle_core::{DType as CDType, Device, Tensor};
use candle_nn::VarBuilder;
use moe_shared::checkpoint::open_model;
use moe_shared::tensor_io::{DType, PlannedTensor, SafetensorsWriter};
use moe_shared::layout::LayoutRequest;
use moe_shared::methods::{upcycle, CopyNoise, ExpertCounts, NoiseKind, RouterInit, UpcycleOptions};

type B = NdArray<f32>;

const IDS: [u32; 10] = [1, 5, 17, 42, 3, 88, 60, 7, 19, 2];

fn fixture(name: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(name)
}

/// `src` (a dense directory) with tied embeddings written untied:
/// `lm_head.weight = model.embed_tokens.weight` (the same function).
fn untied(src: &Path, out: &Path) {
    let m = open_model(src).unwrap();
    let mut plan: Vec<PlannedTensor> = m
        .source
        .tensors()
        .into_iter()
        .map(|t| PlannedTensor { name: t.name, dtype: DType::F32, shape: t.shape })
        .collect();
    let emb = plan.iter().find(|p| p.name == "model.embed_tokens.weight").unwrap().clone();
    plan.push(PlannedTensor { name: "lm_head.weight".into(), ..emb });
    let mut w = SafetensorsWriter::create(out, plan.clone(), Default::default()).unwrap();
    for p in &plan {
        let from = if p.name == "lm_head.weight" { "model.embed_tokens.weight" } else { &p.name };
        w.write_f32(&p.name, &m.source.read_f32(from).unwrap()).unwrap();
    }
    let mut cfg = m.config.clone();
    cfg.tie_word_embeddings = false;
    w.finish(&[("config.json", serde_json::to_vec(&cfg.to_config_json(None)).unwrap())]).unwrap();
}

fn moe_of(dense: &Path, out: &Path, layout: &str) {
    let m = open_model(dense).unwrap();
    let opts = UpcycleOptions {
        experts: ExpertCounts::Uniform(4),
        top_k: 2,
        router_init: RouterInit::Random { std: 0.5 },
        noise: CopyNoise { kind: NoiseKind::Multiplicative, std: 0.3 },
        seed: 7,
        temperature: 0.5,
        dtype: Some(DType::F32),
        layout: LayoutRequest::parse(layout).unwrap(),
        ..Default::default()
    };
    upcycle(m.source.as_ref(), &m.config, &opts, out, None, Default::default()).unwrap();
}

/// The studio's logits `[len, V]` on `dir`.
fn ours(dir: &Path) -> Vec<Vec<f32>> {
    let m = open_model(dir).unwrap();
    let model = moe_shared::model::load_model::<B>(&m, &Default::default()).unwrap();
    let v: Vec<i64> = IDS.iter().map(|&x| x as i64).collect();
    let t = BTensor::<B, 2, Int>::from_data(TensorData::new(v, [1, IDS.len()]), &Default::default());
    let flat: Vec<f32> = model.forward(t, None).into_data().to_vec().unwrap();
    flat.chunks(m.config.vocab_size).map(<[f32]>::to_vec).collect()
}

/// candle's `config.json`: the export's, plus the fields candle requires.
fn candle_config(dir: &Path) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let max = v["max_position_embeddings"].clone();
    v["sliding_window"] = max;
    v["use_flash_attn"] = false.into();
    v["max_window_layers"] = v["num_hidden_layers"].clone();
    v["use_sliding_window"] = false.into();
    v
}

fn vb(dir: &Path) -> VarBuilder<'static> {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    unsafe { VarBuilder::from_mmaped_safetensors(&files, CDType::F32, &Device::Cpu).unwrap() }
}

/// Logits of every position through `step(token, offset)` (candle's KV cache).
fn candle_logits(mut step: impl FnMut(&Tensor, usize) -> candle_core::Result<Tensor>) -> Vec<Vec<f32>> {
    IDS.iter()
        .enumerate()
        .map(|(i, &id)| {
            let input = Tensor::new(&[id], &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            let out = step(&input, i).unwrap();
            out.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        })
        .collect()
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0f32, f32::max)
}

fn record(layout: &str, case: &str, diff: f32) {
    if let Some(p) = std::env::var_os("MOE_STUDIO_COMPAT_OUT") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(p).unwrap();
        let row = serde_json::json!({"layout": layout, "loader": "candle", "case": case, "loads": true,
            "max_abs_diff": diff, "class": format!("candle-transformers 0.11.1 {layout}")});
        writeln!(f, "{row}").unwrap();
    }
}

#[test]
fn candle_mixtral_loads_the_mixtral_export_with_the_studios_logits() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mixtral");
    moe_of(&fixture("tiny-mistral"), &out, "mixtral");
    let cfg: candle_transformers::models::mixtral::Config = serde_json::from_value(candle_config(&out)).unwrap();
    let mut model = candle_transformers::models::mixtral::Model::new(&cfg, vb(&out)).unwrap();
    let theirs = candle_logits(|x, off| model.forward(x, off));
    let diff = max_diff(&theirs, &ours(&out));
    eprintln!("candle mixtral vs moe-studio: max |dlogit| = {diff:.2e}");
    record("mixtral", "tiny-mistral 4x top-2", diff);
    assert!(diff < 1e-4, "{diff}");
}

#[test]
fn candle_qwen2_moe_loads_the_qwen2_moe_export_with_the_studios_logits() {
    let dir = tempfile::tempdir().unwrap();
    let dense = dir.path().join("untied");
    untied(&fixture("tiny-qwen2"), &dense);
    let out = dir.path().join("qwen2_moe");
    moe_of(&dense, &out, "qwen2_moe");
    let cfg: candle_transformers::models::qwen2_moe::Config = serde_json::from_value(candle_config(&out)).unwrap();
    let mut model = candle_transformers::models::qwen2_moe::Model::new(&cfg, vb(&out)).unwrap();
    let theirs = candle_logits(|x, off| model.forward(x, off));
    let diff = max_diff(&theirs, &ours(&out));
    eprintln!("candle qwen2_moe vs moe-studio: max |dlogit| = {diff:.2e}");
    record("qwen2_moe", "tiny-qwen2 (untied) 4x top-2", diff);
    assert!(diff < 1e-4, "{diff}");
}
