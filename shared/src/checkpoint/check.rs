//! Checking a checkpoint against its configuration, before anything uses
//! it: every tensor the configuration describes must be present with its
//! shape ([`expected_tensors`]); and recognising files that are not a model
//! at all, such as a Git LFS pointer left by a clone without `git lfs`.
//!
//! [`super::load::open_model`] and the browser's loaders run
//! [`check_tensors`] on every model they open, so `inspect`, the server's
//! registration and the tab's Load page report the same problems.

use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};
use crate::tensor_io::TensorSource;

/// Most problems of each kind listed in a [`check_tensors`] message.
const SHOWN: usize = 8;

/// The tensors `config` (and the MoE layout `moe`) describe, by Hugging
/// Face name, with their PyTorch shapes: the dense plan of
/// [`super::plan::dense_tensor_plan`], whose FFNs become the routers and
/// experts of [`crate::checkpoint::plan::moe_tensor_plan`] in an MoE.
pub fn expected_tensors(config: &ModelConfig, moe: Option<&MoeConfig>) -> Vec<(String, Vec<usize>)> {
    match moe {
        Some(m) => crate::checkpoint::plan::moe_tensor_plan(config, m).into_iter().map(|t| (t.name, t.shape)).collect(),
        None => super::plan::dense_tensor_plan(config),
    }
}

/// Whether a tensor the configuration does not describe may sit in a
/// decoder layer anyway: RoPE's cached `inv_freq` buffer, which older
/// transformers checkpoints store and every loader recomputes.
fn ignorable_in_layer(name: &str) -> bool {
    name.ends_with(".rotary_emb.inv_freq")
}

