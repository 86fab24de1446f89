//! Right-padded batches (`model::Padding`, `Transformer::forward_hidden_masked`):
//! a batch of texts of different lengths gives each text the numbers it
//! gets alone — per-text NLL, routing decisions, routing counts, pooled
//! neurons, ridge statistics — and padding is never routed, counted or
//! pooled.

use std::path::Path;

use burn::tensor::{activation::log_softmax, Int, Tensor, TensorData};
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::eval::{evaluate, PerplexityOptions};
use moe_shared::methods::neurons::{CollectOptions, NeuronCollector};
use moe_shared::methods::route::{collect_stats, empty_stats};
use moe_shared::methods::{upcycle, CopyNoise, ExpertCounts, NoiseKind, RouterInit, UpcycleOptions};
use moe_shared::model::{load_model, ForwardOptions, Padding, Pooling, Routing, Trace, Transformer};
use moe_shared::tensor_io::{DType, WriteOptions};
use moe_shared::train::{load_balancing_loss, LbForm};
use moe_shared::CpuBackend;

use crate::common;
use crate::train_util;

type B = CpuBackend;

/// stories260K upcycled to 4 experts (top-2) whose copies differ (noise)
/// and whose router is far from uniform, so routing changes the output.
fn noisy_moe(dense: &LoadedModel, dir: &Path) -> LoadedModel {
    let out = dir.join("moe-noisy");
    let opts = UpcycleOptions {
        experts: ExpertCounts::Uniform(4),
        top_k: 2,
        router_init: RouterInit::Random { std: 1.0 },
        noise: CopyNoise { kind: NoiseKind::Multiplicative, std: 0.2 },
        dtype: Some(DType::F32),
        seed: 3,
        ..Default::default()
    };
    upcycle(dense.source.as_ref(), &dense.config, &opts, &out, None, WriteOptions::default()).unwrap();
    open_model(&out).unwrap()
}

/// Texts of different lengths (from 3 to ~60 tokens) from the English corpus.
fn ragged_texts(dense: &LoadedModel) -> Option<Vec<Vec<u32>>> {
    let path = common::data_file("corpora/lang/en/valid.txt")?;
    let tok = dense.tokenizer.as_ref().unwrap();
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).take(6).enumerate() {
        let ids = tok.encode(line, true).unwrap();
        let len = [60, 3, 41, 17, 60, 8][i].min(ids.len());
        out.push(ids[..len].to_vec());
    }
    Some(out)
}

/// Per-position NLL of `text` (positions `0..len-1` predict `1..len`) from
/// hidden states `[len, d]` of that text.
fn nlls(model: &Transformer<B>, hidden: Tensor<B, 2>, text: &[u32]) -> Vec<f64> {
    let [s, d] = hidden.dims();
    let v = model.config.vocab_size;
    let logp = log_softmax(model.head(hidden.reshape([1, s, d])), 2).reshape([s, v]);
    let logp: Vec<f32> = logp.into_data().to_vec().unwrap();
    (0..s - 1).map(|t| -f64::from(logp[t * v + text[t + 1] as usize])).collect()
}

struct Alone {
    nll: f64,
    chosen: Vec<Vec<u32>>,
    logits: Vec<Vec<f32>>,
}

fn alone(model: &Transformer<B>, text: &[u32]) -> Alone {
    let device = Default::default();
    let ids: Vec<i64> = text.iter().map(|&x| i64::from(x)).collect();
    let t = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, text.len()]), &device);
    let mut trace = Trace::default();
    let h = model.forward_hidden_with(t, None, ForwardOptions::default(), Some(&mut trace));
    let d = h.dims()[2];
    let nll = nlls(model, h.reshape([text.len(), d]), text).iter().sum();
    let routed: Vec<_> = trace.routing.into_iter().flatten().collect();
    Alone {
        nll,
        chosen: routed.iter().map(|r| r.chosen.clone()).collect(),
        logits: routed.iter().map(|r| r.logits.clone().into_data().to_vec().unwrap()).collect(),
    }
}

/// The top-k margin of one token's router logits: the gap between the k-th
/// and (k+1)-th largest (routing may legitimately flip below float error).
fn margin(logits: &[f32], k: usize) -> f32 {
    let mut v = logits.to_vec();
    v.sort_by(|a, b| b.partial_cmp(a).unwrap());
    if k < v.len() {
        v[k - 1] - v[k]
    } else {
        f32::INFINITY
    }
}

