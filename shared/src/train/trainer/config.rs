//! A training run's hyper-parameters ([`TrainConfig`], saved in every
//! checkpoint) and their checks against the model.

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StudioError};
use crate::model::transformer::Mlp;
use crate::model::Transformer;
use crate::train::balance::Balance;
use crate::train::freeze::Stage;
use crate::train::losses::LbForm;
use crate::train::schedule::LrSchedule;

/// Hyper-parameters of a run (saved in every checkpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Which parameters train.
    pub stage: Stage,
    /// Optimizer steps in the whole run.
    pub steps: usize,
    /// Tokens per sequence `L` (<= the model's context).
    pub seq_len: usize,
    /// Sequences per device per micro-step.
    pub batch_size: usize,
    /// Micro-steps per optimizer step.
    pub grad_accum: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps.
    pub warmup: usize,
    /// Final rate of the cosine as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW `beta_1`.
    pub beta1: f64,
    /// AdamW `beta_2`.
    pub beta2: f64,
    /// AdamW `epsilon`.
    pub eps: f64,
    /// Maximum global gradient L2 norm (`None`: no clipping).
    pub clip: Option<f64>,
    /// Load-balancing coefficient `alpha` (DeltaMoE: 0.01).
    pub alpha: f64,
    /// Load-balancing formula.
    pub lb_form: LbForm,
    /// Language-prior coefficient (MoE-LPR: 0.1); applies to sequences of
    /// sources tagged as original languages.
    pub prior: f64,
    /// Checkpoint every N steps (0: only at the end).
    pub save_every: usize,
    /// Periodic checkpoints kept (older ones are deleted; the final one is
    /// always kept).
    pub keep: usize,
    /// Seed of the data order (and of the backend generator).
    pub seed: u64,
    /// Data-parallel replicas (devices) of this process (1: no
    /// parallelism); together they equal one replica with `devices` times
    /// the batch.
    pub devices: usize,
    /// How the load is balanced: the `alpha` loss, DeepSeek-V3's
    /// aux-loss-free selection bias, or nothing.
    #[serde(default)]
    pub balance: Balance,
    /// The aux-free bias step `gamma` per optimizer step (DeepSeek-V3:
    /// 0.001 on sigmoid scores; default here 1e-3).
    #[serde(default = "default_bias_rate")]
    pub bias_update_rate: f64,
    /// Router z-loss coefficient (ST-MoE: 1e-3; 0 = off).
    #[serde(default)]
    pub z_loss: f64,
    /// Sets every MoE layer's `norm_topk_prob` before training (`None`:
    /// keep the model's). Saved in the checkpoint's config either way.
    #[serde(default)]
    pub norm_topk: Option<bool>,
    /// The dtype the frozen matrices are held in during training
    /// ([`crate::train::freeze::hold_frozen_in`]; issue 38 item 3): f32
    /// (default, exact) or bf16/f16 (2 bytes a weight; the saved model
    /// holds the rounded values).
    #[serde(default)]
    pub frozen_dtype: crate::model::WeightsDtype,
}

fn default_bias_rate() -> f64 {
    1e-3
}

impl TrainConfig {
    /// The defaults of `stage`: 5e-5 (experts, dense) or 1e-4 (router),
    /// batch 8, sequence 256, 100 steps, warm-up 10, cosine to 10%, no
    /// weight decay, betas (0.9, 0.999), eps 1e-8, clip 1.0, alpha 0.01,
    /// per-layer load balancing, prior 0.1, seed 0, one device,
    /// `--balance aux`, bias step 1e-3, no z-loss, the model's top-k
    /// normalisation, frozen weights in f32.
    pub fn new(stage: Stage) -> Self {
        TrainConfig {
            stage,
            steps: 100,
            seq_len: 256,
            batch_size: 8,
            grad_accum: 1,
            lr: stage.default_lr(),
            warmup: 10,
            min_lr_ratio: 0.1,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            clip: Some(1.0),
            alpha: 0.01,
            lb_form: LbForm::PerLayer,
            prior: 0.1,
            save_every: 0,
            keep: 2,
            seed: 0,
            devices: 1,
            balance: Balance::Aux,
            bias_update_rate: default_bias_rate(),
            z_loss: 0.0,
            norm_topk: None,
            frozen_dtype: crate::model::WeightsDtype::F32,
        }
    }

    /// The learning-rate schedule.
    pub fn schedule(&self) -> LrSchedule {
        LrSchedule { lr: self.lr, warmup: self.warmup, total: self.steps, min_ratio: self.min_lr_ratio }
    }

    /// Input tokens per optimizer step.
    pub fn tokens_per_step(&self) -> usize {
        self.batch_size * self.devices * self.grad_accum * self.seq_len
    }

    /// Checks the values against each other and against `model`.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming the option.
    pub fn validate<B: Backend>(&self, model: &Transformer<B>) -> Result<()> {
        let err = |opt: &str, what: String| Err(StudioError::config(opt, what));
        if self.steps == 0 {
            return err("--steps", "must be at least 1".into());
        }
        if self.batch_size == 0 || self.grad_accum == 0 || self.devices == 0 {
            return err("--batch/--grad-accum/--devices", "must be at least 1".into());
        }
        if self.seq_len == 0 || self.seq_len > model.config.max_position_embeddings {
            return err(
                "--seq-len",
                format!(
                    "{} must be in 1..={} (the model's context)",
                    self.seq_len, model.config.max_position_embeddings
                ),
            );
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return err("--lr", format!("{} must be a positive number", self.lr));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return err("--min-lr", format!("ratio {} must be in [0, 1]", self.min_lr_ratio));
        }
        if let Some(c) = self.clip {
            if !(c.is_finite() && c > 0.0) {
                return err("--clip", format!("{c} must be a positive number"));
            }
        }
        for (name, v) in [
            ("--alpha", self.alpha),
            ("--prior", self.prior),
            ("--weight-decay", self.weight_decay),
            ("--z-loss", self.z_loss),
            ("--bias-update-rate", self.bias_update_rate),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return err(name, format!("{v} must be >= 0"));
            }
        }
        if self.lb_form == LbForm::HfMixtral {
            let counts: Vec<usize> = model
                .layers
                .iter()
                .filter_map(|b| match &b.mlp {
                    Mlp::Moe(m) => Some(m.num_experts()),
                    Mlp::Dense(_) => None,
                })
                .collect();
            if counts.windows(2).any(|w| w[0] != w[1]) {
                return err(
                    "--lb-form",
                    "hf-mixtral pools layers and needs the same expert count in every MoE layer; use per-layer".into(),
                );
            }
        }
        Ok(())
    }
}
