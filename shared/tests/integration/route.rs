//! DUME ridge router on real statistics: stories260K MoErged with itself
//! (expert 0 = English, expert 1 = Hungarian), hidden states from real
//! text (`corpora/lang/{en,hu}`).

use crate::common;

use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::open_model;
use moe_shared::methods::moerge::{moerge, MoergeInput, MoergeOptions};
use moe_shared::methods::ridge::RidgeStats;
use moe_shared::methods::route::{
    collect_stats, empty_stats, pack_sequences, routed_config, routing_accuracy, set_routers, solve_all,
    stats_from_safetensors, stats_to_safetensors, write_routed, DomainSequences, RouteOptions,
};
use moe_shared::model::{load_model, ForwardOptions, Mlp, Routing, Trace, Transformer};
use moe_shared::ops::route::{self as route_op, Collected, RouteParams};
use moe_shared::tensor_io::WriteOptions;
use moe_shared::tokenizer::Tokenizer;
use moe_shared::CpuBackend;

type B = CpuBackend;

fn text_ids(tok: &Tokenizer, rel: &str, chars: usize) -> Option<Vec<u32>> {
    let p = common::data_file(rel)?;
    let t = std::fs::read_to_string(p).unwrap();
    let t: String = t.chars().take(chars).collect();
    Some(tok.encode(&t, false).unwrap())
}

/// FFN inputs of layer `layer` for `seqs`, all experts forced to `expert`.
fn ffn_inputs(model: &Transformer<B>, seqs: &[Vec<u32>], expert: usize, layer: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for s in seqs {
        let ids: Vec<i64> = s.iter().map(|&x| x as i64).collect();
        let t = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, s.len()]), &Default::default());
        let mut tr = Trace::default();
        let opts = ForwardOptions { routing: Routing::Forced(expert), capture_ffn_inputs: true, ..Default::default() };
        model.forward_hidden_with(t, None, opts, Some(&mut tr));
        out.extend(tr.ffn_inputs.swap_remove(layer).into_data().to_vec::<f32>().unwrap());
    }
    out
}

