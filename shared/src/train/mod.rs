//! Training (methods.md §1-2): continued pre-training of upcycled experts
//! (DeltaMoE phase 1 / MoE-LPR stage 1), router tuning with a replay mix and
//! the language prior (MoE-LPR stage 2; DUME+ and BTX), and dense
//! fine-tuning (how the studio makes DUME's domain experts).
//!
//! - [`data`]: files -> token ids -> packed sequences; weighted, tagged,
//!   deterministically shuffled, resumable mixture.
//! - [`losses`]: next-token cross-entropy, load balancing, router z-loss,
//!   language prior.
//! - [`adamw`]: AdamW, one fused in-place pass per parameter on the CPU.
//! - [`balance`]: `--balance aux|aux-free|none` and DeepSeek-V3's selection
//!   bias update.
//! - [`freeze`]: which parameters each [`Stage`] trains.
//! - [`schedule`]: warm-up + cosine learning rate.
//! - [`checkpoint`]: trainer state, optimizer record, stable parameter ids.
//! - [`trainer`]: the loop (AdamW, global-norm clipping, accumulation,
//!   checkpoints, stop flag, metrics).
//! - `parallel` (native only): data parallelism over the devices of one
//!   process (threads) on Burn's collective all-reduce; several machines
//!   run the emitted PyTorch FSDP2 job instead (docs/scaling.md).

pub mod adamw;
pub mod balance;
pub mod checkpoint;
pub mod data;
pub mod freeze;
pub mod losses;
#[cfg(not(target_arch = "wasm32"))]
pub mod parallel;
pub mod schedule;
pub mod trainer;

pub use balance::Balance;
pub use data::{Batch, DataSpec, Mixture, MixtureState, PackedSource};
pub use freeze::{apply_stage, param_counts, ParamCounts, Stage};
pub use losses::{
    expert_load, language_prior_loss, language_prior_loss_dp, load_balancing_loss, load_balancing_loss_dp,
    next_token_loss, router_z_loss, LbForm,
};
pub use schedule::LrSchedule;
#[cfg(not(target_arch = "wasm32"))]
pub use trainer::RunOutcome;
pub use trainer::{clip_global_norm, devices, StepMetrics, TrainConfig, Trainer};

/// A deliberately generous estimate of the memory (bytes) one training
/// run needs on the host, for refusing specs that cannot fit before any
/// work (the server's `POST /api/jobs`).
///
/// Per device (`devices` replicas each run `batch` sequences of `seq_len`
/// tokens), with every number f32 (4 bytes):
/// - parameters `P` (all experts of an MoE): weights, gradients and
///   AdamW's two moments, `16 P` bytes;
/// - the LM head's logits `[batch, seq_len, vocab]`, their log-softmax and
///   gradient: `3 × 4 · B·T·V` bytes;
/// - per layer, the activations autodiff keeps: the residual stream,
///   norms, q/k/v/o and the FFN's gate/up/down inputs (`16 d + 3 f k`
///   floats per token, `k` the experts per token, 1 for a dense FFN), and
///   the attention scores and probabilities `2 · heads · T²` per sequence.
///
/// `parameters` is the model's total parameter count (all experts);
/// `top_k` the largest experts-per-token of its MoE layers (1 when dense).
pub fn memory_estimate(
    config: &crate::config::ModelConfig,
    parameters: u64,
    top_k: u64,
    batch: u64,
    seq_len: u64,
    devices: u64,
) -> u64 {
    let (b, t) = (batch, seq_len);
    let (d, f, l) = (config.hidden_size as u64, config.intermediate_size as u64, config.num_layers as u64);
    let (v, h) = (config.vocab_size as u64, config.num_heads as u64);
    let state = parameters.saturating_mul(16);
    let logits = b.saturating_mul(t).saturating_mul(v).saturating_mul(12);
    let per_token = 16 * d + 3 * f * top_k.max(1);
    let acts = b.saturating_mul(t).saturating_mul(l).saturating_mul(per_token).saturating_mul(4);
    let attn = b.saturating_mul(h).saturating_mul(t).saturating_mul(t).saturating_mul(l).saturating_mul(8);
    devices.max(1).saturating_mul(state.saturating_add(logits).saturating_add(acts).saturating_add(attn))
}

#[cfg(test)]
mod memory_estimate_tests {
    #[test]
    fn the_estimate_grows_with_batch_sequence_vocabulary_and_devices() {
        let c: crate::config::ModelConfig = serde_json::from_value(serde_json::json!({
            "architecture": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
            "num_layers": 30, "num_heads": 9, "num_kv_heads": 3, "head_dim": 64, "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0, "rope_scaling": {"rope_type": "default"}, "max_position_embeddings": 8192,
            "tie_word_embeddings": true, "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2
        }))
        .unwrap();
        let p = 134_515_008;
        let one = super::memory_estimate(&c, p, 1, 8, 256, 1);
        // SmolLM2-135M, 8 x 256: parameters 2.15 GB + logits 1.21 GB + activations.
        assert!(one > 3_000_000_000 && one < 8_000_000_000, "{one}");
        assert_eq!(super::memory_estimate(&c, p, 1, 8, 256, 4), 4 * one);
        assert!(super::memory_estimate(&c, p, 1, 4096, 65_536, 1) > 1 << 50);
        assert!(super::memory_estimate(&c, p, 2, 8, 256, 1) > one);
    }
}
