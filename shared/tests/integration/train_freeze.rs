//! Stage freezing (methods.md §1-2) on stories260K upcycled to 4 experts
//! (top-2): after a few steps of stage `experts`, expert 0, attention,
//! embeddings and norms are bit-identical and the routers and new experts
//! changed; stage `router` changes only the routers; stage `all` changes
//! everything but expert 0; on the dense model stage `ffn` changes only the
//! FFNs and `dense` everything; stages that do not fit the model are refused.

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
    let expert0 = name.contains(".experts.0.");
    let dense_ffn = name.contains(".mlp.");
    match stage {
        Stage::Experts => router || new_expert,
        Stage::Router => router,
        Stage::All => !expert0,
        Stage::Dense => true,
        Stage::Ffn => dense_ffn,
    }
}

fn train_and_compare(stage: Stage) {
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let model = if stage.is_moe() {
        load_model::<A>(&train_util::upcycled(&dense, dir.path(), 0.5), &device).unwrap()
    } else {
        load_model::<A>(&dense, &device).unwrap()
    };
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
fn all_stage_trains_everything_but_the_frozen_expert() {
    train_and_compare(Stage::All);
}

#[test]
fn ffn_stage_trains_only_the_dense_ffns() {
    train_and_compare(Stage::Ffn);
}

#[test]
fn dense_stage_trains_everything() {
    train_and_compare(Stage::Dense);
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
    let model = load_model::<A>(&dense, &device).unwrap();
    let e = apply_stage(model, Stage::All, "stories260K").unwrap_err().to_string();
    assert!(e.contains("--stage all") && e.contains("needs an MoE model"), "{e}");
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

/// Every 2-D parameter back in f32 (the values a 16-bit model holds).
struct Widen;

impl burn::module::ModuleMapper<A> for Widen {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<burn::tensor::Tensor<A, D>>,
    ) -> burn::module::Param<burn::tensor::Tensor<A, D>> {
        let (id, t, mapper) = param.consume();
        burn::module::Param::from_mapped_value(id, moe_shared::model::weights::weight_f32(t), mapper)
    }
}

#[test]
fn frozen_weights_in_bf16_train_as_their_f32_values_do() {
    use burn::module::Module;
    use moe_shared::model::WeightsDtype;
    use moe_shared::train::freeze::hold_frozen_in;
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let moe = train_util::upcycled(&dense, dir.path(), 0.5);
    let stage = Stage::Experts;
    let config = TrainConfig { steps: 3, seq_len: 64, batch_size: 4, lr: 1e-2, warmup: 0, ..TrainConfig::new(stage) };
    // The reference: f32 weights holding exactly the bf16-rounded values of the frozen matrices.
    let staged = apply_stage(load_model::<A>(&moe, &device).unwrap(), stage, "m").unwrap();
    let (rounded, saved) = hold_frozen_in(staged, WeightsDtype::Bf16, "m").unwrap();
    let before = snapshot(&rounded);
    let frozen_elems: usize =
        before.iter().filter(|(n, _)| !trainable_in(stage, n) && !n.contains("norm")).map(|(_, v)| v.len()).sum();
    assert_eq!(saved, 2 * frozen_elems, "2 bytes saved per frozen matrix weight");
    let reference = rounded.map(&mut Widen);
    let run = |model: Transformer<A>, dtype: WeightsDtype| {
        let data = train_util::hu_en(&tok, 64, true, 1).unwrap();
        let c = TrainConfig { frozen_dtype: dtype, ..config.clone() };
        let mut t = Trainer::new(model, data, c, vec![device], "stories260K-moe").unwrap();
        let losses: Vec<f64> = (0..3).map(|_| t.step().unwrap().loss).collect();
        (losses, t)
    };
    let (want, _) = run(reference, WeightsDtype::F32);
    let (got, t) = run(load_model::<A>(&moe, &device).unwrap(), WeightsDtype::Bf16);
    let m = t.model();
    assert_eq!(m.layers[0].self_attn.q_proj.weight.val().dtype(), burn::tensor::DType::BF16);
    assert_eq!(m.embed_tokens.weight.val().dtype(), burn::tensor::DType::BF16);
    assert_eq!(m.layers[0].input_layernorm.gamma.val().dtype(), burn::tensor::DType::F32, "vectors stay f32");
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "losses {got:?} vs the f32 run on the same values {want:?}");
    }
    // Frozen tensors keep their rounded values bit for bit; trainable ones move.
    for ((name, a), (_, b)) in before.iter().zip(&snapshot(m)) {
        assert_eq!(a == b, !trainable_in(stage, name), "{name}");
    }
    // f16 cannot hold a weight past 65504: refused, naming the parameter.
    let mut big = load_model::<A>(&moe, &device).unwrap();
    let w = big.embed_tokens.weight.val();
    let (dims, v) = (w.dims(), w.into_data().to_vec::<f32>().unwrap());
    let v: Vec<f32> = v.iter().map(|x| x * 1e6).collect();
    let w = burn::tensor::Tensor::<A, 2>::from_data(burn::tensor::TensorData::new(v, dims), &device);
    big.embed_tokens.weight = burn::module::Param::from_tensor(w);
    let e = hold_frozen_in(apply_stage(big, stage, "m").unwrap(), WeightsDtype::F16, "big.safetensors")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("big.safetensors") && e.contains("embed_tokens") && e.contains("65504"), "{e}");
}

