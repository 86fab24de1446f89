//! Tiny random Hugging Face checkpoints (Qwen2, Llama 3 RoPE scaling,
//! Mistral) against transformers: every logit of a 12-token prompt.
//!
//! Covers what the SmolLM2 test does not: q/k/v biases with tied embeddings
//! (Qwen2), `rope_scaling` llama3 with an untied `lm_head`, a `head_dim`
//! larger than `hidden / heads`, bf16 storage in a sharded checkpoint
//! (`model.safetensors.index.json`), and f16 storage (Mistral); the configs
//! are the transformers 5 form (`rope_parameters` with `rope_theta` inside).
//!
//! Fixtures and golden logits come from `tests/reference/make_tiny_fixtures.py`
//! (transformers float32, eager attention, weights read back from the saved
//! files so the bf16/f16 rounding is included) and are committed.

use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::{open_model, LoadedModel, ModelFormat};
use moe_shared::config::{Architecture, RopeScaling};
use moe_shared::model::{load_model, Transformer};
use moe_shared::tensor_io::DType;
use moe_shared::CpuBackend;

pub(crate) type B = CpuBackend;

pub(crate) const TOL: f32 = 1e-4;

pub(crate) fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures")).join(name)
}

pub(crate) fn golden(name: &str) -> (Vec<u32>, Vec<Vec<f32>>) {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/golden/tiny_fixtures.json");
    let g: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    let e = &g[name];
    let ids = e["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let logits = e["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect())
        .collect();
    (ids, logits)
}

pub(crate) fn tokens(ids: &[u32]) -> Tensor<B, 2, Int> {
    let v: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
    let n = v.len();
    Tensor::from_data(TensorData::new(v, [1, n]), &Default::default())
}

/// Max |ours - golden| of `[1, s, V]` logits against golden rows `first..first + s`.
pub(crate) fn max_diff(logits: Tensor<B, 3>, golden: &[Vec<f32>], first: usize) -> f32 {
    let [b, s, v] = logits.dims();
    assert_eq!(b, 1);
    let ours: Vec<f32> = logits.into_data().to_vec().unwrap();
    let mut worst = 0f32;
    for p in 0..s {
        let g = &golden[first + p];
        assert_eq!(g.len(), v);
        for (x, y) in ours[p * v..(p + 1) * v].iter().zip(g) {
            assert!(x.is_finite(), "non-finite logit at position {}", first + p);
            worst = worst.max((x - y).abs());
        }
    }
    worst
}

pub(crate) fn load(name: &str) -> (LoadedModel, Transformer<B>) {
    let m = open_model(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(m.format, ModelFormat::Safetensors);
    assert!(m.moe.is_none());
    let model = load_model::<B>(&m, &Default::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    (m, model)
}

/// Full-prompt logits, then the same prompt split 7 + 5 through the KV cache
/// (RoPE at an offset, cached keys); both against transformers.
pub(crate) fn check_logits(name: &str, model: &Transformer<B>) {
    let (ids, golden) = golden(name);
    assert_eq!(ids.len(), 12);
    assert_eq!(golden.len(), 12);
    let full = max_diff(model.forward(tokens(&ids), None), &golden, 0);
    let mut cache = model.new_cache();
    let a = max_diff(model.forward(tokens(&ids[..7]), Some(&mut cache)), &golden, 0);
    let b = max_diff(model.forward(tokens(&ids[7..]), Some(&mut cache)), &golden, 7);
    let cached = a.max(b);
    eprintln!("{name}: max |ours - transformers| over 12x96 logits = {full:e} (KV cache 7+5: {cached:e})");
    assert!(full < TOL, "{name}: max abs diff {full}");
    assert!(cached < TOL, "{name}: max abs diff with the KV cache {cached}");
}

fn dtype(m: &LoadedModel, tensor: &str) -> DType {
    m.source.info(tensor).unwrap_or_else(|| panic!("missing {tensor}")).dtype
}

#[test]
fn tiny_qwen2_biases_tied_f32() {
    let (m, model) = load("tiny-qwen2");
    let c = &m.config;
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.attention_bias);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.rope_theta, 10000.0);
    assert_eq!(c.rope_scaling, RopeScaling::Default);
    assert_eq!((c.vocab_size, c.hidden_size, c.intermediate_size), (96, 32, 48));
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (2, 4, 2, 8));
    assert_eq!(c.max_position_embeddings, 256);
    assert_eq!((c.bos_token_id, c.eos_token_id), (Some(1), Some(2)));
    assert!(m.source.info("lm_head.weight").is_none(), "tied: no lm_head in the file");
    assert!(model.lm_head.is_none());
    assert_eq!(dtype(&m, "model.layers.0.self_attn.q_proj.bias"), DType::F32);
    assert_eq!(dtype(&m, "model.embed_tokens.weight"), DType::F32);
    assert!(model.layers[1].self_attn.k_proj.bias.is_some());
    check_logits("tiny-qwen2", &model);
}

#[test]
fn tiny_llama3_rope_scaling_untied_bf16_sharded() {
    let dir = fixture("tiny-llama3");
    assert!(dir.join("model.safetensors.index.json").exists());
    let shards = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".safetensors"))
        .count();
    assert!(shards > 1, "{shards} shard(s)");
    let (m, model) = load("tiny-llama3");
    let c = &m.config;
    assert_eq!(c.architecture, Architecture::Llama);
    assert!(!c.attention_bias);
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.rope_theta, 500000.0);
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64
        }
    );
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, 16));
    for t in ["model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight"]
    {
        assert_eq!(dtype(&m, t), DType::BF16, "{t}");
    }
    assert!(model.lm_head.is_some());
    assert!(model.layers[0].self_attn.q_proj.bias.is_none());
    check_logits("tiny-llama3", &model);
}

#[test]
fn tiny_mistral_untied_f16() {
    let (m, model) = load("tiny-mistral");
    let c = &m.config;
    assert_eq!(c.architecture, Architecture::Mistral);
    assert!(!c.attention_bias);
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.rope_theta, 10000.0);
    assert_eq!(c.rope_scaling, RopeScaling::Default);
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, 8));
    for t in ["model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.v_proj.weight"] {
        assert_eq!(dtype(&m, t), DType::F16, "{t}");
    }
    assert!(model.lm_head.is_some());
    check_logits("tiny-mistral", &model);
}
