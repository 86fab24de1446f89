//! The train operation's parameters (continued pre-training of a stage:
//! DeltaMoE's new experts + routers, the router with replay and the
//! language prior, a dense model or its FFNs; docs/methods.md §1.2–§1.4,
//! §5.2): one struct for the CLI (`moe-studio train`, flattened), the
//! server's job spec ([`crate::api::TrainSpec`] flattens it), the tab's
//! training (its form fills one) and the job form's inputs
//! ([`TrainParams::form_fields`]). [`TrainParams::config`] turns it into
//! the trainer's [`TrainConfig`], so the defaults are written once
//! ([`TrainConfig::new`]).
//!
//! What stays with the caller: the model, the stage and the step count
//! (required, no default), the corpora, where the run is written or
//! emitted (`--out`, `--engine torch --emit`), resuming, the machines.

use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};
use crate::model::WeightsDtype;
use crate::train::{Balance, LbForm, Stage, TrainConfig};

/// What a training run is asked to do, besides its inputs, stage and
/// steps (see the module docs). `Default` is [`TrainConfig::new`]'s:
/// sequences of 256 tokens, batch 8, the stage's learning rate, warm-up
/// 10, cosine to 10 %, clip 1.0, α 0.01 per layer, prior 0.1, `aux`
/// balancing, bias step 1e-3, no z-loss, the model's top-k normalisation,
/// no weight decay, no periodic checkpoint (2 kept), seed 0, one device.
///
/// Source: DeltaMoE (2025) §3.2 and MoE-LPR (Zhou et al. 2024) for the
/// stages, α and the language prior; Switch Transformers / ST-MoE for the
/// load-balancing and z losses; DeepSeek-V3 for aux-loss-free balancing;
/// docs/methods.md §1.2–§1.4 and §5.2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct TrainParams {
    /// Tokens per sequence.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().seq_len))]
    pub seq_len: usize,
    /// Sequences per device per micro-step.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().batch))]
    pub batch: usize,
    /// Peak learning rate (default: 5e-5 for experts and dense, 1e-4 for router).
    #[cfg_attr(feature = "cli", arg(long))]
    pub lr: Option<f64>,
    /// Linear warm-up steps.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().warmup))]
    pub warmup: usize,
    /// Final learning rate of the cosine, as a fraction of --lr.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().min_lr))]
    pub min_lr: f64,
    /// Micro-steps per optimizer step (gradient accumulation).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().grad_accum))]
    pub grad_accum: usize,
    /// Maximum global gradient norm (0: no clipping).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().clip))]
    pub clip: f64,
    /// Load-balancing loss coefficient.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().alpha))]
    pub alpha: f64,
    /// Load-balancing formula: `per-layer` (methods.md) or `hf-mixtral` (transformers' pooled form, k times larger).
    #[cfg_attr(feature = "cli", arg(long, default_value = "per-layer", value_parser = parse_lb_form))]
    pub lb_form: LbForm,
    /// Language-prior coefficient (applies to `:orig` data).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().prior))]
    pub prior: f64,
    /// Load balancing: `aux` (--alpha x the load-balancing loss), `aux-free` (DeepSeek-V3's per-expert
    /// selection bias, moved by --bias-update-rate against each expert's load error after every step; no
    /// loss term) or `none`.
    #[cfg_attr(feature = "cli", arg(long, default_value = "aux", value_parser = parse_balance))]
    pub balance: Balance,
    /// The aux-free bias step per optimizer step (DeepSeek-V3's gamma).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().bias_update_rate))]
    pub bias_update_rate: f64,
    /// Router z-loss coefficient (ST-MoE: 1e-3; 0 = off).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().z_loss))]
    pub z_loss: f64,
    /// Renormalise the top-k weights (`true`) or weigh by the softmax over all experts (`false`, Switch /
    /// Qwen2-MoE; gives a top-1 router the next-token gradient). Default: the model's own setting.
    #[cfg_attr(feature = "cli", arg(long, action = clap::ArgAction::Set))]
    pub norm_topk: Option<bool>,
    /// The dtype the frozen weight matrices are held in while training: `f32` (exact), `bf16` or `f16`
    /// (2 bytes a weight, widened to f32 for each product; the saved model holds the rounded values, exact
    /// for a bf16 checkpoint). Trainable parameters stay f32.
    #[cfg_attr(feature = "cli", arg(long, default_value = "f32", value_parser = parse_dtype))]
    pub frozen_dtype: WeightsDtype,
    /// AdamW weight decay.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().weight_decay))]
    pub weight_decay: f64,
    /// Checkpoint every N steps (0: only at the end; a server job takes
    /// 0 as a tenth of the steps, what a resumed job continues from).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().save_every))]
    pub save_every: usize,
    /// Periodic checkpoints to keep.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().keep))]
    pub keep: usize,
    /// Seed of the data order.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().seed))]
    pub seed: u64,
    /// Data-parallel replicas in this process, one per device (each runs --batch sequences per micro-step;
    /// Burn's collective all-reduce).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = Self::default().devices))]
    pub devices: usize,
}

