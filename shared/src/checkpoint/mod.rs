//! Checkpoints as models: opening Hugging Face directories (single and
//! sharded safetensors), GGUF files and llama2.c binaries as one
//! [`crate::tensor_io::TensorSource`] view with Hugging Face tensor names
//! and a configuration; the one tensor plan ([`plan`]); writing dense and
//! MoE checkpoints ([`export`], [`output`]) and GGUF ([`gguf_write`]). The
//! bytes, dtypes and containers underneath are [`crate::tensor_io`]'s.
//!
//! Every reader exposes tensors under their Hugging Face names
//! (`model.layers.{l}.self_attn.q_proj.weight`, ...) with PyTorch shapes
//! (`[out_features, in_features]` for linear weights), so that the model and
//! the methods never care where a tensor came from.

pub mod check;
pub mod export;
pub mod fused;
pub mod gguf;
mod gguf_family;
#[cfg(not(target_arch = "wasm32"))]
pub mod gguf_write;
pub mod llama2c;
pub mod load;
pub mod output;
pub mod plan;

#[cfg(not(target_arch = "wasm32"))]
pub use load::open_model;
pub use load::{LoadedModel, ModelFormat};
