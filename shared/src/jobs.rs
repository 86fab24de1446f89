//! One description of each job kind: the spec ([`crate::api::JobSpec`],
//! which validates itself) also gives
//!
//! - the `moe-studio` command line that runs it ([`JobSpec::cli_args`]),
//!   which the server runs as the job's child process — the same options
//!   a user types, so a job and the command give the same numbers;
//! - where its output model lands ([`JobSpec::output_model`]);
//! - the form's inputs with their labels, kinds and defaults
//!   ([`JobKind::fields`]), the defaults read from the same values the CLI
//!   declares ([`Defaults`]), so the Jobs page, the CLI's `--help` and the
//!   spec's documentation say the same thing.
//!
//! A backend test parses every kind's `cli_args` with the CLI's own
//! parser and checks the parser's defaults against [`Defaults`].

use crate::api::{DataRef, JobSpec};
pub use crate::ops::form::{Field, Input};

/// The file the server writes an upcycle's `experts_per_layer` into (in
/// the job's directory), passed as `--allocation`.
pub const ALLOCATION_FILE: &str = "allocation.json";

/// Where a job's inputs are, as its command sees them (paths relative to
/// the job's working directory).
pub trait JobInputs {
    /// The model argument of checkpoint `id` (a directory or a file).
    fn model(&self, id: &str) -> String;
    /// The file of dataset `d` (its held-out file when `heldout`).
    fn data(&self, d: &DataRef, heldout: bool) -> String;
}

/// The defaults of the options a job spec leaves unset: the CLI's
/// defaults (its `clap` attributes read these) and the form's hints.
/// Each comes from the method's own options where it has them
/// ([`crate::ops::upcycle::UpcycleParams::default`]).
/// The operations already in `ops/` with their own form fields
/// ([`crate::ops::route::RouteParams`], [`crate::ops::moerge::MoergeParams`])
/// are not repeated here.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// upcycle `--top-k`.
    pub upcycle_top_k: usize,
    /// upcycle `--frozen`.
    pub upcycle_frozen: Vec<usize>,
    /// upcycle `--router-std`.
    pub upcycle_router_std: f64,
    /// upcycle `--noise`.
    pub upcycle_noise: f64,
    /// upcycle / merge / train `--seed`.
    pub seed: u64,
    /// merge `--density`.
    pub merge_density: f64,
    /// neurons `--top-n`.
    pub neurons_top_n: usize,
    /// neurons `--max-texts`.
    pub neurons_max_texts: usize,
    /// neurons `--max-tokens`.
    pub neurons_max_tokens: usize,
    /// eval `--window`.
    pub eval_window: usize,
    /// eval `--stride`.
    pub eval_stride: usize,
    /// train `--seq-len`.
    pub train_seq_len: usize,
    /// train `--batch`.
    pub train_batch: usize,
    /// train `--warmup`.
    pub train_warmup: usize,
    /// train `--min-lr`.
    pub train_min_lr: f64,
    /// train `--grad-accum`.
    pub train_grad_accum: usize,
    /// train `--clip`.
    pub train_clip: f64,
    /// train `--alpha`.
    pub train_alpha: f64,
    /// train `--prior`.
    pub train_prior: f64,
    /// train `--weight-decay`.
    pub train_weight_decay: f64,
    /// train `--devices`.
    pub train_devices: usize,
}

impl Default for Defaults {
    fn default() -> Self {
        let up = crate::ops::upcycle::UpcycleParams::default();
        Defaults {
            upcycle_top_k: up.top_k,
            upcycle_frozen: up.frozen.clone(),
            upcycle_router_std: up.router_std,
            upcycle_noise: up.noise,
            seed: up.seed,
            merge_density: 0.5,
            neurons_top_n: 1000,
            neurons_max_texts: 300,
            neurons_max_tokens: 256,
            eval_window: 512,
            eval_stride: 256,
            train_seq_len: 256,
            train_batch: 8,
            train_warmup: 10,
            train_min_lr: 0.1,
            train_grad_accum: 1,
            train_clip: 1.0,
            train_alpha: 0.01,
            train_prior: 0.1,
            train_weight_decay: 0.0,
            train_devices: 1,
        }
    }
}