/// The router stage loads its frozen weights in the frozen dtype directly
/// (`freeze::load_dtype`): the same parameters, bit for bit, and the same
/// losses as loading in f32 and narrowing after `apply_stage`; the other
/// stages load in f32.
#[test]
fn the_router_stage_loads_its_frozen_weights_narrow_with_the_same_result() {
    use moe_shared::model::{load_model_as, WeightsDtype};
    use moe_shared::train::freeze::load_dtype;
    let Some(dense) = train_util::stories() else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let moe = train_util::upcycled(&dense, dir.path(), 0.5);
    let stage = Stage::Router;
    assert_eq!(load_dtype(stage, WeightsDtype::Bf16), WeightsDtype::Bf16);
    for s in [Stage::Experts, Stage::All, Stage::Dense, Stage::Ffn] {
        assert_eq!(load_dtype(s, WeightsDtype::Bf16), WeightsDtype::F32, "{s:?} trains large weights");
    }
    let config = TrainConfig {
        steps: 2,
        seq_len: 64,
        batch_size: 4,
        lr: 1e-2,
        warmup: 0,
        frozen_dtype: WeightsDtype::Bf16,
        ..TrainConfig::new(stage)
    };
    let run = |model: Transformer<A>| {
        let data = train_util::hu_en(&tok, 64, true, 1).unwrap();
        let mut t = Trainer::new(model, data, config.clone(), vec![device], "stories260K-moe").unwrap();
        let start = snapshot(t.model());
        let dtypes: Vec<_> = {
            let m = t.model();
            vec![m.embed_tokens.weight.val().dtype(), m.layers[0].self_attn.q_proj.weight.val().dtype()]
        };
        let losses: Vec<f64> = (0..2).map(|_| t.step().unwrap().loss).collect();
        (start, dtypes, losses, snapshot(t.model()))
    };
    let narrowed = run(load_model::<A>(&moe, &device).unwrap());
    let loaded = run(load_model_as::<A>(&moe, &device, load_dtype(stage, WeightsDtype::Bf16)).unwrap());
    assert_eq!(loaded.1, vec![burn::tensor::DType::BF16; 2]);
    assert_eq!(loaded.1, narrowed.1);
    assert_eq!(loaded.0, narrowed.0, "the same starting parameters, bit for bit");
    assert_eq!(loaded.2, narrowed.2, "the same losses");
    assert_eq!(loaded.3, narrowed.3, "the same trained parameters");
}
