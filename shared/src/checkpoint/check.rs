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

/// Checks that `src` holds every tensor of [`expected_tensors`] with its
/// shape. Tensors the configuration does not describe are allowed (a
/// stored `lm_head.weight` of a tied model, `rotary_emb.inv_freq`).
///
/// # Errors
/// [`StudioError::Config`] naming the source, with the number of missing
/// tensors and of tensors of the wrong shape, and the first of each by
/// name (`expected [..]` for the missing, `is [..], expected [..]` for the
/// others).
pub fn check_tensors(src: &dyn TensorSource, config: &ModelConfig, moe: Option<&MoeConfig>) -> Result<()> {
    let found: std::collections::HashMap<String, Vec<usize>> =
        src.tensors().into_iter().map(|t| (t.name, t.shape)).collect();
    let mut missing = Vec::new();
    let mut wrong = Vec::new();
    for (name, shape) in expected_tensors(config, moe) {
        match found.get(&name) {
            None => missing.push(format!("`{name}` {shape:?}")),
            Some(s) if *s != shape => wrong.push(format!("`{name}` is {s:?}, expected {shape:?}")),
            Some(_) => {}
        }
    }
    if missing.is_empty() && wrong.is_empty() {
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
