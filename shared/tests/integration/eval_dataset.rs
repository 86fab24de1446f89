//! `eval::evaluate`: the same perplexity as `eval::perplexity` (same
//! windows), plus per-layer routing load for MoE models under learned,
//! forced (oracle) and random routing.

use crate::common;
use crate::train_util;

use moe_shared::eval::{evaluate, perplexity, randomize_routers, PerplexityOptions};
use moe_shared::model::{load_model, Routing};
use moe_shared::CpuBackend;

type B = CpuBackend;

#[test]
fn evaluate_matches_perplexity_and_reports_load() {
    let Some(dense) = train_util::stories() else { return };
    let Some(path) = common::data_file("corpora/lang/en/valid.txt") else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let text: String = std::fs::read_to_string(path).unwrap().lines().take(40).collect::<Vec<_>>().join("\n");
    let ids = tok.encode(&text, true).unwrap();
    let opts = PerplexityOptions { window: 128, stride: 64, max_tokens: Some(500), ..Default::default() };
    let device = Default::default();
    let model = load_model::<B>(&dense, &device).unwrap();
    let want = perplexity(&model, &ids, opts, &device, |_, _| {}).unwrap();
    let got = evaluate(&model, &ids, opts, Routing::Learned, &device, |_, _| {}).unwrap();
    assert_eq!(got.report, want);
    assert!(got.load.iter().all(|l| l.is_none()) && got.mean_load().is_none());

    let dir = tempfile::tempdir().unwrap();
    let moe = train_util::upcycled(&dense, dir.path(), 0.5);
    let model = load_model::<B>(&moe, &device).unwrap();
    let learned = evaluate(&model, &ids, opts, Routing::Learned, &device, |_, _| {}).unwrap();
    // Identical expert copies: the MoE computes the dense function.
    assert!((learned.report.nll - want.nll).abs() < 1e-4, "{} vs {}", learned.report.nll, want.nll);
    for l in learned.load.iter() {
        let l = l.as_ref().unwrap();
        assert!((l.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }
    let oracle = evaluate(&model, &ids, opts, Routing::Forced(2), &device, |_, _| {}).unwrap();
    assert_eq!(oracle.mean_load().unwrap(), vec![0.0, 0.0, 1.0, 0.0]);
    let random = evaluate(&randomize_routers(model, 9), &ids, opts, Routing::Learned, &device, |_, _| {}).unwrap();
    assert_ne!(random.load, learned.load);
    assert!((random.report.nll - want.nll).abs() < 1e-4);
}
