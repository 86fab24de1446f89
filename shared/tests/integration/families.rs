//! The model families beyond Llama/Qwen2/Mistral (`shared/src/config/family`)
//! against transformers on tiny random checkpoints
//! (`tests/reference/make_tiny_fixtures.py`): every logit of a 12-token
//! prompt, also through the KV cache (< 1e-4, f32); the MoE layouts that hold
//! each family; unsupported families refused with the supported list.

use moe_shared::checkpoint::{open_model, DType};
use moe_shared::config::{Architecture, HfConfig, RopeScaling};
use moe_shared::layout::LayoutRequest;
use moe_shared::methods::{upcycle, CopyNoise, ExpertCounts, RouterInit, UpcycleOptions};
use moe_shared::model::load_model;

use crate::hf_tiny::{check_logits, fixture, load, tokens, B};

/// Qwen3: per-head q/k RMSNorm (random weights, so a missing or misplaced
/// norm changes every logit), no bias, head_dim 16 != hidden / heads,
/// tied embeddings.
#[test]
fn tiny_qwen3_qk_norm_matches_transformers() {
    let (m, model) = load("tiny-qwen3");
    let c = &m.config;
    assert_eq!(c.architecture, Architecture::Qwen3);
    assert!(!c.attention_bias);
    assert!(c.tie_word_embeddings);
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size), (4, 2, 16, 32));
    assert_eq!((c.rope_theta, &c.rope_scaling), (1e6, &RopeScaling::Default));
    let a = &model.layers[0].self_attn;
    assert!(a.q_norm.is_some() && a.k_norm.is_some() && a.q_proj.bias.is_none());
    assert_eq!(m.source.info("model.layers.1.self_attn.k_norm.weight").unwrap().shape, vec![16]);
    check_logits("tiny-qwen3", &model);
}

/// A transformers-written Qwen3-MoE (q/k norms, experts of width 24 !=
/// intermediate 48, layer 1 dense, `num_local_experts` as transformers 5
/// writes it) reads as the qwen3_moe layout and computes transformers'
/// logits.
#[test]
fn transformers_written_qwen3_moe_reads_exactly() {
    let m = open_model(&fixture("tiny-qwen3-moe")).unwrap();
    assert_eq!(m.layout.map(|l| l.name()), Some("qwen3_moe"));
    assert_eq!(m.config.architecture, Architecture::Qwen3);
    let moe = m.moe.as_ref().unwrap();
    assert!(moe.layers[1].is_none());
    let s = moe.layers[0].as_ref().unwrap();
    assert_eq!((s.num_experts, s.top_k, s.norm_topk_prob), (4, 2, true));
    assert_eq!(s.expert_width(&m.config), 24);
    let model = load_model::<B>(&m, &Default::default()).unwrap();
    check_logits("tiny-qwen3-moe", &model);
}

/// Upcycling a Qwen3 keeps its q/k norms and `auto` writes Qwen3-MoE (the
/// only public layout that holds the family); with zero router and no
/// noise every expert is the dense FFN, so the MoE computes the dense
/// logits. Mixtral and Qwen2-MoE refuse the base naming the q/k norm, and
/// nothing is written.
#[test]
fn qwen3_upcycles_to_qwen3_moe_and_other_layouts_refuse_it() {
    let dense = open_model(&fixture("tiny-qwen3")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = |layout: &str| UpcycleOptions {
        experts: ExpertCounts::Uniform(4),
        top_k: 2,
        router_init: RouterInit::Zeros,
        noise: CopyNoise::NONE,
        dtype: Some(DType::F32),
        layout: LayoutRequest::parse(layout).unwrap(),
        ..Default::default()
    };
    let out = dir.path().join("auto");
    let report = upcycle(dense.source.as_ref(), &dense.config, &opts("auto"), &out, None, Default::default()).unwrap();
    assert_eq!((report.layout, report.layout_reason.as_deref()), ("qwen3_moe", None));
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["architectures"], serde_json::json!(["Qwen3MoeForCausalLM"]));
    let m = open_model(&out).unwrap();
    assert_eq!(m.config, dense.config);
    assert!(m.source.info("model.layers.0.self_attn.q_norm.weight").is_some());
    let moe_model = load_model::<B>(&m, &Default::default()).unwrap();
    let dense_model = load_model::<B>(&dense, &Default::default()).unwrap();
    let ids = [1u32, 5, 17, 42, 3, 88, 60, 7, 19, 2, 33, 71];
    let a: Vec<f32> = moe_model.forward(tokens(&ids), None).into_data().to_vec().unwrap();
    let b: Vec<f32> = dense_model.forward(tokens(&ids), None).into_data().to_vec().unwrap();
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "upcycled qwen3 vs dense: {worst}");
    for layout in ["mixtral", "qwen2_moe"] {
        let o = dir.path().join(layout);
        let e = upcycle(dense.source.as_ref(), &dense.config, &opts(layout), &o, None, Default::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("q_norm") && e.contains(layout), "{layout}: {e}");
        assert!(!o.exists(), "{layout}: something was written");
    }
}

#[test]
fn unsupported_family_is_refused_with_the_supported_list() {
    let json = br#"{"model_type":"gpt_neox","vocab_size":10,"hidden_size":8,"intermediate_size":8,
        "num_hidden_layers":1,"num_attention_heads":2}"#;
    let e = HfConfig::from_json(json, "m/config.json").unwrap().to_model_config("m/config.json").unwrap_err();
    let s = e.to_string();
    for want in ["m/config.json", "gpt_neox", "llama, mistral, qwen2, qwen3", "mixtral", "qwen3_moe"] {
        assert!(s.contains(want), "`{want}` missing from: {s}");
    }
}