#[test]
fn a_ragged_batch_gives_each_text_its_own_numbers() {
    let Some(dense) = train_util::stories() else { return };
    let Some(texts) = ragged_texts(&dense) else { return };
    let dir = tempfile::tempdir().unwrap();
    let moe = noisy_moe(&dense, dir.path());
    let device = Default::default();
    let model = load_model::<B>(&moe, &device).unwrap();
    let refs: Vec<&[u32]> = texts.iter().map(|t| t.as_slice()).collect();
    let (tokens, padding) = Padding::pad_tensor::<B>(&refs, 0, &device).unwrap();
    assert!(!padding.is_full());
    let mut trace = Trace::default();
    let h = model.forward_hidden_masked(tokens, Some(&padding), None, ForwardOptions::default(), Some(&mut trace));
    let [b, s, d] = h.dims();
    let flat = h.reshape([b * s, d]);
    let routed: Vec<_> = trace.routing.iter().flatten().collect();
    assert_eq!(routed.len(), 5);
    for r in &routed {
        // Only real tokens are routed: padding takes no slot and no row.
        assert_eq!(r.logits.dims()[0], padding.num_valid());
        assert_eq!(r.counts.iter().sum::<usize>(), padding.num_valid() * 2);
    }
    let (mut row0, mut checked, mut flips) = (0usize, 0usize, 0usize);
    for (i, text) in texts.iter().enumerate() {
        let want = alone(&model, text);
        let rows = flat.clone().narrow(0, i * s, text.len());
        let got: f64 = nlls(&model, rows, text).iter().sum();
        let rel = (got - want.nll).abs() / want.nll.abs();
        assert!(rel <= 1e-5, "text {i} ({} tokens): NLL batched {got} alone {} (rel {rel:.2e})", text.len(), want.nll);
        for (l, r) in routed.iter().enumerate() {
            let k = r.top_k;
            let chosen = &r.chosen[row0 * k..(row0 + text.len()) * k];
            for t in 0..text.len() {
                let e = r.logits.dims()[1];
                let m = margin(&want.logits[l][t * e..(t + 1) * e], k);
                let (mut a, mut w) = (chosen[t * k..(t + 1) * k].to_vec(), want.chosen[l][t * k..(t + 1) * k].to_vec());
                a.sort();
                w.sort();
                if a != w {
                    assert!(m < 1e-5, "text {i} layer {l} token {t}: experts {a:?} batched, {w:?} alone (margin {m})");
                    flips += 1;
                }
                checked += 1;
            }
        }
        row0 += text.len();
    }
    assert!(flips * 100 <= checked, "{flips} of {checked} routing decisions flipped");
}

#[test]
fn padding_does_not_count_in_the_load_balancing_loss() {
    let Some(dense) = train_util::stories() else { return };
    let Some(texts) = ragged_texts(&dense) else { return };
    let dir = tempfile::tempdir().unwrap();
    let moe = noisy_moe(&dense, dir.path());
    let device = Default::default();
    let model = load_model::<B>(&moe, &device).unwrap();
    // Two texts: the long one alone, and the long one batched with a short
    // one padded to its length. The short one's loss, routing it alone,
    // is known; the batched loss must not see its padding (with padding
    // routed, counts would sum to (60 + 60) * 2 slots instead of 63 * 2).
    let (long, short) = (&texts[0], &texts[1]);
    let (tokens, padding) = Padding::pad_tensor::<B>(&[long, short], 0, &device).unwrap();
    let mut trace = Trace::default();
    let _ = model.forward_hidden_masked(tokens, Some(&padding), None, ForwardOptions::default(), Some(&mut trace));
    let batched = load_balancing_loss(&trace.routing, LbForm::PerLayer).unwrap().into_scalar();
    // The same real tokens as one packed row: the loss only depends on the
    // per-token router logits and choices, which padding must not change.
    let joined: Vec<u32> = long.iter().chain(short.iter()).copied().collect();
    let mut trace_alone = Trace::default();
    let (t2, p2) = Padding::pad_tensor::<B>(&[long], 0, &device).unwrap();
    let _ = model.forward_hidden_masked(t2, Some(&p2), None, ForwardOptions::default(), Some(&mut trace_alone));
    let mut trace_short = Trace::default();
    let ids: Vec<i64> = short.iter().map(|&x| i64::from(x)).collect();
    let ts = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, short.len()]), &device);
    let _ = model.forward_hidden_with(ts, None, ForwardOptions::default(), Some(&mut trace_short));
    // Concatenate the per-layer traces of the two texts run alone.
    let mut both = Vec::new();
    for (a, b) in trace_alone.routing.into_iter().zip(trace_short.routing) {
        both.push(match (a, b) {
            (Some(a), Some(b)) => {
                let mut chosen = a.chosen.clone();
                chosen.extend(&b.chosen);
                let counts = a.counts.iter().zip(&b.counts).map(|(x, y)| x + y).collect();
                Some(moe_shared::model::RoutingTrace {
                    logits: Tensor::cat(vec![a.logits, b.logits], 0),
                    chosen,
                    counts,
                    top_k: a.top_k,
                })
            }
            _ => None,
        });
    }
    let want = load_balancing_loss(&both, LbForm::PerLayer).unwrap().into_scalar();
    assert_eq!(joined.len(), padding.num_valid());
    assert!((batched - want).abs() <= 1e-5 * want.abs(), "LB batched {batched} vs alone {want}");
}