/// `--flag=value` when set (`=` so that negative numbers are not read as flags).
fn opt<T: ToString>(argv: &mut Vec<String>, flag: &str, v: Option<T>) {
    if let Some(v) = v {
        argv.push(format!("--{flag}={}", v.to_string()));
    }
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

/// `NAME=FILE` (with `:HELDOUT` when asked and given).
fn data_arg(inputs: &dyn JobInputs, d: &DataRef, with_heldout: bool) -> String {
    let mut s = format!("{}={}", d.name, inputs.data(d, false));
    if with_heldout && d.heldout.is_some() {
        s.push(':');
        s.push_str(&inputs.data(d, true));
    }
    s
}

impl JobSpec {
    /// The `moe-studio` subcommand and options that run this spec (what
    /// follows the global `--backend`), writing into `out/` of the
    /// working directory with `--json` where the command has it; `resume`
    /// adds train's `--resume`. Unset options are left out, so the CLI's
    /// defaults ([`Defaults`]) apply; train's `--save-every` defaults to a
    /// tenth of the steps (what a resumed job continues from).
    pub fn cli_args(&self, inputs: &dyn JobInputs, resume: bool) -> Vec<String> {
        let m = |id: &String| inputs.model(id);
        let mut a: Vec<String> = Vec::new();
        let json_out = |a: &mut Vec<String>| a.extend(["--out=out".to_string(), "--json".to_string()]);
        match self {
            JobSpec::Train(s) => {
                a.extend(["train".into(), m(&s.model), format!("--stage={}", s.stage.name())]);
                for d in &s.data {
                    let mut x = data_arg(inputs, d, false);
                    if let Some(w) = d.weight {
                        x.push_str(&format!(":{w}"));
                    }
                    if d.original {
                        x.push_str(":orig");
                    }
                    a.push(format!("--data={x}"));
                }
                a.push(format!("--steps={}", s.steps));
                opt(&mut a, "seq-len", s.seq_len);
                opt(&mut a, "batch", s.batch);
                opt(&mut a, "lr", s.lr);
                opt(&mut a, "warmup", s.warmup);
                opt(&mut a, "min-lr", s.min_lr);
                opt(&mut a, "grad-accum", s.grad_accum);
                opt(&mut a, "clip", s.clip);
                opt(&mut a, "alpha", s.alpha);
                opt(&mut a, "prior", s.prior);
                opt(&mut a, "weight-decay", s.weight_decay);
                a.push(format!("--save-every={}", s.save_every.unwrap_or((s.steps / 10).max(1))));
                opt(&mut a, "seed", s.seed);
                opt(&mut a, "devices", s.devices);
                if s.engine == Some(crate::api::TrainEngine::Torch) {
                    // The job directory is the artefact; emitting again is the resume.
                    a.extend(["--engine=torch".to_string(), "--emit=out".to_string(), "--json".to_string()]);
                } else {
                    json_out(&mut a);
                    if resume {
                        a.push("--resume".into());
                    }
                }
            }
            JobSpec::Upcycle(s) => {
                a.extend(["upcycle".into(), m(&s.model)]);
                opt(&mut a, "experts", s.experts);
                if s.experts_per_layer.is_some() {
                    a.push(format!("--allocation={ALLOCATION_FILE}"));
                }
                opt(&mut a, "top-k", s.top_k);
                match &s.frozen {
                    Some(f) if f.is_empty() => a.push("--no-frozen".into()),
                    Some(f) => a.push(format!("--frozen={}", join(f))),
                    None => {}
                }
                opt(&mut a, "router-init", s.router_init.clone());
                opt(&mut a, "noise", s.noise);
                opt(&mut a, "seed", s.seed);
                opt(&mut a, "dtype", s.dtype.clone());
                json_out(&mut a);
            }
            JobSpec::Moerge(s) => {
                a.push("moerge".into());
                a.extend(s.models.iter().map(m));
                a.extend(crate::ops::flags(&s.params));
                opt(&mut a, "dtype", s.dtype.clone());
                json_out(&mut a);
            }
            JobSpec::Route(s) => {
                a.extend(["route".into(), m(&s.model)]);
                for d in &s.domains {
                    a.push(format!("--domain={}", data_arg(inputs, d, true)));
                }
                a.extend(crate::ops::flags(&s.params));
                json_out(&mut a);
            }
            JobSpec::Graft(s) => {
                a.extend(["graft".into(), m(&s.target), format!("--base={}", m(&s.base))]);
                a.push(format!("--instruct={}", m(&s.instruct)));
                a.extend(crate::ops::flags(&s.params));
                json_out(&mut a);
            }
            JobSpec::Merge(s) => {
                a.extend(["merge".into(), s.method.name().into()]);
                a.extend(s.models.iter().map(m));
                if let Some(w) = &s.weights {
                    a.push(format!("--weights={}", join(w)));
                }
                if let Some(b) = &s.base {
                    a.push(format!("--base={}", m(b)));
                }
                opt(&mut a, "density", s.density);
                opt(&mut a, "seed", s.seed);
                opt(&mut a, "dtype", s.dtype.clone());
                json_out(&mut a);
            }
            JobSpec::Neurons(s) => {
                a.extend(["neurons".into(), m(&s.model)]);
                for d in &s.langs {
                    a.push(format!("--lang={}", data_arg(inputs, d, false)));
                }
                if !s.new.is_empty() {
                    a.push(format!("--new={}", s.new.join(",")));
                }
                opt(&mut a, "top-n", s.top_n);
                opt(&mut a, "max-texts", s.max_texts);
                opt(&mut a, "max-tokens", s.max_tokens);
                a.push("--out=out".into());
            }
            JobSpec::Eval(s) => {
                a.extend(["eval".into(), m(&s.model)]);
                for d in &s.data {
                    a.push(format!("--data={}", data_arg(inputs, d, false)));
                }
                opt(&mut a, "window", s.window);
                opt(&mut a, "stride", s.stride);
                opt(&mut a, "max-tokens", s.max_tokens);
                opt(&mut a, "routing", s.routing.clone());
                a.push("--json".into());
            }
            JobSpec::Task(s) => {
                a.extend(["eval".into(), m(&s.model)]);
                for d in &s.tasks {
                    a.push(format!("--task={}", data_arg(inputs, d, false)));
                }
                opt(&mut a, "target-delimiter", s.target_delimiter.clone());
                opt(&mut a, "limit", s.limit);
                opt(&mut a, "batch", s.batch);
                a.push("--json".into());
            }
        }
        a
    }

    /// Where the command writes its output model, relative to the working
    /// directory (`out`, train's `out/final`), or `None` when it writes no
    /// model (neurons, eval, task).
    pub fn output_model(&self) -> Option<&'static str> {
        match self {
            JobSpec::Train(s) if s.engine == Some(crate::api::TrainEngine::Torch) => None,
            JobSpec::Train(_) => Some("out/final"),
            JobSpec::Neurons(_) | JobSpec::Eval(_) | JobSpec::Task(_) => None,
            _ => Some("out"),
        }
    }

    /// Whether the command's stdout is its result (eval's and task's JSON
    /// report, kept as `out/result.json`).
    pub fn stdout_is_result(&self) -> bool {
        matches!(self, JobSpec::Eval(_) | JobSpec::Task(_))
    }
}

