//! Random initialisation of a dense model of any family the studio reads
//! from its configuration alone, as transformers'
//! `PreTrainedModel.from_config` does (`_init_weights` of
//! `modeling_llama.py`, `modeling_gemma2.py`, ..., transformers 4.x/5.x):
//! every linear and embedding weight drawn from `N(0, std^2)` with
//! `std = config.initializer_range` (0.02 by default), RMSNorm gains 1 —
//! stored as 0 in the families whose norms scale by `(1 + w)` (Gemma) —,
//! biases 0. The tensors are the dense plan
//! ([`crate::checkpoint::plan::dense_tensor_plan`]).
//!
//! The values come from [`NormalRng`]: each tensor's generator is seeded
//! from `(seed, tensor name)`, so a tensor does not depend on the order the
//! loader reads tensors in (equal to transformers' in distribution, not in
//! the random stream). Used by `moe-studio init-random` (benchmarks on
//! machines without model files; the fetched teaching preset's base model,
//! trained from scratch).

use crate::checkpoint::plan::dense_tensor_plan;
use crate::config::ModelConfig;
use crate::error::{Result, StudioError};
use crate::model::{load_transformer, Transformer};
use crate::rng::NormalRng;
use crate::tensor_io::{DType, TensorInfo, TensorSource};

/// transformers' `initializer_range` default for Llama (`LlamaConfig`).
pub const DEFAULT_INITIALIZER_RANGE: f64 = 0.02;

/// A [`TensorSource`] of randomly initialised weights for a dense model
/// (see the module docs for the distribution).
pub struct RandomInit {
    tensors: Vec<TensorInfo>,
    std: f64,
    seed: u64,
    /// The stored RMSNorm weight of a unit gain: 1, or 0 where the norm
    /// multiplies by `(1 + w)` ([`crate::config::family::Family::norm_plus_one`]).
    unit_norm: f32,
}

impl RandomInit {
    /// The weights of a dense model of `config`: linear and embedding
    /// weights `N(0, std^2)` under `seed`, RMSNorm gains 1, biases 0.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] when `std` is not finite and positive.
    pub fn new(config: &ModelConfig, std: f64, seed: u64) -> Result<Self> {
        if !(std.is_finite() && std > 0.0) {
            return Err(StudioError::Invalid(format!(
                "random initialisation: the standard deviation must be finite and > 0, got {std}"
            )));
        }
        let tensors = dense_tensor_plan(config)
            .into_iter()
            .map(|(name, shape)| TensorInfo { name, dtype: DType::F32, shape })
            .collect();
        let unit_norm = if config.architecture.family().norm_plus_one { 0.0 } else { 1.0 };
        Ok(RandomInit { tensors, std, seed, unit_norm })
    }
}

impl TensorSource for RandomInit {
    fn source_name(&self) -> &str {
        "random initialisation"
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.tensors.clone()
    }

    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| StudioError::tensor("random initialisation", name, "not a tensor of this model"))?;
        let n = info.numel();
        if name.ends_with("norm.weight") {
            return Ok(vec![self.unit_norm; n]);
        }
        if name.ends_with(".bias") {
            return Ok(vec![0.0; n]);
        }
        let mut rng = NormalRng::for_tensor(self.seed, name);
        Ok((0..n).map(|_| (rng.next_normal() * self.std) as f32).collect())
    }
}

