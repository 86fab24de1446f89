//! The load-balancing loss (methods.md §1) on fixed router logits: a value
//! computed by hand, and transformers' Mixtral `load_balancing_loss_func`
//! (golden from `tests/reference/make_lb_golden.py`).

use crate::common;

use burn::tensor::{Tensor, TensorData};
use moe_shared::model::RoutingTrace;
use moe_shared::train::{load_balancing_loss, LbForm};
use moe_shared::CpuBackend;

type B = CpuBackend;

fn trace(logits: &[f32], t: usize, e: usize, k: usize) -> RoutingTrace<B> {
    let dev = Default::default();
    let lt = Tensor::<B, 2>::from_data(TensorData::new(logits.to_vec(), [t, e]), &dev);
    let (_, idx) = lt.clone().topk_with_indices(k, 1);
    let chosen: Vec<u32> =
        idx.into_data().convert::<i64>().to_vec::<i64>().unwrap().iter().map(|&x| x as u32).collect();
    let mut counts = vec![0; e];
    for &c in &chosen {
        counts[c as usize] += 1;
    }
    RoutingTrace { logits: lt, chosen, counts, top_k: k }
}

fn lb(traces: Vec<RoutingTrace<B>>, form: LbForm) -> f64 {
    let r: Vec<Option<RoutingTrace<B>>> = traces.into_iter().map(Some).collect();
    load_balancing_loss(&r, form).unwrap().into_scalar() as f64
}

/// 3 tokens, 2 experts, top-1. Probabilities: t0 = t1 = (1/4, 3/4) -> expert
/// 1, t2 = (3/4, 1/4) -> expert 0. f = (1/3, 2/3), P = (1.25/3, 1.75/3),
/// LB = 2 * (1/3 * 1.25/3 + 2/3 * 1.75/3) = 9.5 / 9.
#[test]
fn hand_computed_top1() {
    let l3 = 3f32.ln();
    let t = trace(&[0.0, l3, 0.0, l3, l3, 0.0], 3, 2, 1);
    let got = lb(vec![t], LbForm::PerLayer);
    assert!((got - 9.5 / 9.0).abs() < 1e-6, "{got}");
}

/// 2 tokens, 3 experts, top-2. Probabilities: t0 = (1/2, 1/4, 1/4) -> {0, 1 or
/// 2}: logits chosen tie-free as (ln 4, ln 2, 0) -> probs (4/7, 2/7, 1/7),
/// picks {0, 1}; t1 = (0, ln 2, ln 4) -> (1/7, 2/7, 4/7), picks {2, 1}.
/// Slots: expert 0: 1, expert 1: 2, expert 2: 1 of 4 -> f = (1/4, 1/2, 1/4).
/// P = (5/14, 4/14, 5/14). LB = 3 * (5/56 + 8/56 + 5/56) = 54/56.
/// transformers' form: f_hf = counts / tokens = (1/2, 1, 1/2) -> 2 * 54/56.
#[test]
fn hand_computed_top2() {
    let (l2, l4) = (2f32.ln(), 4f32.ln());
    let logits = [l4, l2, 0.0, 0.0, l2, l4];
    let got = lb(vec![trace(&logits, 2, 3, 2)], LbForm::PerLayer);
    assert!((got - 54.0 / 56.0).abs() < 1e-6, "{got}");
    let hf = lb(vec![trace(&logits, 2, 3, 2)], LbForm::HfMixtral);
    assert!((hf - 108.0 / 56.0).abs() < 1e-6, "{hf}");
}

#[test]
fn equals_transformers_mixtral() {
    let Some(g) = common::golden_json("lb_loss.json") else { return };
    let (e, k, t) = (
        g["num_experts"].as_u64().unwrap() as usize,
        g["top_k"].as_u64().unwrap() as usize,
        g["tokens"].as_u64().unwrap() as usize,
    );
    let layers: Vec<Vec<f32>> = g["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
        .collect();
    let traces = || layers.iter().map(|l| trace(l, t, e, k)).collect::<Vec<_>>();
    let single = g["hf_single_layer"].as_f64().unwrap();
    let all = g["hf_all_layers"].as_f64().unwrap();
    let got_single = lb(traces()[..1].to_vec(), LbForm::HfMixtral);
    let got_all = lb(traces(), LbForm::HfMixtral);
    eprintln!("hf single {single} ours {got_single}; hf all layers {all} ours {got_all}");
    assert!((got_single - single).abs() < 1e-5);
    assert!((got_all - all).abs() < 1e-5);
    // With one layer the methods.md form is the transformers value / k.
    let per_layer = lb(traces()[..1].to_vec(), LbForm::PerLayer);
    assert!((per_layer * k as f64 - single).abs() < 1e-5, "{per_layer} * {k} vs {single}");
    // Host re-computation of the per-layer mean over the three layers.
    let mut want = 0.0;
    for l in &layers {
        let mut p = vec![0f64; e];
        let mut counts = vec![0f64; e];
        for row in l.chunks(e) {
            let m = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
            let probs: Vec<f64> = row.iter().map(|&x| (x as f64 - m).exp() / z).collect();
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|a, b| probs[*b].partial_cmp(&probs[*a]).unwrap());
            for &i in &order[..k] {
                counts[i] += 1.0;
            }
            p.iter_mut().zip(&probs).for_each(|(a, b)| *a += b / t as f64);
        }
        want += e as f64 * (0..e).map(|i| counts[i] / (t * k) as f64 * p[i]).sum::<f64>() / layers.len() as f64;
    }
    let got = lb(traces(), LbForm::PerLayer);
    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
}
