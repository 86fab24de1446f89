//! The studio's operations on checkpoints, one file per operation
//! (methods.md):
//!
//! - [`upcycle`]: dense -> MoE by copying each FFN into `E_l` experts
//!   (DeltaMoE phase 1, §1; per-layer counts from NeuronMoE, §3, via
//!   [`allocation`]).
//! - [`moerge`]: `N` dense models -> one MoE with `N` experts (DUME
//!   MoErging, §2; on a base model with mergekit-moe's shared experts,
//!   [`moerge_shared`]).
//!
//! Both validate everything before any output exists, stream one source
//! tensor at a time into a [`crate::tensor_io::sink::TensorSink`] (the atomic safetensors
//! writer natively) in the layout [`crate::layout::choose`] picks (`auto`:
//! the first public layout that holds the MoE exactly, else the studio
//! layout; see [`crate::checkpoint::output`]).
//!
//! Helpers: [`router_init`]
//! and [`hidden`] (initial routers), [`average`] (aligned means),
//! [`compat`] (architecture/tokenizer checks). Output tensor names and origins
//! are [`crate::checkpoint::plan`]; seeded normals are [`crate::rng`].

pub mod add_expert;
pub mod allocate;
pub mod allocation;
pub mod average;
pub mod compat;
pub mod hidden;
pub mod moerge;
pub mod moerge_shared;
pub mod neurons;
pub mod ridge;
pub mod route;
pub mod router_init;
pub mod upcycle;

pub use crate::checkpoint::output::MoeReport;
pub use allocation::{AllocationFile, ExpertCounts};
pub use hidden::{hidden_router_rows, ExpertPrompts};
#[cfg(not(target_arch = "wasm32"))]
pub use moerge::{moerge, moerge_with_base};
pub use moerge::{
    plan_moerge, plan_moerge_with_base, weighted_means, write_moerge, write_moerge_with_base, MoergeInput,
    MoergeOptions, MoergePlan,
};
pub use moerge_shared::{mergekit_shared_expert_tensor, SharedGate};
pub use router_init::{cheap_embed_row, RouterInit};
#[cfg(not(target_arch = "wasm32"))]
pub use upcycle::upcycle;
pub use upcycle::{
    plan_upcycle, write_upcycle, CopyNoise, NoiseKind, SharedExperts, SharedInit, UpcycleOptions, UpcyclePlan,
};

pub mod delta;
pub mod merge;
pub mod stream_read;
