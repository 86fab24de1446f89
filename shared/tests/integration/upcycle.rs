//! Sparse upcycling on real weights (methods.md §1): the upcycled model
//! computes the dense function for any router (zeros, random, hidden) and
//! any per-layer expert counts; the Mixtral export matches transformers'
//! `MixtralForCausalLM` (golden logits); bad options fail before any output
//! exists.

use crate::common;

use std::path::Path;

use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::methods::{
    hidden_router_rows, upcycle, AllocationFile, CopyNoise, ExpertCounts, ExpertPrompts, NoiseKind, RouterInit,
    UpcycleOptions,
};
use moe_shared::model::load_model;
use moe_shared::tensor_io::{DType, WriteOptions};
use moe_shared::CpuBackend;

type B = CpuBackend;

const SENTENCE: &str = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";

fn logits(m: &LoadedModel, ids: &[u32]) -> Vec<f32> {
    let device = Default::default();
    let model = load_model::<B>(m, &device).unwrap();
    let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    let n = ids.len();
    let t = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, n]), &device);
    model.forward(t, None).into_data().to_vec().unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn f32_opts(experts: ExpertCounts, router_init: RouterInit) -> UpcycleOptions {
    UpcycleOptions { experts, router_init, dtype: Some(DType::F32), seed: 11, ..Default::default() }
}

/// Upcycles `dense` into `out` and returns the max |logit difference| to
/// the dense model on `ids`, plus the layout written.
fn upcycled_diff(
    dense: &LoadedModel,
    dense_logits: &[f32],
    ids: &[u32],
    opts: &UpcycleOptions,
    out: &Path,
) -> (f32, &'static str) {
    let report = upcycle(dense.source.as_ref(), &dense.config, opts, out, None, WriteOptions::default()).unwrap();
    let moe = open_model(out).unwrap();
    let spec = moe.moe.as_ref().expect("an MoE config was written");
    let want: Vec<usize> = report.experts_per_layer.clone();
    let got: Vec<usize> = spec.layers.iter().map(|s| s.as_ref().map_or(0, |s| s.num_experts)).collect();
    assert_eq!(got, want);
    let diff = max_abs_diff(&logits(&moe, ids), dense_logits);
    drop(moe);
    std::fs::remove_dir_all(out).unwrap();
    (diff, report.layout)
}

fn stories() -> Option<LoadedModel> {
    let path = common::data_file("models/stories260K/stories260K.bin")?;
    Some(open_model(&path).unwrap())
}

#[test]
fn upcycled_stories260k_computes_the_dense_function() {
    let Some(m) = stories() else { return };
    let ids = m.tokenizer.as_ref().unwrap().encode(SENTENCE, true).unwrap();
    let dense = logits(&m, &ids);
    let dir = tempfile::tempdir().unwrap();
    let per_layer = ExpertCounts::PerLayer(vec![Some(2), Some(4), Some(3), None, Some(2)]);
    for (experts, layout) in [(ExpertCounts::Uniform(4), "mixtral"), (per_layer, "moe_studio")] {
        for init in [RouterInit::Zeros, RouterInit::Random { std: 0.5 }] {
            let opts = f32_opts(experts.clone(), init.clone());
            let (diff, got_layout) = upcycled_diff(&m, &dense, &ids, &opts, &dir.path().join("moe"));
            eprintln!("stories260K {experts:?} {}: max |dlogit| = {diff:e}", init.kind());
            assert_eq!(got_layout, layout);
            assert!(diff < 1e-4, "{experts:?} {init:?}: max diff {diff}");
        }
    }
}

