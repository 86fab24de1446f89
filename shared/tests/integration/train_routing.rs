//! The routing options of training (methods.md "Load balancing",
//! "Un-normalised top-k", "Shared experts") on stories260K: a top-1 router
//! gets a next-token gradient exactly when its weights are not
//! renormalised; aux-loss-free balancing moves and saves the selection
//! bias and logs it with the load; the z-loss is logged and trains; shared
//! experts train unless frozen.

use crate::train_util;

use std::path::Path;

use burn::backend::Autodiff;
use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::layout::names::{selection_bias_name, shared_expert_weight_name, Proj};
use moe_shared::methods::{upcycle, CopyNoise, ExpertCounts, NoiseKind, RouterInit, SharedExperts, UpcycleOptions};
use moe_shared::model::save::tensor_values;
use moe_shared::model::transformer::Mlp;
use moe_shared::model::{load_model, Transformer};
use moe_shared::tensor_io::{DType, WriteOptions};
use moe_shared::train::{next_token_loss, Balance, Stage, TrainConfig, Trainer};
use moe_shared::CpuBackend;

type A = Autodiff<CpuBackend>;

/// stories260K upcycled to 4 noisy copies (so the experts differ), top-`k`.
fn upcycled(dense: &LoadedModel, dir: &Path, k: usize, shared: SharedExperts) -> LoadedModel {
    let out = dir.join(format!("moe-k{k}-s{}", shared.count));
    let opts = UpcycleOptions {
        experts: ExpertCounts::Uniform(4),
        top_k: k,
        router_init: RouterInit::Random { std: 0.5 },
        noise: CopyNoise { kind: NoiseKind::Multiplicative, std: 0.3 },
        shared,
        dtype: Some(DType::F32),
        seed: 2,
        ..Default::default()
    };
    upcycle(dense.source.as_ref(), &dense.config, &opts, &out, None, WriteOptions::default()).unwrap();
    open_model(&out).unwrap()
}

/// L2 norm of the next-token loss's gradient on every router weight.
fn router_grad_norm(model: &Transformer<A>, ids: &[u32]) -> f64 {
    let device = Default::default();
    let n = ids.len() - 1;
    let x: Vec<i64> = ids[..n].iter().map(|&i| i64::from(i)).collect();
    let y: Vec<i64> = ids[1..].iter().map(|&i| i64::from(i)).collect();
    let x = Tensor::<A, 2, Int>::from_data(TensorData::new(x, [1, n]), &device);
    let y = Tensor::<A, 2, Int>::from_data(TensorData::new(y, [1, n]), &device);
    let grads = next_token_loss(model.forward(x, None), y).backward();
    let mut sq = 0.0;
    for b in &model.layers {
        if let Mlp::Moe(m) = &b.mlp {
            let g: Vec<f32> = m.gate.weight.grad(&grads).map(|g| g.into_data().to_vec().unwrap()).unwrap_or_default();
            sq += g.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>();
        }
    }
    sq.sqrt()
}