// ----- the form ---------------------------------------------------------------

/// A job kind (the `kind` of [`JobSpec`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JobKind {
    /// [`crate::api::UpcycleSpec`].
    #[default]
    Upcycle,
    /// [`crate::api::MoergeSpec`].
    Moerge,
    /// [`crate::api::RouteSpec`].
    Route,
    /// [`crate::api::GraftSpec`].
    Graft,
    /// [`crate::api::MergeSpec`].
    Merge,
    /// [`crate::api::NeuronsSpec`].
    Neurons,
    /// [`crate::api::TrainSpec`].
    Train,
    /// [`crate::api::EvalSpec`].
    Eval,
    /// [`crate::api::TaskSpec`].
    Task,
}

impl JobKind {
    /// Every kind, in the order of the Jobs page's selector.
    pub const ALL: [JobKind; 9] = [
        JobKind::Upcycle,
        JobKind::Train,
        JobKind::Eval,
        JobKind::Task,
        JobKind::Moerge,
        JobKind::Route,
        JobKind::Graft,
        JobKind::Merge,
        JobKind::Neurons,
    ];

    /// The wire spelling (as [`JobSpec::kind`]).
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Upcycle => "upcycle",
            JobKind::Moerge => "moerge",
            JobKind::Route => "route",
            JobKind::Graft => "graft",
            JobKind::Merge => "merge",
            JobKind::Neurons => "neurons",
            JobKind::Train => "train",
            JobKind::Eval => "eval",
            JobKind::Task => "task",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<JobKind> {
        JobKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// What the selector shows.
    pub fn label(self) -> &'static str {
        match self {
            JobKind::Upcycle => "upcycle (dense → MoE)",
            JobKind::Moerge => "moerge (dense models → MoE, DUME)",
            JobKind::Route => "route (ridge router of a MoErged model)",
            JobKind::Graft => "graft (add instruct − base)",
            JobKind::Merge => "merge (linear / task arithmetic / TIES / DARE)",
            JobKind::Neurons => "neurons (language-specific neurons, NeuronMoE)",
            JobKind::Train => "train (experts / router / dense)",
            JobKind::Eval => "eval (perplexity, routing load)",
            JobKind::Task => "task accuracy (multiple choice, lm-eval's acc / acc_norm)",
        }
    }

