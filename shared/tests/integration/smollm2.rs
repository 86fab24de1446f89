//! SmolLM2-135M-Instruct (Q4_1 GGUF) against Hugging Face transformers on the
//! same file: last-position logits, greedy continuation, perplexity, and the
//! safetensors path (GGUF -> safetensors -> same logits).

use crate::common;

use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::export::export_dense;
use moe_shared::checkpoint::{open_model, LoadedModel, ModelFormat};
use moe_shared::eval::{perplexity, PerplexityOptions};
use moe_shared::generate::{generate, Sampling};
use moe_shared::model::{load_model, Transformer};
use moe_shared::tensor_io::WriteOptions;
use moe_shared::CpuBackend;

type B = CpuBackend;

const PROMPT: &str = "The capital of France is Paris. The capital of Germany is";

fn golden_logits() -> Option<Vec<f32>> {
    let p = common::golden("smollm2_last_logits.f32")?;
    let b = std::fs::read(p).unwrap();
    Some(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

fn last_logits(model: &Transformer<B>, ids: &[u32]) -> Vec<f32> {
    let ids: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
    let n = ids.len();
    let t = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, n]), &Default::default());
    model.forward_last(t, None).into_data().to_vec().unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn load() -> Option<(LoadedModel, Transformer<B>)> {
    let path = common::smollm2_gguf()?;
    let m = open_model(&path).unwrap();
    assert_eq!(m.format, ModelFormat::Gguf);
    let model = load_model::<B>(&m, &Default::default()).unwrap();
    Some((m, model))
}

#[test]
fn logits_match_transformers_and_greedy_says_berlin() {
    let Some((m, model)) = load() else { return };
    let Some(golden) = golden_logits() else {
        return;
    };
    let prompt = common::golden_json("smollm2_prompt.json").unwrap();
    let tok = m.tokenizer.as_ref().unwrap();
    let ids = tok.encode(PROMPT, false).unwrap();
    let expected: Vec<u32> =
        prompt["expected_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(ids, expected);
    let logits = last_logits(&model, &ids);
    let diff = max_abs_diff(&logits, &golden);
    eprintln!("SmolLM2 last-position logits: max |ours - transformers| = {diff:e}");
    assert!(diff < 1e-3, "max abs diff {diff}");

    let device = Default::default();
    let new = generate(&model, &ids, 8, Sampling::default(), m.config.eos_token_id, &device).unwrap();
    let golden_new: Vec<u32> =
        prompt["greedy"]["new_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let text = tok.decode(&new).unwrap();
    assert!(text.starts_with(" Berlin"), "continuation {text:?}");
    assert_eq!(new, golden_new, "greedy ids differ from transformers");
}

#[test]
fn tokenizer_ids_match_transformers_on_multilingual_text() {
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let Some(g) = common::golden_json("smollm2_tokenizer.json") else {
        return;
    };
    let Some(dir) = common::data_dir() else {
        return;
    };
    let m = open_model(&path).unwrap();
    let gguf_tok = m.tokenizer.unwrap();
    let json = std::fs::read(dir.join("models/smollm2-135m-instruct/tokenizer.json")).unwrap();
    let hf_tok = moe_shared::tokenizer::Tokenizer::from_hf_json(&json, "tokenizer.json").unwrap();
    let mut n = 0;
    for line in g["entries"].as_array().expect("entries") {
        let text = line["text"].as_str().unwrap();
        let ids: Vec<u32> =
            line["ids_tokenizer_json"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(hf_tok.encode(text, false).unwrap(), ids, "tokenizer.json on {text:?}");
        assert_eq!(gguf_tok.encode(text, false).unwrap(), ids, "GGUF tokenizer on {text:?}");
        n += 1;
    }
    assert!(n >= 12, "only {n} golden lines");
}

#[test]
fn perplexity_matches_transformers_within_half_a_percent() {
    let Some((m, model)) = load() else { return };
    let Some(g) = common::golden_json("smollm2_perplexity.json") else {
        return;
    };
    let Some(dir) = common::data_dir() else {
        return;
    };
    let tok = m.tokenizer.as_ref().unwrap();
    let device = Default::default();
    let mut checked = 0;
    for r in g["results"].as_array().unwrap() {
        if r["max_tokens"].as_u64() != Some(1024) {
            continue; // the longer settings are for the benchmark note
        }
        let text = std::fs::read_to_string(dir.join(r["file"].as_str().unwrap())).unwrap();
        let ids = tok.encode(&text, false).unwrap();
        assert_eq!(ids.len() as u64, r["file_tokens"].as_u64().unwrap(), "token count of {}", r["file"]);
        let opts = PerplexityOptions {
            window: r["window"].as_u64().unwrap() as usize,
            stride: r["stride"].as_u64().unwrap() as usize,
            max_tokens: Some(1024),
            ..Default::default()
        };
        let ours = perplexity(&model, &ids, opts, &device, |_, _| {}).unwrap();
        let theirs = r["ppl"].as_f64().unwrap();
        let rel = (ours.ppl - theirs).abs() / theirs;
        eprintln!("{}: ppl ours {:.4} transformers {:.4} (rel diff {:.2e})", r["lang"], ours.ppl, theirs, rel);
        assert_eq!(ours.tokens as u64, r["tokens"].as_u64().unwrap());
        assert!(rel < 0.005, "{}: relative difference {rel}", r["lang"]);
        checked += 1;
    }
    assert_eq!(checked, 2, "en and hu");
}

#[test]
fn safetensors_export_reloads_to_the_same_logits() {
    let Some((m, model)) = load() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2-f32");
    // Small shards so that the sharded reader is exercised on real weights.
    let opts = WriteOptions { max_shard_bytes: 200_000_000, ..Default::default() };
    let tok_json = m.tokenizer.as_ref().and_then(|t| t.to_hf_json()).map(String::into_bytes);
    export_dense(m.source.as_ref(), &m.config, &out, None, tok_json, opts).unwrap();
    assert!(out.join("model.safetensors.index.json").exists());
    let back = open_model(&out).unwrap();
    assert_eq!(back.config, m.config);
    let reloaded = load_model::<B>(&back, &Default::default()).unwrap();
    let ids = back.tokenizer.as_ref().unwrap().encode(PROMPT, false).unwrap();
    let a = last_logits(&model, &ids);
    let b = last_logits(&reloaded, &ids);
    assert_eq!(max_abs_diff(&a, &b), 0.0, "f32 export must be lossless");
}