#[test]
fn hidden_router_keeps_the_invariant_and_separates_prompts() {
    let Some(m) = stories() else { return };
    let tok = m.tokenizer.as_ref().unwrap();
    let enc = |t: &str| tok.encode(t, true).unwrap();
    let experts = vec![
        ExpertPrompts { positive: vec![enc("The dog ran in the park."), enc("The cat sat.")], negative: vec![] },
        ExpertPrompts { positive: vec![enc("Mom baked a big cake.")], negative: vec![enc("The dog ran.")] },
        ExpertPrompts { positive: vec![enc("The sun was hot and bright.")], negative: vec![] },
        ExpertPrompts { positive: vec![enc("Lily was sad and cried.")], negative: vec![] },
    ];
    let device = Default::default();
    let model = load_model::<B>(&m, &device).unwrap();
    let rows = hidden_router_rows(&model, &experts, &device).unwrap();
    assert_eq!((rows.len(), rows[0].len(), rows[0][0].len()), (5, 4, 64));
    assert_ne!(rows[2][0], rows[2][1]);
    let ids = enc(SENTENCE);
    let dense = logits(&m, &ids);
    let dir = tempfile::tempdir().unwrap();
    let opts = f32_opts(ExpertCounts::Uniform(4), RouterInit::Hidden { rows });
    let out = dir.path().join("moe");
    let report = upcycle(m.source.as_ref(), &m.config, &opts, &out, None, WriteOptions::default()).unwrap();
    assert_eq!(report.router_init, "hidden");
    // Rows are unit vectors.
    let st = open_model(&out).unwrap();
    let w = st.source.read_f32("model.layers.3.block_sparse_moe.gate.weight").unwrap();
    for row in w.chunks(64) {
        let n: f32 = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-5, "row norm {n}");
    }
    let diff = max_abs_diff(&logits(&st, &ids), &dense);
    eprintln!("stories260K hidden router: max |dlogit| = {diff:e}");
    assert!(diff < 1e-4, "max diff {diff}");
}

#[test]
fn upcycled_smollm2_computes_the_dense_function() {
    let Some(path) = common::smollm2_gguf() else { return };
    let m = open_model(&path).unwrap();
    let ids = m.tokenizer.as_ref().unwrap().encode(SENTENCE, false).unwrap();
    let dense = logits(&m, &ids);
    let dir = tempfile::tempdir().unwrap();
    // NeuronMoE's published Llama-3.2-3B allocation (28 layers of new
    // experts), led by two 1s to cover SmolLM2's 30 layers.
    let alloc = br#"{"new_experts_per_layer": [1,1, 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,2,1,1,1,1,6,1,4,2,2,4,3],
                     "method": "neuronmoe"}"#;
    let per_layer = AllocationFile::parse(alloc, "neuronmoe.json").unwrap();
    for (experts, init) in [
        (ExpertCounts::Uniform(4), RouterInit::Zeros),
        (ExpertCounts::Uniform(4), RouterInit::Random { std: 0.5 }),
        (per_layer.clone(), RouterInit::Zeros),
        (per_layer, RouterInit::Random { std: 0.5 }),
    ] {
        let opts = f32_opts(experts.clone(), init.clone());
        let (diff, layout) = upcycled_diff(&m, &dense, &ids, &opts, &dir.path().join("moe"));
        eprintln!("SmolLM2 {:?} {}: max |dlogit| = {diff:e} ({layout:?})", experts, init.kind());
        assert!(diff < 1e-4, "{experts:?} {init:?}: max diff {diff}");
    }
}

/// The options of `tests/reference/make_mixtral_golden.py`'s CLI run.
fn golden_opts() -> UpcycleOptions {
    UpcycleOptions {
        experts: ExpertCounts::Uniform(4),
        top_k: 2,
        router_init: RouterInit::Random { std: 0.5 },
        noise: CopyNoise { kind: NoiseKind::Multiplicative, std: 0.3 },
        seed: 7,
        temperature: 0.5,
        dtype: Some(DType::F32),
        ..Default::default()
    }
}

