//! Model configuration: the dense decoder ([`ModelConfig`], mirrored from
//! Hugging Face `config.json`) and the MoE layout on top of it
//! ([`MoeConfig`]; its on-disk forms are [`crate::layout`]'s).

mod dense;
pub mod family;
pub mod moe;
pub mod rope;

pub use dense::{Architecture, HfConfig, ModelConfig, RopeScaling};
pub use moe::{MoeConfig, MoeLayerSpec};
