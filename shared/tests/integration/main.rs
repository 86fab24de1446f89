//! Integration tests of `moe_shared`, one test binary (one link) with a
//! module per topic. Tests that need the real models and corpora read them
//! from `MOE_STUDIO_DATA` (default `../shared/data`) and fail under
//! `CI=true` when they are missing (see `common`).

mod common;
mod train_util;

mod bad_input;
mod corpus;
mod delta;
mod eval_dataset;
mod families;
mod gguf_families;
mod gguf_golden;
mod gguf_malformed;
mod gguf_tokenizer;
mod hf_tiny;
mod layouts;
mod merge;
mod moerge;
mod neuron_ties;
mod neurons;
mod neurons_moe;
mod packed;
mod padding;
mod route;
mod save;
mod smollm2;
mod stories260k;
mod task_eval;
mod train_freeze;
mod train_lb_golden;
mod train_parallel;
mod train_prior;
mod train_resume;
mod train_routing;
mod upcycle;
mod upcycle_variants;
