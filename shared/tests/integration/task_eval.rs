//! Multiple-choice task accuracy (`eval::evaluate_task`) against
//! lm-evaluation-harness 0.4.13 (golden `task_eval.json`, written by
//! `tests/reference/make_task_golden.sh`): on the committed hand-written
//! task `tests/reference/tasks/tiny_stories_mc.jsonl`, for
//! - stories260K (a llama2.c vocabulary that prepends BOS) as `convert`
//!   exports it, with the delimiters `" "` and `""`;
//! - its upcycled MoE (4 experts, top-2, random router, noisy copies: the
//!   options of `stories260k_mixtral.json`), exported in the Mixtral layout;
//! - a tiny random llama with SmolLM2's byte-level BPE tokenizer (no BOS),
//!   made by `init-random`.
//!
//! Every item's predictions (`pred`, `pred_norm`, `pred_bytes`), greedy
//! flags and accuracies equal lm-eval's, log-likelihoods agree to 2e-3
//! nats, the means and standard errors to 1e-12; and the numbers do not
//! depend on the batch size.

use crate::common;

use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::config::HfConfig;
use moe_shared::eval::{evaluate_task, McOptions, McReport, McTask};
use moe_shared::methods::{upcycle, CopyNoise, ExpertCounts, NoiseKind, RouterInit, UpcycleOptions};
use moe_shared::model::{load_model, random_dense_model, Transformer};
use moe_shared::tensor_io::{DType, WriteOptions};
use moe_shared::tokenizer::Tokenizer;
use moe_shared::CpuBackend;
use serde_json::Value;

type B = CpuBackend;

const TASK: &str = "tests/reference/tasks/tiny_stories_mc.jsonl";
const TINY_CONFIG: &str = "tests/reference/tasks/tiny_llama_config.json";