#[test]
fn batched_perplexity_equals_one_window_at_a_time() {
    let Some(dense) = train_util::stories() else { return };
    let Some(path) = common::data_file("corpora/lang/en/valid.txt") else { return };
    let tok = dense.tokenizer.clone().unwrap();
    let text: String = std::fs::read_to_string(path).unwrap().lines().take(40).collect::<Vec<_>>().join("\n");
    let ids = tok.encode(&text, true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let moe = noisy_moe(&dense, dir.path());
    let device = Default::default();
    let model = load_model::<B>(&moe, &device).unwrap();
    // 1000 tokens, windows of 128 every 100: the last window is short.
    let one = PerplexityOptions { window: 128, stride: 100, max_tokens: Some(1000), batch: 1 };
    let a = evaluate(&model, &ids, one, Routing::Learned, &device, |_, _| {}).unwrap();
    let b =
        evaluate(&model, &ids, PerplexityOptions { batch: 4, ..one }, Routing::Learned, &device, |_, _| {}).unwrap();
    assert_eq!(a.report.tokens, b.report.tokens);
    let rel = (a.report.nll - b.report.nll).abs() / a.report.nll;
    assert!(rel <= 1e-5, "NLL one window at a time {} vs 4 per pass {} (rel {rel:.2e})", a.report.nll, b.report.nll);
    for (x, y) in a.load.iter().flatten().zip(b.load.iter().flatten()) {
        for (p, q) in x.iter().zip(y) {
            assert!((p - q).abs() < 2e-3, "routing load {x:?} vs {y:?}");
        }
    }
    let e = evaluate(&model, &ids, PerplexityOptions { batch: 0, ..one }, Routing::Learned, &device, |_, _| {});
    assert!(e.unwrap_err().to_string().contains("batch"));
}

#[test]
fn batched_neurons_and_ridge_statistics_equal_one_by_one() {
    let Some(dense) = train_util::stories() else { return };
    let Some(texts) = ragged_texts(&dense) else { return };
    let device = Default::default();
    let model = load_model::<B>(&dense, &device).unwrap();
    for pooling in [Pooling::Mean, Pooling::Max] {
        let opts = CollectOptions { pooling, ..Default::default() };
        let mut one = NeuronCollector::new(&model, vec!["en".into(), "xx".into()], opts).unwrap();
        let mut all = NeuronCollector::new(&model, vec!["en".into(), "xx".into()], opts).unwrap();
        for (i, t) in texts.iter().enumerate() {
            one.add_text(i % 2, t).unwrap();
        }
        let batch: Vec<(usize, &[u32])> = texts.iter().enumerate().map(|(i, t)| (i % 2, t.as_slice())).collect();
        all.add_texts(&batch).unwrap();
        let (a, b) = (one.finish().unwrap(), all.finish().unwrap());
        assert_eq!(a.labels, b.labels);
        assert_eq!(a.tokens, b.tokens);
        let worst = a.data.iter().zip(&b.data).map(|(x, y)| (x - y).abs() / x.abs().max(1.0)).fold(0f32, f32::max);
        assert!(worst < 1e-4, "{pooling:?}: pooled activations differ by {worst}");
        for (x, y) in a.hidden_means.iter().flatten().zip(b.hidden_means.iter().flatten()) {
            assert!((x - y).abs() < 1e-4 * x.abs().max(1.0), "hidden means {x} vs {y}");
        }
    }

    // Ridge statistics of an MoE: batched collection (several sequences
    // per pass) equals one sequence per call.
    let dir = tempfile::tempdir().unwrap();
    let moe = train_util::upcycled(&dense, dir.path(), 0.02);
    let model = load_model::<B>(&moe, &device).unwrap();
    let mut batched = empty_stats(&model, true);
    let n = collect_stats(&model, 1, &texts, Some(10_000), &mut batched).unwrap();
    assert_eq!(n, texts.iter().map(|t| t.len()).sum::<usize>());
    let mut single = empty_stats(&model, true);
    for t in &texts {
        collect_stats(&model, 1, std::slice::from_ref(t), Some(10_000), &mut single).unwrap();
    }
    for (x, y) in batched.iter().flatten().zip(single.iter().flatten()) {
        assert_eq!(x.tokens, y.tokens);
        for (p, q) in x.a.iter().zip(&y.a).chain(x.b.iter().zip(&y.b)) {
            assert!((p - q).abs() <= 1e-4 * p.abs().max(1.0), "ridge statistics {p} vs {q}");
        }
    }
}