    /// The form's inputs: one per field of the kind's spec type, in its
    /// order, with the CLI's defaults ([`Defaults`]) as hints.
    pub fn fields(self) -> &'static [Field] {
        static TABLES: std::sync::OnceLock<Vec<Vec<Field>>> = std::sync::OnceLock::new();
        let t = TABLES.get_or_init(|| JobKind::ALL.iter().map(|k| k.make_fields(&Defaults::default())).collect());
        &t[JobKind::ALL.iter().position(|k| *k == self).unwrap_or(0)]
    }

    /// The field `key` of this kind's form.
    pub fn field(self, key: &str) -> Option<&'static Field> {
        self.fields().iter().find(|f| f.key == key)
    }

    fn make_fields(self, d: &Defaults) -> Vec<Field> {
        let dflt = |v: &dyn std::fmt::Display| format!("default {v}");
        let frozen = if d.upcycle_frozen.is_empty() { "none".to_string() } else { join(&d.upcycle_frozen) };
        match self {
            JobKind::Upcycle => vec![
                req("model", "model", Input::Checkpoint, ""),
                f("experts", "experts", Input::Int, "2-256"),
                f("experts_per_layer", "experts per layer", Input::LayerList, "e.g. 2,4,-,4 (- = dense)"),
                f("top_k", "top-k", Input::Int, &dflt(&d.upcycle_top_k)),
                f("frozen", "frozen experts", Input::IntList, &format!("default {frozen}; none")),
                f("router_init", "router init", Input::Choice(&["zeros", "random"]), "zeros"),
                adv("noise", "noise", Input::Float, &dflt(&d.upcycle_noise)),
                adv("seed", "seed", Input::Int, &dflt(&d.seed)),
                adv("dtype", "dtype", Input::Choice(DTYPES), "source's"),
            ],
            JobKind::Moerge => std::iter::once(req("models", "models (expert i = model i)", Input::Checkpoints, ""))
                .chain(crate::ops::moerge::MoergeParams::form_fields())
                .chain([adv("dtype", "dtype", Input::Choice(DTYPES), "source's")])
                .collect(),
            JobKind::Route => [
                req("model", "MoErged model", Input::Checkpoint, ""),
                req("domains", "domains (one per expert, in expert order)", data(2, false, false, true), ""),
            ]
            .into_iter()
            .chain(crate::ops::route::RouteParams::form_fields())
            .collect(),
            JobKind::Graft => vec![
                req("target", "target (MoE or dense)", Input::Checkpoint, ""),
                req("base", "base (dense)", Input::Checkpoint, ""),
                req("instruct", "instruct (dense)", Input::Checkpoint, ""),
            ]
            .into_iter()
            .chain(crate::ops::graft::GraftParams::form_fields())
            .collect(),
            JobKind::Merge => vec![
                req("method", "method", Input::Choice(&["linear", "task-arithmetic", "ties", "dare", "dare-ties"]), ""),
                req("models", "models", Input::Checkpoints, ""),
                f("weights", "weights", Input::FloatList, "one per model, e.g. 0.5,0.5"),
                f("base", "base", Input::OptCheckpoint, ""),
                f("density", "density", Input::Float, &dflt(&d.merge_density)),
                adv("seed", "seed", Input::Int, &dflt(&d.seed)),
                adv("dtype", "dtype", Input::Choice(DTYPES), "source's"),
            ],
            JobKind::Neurons => vec![
                req("model", "model", Input::Checkpoint, ""),
                req("langs", "languages (name = language code)", data(2, false, false, false), ""),
                f("new", "new languages", Input::Names, "e.g. hu,el"),
                f("top_n", "top-n", Input::Int, &dflt(&d.neurons_top_n)),
                f("max_texts", "max texts", Input::Int, &dflt(&d.neurons_max_texts)),
                f("max_tokens", "max tokens", Input::Int, &dflt(&d.neurons_max_tokens)),
            ],
            JobKind::Train => vec![
                req("model", "model", Input::Checkpoint, ""),
                req("stage", "stage", Input::Choice(&crate::train::Stage::NAMES), ""),
                req("data", "corpora", data(1, true, true, false), ""),
                req("steps", "steps", Input::Int, "1-1000000"),
                f("seq_len", "seq len", Input::Int, &dflt(&d.train_seq_len)),
                f("batch", "batch", Input::Int, &dflt(&d.train_batch)),
                f("lr", "lr", Input::Float, "default per stage (5e-5; router 1e-4)"),
                adv("warmup", "warmup", Input::Int, &dflt(&d.train_warmup)),
                adv("min_lr", "min lr (fraction)", Input::Float, &dflt(&d.train_min_lr)),
                adv("grad_accum", "grad accum", Input::Int, &dflt(&d.train_grad_accum)),
                adv("clip", "clip", Input::Float, &dflt(&d.train_clip)),
                adv("alpha", "alpha (balance)", Input::Float, &dflt(&d.train_alpha)),
                adv("prior", "prior", Input::Float, &dflt(&d.train_prior)),
                adv("weight_decay", "weight decay", Input::Float, &dflt(&d.train_weight_decay)),
                adv("save_every", "save every", Input::Int, "steps / 10"),
                f("seed", "seed", Input::Int, &dflt(&d.seed)),
                adv("devices", "devices", Input::Int, &dflt(&d.train_devices)),
                f("engine", "engine", Input::Choice(&["burn", "torch"]), "burn (torch: emit a PyTorch FSDP job)"),
            ],
            JobKind::Eval => vec![
                req("model", "model", Input::Checkpoint, ""),
                req("data", "datasets", data(1, false, false, false), ""),
                f("window", "window", Input::Int, &dflt(&d.eval_window)),
                f("stride", "stride", Input::Int, &dflt(&d.eval_stride)),
                f("max_tokens", "max tokens", Input::Int, "all"),
                f("routing", "routing", Input::Choice(&["learned", "oracle", "random"]), "learned"),
            ],
            JobKind::Task => vec![
                req("model", "model", Input::Checkpoint, ""),
                req("tasks", "tasks (.jsonl: context, choices, gold per line)", data(1, false, false, false), ""),
                f(
                    "target_delimiter",
                    "target delimiter",
                    Input::Choice(&["space", "none"]),
                    "space (lm-eval's default); none for contexts that end in a newline",
                ),
                f("limit", "items per task", Input::Int, "all"),
                adv("batch", "batch (requests per pass)", Input::Int, &dflt(&crate::eval::McOptions::default().batch)),
            ],
        }
    }
}