#[cfg(feature = "cli")]
fn parse_lb_form(s: &str) -> Result<LbForm, String> {
    LbForm::parse(s).ok_or_else(|| format!("`{s}`: expected per-layer or hf-mixtral"))
}

#[cfg(feature = "cli")]
fn parse_dtype(s: &str) -> Result<WeightsDtype, String> {
    WeightsDtype::parse(s).map_err(|e| e.to_string())
}

#[cfg(feature = "cli")]
fn parse_balance(s: &str) -> Result<Balance, String> {
    Balance::parse(s).ok_or_else(|| format!("`{s}`: expected aux, aux-free or none"))
}

impl Default for TrainParams {
    fn default() -> Self {
        let c = TrainConfig::new(Stage::Experts);
        TrainParams {
            seq_len: c.seq_len,
            batch: c.batch_size,
            lr: None,
            warmup: c.warmup,
            min_lr: c.min_lr_ratio,
            grad_accum: c.grad_accum,
            clip: c.clip.unwrap_or(0.0),
            alpha: c.alpha,
            lb_form: c.lb_form,
            prior: c.prior,
            balance: c.balance,
            bias_update_rate: c.bias_update_rate,
            z_loss: c.z_loss,
            norm_topk: c.norm_topk,
            frozen_dtype: c.frozen_dtype,
            weight_decay: c.weight_decay,
            save_every: c.save_every,
            keep: c.keep,
            seed: c.seed,
            devices: c.devices,
        }
    }
}

impl TrainParams {
    /// The trainer's configuration for `stage` and `steps` (the learning
    /// rate the stage's when unset; clip 0 = none).
    pub fn config(&self, stage: Stage, steps: usize) -> TrainConfig {
        TrainConfig {
            stage,
            steps,
            seq_len: self.seq_len,
            batch_size: self.batch,
            grad_accum: self.grad_accum,
            lr: self.lr.unwrap_or(stage.default_lr()),
            warmup: self.warmup,
            min_lr_ratio: self.min_lr,
            weight_decay: self.weight_decay,
            clip: (self.clip > 0.0).then_some(self.clip),
            alpha: self.alpha,
            lb_form: self.lb_form,
            prior: self.prior,
            save_every: self.save_every,
            keep: self.keep,
            seed: self.seed,
            devices: self.devices,
            balance: self.balance,
            bias_update_rate: self.bias_update_rate,
            z_loss: self.z_loss,
            norm_topk: self.norm_topk,
            frozen_dtype: self.frozen_dtype,
            ..TrainConfig::new(stage)
        }
    }