#[test]
fn mixtral_export_matches_transformers() {
    let Some(m) = stories() else { return };
    let Some(golden) = common::golden_json("stories260k_mixtral.json") else { return };
    let cli = golden["cli_args"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect::<Vec<_>>().join(" ");
    assert_eq!(
        cli,
        "--experts 4 --top-k 2 --router-init random --router-std 0.5 --noise 0.3 --noise-kind mul --seed 7 \
         --temperature 0.5 --dtype f32",
        "the golden file was made with other options than golden_opts()"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mixtral");
    let report = upcycle(m.source.as_ref(), &m.config, &golden_opts(), &out, None, WriteOptions::default()).unwrap();
    assert_eq!(report.layout, "mixtral");
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "mixtral");
    let moe = open_model(&out).unwrap();
    assert_eq!(moe.moe.as_ref().unwrap().layers[0].as_ref().unwrap().temperature, 1.0, "T folded into the gate");
    let ids: Vec<u32> = golden["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let want: Vec<f32> = golden["logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    let ours = logits(&moe, &ids);
    let diff = max_abs_diff(&ours, &want);
    let dense_diff = max_abs_diff(&logits(&m, &ids), &want);
    eprintln!("Mixtral export vs transformers: max |dlogit| = {diff:e} (dense model vs golden: {dense_diff:.3})");
    assert!(diff < 1e-4, "max diff {diff}");
    assert!(dense_diff > 1e-2, "noise and routing should change the function (dense diff {dense_diff})");
}

fn assert_fails_cleanly(m: &LoadedModel, opts: &UpcycleOptions, expect: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("moe");
    let e = upcycle(m.source.as_ref(), &m.config, opts, &out, None, WriteOptions::default()).unwrap_err().to_string();
    for x in expect {
        assert!(e.contains(x), "`{x}` not in: {e}");
    }
    assert!(!out.exists(), "no output directory after: {e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left beside it after: {e}");
}

#[test]
fn bad_options_fail_before_any_output() {
    let Some(m) = stories() else { return };
    let per_layer = |v: Vec<Option<usize>>, src: &str| UpcycleOptions {
        experts: ExpertCounts::PerLayer(v),
        experts_source: src.into(),
        ..Default::default()
    };
    assert_fails_cleanly(&m, &per_layer(vec![Some(2); 3], "alloc.json"), &["alloc.json", "3 layers", "has 5"]);
    assert_fails_cleanly(&m, &UpcycleOptions { top_k: 5, ..Default::default() }, &["top-k 5", "expert count 4"]);
    assert_fails_cleanly(
        &m,
        &per_layer(vec![Some(2), Some(0), Some(2), Some(2), Some(2)], "alloc.json"),
        &["alloc.json", "layer 1", "at least 1 expert"],
    );
    assert_fails_cleanly(
        &m,
        &UpcycleOptions { experts: ExpertCounts::Uniform(0), ..Default::default() },
        &["at least 1"],
    );
    assert_fails_cleanly(&m, &per_layer(vec![None; 5], "alloc.json"), &["nothing to upcycle"]);
    assert_fails_cleanly(&m, &UpcycleOptions { frozen: vec![4], ..Default::default() }, &["frozen expert 4"]);
    assert_fails_cleanly(&m, &UpcycleOptions { temperature: 0.0, ..Default::default() }, &["temperature"]);
    let hidden = RouterInit::Hidden { rows: vec![vec![vec![0.0; 64]; 2]; 5] };
    assert_fails_cleanly(
        &m,
        &UpcycleOptions { router_init: hidden, ..Default::default() },
        &["prompts were given for only 2"],
    );
    let e = AllocationFile::parse(br#"{"experts_per_layer": [2, 0, 2, 2, 2]}"#, "a.json").unwrap_err().to_string();
    assert!(e.contains("a.json") && e.contains("experts_per_layer[1] is 0"), "{e}");
}

#[test]
fn existing_output_is_never_overwritten() {
    let Some(m) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mine.txt"), b"keep").unwrap();
    let e =
        upcycle(m.source.as_ref(), &m.config, &UpcycleOptions::default(), dir.path(), None, WriteOptions::default())
            .unwrap_err()
            .to_string();
    assert!(e.contains("not empty"), "{e}");
    assert_eq!(std::fs::read(dir.path().join("mine.txt")).unwrap(), b"keep");
}
