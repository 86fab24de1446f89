//! DeltaMoE's training stages in the browser (methods.md §1.2 and §1.4):
//! the CLI's own trainer (`moe_shared::train::Trainer`, Burn's autodiff
//! over the wasm CPU backend) on texts held by the page instead of files.
//!
//! - stage `experts` (DeltaMoE phase 1 / MoE-LPR stage 1): the new experts
//!   and the routers learn the new language; expert 0 (the original FFN)
//!   and every non-FFN tensor stay frozen; loss = next-token +
//!   `alpha · load balancing`;
//! - stage `router` (MoE-LPR stage 2): only the routers train, on the new
//!   language mixed with a replay of the original one, whose tokens the
//!   language prior (`prior · LP`) sends back to expert 0.
//!
//! Before the first step, every [`TrainJob::eval_every`] steps and after
//! the last, both languages' held-out texts are scored
//! (`moe_shared::eval::evaluate`: perplexity and the routing load per
//! expert); every step's losses and those evaluations reach the page as
//! [`TrainPoint`]s while the stage runs. The trained model is written with
//! `moe_shared::model::model_to_bytes` (the files `moe-studio train` saves
//! in `final/`), with the run's `metrics.jsonl` beside it.

use burn::backend::Autodiff;
use moe_shared::eval::{evaluate, PerplexityOptions};
use moe_shared::layout::LayoutRequest;
use moe_shared::model::transformer::Mlp;
use moe_shared::model::{load_model, model_to_bytes, Routing, Transformer};
use moe_shared::ops::train::TrainParams;
use moe_shared::tensor_io::DType;
use moe_shared::train::data::source_from_text;
use moe_shared::train::{DataSpec, Mixture, Stage, StepMetrics, TrainConfig, Trainer};
use serde::{Deserialize, Serialize};

use super::artifact::{into_artifact, tokenizer_json, Output};
use super::msg;
use super::progress::Progress;
use crate::store::{Artifact, Picked};
use crate::Cpu;

/// The training backend: Burn's autodiff over the studio's CPU backend.
pub type Ad = Autodiff<Cpu>;

/// Held-out tokens scored per language at each evaluation (the page's
/// perplexity and routing shares; windows of
/// [`super::perplexity::WINDOW`]).
pub const EVAL_TOKENS: usize = 512;

/// The most steps the page runs in one stage (longer runs belong to the
/// CLI or the server's Jobs page).
pub const MAX_STEPS: usize = 2000;

/// One language's texts: what it trains on and what is held out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LangText {
    /// Language or domain name (`hu`, `en`).
    pub name: String,
    /// Training text (documents separated by blank lines, as the CLI's
    /// `.txt` files).
    pub train: String,
    /// Held-out text (scored, never trained on).
    pub heldout: String,
}

/// The training form as plain values (the page checks them with
/// [`crate::validate::train`], the worker builds the [`TrainConfig`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainForm {
    /// `experts` (stage 1) or `router` (stage 2).
    pub stage: String,
    /// Optimizer steps.
    pub steps: String,
    /// Peak learning rate.
    pub lr: String,
    /// Sequences per step.
    pub batch: String,
    /// Tokens per sequence.
    pub seq_len: String,
    /// Load-balancing coefficient.
    pub alpha: String,
    /// Language-prior coefficient (applies to the replayed original
    /// language).
    pub prior: String,
    /// Mix the original language's text into the training data, tagged as
    /// original (stage 2's replay).
    pub replay: bool,
}

/// The form field an error is about (the page shows it next to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TrainField {
    /// The model (no MoE layer, too large, ...).
    Model,
    /// The stage.
    Stage,
    /// Steps.
    Steps,
    /// Learning rate.
    Lr,
    /// Batch.
    Batch,
    /// Sequence length.
    SeqLen,
    /// Load-balancing coefficient.
    Alpha,
    /// Language-prior coefficient.
    Prior,
    /// The new language's texts.
    NewText,
    /// The original language's texts.
    OrigText,
}

impl TrainField {
    /// The `data-testid` suffix of the field's error (`train-error-lr`).
    pub fn id(self) -> &'static str {
        match self {
            TrainField::Model => "model",
            TrainField::Stage => "stage",
            TrainField::Steps => "steps",
            TrainField::Lr => "lr",
            TrainField::Batch => "batch",
            TrainField::SeqLen => "seq-len",
            TrainField::Alpha => "alpha",
            TrainField::Prior => "prior",
            TrainField::NewText => "new-text",
            TrainField::OrigText => "orig-text",
        }
    }

    /// The field a spec field of [`crate::validate::train`] or a CLI
    /// option of [`TrainConfig::validate`] names.
    pub fn of_option(name: &str) -> TrainField {
        let n = name.trim_start_matches("--").trim_start_matches("spec.");
        match n.split(['[', '.', '/']).next().unwrap_or("") {
            "stage" => TrainField::Stage,
            "steps" => TrainField::Steps,
            "lr" | "min-lr" | "min_lr" => TrainField::Lr,
            "batch" => TrainField::Batch,
            "seq-len" | "seq_len" => TrainField::SeqLen,
            "alpha" => TrainField::Alpha,
            "prior" => TrainField::Prior,
            "data" => TrainField::NewText,
            _ => TrainField::Model,
        }
    }
}