#[test]
fn top1_router_gets_a_next_token_gradient_only_unnormalised() {
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let ids = tok.encode("Once upon a time, there was a little girl named Lily. She loved to play.", true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let moe = upcycled(&dense, dir.path(), 1, SharedExperts::default());
    let device = Default::default();
    let mut model = load_model::<A>(&moe, &device).unwrap();
    let renormalised = router_grad_norm(&model, &ids);
    for b in model.layers.iter_mut() {
        if let Mlp::Moe(m) = &mut b.mlp {
            m.norm_topk_prob = false;
        }
    }
    let unnormalised = router_grad_norm(&model, &ids);
    eprintln!(
        "top-1 router |grad of next-token loss|: renormalised {renormalised:e}, softmax over all {unnormalised:e}"
    );
    assert_eq!(renormalised, 0.0, "one renormalised weight is always 1");
    assert!(unnormalised > 1e-3, "{unnormalised}");

    // Through the trainer: --stage router --alpha 0 is refused with
    // renormalised top-1 and trains with --norm-topk false.
    let c = TrainConfig {
        steps: 2,
        seq_len: 32,
        batch_size: 2,
        alpha: 0.0,
        lr: 1e-2,
        warmup: 0,
        ..TrainConfig::new(Stage::Router)
    };
    let data = || train_util::hu_en(&tok, 32, false, 0).unwrap();
    let e = Trainer::new(load_model::<A>(&moe, &device).unwrap(), data(), c.clone(), vec![device], "top1")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no gradient") && e.contains("--norm-topk false"), "{e}");
    let c = TrainConfig { norm_topk: Some(false), ..c };
    let mut t = Trainer::new(load_model::<A>(&moe, &device).unwrap(), data(), c, vec![device], "top1").unwrap();
    let name = "model.layers.2.block_sparse_moe.gate.weight";
    let before = tensor_values(t.model(), name).unwrap();
    t.step().unwrap();
    assert_ne!(tensor_values(t.model(), name).unwrap(), before, "the router moved on the next-token loss alone");
    assert!(!t.model().moe_config().unwrap().layers[0].as_ref().unwrap().norm_topk_prob);
}

#[test]
fn aux_free_balancing_moves_logs_and_saves_the_selection_bias() {
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let moe = upcycled(&dense, dir.path(), 2, SharedExperts::default());
    let device = Default::default();
    let c = TrainConfig {
        steps: 3,
        seq_len: 32,
        batch_size: 2,
        lr: 1e-3,
        warmup: 0,
        balance: Balance::AuxFree,
        bias_update_rate: 0.01,
        z_loss: 1e-3,
        ..TrainConfig::new(Stage::Experts)
    };
    let data = train_util::hu_en(&tok, 32, false, 0).unwrap();
    let mut t = Trainer::new(load_model::<A>(&moe, &device).unwrap(), data, c.clone(), vec![device], "moe").unwrap();
    assert!(t.warnings().iter().any(|w| w.contains("studio layout")), "{:?}", t.warnings());
    let mut last = None;
    for _ in 0..3 {
        let m = t.step().unwrap();
        let z = m.z_loss.unwrap();
        let lb = m.lb_loss.unwrap();
        // The loss has the z term and no load-balancing term.
        assert!((m.loss - (m.ce_loss + 1e-3 * z)).abs() < 1e-9, "{} vs {} + {z}", m.loss, m.ce_loss);
        assert!(lb > 0.0, "the load-balancing value is still logged");
        assert_eq!(m.selection_bias.len(), 5);
        let bias = m.selection_bias[1].clone().unwrap();
        // Each step moves every unbalanced expert by exactly +-0.01.
        let load = m.expert_load[1].clone().unwrap();
        let prev = last.clone().unwrap_or(vec![0.0; 4]);
        for e in 0..4 {
            let step = bias[e] - prev[e];
            let want = if load[e] > 0.25 {
                -0.01
            } else if load[e] < 0.25 {
                0.01
            } else {
                0.0
            };
            assert!((step - want).abs() < 1e-6, "expert {e}: load {} bias {} -> {}", load[e], prev[e], bias[e]);
        }
        last = Some(bias);
        let line = serde_json::to_value(&m).unwrap();
        assert!(line["selection_bias"][1].is_array() && line["z_loss"].is_number(), "{line}");
    }
    // The checkpoint holds the bias (studio layout) and loads it back.
    let out = dir.path().join("ckpt");
    t.save_checkpoint(&out).unwrap();
    let saved = open_model(&out).unwrap();
    let spec = saved.moe.as_ref().unwrap().layers[1].clone().unwrap();
    assert!(spec.selection_bias);
    let got = saved.source.read_f32(&selection_bias_name(1)).unwrap();
    let want: Vec<f32> = last.unwrap().iter().map(|&x| x as f32).collect();
    assert_eq!(got, want);
    let reloaded = load_model::<A>(&saved, &device).unwrap();
    let Mlp::Moe(m) = &reloaded.layers[1].mlp else { panic!("MoE layer") };
    assert_eq!(m.selection_bias.as_deref(), Some(want.as_slice()));
}

#[test]
fn shared_experts_train_unless_frozen() {
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    for frozen in [false, true] {
        let shared = SharedExperts { count: 1, gate: true, frozen, ..Default::default() };
        let moe = upcycled(&dense, &dir.path().join(frozen.to_string()), 2, shared);
        let c = TrainConfig {
            steps: 2,
            seq_len: 32,
            batch_size: 2,
            lr: 1e-2,
            warmup: 0,
            ..TrainConfig::new(Stage::Experts)
        };
        let data = train_util::hu_en(&tok, 32, false, 0).unwrap();
        let mut t = Trainer::new(load_model::<A>(&moe, &device).unwrap(), data, c, vec![device], "moe").unwrap();
        let names = [
            shared_expert_weight_name(0, 0, Proj::Gate),
            shared_expert_weight_name(0, 0, Proj::Down),
            "model.layers.0.block_sparse_moe.shared_expert_gate.weight".to_string(),
        ];
        let before: Vec<Vec<f32>> = names.iter().map(|n| tensor_values(t.model(), n).unwrap()).collect();
        t.step().unwrap();
        t.step().unwrap();
        for (n, b) in names.iter().zip(&before) {
            let moved = tensor_values(t.model(), n).unwrap() != *b;
            assert_eq!(moved, !frozen, "{n} (shared_frozen {frozen})");
        }
    }
}
