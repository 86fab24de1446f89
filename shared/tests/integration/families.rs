//! The model families beyond Llama/Qwen2/Mistral (`shared/src/config/family`)
//! against transformers on tiny random checkpoints
//! (`tests/reference/make_tiny_fixtures.py`): every logit of a 12-token
//! prompt, also through the KV cache (< 1e-4, f32); the MoE layouts that hold
//! each family; unsupported families refused with the supported list.

use moe_shared::checkpoint::open_model;
use moe_shared::config::{Architecture, HfConfig, RopeScaling};
use moe_shared::layout::LayoutRequest;
use moe_shared::methods::{upcycle, CopyNoise, ExpertCounts, RouterInit, UpcycleOptions};
use moe_shared::model::load_model;
use moe_shared::tensor_io::DType;

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

/// Max |a - b| of two logit tensors.
fn worst(a: burn::tensor::Tensor<B, 3>, b: burn::tensor::Tensor<B, 3>) -> f32 {
    let a: Vec<f32> = a.into_data().to_vec().unwrap();
    let b: Vec<f32> = b.into_data().to_vec().unwrap();
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

const IDS: [u32; 12] = [1, 5, 17, 42, 3, 88, 60, 7, 19, 2, 33, 71];

/// Gemma 2: GeGLU, (1 + w) sandwich norms, sqrt(d) embedding scale,
/// query_pre_attn_scalar, attention and final soft-caps, layer 0 with a
/// sliding window of 4 over the 12-token prompt. Each feature is load-bearing:
/// turning the window or the soft-caps off moves the logits away from
/// transformers'.
#[test]
fn tiny_gemma2_matches_transformers() {
    use moe_shared::config::family::{GateActivation, LayerType};
    let (m, mut model) = load("tiny-gemma2");
    let c = &m.config;
    assert_eq!(c.architecture, Architecture::Gemma2);
    assert_eq!(c.architecture.family().activation, GateActivation::GeluTanh);
    let p = &c.family_params;
    assert_eq!(p.query_pre_attn_scalar, Some(12.0));
    assert_eq!((p.attn_logit_softcapping, p.final_logit_softcapping), (Some(2.0), Some(3.0)));
    assert_eq!(p.sliding_window, Some(4));
    assert_eq!(p.layer_types, vec![LayerType::SlidingAttention, LayerType::FullAttention]);
    assert_eq!(model.layers[0].self_attn.sliding_window, Some(4));
    assert_eq!(model.layers[1].self_attn.sliding_window, None);
    check_logits("tiny-gemma2", &model);
    let reference = model.forward(tokens(&IDS), None);
    model.layers[0].self_attn.sliding_window = None;
    let no_window = worst(model.forward(tokens(&IDS), None), reference.clone());
    model.layers[0].self_attn.sliding_window = Some(4);
    model.layers.iter_mut().for_each(|b| b.self_attn.softcap = None);
    let no_cap = worst(model.forward(tokens(&IDS), None), reference);
    eprintln!("tiny-gemma2: without the window the logits move {no_window:e}, without the score soft-cap {no_cap:e}");
    assert!(no_window > 1e-2 && no_cap > 1e-2, "{no_window} {no_cap}");
}

/// Gemma 3 text: (1 + w) q/k norms, sliding layer 0 (window 4, RoPE base
/// 1e4) and global layer 1 (RoPE base 1e6, linear factor 2), bf16 storage.
#[test]
fn tiny_gemma3_matches_transformers() {
    let (m, model) = load("tiny-gemma3");
    let c = &m.config;
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!((c.rope_theta, &c.rope_scaling), (1e6, &RopeScaling::Linear { factor: 2.0 }));
    assert_eq!(c.family_params.rope_local_theta, Some(10000.0));
    assert_eq!((c.family_params.attn_logit_softcapping, c.family_params.final_logit_softcapping), (None, None));
    assert!(model.rope_local.is_some() && model.layers[0].self_attn.q_norm.is_some());
    check_logits("tiny-gemma3", &model);
}

/// The Gemma config reads back from the `config.json` the studio writes for
/// it (dense export, and the studio MoE layout's base).
#[test]
fn gemma_configs_round_trip_through_config_json() {
    for name in ["tiny-gemma2", "tiny-gemma3"] {
        let m = open_model(&fixture(name)).unwrap();
        let v = m.config.to_config_json(None);
        let back =
            HfConfig::from_json(&serde_json::to_vec(&v).unwrap(), "out").unwrap().to_model_config("out").unwrap();
        assert_eq!(back, m.config, "{name}: {v}");
    }
}

/// Upcycling a Gemma keeps its GeGLU as the expert type; no public MoE
/// layout holds Gemma's blocks, so `auto` writes the studio layout and says
/// why; with no noise and a zero router the MoE computes the dense logits
/// (reads back through the studio layout with every Gemma norm).
#[test]
fn gemma_upcycles_to_the_studio_layout_with_geglu_experts() {
    use moe_shared::config::family::GateActivation;
    use moe_shared::model::Mlp;
    for name in ["tiny-gemma2", "tiny-gemma3"] {
        let dense = open_model(&fixture(name)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("moe");
        let opts = UpcycleOptions {
            experts: ExpertCounts::Uniform(4),
            top_k: 2,
            router_init: RouterInit::Zeros,
            noise: CopyNoise::NONE,
            dtype: Some(DType::F32),
            ..Default::default()
        };
        let report = upcycle(dense.source.as_ref(), &dense.config, &opts, &out, None, Default::default()).unwrap();
        assert_eq!(report.layout, "moe_studio", "{name}");
        let why = report.layout_reason.clone().unwrap_or_default();
        assert!(why.contains("GeGLU"), "{name}: {why}");
        let m = open_model(&out).unwrap();
        assert_eq!(m.config, dense.config, "{name}");
        let moe_model = load_model::<B>(&m, &Default::default()).unwrap();
        match &moe_model.layers[0].mlp {
            Mlp::Moe(l) => assert!(l.experts.iter().all(|e| e.activation == GateActivation::GeluTanh)),
            Mlp::Dense(_) => panic!("{name}: layer 0 is dense"),
        }
        let dense_model = load_model::<B>(&dense, &Default::default()).unwrap();
        let d = worst(moe_model.forward(tokens(&IDS), None), dense_model.forward(tokens(&IDS), None));
        assert!(d < 1e-5, "{name}: upcycled vs dense {d}");
    }
}

/// Phi-3: fused `qkv_proj` / `gate_up_proj` split on read, LongRoPE (short
/// factors and the attention factor for a 12-token prompt under the
/// original 64), sliding window 6 on every layer; the dense export fuses the
/// projections again: the same tensors, bit for bit, as transformers wrote.
#[test]
fn tiny_phi3_fused_longrope_matches_transformers_and_fuses_on_write() {
    use moe_shared::checkpoint::export::export_dense;
    use moe_shared::tensor_io::safetensors_io::SafetensorsModel;
    use moe_shared::tensor_io::TensorSource;
    let (m, model) = load("tiny-phi3");
    let c = &m.config;
    assert_eq!(c.architecture, Architecture::Phi3);
    match &c.rope_scaling {
        RopeScaling::LongRope { short_factor, original_max_position_embeddings, attention_factor, .. } => {
            assert_eq!(short_factor, &vec![1.0, 1.5, 2.0, 3.0]);
            assert_eq!(*original_max_position_embeddings, 64);
            let want = (1.0 + 4f64.ln() / 64f64.ln()).sqrt();
            assert!((attention_factor - want).abs() < 1e-12, "{attention_factor}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.family_params.window_of(1), Some(6));
    assert!(m.source.info("model.layers.0.self_attn.qkv_proj.weight").is_none());
    assert_eq!(m.source.info("model.layers.0.self_attn.k_proj.weight").unwrap().shape, vec![16, 32]);
    assert_eq!(m.source.info("model.layers.1.mlp.up_proj.weight").unwrap().shape, vec![48, 32]);
    check_logits("tiny-phi3", &model);

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("phi3");
    export_dense(m.source.as_ref(), c, &out, None, None, Default::default()).unwrap();
    let ours = SafetensorsModel::open_dir(&out).unwrap();
    let theirs = SafetensorsModel::open_dir(&fixture("tiny-phi3")).unwrap();
    let mut a: Vec<String> = ours.tensors().into_iter().map(|t| t.name).collect();
    let mut b: Vec<String> = theirs.tensors().into_iter().map(|t| t.name).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    for n in &b {
        assert_eq!(ours.read_f32(n).unwrap(), theirs.read_f32(n).unwrap(), "{n}");
    }
    let back = open_model(&out).unwrap();
    assert_eq!(back.config, m.config);
}

/// `init-random` for every family the studio reads (issue 37): the random
/// model's tensors are exactly the names and shapes of the tiny fixture
/// transformers wrote for that family (Phi-3's fused tensors split as the
/// reader splits them), their count is `num_parameters`, the model builds
/// and gives finite logits, and a unit RMSNorm gain is stored as the family
/// needs it (0 under Gemma's `(1 + w)`, else 1). Every family of the
/// registry is covered.
#[test]
fn random_init_builds_every_family_with_the_fixture_tensors() {
    use moe_shared::model::init::{random_dense_model, RandomInit};
    use moe_shared::tensor_io::TensorSource;
    let mut seen = std::collections::BTreeSet::new();
    for name in ["tiny-llama3", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3", "tiny-phi3"] {
        let m = open_model(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let c = &m.config;
        seen.insert(c.architecture.model_type());
        let src = RandomInit::new(c, 0.02, 1).unwrap();
        let tied = |n: &str| c.tie_word_embeddings && n == "lm_head.weight";
        let mut want: Vec<(String, Vec<usize>)> =
            m.source.tensors().into_iter().filter(|t| !tied(&t.name)).map(|t| (t.name, t.shape)).collect();
        let mut got: Vec<(String, Vec<usize>)> = src.tensors().into_iter().map(|t| (t.name, t.shape)).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{name}: the random model's tensors against transformers' fixture");
        let n: usize = src.tensors().iter().map(|t| t.numel()).sum();
        assert_eq!(n, c.num_parameters(), "{name}");
        let unit = if c.architecture.family().norm_plus_one { 0.0 } else { 1.0 };
        assert!(src.read_f32("model.norm.weight").unwrap().iter().all(|&x| x == unit), "{name}");
        let model = random_dense_model::<B>(c, 0.02, 1, &Default::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let logits = model.forward(tokens(&IDS), None).into_data().to_vec::<f32>().unwrap();
        assert_eq!(logits.len(), IDS.len() * c.vocab_size, "{name}");
        assert!(logits.iter().all(|x| x.is_finite()), "{name}: non-finite logits");
    }
    let all: std::collections::BTreeSet<&str> =
        moe_shared::config::family::FAMILIES.iter().map(|f| f.model_type).collect();
    assert_eq!(seen, all, "a family without a random-init check");
}
