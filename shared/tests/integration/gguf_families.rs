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

/// Logits of `g` against the safetensors model `st` (12 tokens, longer than
/// every fixture's sliding window), max |diff|.
fn gguf_vs_safetensors(g: &moe_shared::checkpoint::LoadedModel, st: &moe_shared::checkpoint::LoadedModel) -> f32 {
    let a_model = load_model::<B>(g, &Default::default()).unwrap();
    let b_model = load_model::<B>(st, &Default::default()).unwrap();
    let ids = [1u32, 5, 17, 42, 3, 88, 60, 7, 19, 2, 33, 71];
    let a: Vec<f32> = a_model.forward(tokens(&ids), None).into_data().to_vec().unwrap();
    let b: Vec<f32> = b_model.forward(tokens(&ids), None).into_data().to_vec().unwrap();
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

/// Gemma 2 / 3 GGUF (llama.cpp `gemma2` / `gemma3`: norms stored as 1 + w,
/// the sandwich norms renamed, soft-caps and window as keys): the
/// configuration equals the original's but for what GGUF does not carry
/// and llama.cpp derives — `query_pre_attn_scalar` (= head_dim, the fixture
/// has 12) and, for Gemma 3, the layer pattern (five sliding to one global:
/// both of the fixture's two layers slide) — and with those two values set
/// so on the original, the logits agree.
#[test]
fn gemma_gguf_matches_safetensors_with_llamacpp_defaults() {
    use moe_shared::config::family::LayerType;
    for (name, pattern) in [
        ("tiny-gemma2", vec![LayerType::SlidingAttention, LayerType::FullAttention]),
        ("tiny-gemma3", vec![LayerType::SlidingAttention, LayerType::SlidingAttention]),
    ] {
        let g = open_model(&fixture(&format!("{name}.gguf"))).unwrap_or_else(|e| panic!("{name}.gguf: {e}"));
        assert_eq!(g.format, ModelFormat::Gguf);
        let mut st = open_model(&fixture(name)).unwrap();
        assert_eq!(st.config.family_params.query_pre_attn_scalar, Some(12.0));
        let mut want = st.config.clone();
        want.rms_norm_eps = g.config.rms_norm_eps;
        want.family_params.query_pre_attn_scalar = Some(16.0);
        want.family_params.layer_types = pattern;
        assert_eq!(g.config, want, "{name}");
        // The stored 1 + w reads back as w: what the model holds, 1 + w,
        // is bit for bit the original's.
        let norm = "model.layers.0.pre_feedforward_layernorm.weight";
        let plus_one = |v: Vec<f32>| v.into_iter().map(|x| x + 1.0).collect::<Vec<_>>();
        assert_eq!(
            plus_one(g.source.read_f32(norm).unwrap()),
            plus_one(st.source.read_f32(norm).unwrap()),
            "{name}: {norm}"
        );
        st.config = want;
        let worst = gguf_vs_safetensors(&g, &st);
        eprintln!("{name}.gguf vs safetensors (llama.cpp's derived values): max |diff| = {worst:e}");
        assert!(worst < 1e-5, "{name}: GGUF and safetensors logits differ by {worst}");
    }
}

/// Phi-3 GGUF (llama.cpp `phi3`: fused `attn_qkv` / `ffn_up`, LongRoPE as
/// `rope_factors_{short,long}.weight` + original context + attention
/// factor): the same configuration, split tensors and logits as the
/// safetensors original (which transformers' golden checks in
/// `families.rs`).
#[test]
fn phi3_gguf_fused_longrope_matches_safetensors() {
    let g = open_model(&fixture("tiny-phi3.gguf")).unwrap();
    assert_eq!(g.format, ModelFormat::Gguf);
    let st = open_model(&fixture("tiny-phi3")).unwrap();
    let mut want = st.config.clone();
    want.rms_norm_eps = g.config.rms_norm_eps;
    // The attention factor travels as f32.
    if let (RopeScaling::LongRope { attention_factor: a, .. }, RopeScaling::LongRope { attention_factor: b, .. }) =
        (&mut want.rope_scaling, &g.config.rope_scaling)
    {
        assert!((*a - b).abs() < 1e-6, "attention factor {a} vs {b}");
        *a = *b;
    }
    assert_eq!(g.config, want);
    for t in ["model.layers.1.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight"] {
        assert_eq!(g.source.read_f32(t).unwrap(), st.source.read_f32(t).unwrap(), "{t}");
    }
    let worst = gguf_vs_safetensors(&g, &st);
    eprintln!("tiny-phi3.gguf vs safetensors: max |diff| = {worst:e}");
    assert!(worst < 1e-5, "GGUF and safetensors logits differ by {worst}");
    check_logits("tiny-phi3", &load_model::<B>(&g, &Default::default()).unwrap());
}

/// `convert --to gguf` of a Llama 3.1-scaled model (`write_gguf`, what the
/// CLI calls) writes llama.cpp's `rope_freqs.weight` divisors (the same
/// values the converter writes into `tiny-llama3.gguf`) and no
/// `rope.scaling.*` keys; reading the file back gives the same `llama3`
/// setting and logits.
#[test]
fn llama3_scaled_model_round_trips_through_the_gguf_writer() {
    use moe_shared::checkpoint::gguf_write::write_gguf;
    use moe_shared::tensor_io::DType;
    let dir = tempfile::tempdir().unwrap();
    let (st, st_model) = load("tiny-llama3");
    let out = dir.path().join("llama3.gguf");
    write_gguf(st.source.as_ref(), &st.config, None, DType::F32, vec![], &out).unwrap();
    let g = open_model(&out).unwrap();
    let ours = g.source.read_f32("rope_freqs.weight").unwrap();
    let converter = open_model(&fixture("tiny-llama3.gguf")).unwrap().source.read_f32("rope_freqs.weight").unwrap();
    // The converter computes them in torch float32, the writer in f64.
    assert_eq!(ours.len(), converter.len());
    for (a, b) in ours.iter().zip(&converter) {
        assert!((a - b).abs() <= 1e-6 * b, "rope_freqs {ours:?} vs llama.cpp's converter's {converter:?}");
    }
    let raw = moe_shared::checkpoint::gguf::open(
        moe_shared::tensor_io::Bytes::map_file(&out).unwrap(),
        &out.display().to_string(),
    )
    .unwrap();
    assert!(raw.file.get("llama.rope.scaling.type").is_none());
    let mut want = st.config.clone();
    want.rms_norm_eps = g.config.rms_norm_eps;
    // BOS/EOS travel with the tokenizer metadata; none is given here.
    (want.bos_token_id, want.eos_token_id) = (None, None);
    assert_eq!(g.config, want);
    let model = load_model::<B>(&g, &Default::default()).unwrap();
    let ids = [1u32, 5, 17, 42, 3, 88, 60, 7, 19, 2, 33, 71];
    let a: Vec<f32> = model.forward(tokens(&ids), None).into_data().to_vec().unwrap();
    let b: Vec<f32> = st_model.forward(tokens(&ids), None).into_data().to_vec().unwrap();
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    eprintln!("tiny-llama3 -> write_gguf -> read: max |diff| = {worst:e}");
    assert!(worst < 1e-5, "{worst}");
}