/// A refusal: the field and the message in the page's words.
pub type Refusal = (TrainField, String);

/// What a stage runs: the form parsed, and the two languages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainJob {
    /// The form.
    pub form: TrainForm,
    /// The new language (trained in both stages).
    pub new: LangText,
    /// The original language (scored in both stages; replayed in stage 2).
    pub original: LangText,
    /// Evaluate every this many steps (0: only before and after).
    pub eval_every: usize,
}

/// Parses the form into the trainer's configuration (the CLI's defaults
/// for everything the form does not set: warm-up 10% of the steps, cosine
/// to 10%, clip 1.0, seed 0).
///
/// # Errors
/// The field that does not parse or that the server's rules refuse.
pub fn config(form: &TrainForm) -> Result<TrainConfig, Refusal> {
    let stage = match form.stage.as_str() {
        "experts" => Stage::Experts,
        "router" => Stage::Router,
        s => {
            return Err((
                TrainField::Stage,
                format!("stage `{s}`: the tab trains `experts` (stage 1) or `router` (stage 2)"),
            ))
        }
    };
    fn num<T: std::str::FromStr>(s: &str, field: TrainField, what: &str) -> Result<T, Refusal> {
        s.trim().parse().map_err(|_| (field, format!("{what}: `{}` is not a valid number", s.trim())))
    }
    let steps: usize = num(&form.steps, TrainField::Steps, "steps")?;
    let lr: f64 = num(&form.lr, TrainField::Lr, "learning rate")?;
    let batch: usize = num(&form.batch, TrainField::Batch, "batch")?;
    let seq_len: usize = num(&form.seq_len, TrainField::SeqLen, "sequence length")?;
    let alpha: f64 = num(&form.alpha, TrainField::Alpha, "load-balancing coefficient α")?;
    let prior: f64 = num(&form.prior, TrainField::Prior, "language-prior coefficient β")?;
    let params = TrainParams {
        seq_len,
        batch,
        lr: Some(lr),
        alpha,
        prior,
        warmup: (steps / 10).min(10),
        ..TrainParams::default()
    };
    crate::validate::train(stage, steps, &params).map_err(|e| (TrainField::of_option(&e.key), e.message))?;
    if steps > MAX_STEPS {
        return Err((
            TrainField::Steps,
            format!(
                "steps: {steps}: the tab runs at most {MAX_STEPS} per stage (use the CLI or the Jobs page for more)"
            ),
        ));
    }
    Ok(params.config(stage, steps))
}

/// Held-out perplexity and routing of one language at one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LangEval {
    /// The language.
    pub name: String,
    /// Held-out perplexity (learned routing).
    pub ppl: f64,
    /// Tokens scored.
    pub tokens: usize,
    /// The share of routed slots each expert got, averaged over the MoE
    /// layers with the most common expert count (`None` when the layers'
    /// counts differ so much that no expert index means one thing; see
    /// `new_share`).
    pub expert_share: Option<Vec<f64>>,
    /// The share of routed slots that went to trainable (not frozen)
    /// experts, averaged over the MoE layers.
    pub new_share: f64,
}

/// One step of a stage as the page draws it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainPoint {
    /// Steps done (0: before the first).
    pub step: usize,
    /// Steps of the stage.
    pub steps: usize,
    /// Total loss of the step (`None` at step 0).
    pub loss: Option<f64>,
    /// Next-token cross-entropy.
    pub ce: Option<f64>,
    /// Load-balancing loss.
    pub lb: Option<f64>,
    /// Language-prior loss.
    pub prior: Option<f64>,
    /// Both languages scored, on evaluation steps.
    pub eval: Option<Vec<LangEval>>,
    /// Milliseconds since the stage started.
    pub millis: f64,
}

/// What a finished stage reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSummary {
    /// Every step (with the evaluations).
    pub points: Vec<TrainPoint>,
    /// Trainable and frozen parameters (elements).
    pub trainable: usize,
    /// Frozen parameters (elements).
    pub frozen: usize,
    /// Tokens per step.
    pub tokens_per_step: usize,
    /// Warnings of the trainer (e.g. top-1 routers).
    pub warnings: Vec<String>,
}