/// Checks that `src` holds every tensor of [`expected_tensors`] with its
/// shape, and nothing in its decoder layers that the configuration does not
/// describe: a layer past `num_hidden_layers`, an expert past the layer's
/// count, a router in a dense layer — weights every command would otherwise
/// drop without a word (transformers refuses an extra expert as a size
/// mismatch). Tensors outside `model.layers.` that the configuration does
/// not describe are allowed (a stored `lm_head.weight` of a tied model, a
/// GGUF's `rope_freqs.weight`), and so is `rotary_emb.inv_freq`.
///
/// # Errors
/// [`StudioError::Config`] naming the source, with the number of missing
/// tensors, of tensors of the wrong shape and of unexpected layer tensors,
/// and the first of each by name (`expected [..]` for the missing, `is [..],
/// expected [..]` for the others).
pub fn check_tensors(src: &dyn TensorSource, config: &ModelConfig, moe: Option<&MoeConfig>) -> Result<()> {
    let found: std::collections::HashMap<String, Vec<usize>> =
        src.tensors().into_iter().map(|t| (t.name, t.shape)).collect();
    let expected = expected_tensors(config, moe);
    let mut missing = Vec::new();
    let mut wrong = Vec::new();
    for (name, shape) in &expected {
        match found.get(name) {
            None => missing.push(format!("`{name}` {shape:?}")),
            Some(s) if s != shape => wrong.push(format!("`{name}` is {s:?}, expected {shape:?}")),
            Some(_) => {}
        }
    }
    let described: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let mut unexpected: Vec<String> = found
        .iter()
        .filter(|(n, _)| n.starts_with("model.layers.") && !described.contains(n.as_str()) && !ignorable_in_layer(n))
        .map(|(n, s)| format!("`{n}` {s:?}"))
        .collect();
    unexpected.sort();
    if missing.is_empty() && wrong.is_empty() && unexpected.is_empty() {
        return Ok(());
    }
    let list = |v: &[String]| {
        let mut s = v.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
        if v.len() > SHOWN {
            s.push_str(&format!(" and {} more", v.len() - SHOWN));
        }
        s
    };
    let mut parts = Vec::new();
    if !wrong.is_empty() {
        parts.push(format!("{} tensor(s) of the wrong shape: {}", wrong.len(), list(&wrong)));
    }
    if !missing.is_empty() {
        parts.push(format!("{} tensor(s) missing: {}", missing.len(), list(&missing)));
    }
    if !unexpected.is_empty() {
        parts.push(format!(
            "{} tensor(s) in its layers that the configuration does not describe (a layer or expert past its \
             counts, or a weight this studio does not model, such as an `o_proj.bias`): {}",
            unexpected.len(),
            list(&unexpected)
        ));
    }
    let what = if moe.is_some() { "MoE configuration" } else { "configuration" };
    Err(StudioError::config(
        src.source_name(),
        format!(
            "the checkpoint does not match its {what} ({} layers, d={}, ffn={}, vocab {}): {}",
            config.num_layers,
            config.hidden_size,
            config.intermediate_size,
            config.vocab_size,
            parts.join("; ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MoeLayerSpec;
    use crate::tensor_io::safetensors_io::SafetensorsFile;
    use crate::tensor_io::writer::{serialize_to_vec, PlannedTensor};
    use crate::tensor_io::{Bytes, DType};

    fn config() -> ModelConfig {
        let cfg = br#"{"model_type":"llama","vocab_size":8,"hidden_size":4,"intermediate_size":6,"num_hidden_layers":2,
            "num_attention_heads":2,"num_key_value_heads":1,"tie_word_embeddings":true}"#;
        crate::config::HfConfig::from_json(cfg, "c").unwrap().to_model_config("c").unwrap()
    }

    /// A safetensors source holding `tensors` (zeros, f32).
    fn source(tensors: &[(String, Vec<usize>)]) -> SafetensorsFile {
        let data: Vec<Vec<u8>> = tensors.iter().map(|(_, s)| vec![0u8; 4 * s.iter().product::<usize>()]).collect();
        let planned: Vec<(PlannedTensor, &Vec<u8>)> = tensors
            .iter()
            .zip(&data)
            .map(|((n, s), d)| (PlannedTensor { name: n.clone(), dtype: DType::F32, shape: s.clone() }, d))
            .collect();
        let bytes = serialize_to_vec(
            &planned.iter().map(|(p, d)| (p.clone(), &d[..])).collect::<Vec<_>>(),
            &Default::default(),
        )
        .unwrap();
        SafetensorsFile::parse(Bytes::from_vec(bytes), "m.safetensors").unwrap()
    }

    /// Weights in the layers that the configuration does not describe are
    /// refused by name (a layer past `num_hidden_layers`, an expert past the
    /// count: every command would drop them silently); RoPE's `inv_freq` and
    /// tensors outside the layers are not.
    #[test]
    fn weights_past_the_configured_counts_are_refused_by_name() {
        let c = config();
        let mut t = expected_tensors(&c, None);
        t.push(("model.layers.0.self_attn.rotary_emb.inv_freq".into(), vec![1]));
        t.push(("rope_freqs.weight".into(), vec![1]));
        check_tensors(&source(&t), &c, None).unwrap();
        let mut extra = t.clone();
        extra.push(("model.layers.2.mlp.up_proj.weight".into(), vec![6, 4]));
        let e = check_tensors(&source(&extra), &c, None).unwrap_err().to_string();
        assert!(e.contains("m.safetensors") && e.contains("1 tensor(s) in its layers"), "{e}");
        assert!(e.contains("`model.layers.2.mlp.up_proj.weight` [6, 4]"), "{e}");

        let moe = MoeConfig::uniform(2, MoeLayerSpec { num_experts: 2, top_k: 1, ..Default::default() });
        let mut t = expected_tensors(&c, Some(&moe));
        check_tensors(&source(&t), &c, Some(&moe)).unwrap();
        let e0 = t.iter().find(|(n, _)| n.contains("layers.1.") && n.contains("experts.1.")).unwrap().clone();
        t.push((e0.0.replace("experts.1.", "experts.2."), e0.1));
        let e = check_tensors(&source(&t), &c, Some(&moe)).unwrap_err().to_string();
        assert!(e.contains("experts.2.") && e.contains("does not describe"), "{e}");
    }
}
