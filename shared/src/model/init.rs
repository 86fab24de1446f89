//! Random initialisation of a dense model from its configuration alone, as
//! transformers' `PreTrainedModel.from_config` does for Llama-style models
//! (`LlamaPreTrainedModel._init_weights`, transformers 4.x/5.x
//! `modeling_llama.py`): every linear and embedding weight drawn from
//! `N(0, std^2)` with `std = config.initializer_range` (0.02 by default),
//! RMSNorm gains 1, biases 0.
//!
//! The values come from [`NormalRng`]: each tensor's generator is seeded
//! from `(seed, tensor name)`, so a tensor does not depend on the order the
//! loader reads tensors in (equal to transformers' in distribution, not in
//! the random stream). Used by `moe-studio init-random` (benchmarks on
//! machines without model files; the fetched teaching preset's base model,
//! trained from scratch).

use crate::checkpoint::{DType, TensorInfo, TensorSource};
use crate::config::ModelConfig;
use crate::error::{Result, StudioError};
use crate::methods::rng::NormalRng;
use crate::model::{load_transformer, Transformer};

/// transformers' `initializer_range` default for Llama (`LlamaConfig`).
pub const DEFAULT_INITIALIZER_RANGE: f64 = 0.02;

/// The tensors of a dense model of `c`: Hugging Face names and shapes
/// (`[out, in]` for linear weights, `[vocab, hidden]` for the embedding and
/// an untied `lm_head`), all f32.
pub fn dense_tensor_infos(c: &ModelConfig) -> Vec<TensorInfo> {
    let (d, f, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let mut out: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![v, d])];
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![d]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![d]));
        for (n, o) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            out.push((format!("{p}.self_attn.{n}.weight"), vec![o, d]));
            if c.attention_bias {
                out.push((format!("{p}.self_attn.{n}.bias"), vec![o]));
            }
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![d, q]));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![f, d]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![f, d]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![d, f]));
    }
    out.push(("model.norm.weight".into(), vec![d]));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".into(), vec![v, d]));
    }
    out.into_iter().map(|(name, shape)| TensorInfo { name, dtype: DType::F32, shape }).collect()
}

/// A [`TensorSource`] of randomly initialised weights for a dense model
/// (see the module docs for the distribution).
pub struct RandomInit {
    tensors: Vec<TensorInfo>,
    std: f64,
    seed: u64,
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
        Ok(RandomInit { tensors: dense_tensor_infos(config), std, seed })
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
            return Ok(vec![1.0; n]);
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