/// Packs one text for the mixture with the model's tokenizer, as the CLI
/// packs a `--data` file.
fn source(
    spec: DataSpec,
    text: &str,
    m: &moe_shared::checkpoint::LoadedModel,
    seq_len: usize,
    field: TrainField,
) -> Result<moe_shared::train::PackedSource, Refusal> {
    let tok = m.tokenizer.as_ref().ok_or((TrainField::Model, format!("{} has no tokenizer", m.path)))?;
    source_from_text(&spec, text, moe_shared::corpus::DocSplit::Blank, tok, seq_len).map_err(|e| (field, msg(e)))
}

/// Scores `text` with `model`: held-out perplexity and the routing shares.
fn eval_lang(model: &Transformer<Cpu>, name: &str, ids: &[u32], frozen: &[Vec<usize>]) -> Result<LangEval, String> {
    let window = super::perplexity::WINDOW.min(model.config.max_position_embeddings).max(2);
    let opts = PerplexityOptions { window, stride: window, max_tokens: Some(EVAL_TOKENS), ..Default::default() };
    let r = evaluate(model, ids, opts, Routing::Learned, &Default::default(), |_, _| {}).map_err(msg)?;
    Ok(LangEval {
        name: name.to_string(),
        ppl: r.report.ppl,
        tokens: r.report.tokens,
        expert_share: common_share(&r.load),
        new_share: new_share(&r.load, frozen),
    })
}

/// The per-expert share averaged over the MoE layers whose expert count is
/// the most common one.
pub fn common_share(load: &[Option<Vec<f64>>]) -> Option<Vec<f64>> {
    let layers: Vec<&Vec<f64>> = load.iter().flatten().collect();
    let mut counts: Vec<(usize, usize)> = Vec::new();
    for l in &layers {
        match counts.iter_mut().find(|(e, _)| *e == l.len()) {
            Some(c) => c.1 += 1,
            None => counts.push((l.len(), 1)),
        }
    }
    let (e, n) = counts.into_iter().max_by_key(|&(e, n)| (n, e))?;
    if n * 2 < layers.len() {
        return None;
    }
    let mut m = vec![0.0; e];
    for l in layers.iter().filter(|l| l.len() == e) {
        m.iter_mut().zip(l.iter()).for_each(|(a, b)| *a += b);
    }
    m.iter_mut().for_each(|x| *x /= n as f64);
    Some(m)
}

/// The share of routed slots that went to experts not in `frozen[l]`,
/// averaged over the MoE layers.
pub fn new_share(load: &[Option<Vec<f64>>], frozen: &[Vec<usize>]) -> f64 {
    let per: Vec<f64> = load
        .iter()
        .enumerate()
        .filter_map(|(l, s)| {
            let f = frozen.get(l).map(Vec::as_slice).unwrap_or(&[]);
            s.as_ref().map(|s| s.iter().enumerate().filter(|(e, _)| !f.contains(e)).map(|(_, x)| x).sum::<f64>())
        })
        .collect();
    per.iter().sum::<f64>() / per.len().max(1) as f64
}