impl JobSpec {
    /// Its [`JobKind`].
    pub fn job_kind(&self) -> JobKind {
        JobKind::parse(self.kind()).unwrap_or_default()
    }
}

fn f(key: &'static str, label: &'static str, input: Input, hint: &str) -> Field {
    Field::new(key, label, input, hint)
}
fn req(key: &'static str, label: &'static str, input: Input, hint: &str) -> Field {
    Field::new(key, label, input, hint).required()
}
fn adv(key: &'static str, label: &'static str, input: Input, hint: &str) -> Field {
    Field::new(key, label, input, hint).advanced()
}
const fn data(rows: usize, weight: bool, original: bool, heldout: bool) -> Input {
    Input::Data { rows, weight, original, heldout }
}

const DTYPES: &[&str] = &["f32", "f16", "bf16"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_show_the_defaults() {
        let r = crate::ops::route::RouteParams::default();
        assert_eq!(JobKind::Route.field("lambda").unwrap().hint, format!("default {}", r.lambda));
        assert_eq!(JobKind::Upcycle.field("top_k").unwrap().hint, "default 2");
        assert_eq!(JobKind::Upcycle.field("frozen").unwrap().hint, "default 0; none");
        assert_eq!(JobKind::Train.field("seq_len").unwrap().hint, "default 256");
        for k in JobKind::ALL {
            assert_eq!(JobKind::parse(k.as_str()), Some(k));
            assert!(!k.fields().is_empty());
        }
    }
}
