//! MoE-LPR stage 2: router-only training on an en (original) + hu replay
//! mix with the language-prior loss sends English tokens to expert 0 — the
//! prior loss drops and expert 0's share of English routing grows.

use crate::train_util;

use burn::backend::Autodiff;
use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::model::{load_model, ForwardOptions, Trace, Transformer};
use moe_shared::train::{Stage, TrainConfig, Trainer};
use moe_shared::CpuBackend;

type A = Autodiff<CpuBackend>;
type B = CpuBackend;

/// Fraction of English routing slots that go to expert 0 (all layers).
fn expert0_share(model: &Transformer<B>, ids: &[u32]) -> f64 {
    let n = ids.len();
    let t = Tensor::<B, 2, Int>::from_data(
        TensorData::new(ids.iter().map(|&x| x as i64).collect::<Vec<_>>(), [1, n]),
        &Default::default(),
    );
    let mut trace = Trace::default();
    model.forward_hidden_with(t, None, ForwardOptions::default(), Some(&mut trace));
    let (mut zero, mut all) = (0, 0);
    for r in trace.routing.iter().flatten() {
        zero += r.counts[0];
        all += r.counts.iter().sum::<usize>();
    }
    zero as f64 / all as f64
}

#[test]
fn language_prior_routes_original_language_to_expert_zero() {
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let moe = train_util::upcycled(&dense, dir.path(), 0.5);
    let device = Default::default();
    let data = train_util::hu_en(&tok, 64, true, 3).unwrap();
    let en_ids =
        tok.encode("Once upon a time, there was a little girl named Lily. She loved to play outside.", true).unwrap();
    let model = load_model::<A>(&moe, &device).unwrap();
    let config = TrainConfig {
        steps: 30,
        seq_len: 64,
        batch_size: 4,
        lr: 3e-2,
        warmup: 0,
        prior: 0.1,
        ..TrainConfig::new(Stage::Router)
    };
    let mut t = Trainer::new(model, data, config, vec![device], "moe").unwrap();
    let share_before = expert0_share(&t.inference_model(), &en_ids);
    let mut priors = Vec::new();
    for _ in 0..30 {
        let m = t.step().unwrap();
        if let Some(p) = m.prior_loss {
            priors.push(p);
        }
    }
    let share_after = expert0_share(&t.inference_model(), &en_ids);
    let head: f64 = priors[..5].iter().sum::<f64>() / 5.0;
    let tail: f64 = priors[priors.len() - 5..].iter().sum::<f64>() / 5.0;
    eprintln!("prior loss {head:.4} -> {tail:.4}; English slots on expert 0: {share_before:.3} -> {share_after:.3}");
    assert!(tail < head * 0.5, "prior loss should drop: {head} -> {tail}");
    assert!(share_after > share_before && share_after >= 0.45, "expert 0 share {share_before} -> {share_after}");
}