/// Runs `job` on `picked` (an MoE), reporting every step to `on_point`.
///
/// # Errors
/// A [`Refusal`] naming the field at fault: a dense model, a stage that
/// has nothing to train, texts with too few tokens, a loss that is not
/// finite (lower the learning rate).
pub fn run(
    progress: &Progress,
    picked: &Picked,
    job: &TrainJob,
    on_point: &dyn Fn(&TrainPoint),
) -> Result<(Artifact, TrainSummary), Refusal> {
    let t0 = crate::web::now_ms();
    let config = config(&job.form)?;
    let m = picked.model();
    if m.moe.is_none() {
        return Err((
            TrainField::Model,
            format!(
                "{} is dense: DeltaMoE's stages train an MoE (upcycle it first on the Upcycle page)",
                picked.name()
            ),
        ));
    }
    for (t, field) in [(&job.new, TrainField::NewText), (&job.original, TrainField::OrigText)] {
        if t.train.trim().is_empty() && (field == TrainField::NewText || job.form.replay) {
            return Err((field, format!("the {} training text is empty", t.name)));
        }
        if t.heldout.trim().is_empty() {
            return Err((field, format!("the {} held-out text is empty", t.name)));
        }
    }
    progress.step("tokenizing the texts", 0, 1, "steps");
    let spec = |t: &LangText, original: bool| DataSpec {
        name: t.name.clone(),
        path: format!("{}.txt", t.name),
        weight: 1.0,
        original,
    };
    let mut sources = vec![source(spec(&job.new, false), &job.new.train, m, config.seq_len, TrainField::NewText)?];
    if job.form.replay {
        sources.push(source(spec(&job.original, true), &job.original.train, m, config.seq_len, TrainField::OrigText)?);
    }
    let data = Mixture::new(sources, config.seed).map_err(|e| (TrainField::OrigText, msg(e)))?;
    let tok = m.tokenizer.as_ref().ok_or((TrainField::Model, format!("{} has no tokenizer", m.path)))?;
    let held: Vec<(String, Vec<u32>)> = [(&job.new, TrainField::NewText), (&job.original, TrainField::OrigText)]
        .into_iter()
        .map(|(t, f)| {
            let ids = moe_shared::corpus::text_stream(
                &t.heldout,
                "the held-out text",
                moe_shared::corpus::DocSplit::Blank,
                tok,
            )
            .map_err(|e| (f, msg(e)))?;
            if ids.len() < 2 {
                return Err((
                    f,
                    format!("the {} held-out text has {} token(s): at least 2 are needed", t.name, ids.len()),
                ));
            }
            Ok((t.name.clone(), ids))
        })
        .collect::<Result<_, Refusal>>()?;
    let device = Default::default();
    let model = load_model::<Ad>(m, &device).map_err(|e| (TrainField::Model, msg(e)))?;
    let frozen: Vec<Vec<usize>> = model
        .layers
        .iter()
        .map(|b| match &b.mlp {
            Mlp::Moe(x) => x.frozen.clone(),
            Mlp::Dense(_) => Vec::new(),
        })
        .collect();
    let mut trainer = Trainer::new(model, data, config.clone(), vec![device], picked.name()).map_err(|e| {
        let field = match &e {
            moe_shared::StudioError::Config { source_name, .. } => TrainField::of_option(source_name),
            _ => TrainField::Model,
        };
        (field, msg(e))
    })?;
    let counts = trainer.param_counts();
    let score = |t: &Trainer<Ad>| -> Result<Vec<LangEval>, Refusal> {
        let inf = t.inference_model();
        held.iter().map(|(n, ids)| eval_lang(&inf, n, ids, &frozen).map_err(|e| (TrainField::Model, e))).collect()
    };
    let mut points = Vec::with_capacity(config.steps + 1);
    let first = TrainPoint {
        step: 0,
        steps: config.steps,
        loss: None,
        ce: None,
        lb: None,
        prior: None,
        eval: Some(score(&trainer)?),
        millis: crate::web::now_ms() - t0,
    };
    on_point(&first);
    points.push(first);
    let mut metrics = Vec::new();
    for s in 1..=config.steps {
        progress.step(
            &format!("stage {} ({})", config.stage.name(), picked.name()),
            (s - 1) as u64,
            config.steps as u64,
            "steps",
        );
        let sm: StepMetrics = trainer.step().map_err(|e| (TrainField::Lr, msg(e)))?;
        let eval = (s == config.steps || (job.eval_every > 0 && s % job.eval_every == 0))
            .then(|| score(&trainer))
            .transpose()?;
        let p = TrainPoint {
            step: s,
            steps: config.steps,
            loss: Some(sm.loss),
            ce: Some(sm.ce_loss),
            lb: sm.lb_loss,
            prior: sm.prior_loss,
            eval,
            millis: crate::web::now_ms() - t0,
        };
        on_point(&p);
        points.push(p);
        metrics.extend(serde_json::to_vec(&sm).expect("metrics serialise"));
        metrics.push(b'\n');
    }
    progress.step("writing the trained checkpoint", 0, 1, "files");
    let provenance = serde_json::json!({
        "method": format!("train/{}", config.stage.name()),
        "source": picked.name(),
        "config": config,
        "data": [&job.new.name, &job.original.name],
        "engine": "burn (browser, wasm32)",
    });
    let inf = trainer.inference_model();
    let (safetensors, config_json) =
        model_to_bytes(&inf, DType::F32, provenance, LayoutRequest::Auto).map_err(|e| (TrainField::Model, msg(e)))?;
    let stem = match config.stage {
        Stage::Router => "stage2",
        _ => "stage1",
    };
    let out = Output {
        name: format!("{}-{stem}", picked.name()),
        method: "train",
        safetensors,
        config_json,
        tokenizer: m.tokenizer.clone(),
        tokenizer_json: tokenizer_json(m.tokenizer.as_ref()),
        extra: vec![("metrics.jsonl".into(), metrics)],
        millis: crate::web::now_ms() - t0,
    };
    let artifact = into_artifact(out).map_err(|e| (TrainField::Model, e))?;
    let summary = TrainSummary {
        points,
        trainable: counts.trainable,
        frozen: counts.frozen,
        tokens_per_step: config.tokens_per_step(),
        warnings: trainer.warnings().to_vec(),
    };
    Ok((artifact, summary))
}
