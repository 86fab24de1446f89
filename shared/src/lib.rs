//! moe-studio core: checkpoint I/O, tokenizers, the Burn dense/MoE model,
//! the methods (upcycle, MoErge, ridge router, delta graft, neurons) and the
//! API types shared by the browser app and the server.
//!
//! This crate compiles for native targets and for `wasm32-unknown-unknown`:
//! file access is behind [`tensor_io::Bytes`] (a memory map natively, owned
//! bytes in the browser) and native-only code is gated with `cfg`.

pub mod api;
pub mod checkpoint;
pub mod config;
pub mod corpus;
pub mod error;
pub mod eval;
pub mod generate;
pub mod jobs;
pub mod layout;
pub mod methods;
pub mod model;
pub mod ops;
pub mod recipe;
pub mod rng;
pub mod tensor_io;
pub mod tokenizer;
pub mod train;

pub use error::{Param, Result, StudioError};

/// The studio's version (the workspace's `version`), as model cards and
/// job records state it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The CPU backend of every CPU path: the CLI's `--backend cpu` (alias
/// `ndarray`, the name stored job rows carry), the browser tab's forward
/// passes and every test. burn-flex (Burn's pure-Rust CPU backend, the
/// successor of the deprecated burn-ndarray): `gemm` matrix products with
/// run-time dispatch (AVX-512 / AVX2 on x86_64, SIMD128 in wasm32), rayon
/// threads natively, none in wasm32, and a fused attention kernel (naive
/// for short sequences, flash attention beyond). Chosen by measurement
/// against burn-ndarray with and without OpenBLAS (`docs/benchmarks.md`,
/// `scripts/backend_compare.sh`).
pub type CpuBackend = burn::backend::Flex;