    /// The rules every caller checks before any model is read (what needs
    /// the model — the sequence against its context, `hf-mixtral` against
    /// its expert counts — [`TrainConfig::validate`] checks): `seq_len`
    /// 2..=65,536, `batch` 1..=4,096, `lr` in (0, 10], `warmup`
    /// 0..=1,000,000, `min_lr` in [0, 1], `grad_accum` 1..=1,024, `clip`
    /// in [0, 10^6], `alpha` and `prior` in [0, 1000], `bias_update_rate`
    /// in [0, 1], `z_loss` in [0, 1000], `weight_decay` in [0, 10],
    /// `save_every` 0..=1,000,000, `keep` 0..=1,000, `devices` 1..=64.
    ///
    /// # Errors
    /// A [`ParamError`] naming the field and what was expected.
    pub fn check(&self) -> Result<(), ParamError> {
        let bad = |field: &'static str, message: String| Err(ParamError { field, message });
        let ints: [(&'static str, usize, usize, usize); 7] = [
            ("seq_len", self.seq_len, 2, 65_536),
            ("batch", self.batch, 1, 4096),
            ("warmup", self.warmup, 0, 1_000_000),
            ("grad_accum", self.grad_accum, 1, 1024),
            ("save_every", self.save_every, 0, 1_000_000),
            ("keep", self.keep, 0, 1000),
            ("devices", self.devices, 1, 64),
        ];
        for (field, v, lo, hi) in ints {
            if !(lo..=hi).contains(&v) {
                return bad(field, format!("{v} is out of range {lo}..={hi}"));
            }
        }
        if let Some(lr) = self.lr.filter(|lr| !(lr.is_finite() && *lr > 0.0 && *lr <= 10.0)) {
            return bad("lr", format!("{lr} is out of range (exclusive) 0..=10"));
        }
        let floats: [(&'static str, f64, f64); 7] = [
            ("min_lr", self.min_lr, 1.0),
            ("clip", self.clip, 1e6),
            ("alpha", self.alpha, 1e3),
            ("prior", self.prior, 1e3),
            ("bias_update_rate", self.bias_update_rate, 1.0),
            ("z_loss", self.z_loss, 1e3),
            ("weight_decay", self.weight_decay, 10.0),
        ];
        for (field, v, hi) in floats {
            if !(v.is_finite() && (0.0..=hi).contains(&v)) {
                return bad(field, format!("{v} is out of range 0..={hi}"));
            }
        }
        Ok(())
    }

    /// The job form's inputs for these parameters, in field order, with the
    /// defaults as hints (the Jobs page; `model`, `stage`, `data`, `steps`
    /// and `engine` are the job's own). `norm_topk` (unset: the model's)
    /// is a choice of `true` / `false`.
    pub fn form_fields() -> Vec<Field> {
        let d = TrainParams::default();
        let dflt = |v: &dyn std::fmt::Display| format!("default {v}");
        vec![
            Field::new("seq_len", "seq len", Input::Int, &dflt(&d.seq_len)),
            Field::new("batch", "batch", Input::Int, &dflt(&d.batch)),
            Field::new("lr", "lr", Input::Float, "default per stage (5e-5; router 1e-4)"),
            Field::new("warmup", "warmup", Input::Int, &dflt(&d.warmup)).advanced(),
            Field::new("min_lr", "min lr (fraction)", Input::Float, &dflt(&d.min_lr)).advanced(),
            Field::new("grad_accum", "grad accum", Input::Int, &dflt(&d.grad_accum)).advanced(),
            Field::new("clip", "clip", Input::Float, &dflt(&d.clip)).advanced(),
            Field::new("alpha", "alpha (balance)", Input::Float, &dflt(&d.alpha)).advanced(),
            Field::new("lb_form", "load-balancing form", Input::Choice(&["per-layer", "hf-mixtral"]), "per-layer")
                .advanced(),
            Field::new("prior", "prior", Input::Float, &dflt(&d.prior)).advanced(),
            Field::new("balance", "balancing", Input::Choice(&["aux", "aux-free", "none"]), "aux").advanced(),
            Field::new("bias_update_rate", "aux-free bias step", Input::Float, &dflt(&d.bias_update_rate)).advanced(),
            Field::new("z_loss", "router z-loss", Input::Float, &dflt(&d.z_loss)).advanced(),
            Field::new("norm_topk", "renormalise top-k", Input::Choice(&["true", "false"]), "the model's").advanced(),
            Field::new("frozen_dtype", "frozen weights in", Input::Choice(&["f32", "bf16", "f16"]), "f32").advanced(),
            Field::new("weight_decay", "weight decay", Input::Float, &dflt(&d.weight_decay)).advanced(),
            Field::new("save_every", "save every", Input::Int, "steps / 10").advanced(),
            Field::new("keep", "checkpoints kept", Input::Int, &dflt(&d.keep)).advanced(),
            Field::new("seed", "seed", Input::Int, &dflt(&d.seed)),
            Field::new("devices", "devices", Input::Int, &dflt(&d.devices)).advanced(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_trainer_s() {
        for stage in Stage::ALL {
            assert_eq!(TrainParams::default().config(stage, 100), TrainConfig::new(stage), "{stage:?}");
        }
        assert_eq!(TrainParams::default().check(), Ok(()));
    }

    #[test]
    fn check_names_the_field() {
        let d = TrainParams::default;
        let field = |p: TrainParams| p.check().unwrap_err().field;
        assert_eq!(field(TrainParams { seq_len: 1, ..d() }), "seq_len");
        assert_eq!(field(TrainParams { batch: 0, ..d() }), "batch");
        assert_eq!(field(TrainParams { lr: Some(0.0), ..d() }), "lr");
        assert_eq!(field(TrainParams { min_lr: 1.5, ..d() }), "min_lr");
        assert_eq!(field(TrainParams { alpha: f64::NAN, ..d() }), "alpha");
        assert_eq!(field(TrainParams { z_loss: -1.0, ..d() }), "z_loss");
        assert_eq!(field(TrainParams { devices: 65, ..d() }), "devices");
    }

    #[test]
    fn the_form_offers_every_parameter_and_flags_spell_the_enums_as_the_cli() {
        let keys: Vec<&str> = crate::ops::fields_of::<TrainParams>().to_vec();
        let inputs: Vec<&str> = TrainParams::form_fields().iter().map(|f| f.key).collect();
        assert_eq!(keys, inputs);
        let p = TrainParams {
            lb_form: LbForm::HfMixtral,
            balance: Balance::AuxFree,
            norm_topk: Some(false),
            frozen_dtype: WeightsDtype::Bf16,
            ..d()
        };
        let f = crate::ops::flags(&p);
        for want in ["--lb-form=hf-mixtral", "--balance=aux-free", "--norm-topk=false", "--frozen-dtype=bf16"] {
            assert!(f.contains(&want.to_string()), "{want}: {f:?}");
        }
        fn d() -> TrainParams {
            TrainParams::default()
        }
    }
}
