//! GGUF files of the model families against their safetensors originals
//! and transformers: the same logits (12 tokens, also through the KV
//! cache). Fixtures: `tests/reference/make_gguf_fixtures.py` (llama.cpp's
//! `convert_hf_to_gguf.py` naming, q/k permutation and extra tensors,
//! written with the `gguf` package) from the tiny transformers checkpoints
//! of `make_tiny_fixtures.py`.

use moe_shared::checkpoint::{open_model, ModelFormat};
use moe_shared::config::RopeScaling;
use moe_shared::model::load_model;

use crate::hf_tiny::{check_logits, fixture, load, tokens, B};

/// Llama 3.x GGUF: the Llama 3.1 RoPE scaling arrives as llama.cpp's
/// `rope_freqs.weight` divisors (no `rope.scaling.*` keys) and is read back
/// as the `llama3` setting of the original's `config.json`; the logits
/// equal the original's (same weights: the fixture's bf16 values in F32).
#[test]
fn llama3_gguf_rope_freqs_matches_safetensors() {
    let path = fixture("tiny-llama3.gguf");
    let g = open_model(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(g.format, ModelFormat::Gguf);
    assert!(g.source.info("rope_freqs.weight").is_some(), "the fixture carries rope_freqs");
    let (st, st_model) = load("tiny-llama3");
    assert_eq!(
        g.config.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64
        }
    );
    // Same configuration but for the epsilon, which GGUF stores as f32.
    let mut want = st.config.clone();
    want.rms_norm_eps = g.config.rms_norm_eps;
    assert!((g.config.rms_norm_eps - 1e-6).abs() < 1e-12);
    assert_eq!(g.config, want);
    let model = load_model::<B>(&g, &Default::default()).unwrap();
    let ids = [1u32, 5, 17, 42, 3, 88, 60, 7, 19, 2, 33, 71];
    let a: Vec<f32> = model.forward(tokens(&ids), None).into_data().to_vec().unwrap();
    let b: Vec<f32> = st_model.forward(tokens(&ids), None).into_data().to_vec().unwrap();
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    eprintln!("tiny-llama3.gguf vs safetensors: max |diff| = {worst:e}");
    assert!(worst < 1e-5, "GGUF and safetensors logits differ by {worst}");
    check_logits("tiny-llama3", &model);
}

/// Qwen3 GGUF (llama.cpp `qwen3`: `blk.N.attn_{q,k}_norm.weight`, q/k rows
/// not permuted, tied): the same configuration and logits as the
/// safetensors original and transformers.
#[test]
fn qwen3_gguf_matches_safetensors() {
    let g = open_model(&fixture("tiny-qwen3.gguf")).unwrap();
    assert_eq!(g.format, ModelFormat::Gguf);
    let (st, st_model) = load("tiny-qwen3");
    let mut want = st.config.clone();
    want.rms_norm_eps = g.config.rms_norm_eps;
    assert_eq!(g.config, want);
    let model = load_model::<B>(&g, &Default::default()).unwrap();
    let ids = [1u32, 5, 17, 42, 3, 88, 60, 7, 19, 2, 33, 71];
    let a: Vec<f32> = model.forward(tokens(&ids), None).into_data().to_vec().unwrap();
    let b: Vec<f32> = st_model.forward(tokens(&ids), None).into_data().to_vec().unwrap();
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "GGUF and safetensors logits differ by {worst}");
    check_logits("tiny-qwen3", &model);
}
