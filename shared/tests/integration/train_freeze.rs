//! Stage freezing (methods.md §1-2) on stories260K upcycled to 4 experts
//! (top-2): after a few steps of stage `experts`, expert 0, attention,
//! embeddings and norms are bit-identical and the routers and new experts
//! changed; stage `router` changes only the routers; stage `ffn` on the
//! dense model changes only its FFNs; stages that do not fit the model are
//! refused.

use crate::train_util;

use burn::backend::Autodiff;
use moe_shared::model::save::tensor_values;
use moe_shared::model::{load_model, Transformer};
use moe_shared::train::{apply_stage, Stage, TrainConfig, Trainer};
use moe_shared::CpuBackend;

type A = Autodiff<CpuBackend>;

fn names(model: &Transformer<A>) -> Vec<String> {
    moe_shared::model::save::tensor_plan(model).0.into_iter().map(|(n, _)| n).collect()
}

fn snapshot(model: &Transformer<A>) -> Vec<(String, Vec<f32>)> {
    names(model).into_iter().map(|n| (n.clone(), tensor_values(model, &n).unwrap())).collect()
}

fn trainable_in(stage: Stage, name: &str) -> bool {
    let router = name.ends_with("block_sparse_moe.gate.weight");
    let new_expert = name.contains(".experts.") && !name.contains(".experts.0.");
    match stage {
        Stage::Experts => router || new_expert,
        Stage::Router => router,
        Stage::Dense => true,
        Stage::Ffn => name.contains(".mlp."),
    }
}

fn train_and_compare(stage: Stage) {
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let moe = train_util::upcycled(&dense, dir.path(), 0.5);
    let device = Default::default();
    let model = load_model::<A>(&moe, &device).unwrap();
    let before = snapshot(&model);
    let data = train_util::hu_en(&tok, 64, true, 1).unwrap();
    let config = TrainConfig { steps: 3, seq_len: 64, batch_size: 4, lr: 1e-2, warmup: 0, ..TrainConfig::new(stage) };
    let mut t = Trainer::new(model, data, config, vec![device], "stories260K-moe").unwrap();
    let counts = t.param_counts();
    eprintln!("{stage:?}: {counts:?}");
    for _ in 0..3 {
        let m = t.step().unwrap();
        eprintln!("step {} loss {:.4} lb {:?} load {:?}", m.step, m.loss, m.lb_loss, m.expert_load[0]);
    }
    let after = snapshot(t.model());
    let (mut frozen, mut changed, mut trainable) = (0, 0, 0);
    for ((name, a), (_, b)) in before.iter().zip(&after) {
        if trainable_in(stage, name) {
            trainable += 1;
            if a != b {
                changed += 1;
            }
        } else {
            frozen += 1;
            assert!(a == b, "{stage:?}: frozen tensor {name} changed");
        }
    }
    eprintln!("{stage:?}: {frozen} frozen tensors bit-identical, {changed}/{trainable} trainable tensors changed");
    assert_eq!(changed, trainable, "every trainable tensor of {stage:?} should have moved");
    // Parameter counts agree with the tensor classification.
    let trainable_elems: usize = before.iter().filter(|(n, _)| trainable_in(stage, n)).map(|(_, v)| v.len()).sum();
    assert_eq!(counts.trainable, trainable_elems);
}

#[test]
fn experts_stage_freezes_expert0_attention_embeddings_norms() {
    train_and_compare(Stage::Experts);
}

#[test]
fn router_stage_trains_only_routers() {
    train_and_compare(Stage::Router);
}

#[test]
fn ffn_stage_trains_only_the_dense_ffns() {
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let device = Default::default();
    let model = load_model::<A>(&dense, &device).unwrap();
    let before = snapshot(&model);
    let data = train_util::hu_en(&tok, 64, false, 1).unwrap();
    let config =
        TrainConfig { steps: 2, seq_len: 64, batch_size: 4, lr: 1e-2, warmup: 0, ..TrainConfig::new(Stage::Ffn) };
    let mut t = Trainer::new(model, data, config, vec![device], "stories260K").unwrap();
    let counts = t.param_counts();
    for _ in 0..2 {
        t.step().unwrap();
    }
    let after = snapshot(t.model());
    let mut changed = 0;
    for ((name, a), (_, b)) in before.iter().zip(&after) {
        if trainable_in(Stage::Ffn, name) {
            assert!(a != b, "FFN tensor {name} did not move");
            changed += 1;
        } else {
            assert!(a == b, "ffn stage: {name} changed");
        }
    }
    // stories260K: 5 layers x gate/up/down.
    assert_eq!(changed, 15);
    let ffn: usize = before.iter().filter(|(n, _)| trainable_in(Stage::Ffn, n)).map(|(_, v)| v.len()).sum();
    assert_eq!((counts.trainable, counts.trainable_tensors), (ffn, 15));
}

#[test]
fn stages_must_fit_the_model() {
    let Some(dense) = train_util::stories() else { return };
    let device = Default::default();
    let model = load_model::<A>(&dense, &device).unwrap();
    let e = apply_stage(model, Stage::Experts, "stories260K").unwrap_err().to_string();
    assert!(e.contains("needs an MoE model"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let moe = train_util::upcycled(&dense, dir.path(), 0.02);
    let model = load_model::<A>(&moe, &device).unwrap();
    let e = apply_stage(model, Stage::Dense, "moe").unwrap_err().to_string();
    assert!(e.contains("this one is MoE"), "{e}");
    let model = load_model::<A>(&moe, &device).unwrap();
    let e = apply_stage(model, Stage::Ffn, "moe").unwrap_err().to_string();
    assert!(e.contains("--stage ffn") && e.contains("this one is MoE"), "{e}");
    // Router training under top-1 routing with nothing but the next-token loss.
    let top1 = train_util::upcycled_k(&dense, dir.path(), 0.02, 1);
    let tok = dense.tokenizer.clone().unwrap();
    let c = TrainConfig { seq_len: 32, alpha: 0.0, ..TrainConfig::new(Stage::Router) };
    let data = train_util::hu_en(&tok, 32, false, 0).unwrap();
    let e = Trainer::new(load_model::<A>(&top1, &device).unwrap(), data, c.clone(), vec![device], "top1")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no gradient"), "{e}");
    let data = train_util::hu_en(&tok, 32, false, 0).unwrap();
    let c = TrainConfig { alpha: 0.01, ..c };
    let t = Trainer::new(load_model::<A>(&top1, &device).unwrap(), data, c, vec![device], "top1").unwrap();
    assert_eq!(t.warnings().len(), 1);
    // --seq-len beyond the context.
    let model = load_model::<A>(&dense, &device).unwrap();
    let c = TrainConfig { seq_len: 4096, ..TrainConfig::new(Stage::Dense) };
    let e = c.validate(&model).unwrap_err().to_string();
    assert!(e.contains("--seq-len") && e.contains("512"), "{e}");
}