/// A dense model of `config` with random weights ([`RandomInit`]): the
/// starting point of a model trained from scratch.
///
/// # Errors
/// A `std` that is not finite and positive; a config the model cannot be
/// built from (as [`load_transformer`]).
pub fn random_dense_model<B: burn::tensor::backend::Backend>(
    config: &ModelConfig,
    std: f64,
    seed: u64,
    device: &B::Device,
) -> Result<Transformer<B>> {
    load_transformer::<B>(config, None, &RandomInit::new(config, std, seed)?, device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HfConfig;

    fn tiny() -> ModelConfig {
        let json = br#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 172,
            "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
            "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": true}"#;
        HfConfig::from_json(json, "tiny config.json").unwrap().to_model_config("tiny config.json").unwrap()
    }

    #[test]
    fn weights_follow_the_requested_normal_and_norms_are_one() {
        let c = tiny();
        let src = RandomInit::new(&c, 0.02, 7).unwrap();
        let names: Vec<String> = src.tensors().into_iter().map(|t| t.name).collect();
        // 1 embedding + 2 x (2 norms + 4 attention + 3 MLP) + final norm; tied head.
        assert_eq!(names.len(), 1 + 2 * 9 + 1);
        assert!(!names.iter().any(|n| n == "lm_head.weight"));
        let e = src.read_f32("model.embed_tokens.weight").unwrap();
        assert_eq!(e.len(), 512 * 64);
        let n = e.len() as f64;
        let mean = e.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let sd = (e.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 0.02 * 0.03, "mean {mean}");
        assert!((sd / 0.02 - 1.0).abs() < 0.02, "std {sd}");
        assert!(src.read_f32("model.layers.1.input_layernorm.weight").unwrap().iter().all(|&x| x == 1.0));
        assert!(src.read_f32("model.norm.weight").unwrap().iter().all(|&x| x == 1.0));
        // The same (seed, name) gives the same values; another seed others.
        let again = RandomInit::new(&c, 0.02, 7).unwrap().read_f32("model.embed_tokens.weight").unwrap();
        assert_eq!(e, again);
        let other = RandomInit::new(&c, 0.02, 8).unwrap().read_f32("model.embed_tokens.weight").unwrap();
        assert_ne!(e, other);
        assert!(src.read_f32("model.layers.9.mlp.up_proj.weight").is_err());
    }

    /// stories260K's shape (llama2.c's 260K model; the fetched teaching
    /// preset's scratch260K), untied and with q/k/v biases when asked.
    fn s260k(untied_qwen2: bool) -> ModelConfig {
        let (ty, tie) = if untied_qwen2 { ("qwen2", "false") } else { ("llama", "true") };
        let json = format!(
            r#"{{"model_type": "{ty}", "hidden_size": 64, "intermediate_size": 172,
            "num_hidden_layers": 5, "num_attention_heads": 8, "num_key_value_heads": 4,
            "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": {tie}}}"#
        );
        HfConfig::from_json(json.as_bytes(), "260K config.json").unwrap().to_model_config("260K config.json").unwrap()
    }

    #[test]
    fn tensors_have_the_configs_shapes() {
        let c = s260k(false);
        let infos = RandomInit::new(&c, 0.02, 0).unwrap().tensors();
        let shape = |n: &str| infos.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n}")).shape.clone();
        assert_eq!(shape("model.embed_tokens.weight"), [512, 64]);
        assert_eq!(shape("model.layers.4.self_attn.q_proj.weight"), [64, 64]); // 8 heads x 8
        assert_eq!(shape("model.layers.4.self_attn.k_proj.weight"), [32, 64]); // 4 kv heads x 8
        assert_eq!(shape("model.layers.0.self_attn.v_proj.weight"), [32, 64]);
        assert_eq!(shape("model.layers.0.self_attn.o_proj.weight"), [64, 64]);
        assert_eq!(shape("model.layers.2.mlp.gate_proj.weight"), [172, 64]);
        assert_eq!(shape("model.layers.2.mlp.up_proj.weight"), [172, 64]);
        assert_eq!(shape("model.layers.2.mlp.down_proj.weight"), [64, 172]);
        assert_eq!(shape("model.layers.3.post_attention_layernorm.weight"), [64]);
        assert_eq!(shape("model.norm.weight"), [64]);
        assert!(infos.iter().all(|t| t.dtype == DType::F32));
        // 512x64 embedding + 5 x (2x64 norms + 64x64 q + 2 x 32x64 k/v +
        // 64x64 o + 3 x 172x64 MLP) + 64 final norm = 260,032: "260K".
        let total: usize = infos.iter().map(TensorInfo::numel).sum();
        assert_eq!(total, 260_032);
        assert_eq!(total, c.num_parameters());
        // Untied Qwen2: an lm_head and q/k/v biases (zeros) too.
        let q = s260k(true);
        let infos = RandomInit::new(&q, 0.02, 0).unwrap().tensors();
        let shape = |n: &str| infos.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n}")).shape.clone();
        assert_eq!(shape("lm_head.weight"), [512, 64]);
        assert_eq!(shape("model.layers.1.self_attn.q_proj.bias"), [64]);
        assert_eq!(shape("model.layers.1.self_attn.k_proj.bias"), [32]);
        let total: usize = infos.iter().map(TensorInfo::numel).sum();
        assert_eq!(total, 260_032 + 512 * 64 + 5 * (64 + 2 * 32));
        assert_eq!(total, q.num_parameters());
        let src = RandomInit::new(&q, 0.02, 0).unwrap();
        assert!(src.read_f32("model.layers.1.self_attn.v_proj.bias").unwrap().iter().all(|&x| x == 0.0));
        assert_eq!(src.read_f32("lm_head.weight").unwrap().len(), 512 * 64);
    }

    #[test]
    fn the_model_is_seeded_deterministic_and_holds_the_drawn_weights() {
        use burn::tensor::{Int, Tensor};
        let c = s260k(false);
        let dev = Default::default();
        let tokens = || Tensor::<crate::CpuBackend, 2, Int>::from_ints([[1, 2, 3, 4]], &dev);
        let logits = |seed| {
            let m = random_dense_model::<crate::CpuBackend>(&c, 0.02, seed, &dev).unwrap();
            let l = m.forward(tokens(), None);
            assert_eq!(l.dims(), [1, 4, 512]);
            (m, l.into_data().to_vec::<f32>().unwrap())
        };
        let (m, a) = logits(3);
        let (_, b) = logits(3);
        let (_, other) = logits(4);
        assert_eq!(a, b, "the same seed gives bit-identical logits");
        assert_ne!(a, other, "another seed gives other weights");
        assert!(a.iter().all(|x| x.is_finite()));
        // The model holds exactly what RandomInit draws.
        let src = RandomInit::new(&c, 0.02, 3).unwrap();
        let embed = m.embed_tokens.weight.val().into_data().to_vec::<f32>().unwrap();
        assert_eq!(embed, src.read_f32("model.embed_tokens.weight").unwrap());
        // Tensors draw from their own streams: layer 0's q_proj is not layer 1's.
        assert_ne!(
            src.read_f32("model.layers.0.self_attn.q_proj.weight").unwrap(),
            src.read_f32("model.layers.1.self_attn.q_proj.weight").unwrap()
        );
    }

    /// Every dense family the studio reads (issue 37): the random model's
    /// tensors are exactly the names and shapes transformers 5.24 wrote for
    /// the same config (the tiny fixtures of
    /// tests/reference/make_tiny_fixtures.py: `save_pretrained` of a
    /// randomly initialised `*ForCausalLM`), the model builds and runs, and
    /// what `save_model` writes from it opens again as that family with that
    /// config (the open-time checks of a checkpoint against its config).
    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn every_family_s_random_model_has_the_tensors_transformers_writes() {
        use burn::tensor::{Int, Tensor};
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        let families = [
            ("tiny-llama3", "llama"),
            ("tiny-mistral", "mistral"),
            ("tiny-qwen2", "qwen2"),
            ("tiny-qwen3", "qwen3"),
            ("tiny-gemma2", "gemma2"),
            ("tiny-gemma3", "gemma3_text"),
            ("tiny-phi3", "phi3"),
        ];
        let dev = Default::default();
        for (fixture, model_type) in families {
            let m = crate::checkpoint::open_model(&root.join(fixture)).unwrap_or_else(|e| panic!("{fixture}: {e}"));
            assert_eq!(m.config.architecture.family().model_type, model_type, "{fixture}");
            let sorted = |infos: Vec<TensorInfo>| {
                let mut v: Vec<(String, Vec<usize>)> = infos.into_iter().map(|t| (t.name, t.shape)).collect();
                v.sort();
                v
            };
            let src = RandomInit::new(&m.config, 0.02, 5).unwrap();
            assert_eq!(sorted(src.tensors()), sorted(m.source.tensors()), "{fixture}: names and shapes");
            let total: usize = src.tensors().iter().map(TensorInfo::numel).sum();
            assert_eq!(total, m.config.num_parameters(), "{fixture}");
            let unit = if m.config.architecture.family().norm_plus_one { 0.0 } else { 1.0 };
            assert!(src.read_f32("model.norm.weight").unwrap().iter().all(|&x| x == unit), "{fixture}");
            let model = random_dense_model::<crate::CpuBackend>(&m.config, 0.02, 5, &dev).unwrap();
            let logits = model.forward(Tensor::<crate::CpuBackend, 2, Int>::from_ints([[1, 2, 3]], &dev), None);
            assert_eq!(logits.dims(), [1, 3, m.config.vocab_size], "{fixture}");
            assert!(logits.into_data().to_vec::<f32>().unwrap().iter().all(|x| x.is_finite()), "{fixture}");
            // Saved and opened again: the same family, config and tensors.
            let out = std::env::temp_dir().join(format!("moe-init-{}-{fixture}", std::process::id()));
            let _ = std::fs::remove_dir_all(&out);
            crate::model::save_model(&model, &out, DType::F32, Vec::new(), serde_json::json!({}), Default::default())
                .unwrap_or_else(|e| panic!("{fixture}: {e}"));
            let back = crate::checkpoint::open_model(&out).unwrap_or_else(|e| panic!("{fixture} saved: {e}"));
            assert_eq!(back.config.architecture, m.config.architecture, "{fixture}");
            assert_eq!(sorted(back.source.tensors()), sorted(m.source.tensors()), "{fixture}: saved tensors");
            let _ = std::fs::remove_dir_all(&out);
        }
    }

    #[test]
    fn a_bad_std_is_refused_and_the_model_builds() {
        let c = tiny();
        for bad in [0.0, -0.1, f64::NAN, f64::INFINITY] {
            let e = RandomInit::new(&c, bad, 0).err().expect("refused").to_string();
            assert!(e.contains("standard deviation"), "{e}");
        }
        let m = random_dense_model::<crate::CpuBackend>(&c, 0.02, 0, &Default::default()).unwrap();
        assert_eq!(m.config.vocab_size, 512);
        assert_eq!(m.config.num_layers, 2);
    }
}