fn repo_file(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn task() -> McTask {
    let text = std::fs::read_to_string(repo_file(TASK)).unwrap();
    McTask::parse(&text, TASK).unwrap()
}

fn score(model: &Transformer<B>, tok: &Tokenizer, delimiter: &str, batch: usize) -> McReport {
    let opts = McOptions { target_delimiter: delimiter.into(), batch };
    evaluate_task(model, tok, &task(), &opts, &Default::default(), |_, _| {}).unwrap()
}

/// Compares a report with the golden run `key`; returns the largest |Δll|.
fn assert_matches(key: &str, golden: &Value, got: &McReport) -> f64 {
    let run = &golden["runs"][key];
    assert!(run.is_object(), "the golden file has no run {key}");
    let want = &run["tasks"]["tiny"];
    assert_eq!(run["target_delimiter"].as_str().unwrap(), got.target_delimiter, "{key}");
    assert_eq!(want["items"].as_u64().unwrap() as usize, got.items, "{key}");
    let mut dll = 0f64;
    for (w, g) in want["samples"].as_array().unwrap().iter().zip(&got.samples) {
        let at = format!("{key} item {}", w["doc_id"]);
        for k in ["pred", "pred_norm", "pred_bytes", "gold"] {
            let gv = match k {
                "pred" => g.pred,
                "pred_norm" => g.pred_norm,
                "pred_bytes" => g.pred_bytes,
                _ => g.gold,
            };
            assert_eq!(w[k].as_u64().unwrap() as usize, gv, "{at}: {k}");
        }
        for k in ["acc", "acc_norm", "acc_bytes"] {
            let gv = match k {
                "acc" => g.acc,
                "acc_norm" => g.acc_norm,
                _ => g.acc_bytes,
            };
            assert_eq!(w[k].as_f64().unwrap(), gv, "{at}: {k}");
        }
        let greedy: Vec<bool> = w["greedy"].as_array().unwrap().iter().map(|b| b.as_bool().unwrap()).collect();
        assert_eq!(greedy, g.greedy, "{at}: greedy");
        for (a, b) in w["loglikelihoods"].as_array().unwrap().iter().zip(&g.loglikelihoods) {
            dll = dll.max((a.as_f64().unwrap() - b).abs());
        }
    }
    assert!(dll < 2e-3, "{key}: max |Δ loglikelihood| {dll}");
    for (k, m) in [("acc", got.acc), ("acc_norm", got.acc_norm), ("acc_bytes", got.acc_bytes)] {
        assert!((want[k].as_f64().unwrap() - m.value).abs() < 1e-12, "{key}: {k}");
        let se = want[format!("{k}_stderr")].as_f64().unwrap();
        assert!((se - m.stderr.unwrap()).abs() < 1e-12, "{key}: {k}_stderr");
    }
    eprintln!(
        "{key}: acc {:.4} acc_norm {:.4} acc_bytes {:.4}, max |Δll| vs lm-eval {dll:.2e}",
        got.acc.value, got.acc_norm.value, got.acc_bytes.value
    );
    dll
}

fn stories() -> Option<LoadedModel> {
    let path = common::data_file("models/stories260K/stories260K.bin")?;
    Some(open_model(&path).unwrap())
}

#[test]
fn stories260k_and_its_moe_match_lm_eval() {
    let Some(m) = stories() else { return };
    let Some(golden) = common::golden_json("task_eval.json") else { return };
    let tok = m.tokenizer.clone().unwrap();
    let dense = load_model::<B>(&m, &Default::default()).unwrap();
    let space = score(&dense, &tok, " ", 4);
    assert_matches("dense_space", &golden, &space);
    assert_matches("dense_none", &golden, &score(&dense, &tok, "", 4));
    // Batching changes nothing but float summation order.
    let one = score(&dense, &tok, " ", 1);
    let wide = score(&dense, &tok, " ", 64);
    for (a, b) in one.samples.iter().zip(&wide.samples).chain(one.samples.iter().zip(&space.samples)) {
        assert_eq!((a.pred, a.pred_norm, a.pred_bytes, &a.greedy), (b.pred, b.pred_norm, b.pred_bytes, &b.greedy));
        for (x, y) in a.loglikelihoods.iter().zip(&b.loglikelihoods) {
            assert!((x - y).abs() < 1e-4, "batch 1 vs 64: {x} vs {y}");
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("moe");
    let opts = UpcycleOptions {
        experts: ExpertCounts::Uniform(4),
        top_k: 2,
        router_init: RouterInit::Random { std: 0.5 },
        noise: CopyNoise { kind: NoiseKind::Multiplicative, std: 0.3 },
        seed: 7,
        temperature: 0.5,
        dtype: Some(DType::F32),
        ..Default::default()
    };
    upcycle(m.source.as_ref(), &m.config, &opts, &out, None, WriteOptions::default()).unwrap();
    let moe = load_model::<B>(&open_model(&out).unwrap(), &Default::default()).unwrap();
    let r = score(&moe, &tok, " ", 4);
    assert_matches("moe_space", &golden, &r);
    let moved =
        r.samples.iter().zip(&space.samples).any(|(a, b)| (a.loglikelihoods[0] - b.loglikelihoods[0]).abs() > 0.1);
    assert!(moved, "the noisy experts and the router should change the scores");
}

#[test]
fn a_bpe_tokenizer_without_bos_matches_lm_eval() {
    let Some(tok_path) = common::data_file("models/smollm2-135m-instruct/tokenizer.json") else { return };
    let Some(golden) = common::golden_json("task_eval.json") else { return };
    let tok = Tokenizer::from_hf_json(&std::fs::read(&tok_path).unwrap(), "SmolLM2 tokenizer.json").unwrap();
    assert!(tok.encode("Hello", true).unwrap() == tok.encode("Hello", false).unwrap(), "SmolLM2 adds no BOS");
    let raw = std::fs::read(repo_file(TINY_CONFIG)).unwrap();
    let config = HfConfig::from_json(&raw, TINY_CONFIG).unwrap().to_model_config(TINY_CONFIG).unwrap();
    // As `init-random --config tiny_llama_config.json --std 0.2 --seed 3`.
    let model = random_dense_model::<B>(&config, 0.2, 3, &Default::default()).unwrap();
    assert_matches("tiny_bpe_space", &golden, &score(&model, &tok, " ", 4));
}
