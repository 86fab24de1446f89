//! moe-studio core: checkpoint I/O, tokenizers, the Burn dense/MoE model,
//! the methods (upcycle, MoErge, ridge router, delta graft, neurons) and the
//! API types shared by the browser app and the server.
//!
//! This crate compiles for native targets and for `wasm32-unknown-unknown`:
//! file access is behind [`checkpoint::Bytes`] (a memory map natively, owned
//! bytes in the browser) and native-only code is gated with `cfg`.

pub mod api;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod eval;
pub mod generate;
pub mod jobs;
pub mod layout;
pub mod methods;
pub mod model;
pub mod tokenizer;
pub mod train;

pub use error::{Result, StudioError};
