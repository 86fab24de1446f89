//! The methods as the browser runs them, in the studio's worker
//! ([`crate::worker`]): reporting progress in real units of work
//! ([`progress`]) and calling exactly the `moe_shared` functions the CLI
//! calls (so outputs are identical).

pub mod artifact;
pub mod average;
pub mod generate;
pub mod gpu;
pub mod graft;
pub mod inspect;
pub mod logits;
pub mod moerge;
pub mod neurons;
pub mod perplexity;
pub mod progress;
pub mod route;
pub mod slices;
pub mod task;
pub mod train;
pub mod upcycle;

use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::LoadedModel;
use moe_shared::model::{load_model, Transformer};

use crate::Cpu;

/// Converts a studio error into the message shown in the page.
pub fn msg(e: moe_shared::StudioError) -> String {
    e.to_string()
}

/// Builds the CPU (`moe_shared::CpuBackend`) model of a loaded checkpoint.
///
/// # Errors
/// The loader's error (missing or misshapen tensors), as text.
pub fn cpu_model(m: &LoadedModel) -> Result<Transformer<Cpu>, String> {
    load_model::<Cpu>(m, &Default::default()).map_err(msg)
}

/// A `[1, len]` token tensor.
pub fn tokens(ids: &[u32]) -> Tensor<Cpu, 2, Int> {
    let v: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
    Tensor::from_data(TensorData::new(v, [1, ids.len()]), &Default::default())
}

/// Token ids of `text` with the model's tokenizer.
///
/// # Errors
/// No tokenizer, or an encoding error.
pub fn encode(m: &LoadedModel, text: &str, special: bool) -> Result<Vec<u32>, String> {
    let tok =
        m.tokenizer.as_ref().ok_or_else(|| format!("{} has no tokenizer: load it with its tokenizer file", m.path))?;
    tok.encode(text, special).map_err(msg)
}
