//! Training (methods.md §1-2): continued pre-training of upcycled experts
//! (DeltaMoE phase 1 / MoE-LPR stage 1), router tuning with a replay mix and
//! the language prior (MoE-LPR stage 2; DUME+ and BTX), and dense
//! fine-tuning (how the studio makes DUME's domain experts).
//!
//! - [`data`]: files -> token ids -> packed sequences; weighted, tagged,
//!   deterministically shuffled, resumable mixture.
//! - [`losses`]: next-token cross-entropy, load balancing, router z-loss,
//!   language prior.
//! - [`balance`]: `--balance aux|aux-free|none` and DeepSeek-V3's selection
//!   bias update.
//! - [`freeze`]: which parameters each [`Stage`] trains.
//! - [`schedule`]: warm-up + cosine learning rate.
//! - [`checkpoint`]: trainer state, optimizer record, stable parameter ids.
//! - [`trainer`]: the loop (AdamW, global-norm clipping, accumulation,
//!   data parallelism over devices, checkpoints, stop flag, metrics).

pub mod balance;
pub mod checkpoint;
pub mod data;
pub mod freeze;
pub mod losses;
pub mod schedule;
pub mod trainer;

pub use balance::Balance;
pub use data::{Batch, DataSpec, Mixture, MixtureState, PackedSource};
pub use freeze::{apply_stage, param_counts, ParamCounts, Stage};
pub use losses::{expert_load, language_prior_loss, load_balancing_loss, next_token_loss, router_z_loss, LbForm};
pub use schedule::LrSchedule;
#[cfg(not(target_arch = "wasm32"))]
pub use trainer::RunOutcome;
pub use trainer::{clip_global_norm, devices, StepMetrics, TrainConfig, Trainer};