#[test]
fn ridge_router_on_real_hidden_states() {
    let Some(path) = common::data_file("models/stories260K/stories260K.bin") else { return };
    let m = open_model(&path).unwrap();
    let tok = m.tokenizer.clone().unwrap();
    let (Some(en), Some(hu)) =
        (text_ids(&tok, "corpora/lang/en/train.txt", 12_000), text_ids(&tok, "corpora/lang/hu/train.txt", 12_000))
    else {
        return;
    };
    let (Some(en_v), Some(hu_v)) =
        (text_ids(&tok, "corpora/lang/en/valid.txt", 4_000), text_ids(&tok, "corpora/lang/hu/valid.txt", 4_000))
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let merged = dir.path().join("moe");
    let input = MoergeInput { name: "stories260K", source: m.source.as_ref(), config: &m.config, tokenizer: None };
    moerge(
        &[input, MoergeInput { name: "copy", ..input }],
        &MoergeOptions::default(),
        &merged,
        None,
        WriteOptions::default(),
    )
    .unwrap();
    let moe_ckpt = open_model(&merged).unwrap();
    let mut model = load_model::<B>(&moe_ckpt, &Default::default()).unwrap();
    let (en_s, hu_s) = (pack_sequences(&en, 128), pack_sequences(&hu, 128));
    let opts = RouteOptions { max_tokens: Some(3000), ..Default::default() };
    let mut stats = empty_stats(&model, true);
    assert_eq!(collect_stats(&model, 0, &en_s, opts.max_tokens, &mut stats).unwrap(), 3000);
    assert_eq!(collect_stats(&model, 1, &hu_s, opts.max_tokens, &mut stats).unwrap(), 3000);

    // 1. Cholesky (faer) equals a direct solve on real statistics.
    for st in stats.iter().flatten() {
        let (chol, direct) = (st.solve_raw(opts.lambda).unwrap(), st.solve_raw_direct(opts.lambda).unwrap());
        let scale = direct.iter().map(|x| x.abs()).fold(0.0, f64::max);
        let rel = chol.iter().zip(&direct).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale;
        assert!(rel < 1e-8, "Cholesky vs direct: {rel:e}");
    }

    // 2. Two halves added equal one pass; 3. an expert added later equals from scratch.
    let layer = 2;
    let x_en = ffn_inputs(&model, &en_s[..6], 0, layer);
    let x_hu = ffn_inputs(&model, &hu_s[..6], 1, layer);
    let d = model.config.hidden_size;
    let mut once = RidgeStats::new(d, 2, true);
    once.accumulate(&x_en, 0).unwrap();
    once.accumulate(&x_hu, 1).unwrap();
    let half = (x_en.len() / d / 2) * d;
    let (mut h1, mut h2) = (RidgeStats::new(d, 2, true), RidgeStats::new(d, 2, true));
    h1.accumulate(&x_en[..half], 0).unwrap();
    h2.accumulate(&x_en[half..], 0).unwrap();
    h2.accumulate(&x_hu, 1).unwrap();
    h1.merge(&h2).unwrap();
    let max_a = once.a.iter().map(|x| x.abs()).fold(0.0, f64::max);
    assert!(h1.a.iter().zip(&once.a).all(|(x, y)| (x - y).abs() <= 1e-12 * max_a));
    let mut inc = RidgeStats::new(d, 1, true);
    inc.accumulate(&x_en, 0).unwrap();
    assert_eq!(inc.add_expert(), 1);
    inc.accumulate(&x_hu, 1).unwrap();
    let (wi, wo) = (inc.solve(1e-2).unwrap(), once.solve(1e-2).unwrap());
    let diff = wi.weight.iter().zip(&wo.weight).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-6, "incremental vs from scratch: {diff}");

    // 4. Held-out routing accuracy beats random routing (0.5) by far.
    let routers = solve_all(&stats, opts.lambda).unwrap();
    set_routers(&mut model, &routers, 1, 1.0);
    let (en_vs, hu_vs) = (pack_sequences(&en_v, 128), pack_sequences(&hu_v, 128));
    let acc_en = routing_accuracy(&model, 0, &en_vs, 1000);
    let acc_hu = routing_accuracy(&model, 1, &hu_vs, 1000);
    let best = acc_en.iter().zip(&acc_hu).map(|(a, b)| (a.unwrap() + b.unwrap()) / 2.0).fold(0.0, f64::max);
    eprintln!("held-out accuracy en {acc_en:?}\nhu {acc_hu:?}");
    assert!(best > 0.9, "best layer accuracy {best}");

    // 5. Statistics round-trip; the written checkpoint routes like the in-memory model.
    let bytes = stats_to_safetensors(&stats, &["en".into(), "hu".into()]).unwrap();
    for _ in 0..4 {
        let again = stats_to_safetensors(&stats, &["en".into(), "hu".into()]).unwrap();
        assert!(again == bytes, "the same statistics must give the same bytes");
    }
    let (back, names) = stats_from_safetensors(&bytes, "ridge_stats.safetensors", d).unwrap();
    assert_eq!(back, stats);
    assert_eq!(names, vec!["en", "hu"]);
    let out = dir.path().join("routed");
    let routed = routed_config(moe_ckpt.moe.as_ref().unwrap(), &opts);
    write_routed(
        moe_ckpt.source.as_ref(),
        &moe_ckpt.config,
        &routed,
        &routers,
        &out,
        vec![],
        serde_json::json!({}),
        moe_shared::layout::LayoutRequest::Auto,
        moe_shared::layout::ExpertsFormat::PerExpert,
        WriteOptions::default(),
    )
    .unwrap();
    let reloaded = load_model::<B>(&open_model(&out).unwrap(), &Default::default()).unwrap();
    assert_eq!(routing_accuracy(&reloaded, 0, &en_vs, 1000), acc_en);

    // 6. The shared fit (what the CLI's `route` and the tab's router run,
    // collecting in groups with progress) is the step-by-step fit above, bit
    // for bit; statistics handed in give the same routers; statistics that
    // do not fit the model or the parameters are refused.
    let domain = |name: &str, train: &[Vec<u32>], heldout: &[Vec<u32>]| DomainSequences {
        name: name.into(),
        train: train.to_vec(),
        heldout: heldout.to_vec(),
        stream_sha256: String::new(),
        heldout_sha256: None,
    };
    let doms = [domain("en", &en_s, &en_vs), domain("hu", &hu_s, &hu_vs)];
    let params = RouteParams { max_tokens: Some(3000), eval_tokens: 1000, ..Default::default() };
    let mut steps: Vec<(String, u64, u64)> = Vec::new();
    let mut record = |w: &str, d: u64, t: u64, _: &str| steps.push((w.to_string(), d, t));
    // A model loaded afresh (its routers are moerge's), so that the
    // accuracy below is of the routers the fit put in.
    let mut fresh = load_model::<B>(&moe_ckpt, &Default::default()).unwrap();
    let before = route_op::accuracy(&fresh, &doms, &params, &mut |_, _, _, _| {});
    assert_ne!(before[1].per_layer, acc_hu, "moerge's routers already route like the solved ones");
    let fit = route_op::fit(&mut fresh, &doms, &params, None, &mut record).unwrap();
    assert_eq!(fit.tokens, vec![3000, 3000]);
    assert!(fit.stats == stats, "the shared fit's statistics differ from collect_stats'");
    assert_eq!(fit.routers, routers);
    let acc = route_op::accuracy(&fresh, &doms, &params, &mut record);
    assert_eq!((acc[0].per_layer.clone(), acc[1].per_layer.clone()), (acc_en.clone(), acc_hu.clone()));
    assert_eq!((acc[0].tokens, acc[1].tokens), (1000, 1000));
    let last = |prefix: &str| steps.iter().rev().find(|s| s.0.starts_with(prefix)).map(|s| (s.1, s.2));
    assert_eq!(last("ridge statistics (hu)"), Some((6000, 6000)));
    let moe_layers = stats.iter().flatten().count() as u64;
    assert_eq!(last("solving the ridge systems"), Some((moe_layers, moe_layers)));
    assert_eq!(last("routing accuracy (hu)"), Some((2000, 2000)));
    let given = |stats: Vec<Option<RidgeStats>>| Some(Collected { stats, tokens: vec![3000, 3000] });
    let again = route_op::fit(&mut model, &doms, &params, given(stats.clone()), &mut |_, _, _, _| {}).unwrap();
    assert_eq!(again.routers, routers);
    let mut err =
        |params: &RouteParams, c| route_op::fit(&mut model, &doms, params, c, &mut |_, _, _, _| {}).unwrap_err();
    let dense_only: Vec<Option<RidgeStats>> = stats.iter().map(|_| None).collect();
    assert!(err(&params, given(dense_only)).to_string().contains("MoE layers (0 of"));
    let unbiased = RouteParams { no_bias: true, ..params.clone() };
    assert!(err(&unbiased, given(stats.clone())).to_string().contains("bias column"));
    assert!(err(&RouteParams { top_k: 3, ..params.clone() }, None).to_string().contains("top_k"));
    let no_tokens = Some(Collected { stats: stats.clone(), tokens: vec![3000, 0] });
    assert!(err(&params, no_tokens).to_string().contains("one non-zero count per domain"));
    let two = RouteParams { top_k: 2, temperature: 0.5, ..params.clone() };
    route_op::fit(&mut model, &doms, &two, given(stats.clone()), &mut |_, _, _, _| {}).unwrap();
    for block in &model.layers {
        if let Mlp::Moe(m) = &block.mlp {
            assert_eq!((m.top_k, m.temperature), (2, 0.5), "the fit's top-k and temperature are the model's");
        }
    }
    let one =
        route_op::fit(&mut model, &doms[..1], &RouteParams { top_k: 1, ..params.clone() }, None, &mut |_, _, _, _| {});
    assert!(one.unwrap_err().to_string().contains("has 2 experts but 1 domains"));
}
