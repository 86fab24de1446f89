//! An in-memory model saved with `save_model` reloads to the same logits
//! (dense HF layout and MoE layout, with a router temperature folded).

use crate::common;

use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::open_model;
use moe_shared::layout::LayoutRequest;
use moe_shared::model::{load_model, save_model, Mlp, Transformer};
use moe_shared::tensor_io::DType;
use moe_shared::CpuBackend;

type B = CpuBackend;

fn logits(m: &Transformer<B>) -> Vec<f32> {
    let ids: Vec<i64> = vec![1, 403, 407, 261, 378, 275, 300, 30, 280, 91, 7];
    let t = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, 11]), &Default::default());
    m.forward(t, None).into_data().to_vec().unwrap()
}

#[test]
fn dense_and_moe_models_round_trip() {
    let Some(path) = common::data_file("models/stories260K/stories260K.bin") else { return };
    let m = open_model(&path).unwrap();
    let model = load_model::<B>(&m, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    save_model(&model, &dir.path().join("dense"), DType::F32, vec![], serde_json::json!({}), LayoutRequest::Auto)
        .unwrap();
    let back = load_model::<B>(&open_model(&dir.path().join("dense")).unwrap(), &Default::default()).unwrap();
    assert_eq!(logits(&back), logits(&model));

    // An MoE: MoErge two copies, give the routers a temperature and random
    // weights, save (Mixtral layout folds 1/T into the router) and reload.
    let input = moe_shared::methods::moerge::MoergeInput {
        name: "a",
        source: m.source.as_ref(),
        config: &m.config,
        tokenizer: None,
    };
    let opts = moe_shared::methods::moerge::MoergeOptions {
        router_init: moe_shared::methods::RouterInit::Random { std: 0.5 },
        seed: 3,
        top_k: 1,
        ..Default::default()
    };
    let moe_dir = dir.path().join("moe");
    moe_shared::methods::moerge::moerge(
        &[input, moe_shared::methods::moerge::MoergeInput { name: "b", ..input }],
        &opts,
        &moe_dir,
        None,
        Default::default(),
    )
    .unwrap();
    let mut moe = load_model::<B>(&open_model(&moe_dir).unwrap(), &Default::default()).unwrap();
    for b in moe.layers.iter_mut() {
        if let Mlp::Moe(x) = &mut b.mlp {
            x.temperature = 0.5;
        }
    }
    let before = logits(&moe);
    save_model(
        &moe,
        &dir.path().join("moe2"),
        DType::F32,
        vec![],
        serde_json::json!({"test": true}),
        LayoutRequest::Auto,
    )
    .unwrap();
    let reopened = open_model(&dir.path().join("moe2")).unwrap();
    assert_eq!(reopened.moe.as_ref().unwrap().layers[0].as_ref().unwrap().temperature, 1.0, "folded into the weights");
    let after = load_model::<B>(&reopened, &Default::default()).unwrap();
    let diff = before.iter().zip(logits(&after)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-5, "MoE round trip {diff}");
}
