//! Command-line definitions and dispatch.

mod allocate;
mod args;
pub(crate) mod backend;
mod bench;
mod bench_capture;
mod bench_kernels;
mod bench_train;
mod card;
mod convert;
mod eval;
mod eval_task;
mod figures;
mod generate;
mod graft;
mod init_random;
mod inspect;
mod logits;
mod merge;
mod moe_summary;
mod moerge;
mod neurons;
mod perplexity;
mod plot;
mod recipe;
mod route;
mod run_job;
mod tokenize;
mod torch_handoff;
mod train;
mod upcycle;

use clap::{Parser, Subcommand};

/// moe-studio: turn dense LLMs into Mixture-of-Experts models.
#[derive(Debug, Parser)]
#[command(name = "moe-studio", version, about)]
pub struct Cli {
    /// Compute backend: `auto` (CUDA if built with `cuda` and a device
    /// answers, else wgpu if built with `wgpu` and a hardware adapter exists,
    /// else CPU), `cpu` (always built; `ndarray` and `flex` are aliases),
    /// `wgpu` or `cuda` (when built with those cargo features).
    #[arg(long, global = true, default_value = "auto")]
    pub backend: String,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Architecture, parameter count, dtypes and tensors of a model.
    Inspect(inspect::Args),
    /// Generate text from a prompt (greedy by default).
    Generate(generate::Args),
    /// Token-level perplexity of a model on a text file (strided windows).
    Perplexity(perplexity::Args),
    /// Write any supported model as a Hugging Face safetensors directory (an MoE in any `--layout`) or a llama.cpp GGUF file (`--to gguf`).
    Convert(convert::Args),
    /// The logits of one token window as raw f32 (for comparing with other loaders).
    Logits(logits::Args),
    /// Dense -> MoE: copy every FFN into experts (DeltaMoE phase 1, NeuronMoE counts).
    Upcycle(upcycle::Args),
    /// N dense models -> one MoE with N experts (DUME MoErging).
    Moerge(moerge::Args),
    /// DUME ridge router for an MoErged model (one domain text per expert).
    Route(route::Args),
    /// Add `scale * (instruct - base)` to an MoE (every expert gets its layer's FFN delta) or a dense model (DeltaMoE phase 2).
    Graft(graft::Args),
    /// Merge baselines: linear, task-arithmetic, ties, dare, dare-ties (mergekit semantics).
    Merge(merge::Args),
    /// Run a mergekit / mergekit-moe YAML config or a studio pipeline recipe (one file, several stages).
    Recipe(recipe::Args),
    /// NeuronMoE: language-specific neurons by Average Precision (per layer and component).
    Neurons(neurons::Args),
    /// NeuronMoE: new experts per layer from `neurons` output (+ uniform / LayerMoE baselines).
    Allocate(allocate::Args),
    /// Redraw the CSV files and figures of a `neurons` output directory from its neurons.json.
    NeuronsPlot(neurons::PlotArgs),
    /// Draw one figure (lines or grouped bars) from a small JSON spec, as SVG and PNG (the experiment reports).
    Plot(plot::Args),
    /// Train an MoE's new experts or routers, or fine-tune a dense model (DeltaMoE / MoE-LPR / DUME+).
    Train(train::Args),
    /// Per-dataset perplexity and MoE routing load.
    Eval(eval::Args),
    /// Tokenise a corpus once into a memory-mapped token file (.tokens) that train, eval, perplexity and route read by offset.
    Tokenize(tokenize::Args),
    /// A dense model of a Hugging Face config with random weights (benchmarks; with a tokenizer, a model to train from scratch).
    InitRandom(init_random::Args),
    /// Benchmarks (printed beside a reference measured in the same run).
    #[command(subcommand)]
    Bench(bench::Bench),
    /// The studio's HTTP server: frontend, JSON API, uploads, job queue, live progress.
    Serve(crate::server::ServeArgs),
    /// Run a server job from its job file (`job.json` in the job's directory: the spec, the backend, the inputs).
    RunJob(run_job::Args),
}

/// Runs one parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    if !matches!(cli.command, Command::Serve(_)) {
        // Rust ignores SIGPIPE, so `moe-studio inspect M | head` panicked
        // with "failed printing to stdout: Broken pipe"; a command-line
        // tool should end quietly instead, as `cat` does. (Not for `serve`,
        // where a closed socket must not kill the server.)
        // SAFETY: `signal` only restores the default disposition of
        // SIGPIPE for the whole process; no handler is installed.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Generate(a) => {
            // Bad sampling flags fail before the backend is chosen or the model read.
            a.validate()?;
            backend::run(&cli.backend, a)
        }
        Command::Perplexity(a) => backend::run(&cli.backend, a),
        Command::Convert(a) => convert::run(a),
        Command::Logits(a) => backend::run(&cli.backend, a),
        Command::Upcycle(a) => backend::run(&cli.backend, a),
        Command::Moerge(a) if a.needs_backend() => backend::run(&cli.backend, a),
        Command::Moerge(a) => moerge::run(a),
        Command::Route(a) => backend::run(&cli.backend, a),
        Command::Graft(a) => graft::run(a),
        Command::Merge(a) => merge::run(a),
        Command::Recipe(a) => recipe::run(&cli.backend, a),
        Command::Neurons(a) => backend::run(&cli.backend, a),
        Command::Allocate(a) => allocate::run(a),
        Command::NeuronsPlot(a) => neurons::plot(a),
        Command::Plot(a) => plot::run(a),
        Command::InitRandom(a) => init_random::run(a),
        Command::Bench(bench::Bench::Prefill(a)) => backend::run(&cli.backend, a),
        Command::Bench(bench::Bench::Generate(a)) => backend::run(&cli.backend, a),
        Command::Bench(bench::Bench::Ridge(a)) => backend::run(&cli.backend, a),
        Command::Bench(bench::Bench::Neurons(a)) => backend::run(&cli.backend, a),
        Command::Bench(bench::Bench::Train(a)) => train::run_autodiff(&cli.backend, a),
        Command::Bench(bench::Bench::Kernels(a)) => bench_kernels::run(a),
        Command::Train(a) => train::run_autodiff(&cli.backend, a),
        Command::Eval(a) => backend::run(&cli.backend, a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Serve(a) => crate::server::run(&cli.backend, a),
        Command::RunJob(a) => run_job::run(a),
    }
}

/// The job specs and the CLI describe the same commands: every spec's
/// command line (`shared::jobs`) parses with this CLI, each set field
/// reaches the option of the same name, and the CLI's defaults are the
/// operations' own (`moe_shared::ops`).
#[cfg(test)]
mod job_spec_tests {
    use super::*;
    use moe_shared::api::{DataRef, JobSpec};
    use moe_shared::jobs::JobInputs;
    use moe_shared::ops::train::TrainParams;
    use moe_shared::ops::upcycle::{NoiseArg, RouterInitArg, SharedInitArg, UpcycleParams};

    struct Paths;
    impl JobInputs for Paths {
        fn model(&self, id: &str) -> String {
            format!("models/{id}")
        }
        fn data(&self, d: &DataRef, heldout: bool) -> String {
            format!("data/{}{}.txt", d.name, if heldout { ".heldout" } else { "" })
        }
    }

    const A: &str = "123e4567-e89b-42d3-a456-426614174000";
    const B: &str = "123e4567-e89b-42d3-a456-426614174001";
    const U: &str = "123e4567-e89b-42d3-a456-426614174002";

    fn spec(v: serde_json::Value) -> JobSpec {
        let s: JobSpec = serde_json::from_value(v).unwrap();
        s.validate().unwrap();
        s
    }

    fn parse(s: &JobSpec) -> Command {
        let mut argv = vec!["moe-studio".to_string(), "--backend=ndarray".to_string()];
        argv.extend(s.cli_args(&Paths, false));
        Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}")).command
    }

    #[test]
    fn every_spec_s_command_line_parses_with_the_cli_and_carries_its_values() {
        let d = |n: &str| serde_json::json!({"name": n, "upload": U, "heldout": U, "weight": 2.0, "original": true});
        let train = spec(serde_json::json!({"kind": "train", "model": A, "stage": "router", "data": [d("hu")],
            "steps": 40, "seq_len": 64, "batch": 3, "lr": 0.001, "warmup": 2, "min_lr": 0.2, "grad_accum": 2,
            "clip": 0.5, "alpha": 0.02, "prior": 0.3, "weight_decay": 0.1, "seed": 7, "devices": 1}));
        let Command::Train(t) = parse(&train) else { panic!("train") };
        assert_eq!(
            (t.stage.name(), t.steps, t.params.seq_len, t.params.batch, t.params.warmup, t.params.grad_accum),
            ("router", 40, 64, 3, 2, 2)
        );
        let p = &t.params;
        assert_eq!((p.lr, p.min_lr, p.clip, p.alpha, p.prior, p.weight_decay), (Some(0.001), 0.2, 0.5, 0.02, 0.3, 0.1));
        assert_eq!((p.seed, p.save_every, t.data.clone()), (7, 4, vec!["hu=data/hu.txt:2:orig".to_string()]));
        // Every train parameter, each away from its default, reaches the CLI
        // through the derived flags unchanged.
        let all = TrainParams {
            seq_len: 32,
            batch: 2,
            lr: Some(3e-4),
            warmup: 3,
            min_lr: 0.25,
            grad_accum: 2,
            clip: 0.0,
            alpha: 0.02,
            lb_form: moe_shared::train::LbForm::HfMixtral,
            prior: 0.5,
            balance: moe_shared::train::Balance::AuxFree,
            bias_update_rate: 0.01,
            z_loss: 1e-3,
            norm_topk: Some(false),
            frozen_dtype: moe_shared::model::WeightsDtype::Bf16,
            weight_decay: 0.1,
            save_every: 5,
            keep: 3,
            seed: 11,
            devices: 2,
        };
        let JobSpec::Train(mut ts) = train.clone() else { unreachable!() };
        ts.params = all.clone();
        JobSpec::Train(ts.clone()).validate().unwrap();
        let Command::Train(t) = parse(&JobSpec::Train(ts)) else { panic!("train") };
        assert_eq!(t.params, all);
        assert_eq!(t.model, std::path::PathBuf::from(format!("models/{A}")));
        assert_eq!((t.engine.as_str(), t.emit.clone(), t.out.clone()), ("burn", None, Some("out".into())));
        // The PyTorch hand-off: the job directory `out` is the artefact, no model is registered.
        let torch = spec(serde_json::json!({"kind": "train", "model": A, "stage": "experts", "data": [d("hu")],
            "steps": 40, "batch": 2, "devices": 4, "engine": "torch"}));
        assert_eq!(torch.output_model(), None);
        assert!(!torch.cli_args(&Paths, true).contains(&"--resume".to_string()), "emitting again is the resume");
        let Command::Train(t) = parse(&torch) else { panic!("train") };
        assert_eq!((t.engine.as_str(), t.emit.clone(), t.out.clone()), ("torch", Some("out".into()), None));
        assert_eq!((t.params.batch, t.params.devices), (2, 4));
        // Stages dense and ffn hand off too (DUME's domain experts past one machine); all does not.
        let dense = spec(serde_json::json!({"kind": "train", "model": A, "stage": "dense",
            "data": [d("hu")], "steps": 4, "engine": "torch"}));
        let Command::Train(t) = parse(&dense) else { panic!("train") };
        assert_eq!((t.stage.name(), t.engine.as_str()), ("dense", "torch"));
        let all: JobSpec = serde_json::from_value(serde_json::json!({"kind": "train", "model": A, "stage": "all",
            "data": [d("hu")], "steps": 4, "engine": "torch"}))
        .unwrap();
        assert_eq!(all.validate().unwrap_err().field.as_deref(), Some("spec.engine"));
        let up = spec(serde_json::json!({"kind": "upcycle", "model": A, "experts": 4, "top_k": 1, "frozen": [0, 1],
            "router_init": "random", "noise": 0.01, "seed": 3, "dtype": "bf16"}));
        let Command::Upcycle(u) = parse(&up) else { panic!("upcycle") };
        assert_eq!(
            (u.experts, u.params.top_k, u.params.frozen.clone(), u.params.noise, u.params.seed),
            (Some(4), 1, vec![0, 1], 0.01, 3)
        );
        assert_eq!(u.params.router_init, RouterInitArg::Random);
        assert_eq!(u.dtype.dtype.as_deref(), Some("bf16"));
        // Every upcycle parameter, each away from its default (none frozen,
        // un-normalised top-k: `--no-frozen`, `--norm-topk=false`), reaches
        // the CLI through the derived flags unchanged.
        let all = UpcycleParams {
            top_k: 1,
            frozen: vec![],
            router_init: RouterInitArg::Random,
            router_std: 0.5,
            noise: 0.01,
            noise_kind: NoiseArg::Add,
            seed: 3,
            temperature: 0.5,
            shared_experts: 1,
            shared_gate: true,
            shared_init: SharedInitArg::Copy,
            shared_frozen: true,
            drop_ratio: 0.5,
            granularity: 2,
            norm_topk: false,
        };
        let up_all = JobSpec::Upcycle(moe_shared::api::UpcycleSpec {
            model: A.into(),
            experts: Some(4),
            experts_per_layer: None,
            dtype: None,
            params: all.clone(),
        });
        up_all.validate().unwrap();
        let Command::Upcycle(u) = parse(&up_all) else { panic!("upcycle") };
        assert!(u.no_frozen);
        let mut got = u.params.clone();
        got.frozen.clear();
        assert_eq!(got, all);
        let route = spec(serde_json::json!({"kind": "route", "model": A, "domains": [d("en"), d("hu")],
            "lambda": 0.5, "top_k": 2, "max_tokens": 99, "context": 32}));
        let Command::Route(r) = parse(&route) else { panic!("route") };
        assert_eq!((r.params.lambda, r.params.top_k, r.params.max_tokens, r.params.context), (0.5, 2, Some(99), 32));
        assert_eq!(r.domains[1], "hu=data/hu.txt:data/hu.heldout.txt");
        // Every route parameter, each away from its default, reaches the CLI
        // through the derived flags (ops::flags) unchanged.
        let all = moe_shared::ops::route::RouteParams {
            lambda: 1e-9,
            top_k: 2,
            temperature: 0.25,
            max_tokens: Some(7),
            context: 33,
            no_bias: true,
            eval_tokens: 5,
        };
        let JobSpec::Route(mut s) = route.clone() else { unreachable!() };
        s.params = all.clone();
        let Command::Route(r) = parse(&JobSpec::Route(s)) else { panic!("route") };
        assert_eq!(r.params, all);
        // Every moerge parameter, each away from its default, likewise.
        let all = moe_shared::ops::moerge::MoergeParams {
            top_k: 2,
            temperature: 0.5,
            router_init: Some(RouterInitArg::Random),
            router_std: Some(0.125),
            frozen: vec![0, 1],
            seed: 9,
        };
        let moerge = JobSpec::Moerge(moe_shared::api::MoergeSpec {
            models: vec![A.into(), B.into()],
            dtype: None,
            params: all.clone(),
        });
        moerge.validate().unwrap();
        let Command::Moerge(m) = parse(&moerge) else { panic!("moerge") };
        assert_eq!(m.params, all);
        let merge = spec(serde_json::json!({"kind": "merge", "method": "dare-ties", "models": [A, B],
            "weights": [0.5, -0.25], "base": A, "density": 0.3, "seed": 5, "dtype": "f16"}));
        let Command::Merge(m) = parse(&merge) else { panic!("merge") };
        assert_eq!(
            (m.method.name(), m.params.weights.clone(), m.params.density, m.params.seed),
            ("dare-ties", Some(vec![0.5, -0.25]), 0.3, 5)
        );
        for (v, kind) in [
            (serde_json::json!({"kind": "moerge", "models": [A, B], "top_k": 2, "seed": 1, "dtype": "f32"}), "moerge"),
            (serde_json::json!({"kind": "graft", "target": A, "base": B, "instruct": A, "scale": -0.5}), "graft"),
            (
                serde_json::json!({"kind": "neurons", "model": A, "langs": [{"name": "en", "upload": U}, {"name": "hu", "upload": U}],
                    "new": ["hu"], "top_n": 10, "max_texts": 5, "max_tokens": 16}),
                "neurons",
            ),
            (
                serde_json::json!({"kind": "eval", "model": A, "data": [{"name": "hu", "upload": U}], "window": 64,
                    "stride": 32, "max_tokens": 100, "routing": "oracle"}),
                "eval",
            ),
            (
                serde_json::json!({"kind": "task", "model": A, "tasks": [{"name": "en", "upload": U}],
                    "target_delimiter": "", "limit": 5, "batch": 2}),
                "task",
            ),
        ] {
            let s = spec(v);
            let ok = match (parse(&s), kind) {
                (Command::Moerge(m), "moerge") => m.params.top_k == 2 && m.params.seed == 1 && m.models.len() == 2,
                (Command::Graft(g), "graft") => g.params.scale == -0.5,
                (Command::Neurons(n), "neurons") => {
                    n.params.top_n == 10 && n.params.max_texts == 5 && n.params.max_tokens == 16 && n.new == ["hu"]
                }
                (Command::Eval(e), "eval") => {
                    e.params.window == 64
                        && e.params.stride == 32
                        && e.params.max_tokens == Some(100)
                        && e.params.routing == moe_shared::ops::eval::EvalRouting::Oracle
                }
                (Command::Eval(e), "task") => {
                    e.task == ["en=data/en.txt"]
                        && e.data.is_empty()
                        && e.task_params.target_delimiter.is_empty()
                        && e.task_params.limit == Some(5)
                        && e.batch == 2
                }
                _ => false,
            };
            assert!(ok, "{kind}");
        }
    }

    #[test]
    fn the_cli_defaults_are_the_spec_defaults() {
        let bare = |argv: &[&str]| Cli::try_parse_from(argv).unwrap().command;
        let Command::Train(t) =
            bare(&["m", "train", "x", "--stage", "dense", "--data", "a=b", "--steps", "1", "--out", "o"])
        else {
            panic!()
        };
        assert_eq!(t.params, TrainParams::default());
        let Command::Upcycle(u) = bare(&["m", "upcycle", "x", "--experts", "2", "--out", "o"]) else { panic!() };
        // Every upcycle parameter: the CLI's defaults are the operation's.
        assert_eq!(u.params, UpcycleParams::default());
        let Command::Route(r) = bare(&["m", "route", "x", "--domain", "a=b", "--out", "o"]) else { panic!() };
        assert_eq!(r.params, moe_shared::ops::route::RouteParams::default());
        let Command::Eval(e) = bare(&["m", "eval", "x", "--data", "a=b"]) else { panic!() };
        assert_eq!(e.params, moe_shared::ops::eval::EvalParams::default());
        let Command::Neurons(n) = bare(&["m", "neurons", "x", "--lang", "a=b", "--lang", "c=d", "--out", "o"]) else {
            panic!()
        };
        assert_eq!(n.params, moe_shared::ops::neurons::NeuronsParams::default());
        let Command::Merge(m) = bare(&["m", "merge", "linear", "x", "--out", "o"]) else { panic!() };
        assert_eq!(m.params, moe_shared::ops::merge::MergeParams::default());
        let Command::Moerge(m) = bare(&["m", "moerge", "x", "y", "--out", "o"]) else { panic!() };
        assert_eq!(m.params, moe_shared::ops::moerge::MoergeParams::default());
    }

    /// A job file placing `s`'s inputs where [`Paths`] does.
    fn job_file(s: &JobSpec, resume: bool) -> moe_shared::jobs::JobFile {
        use moe_shared::jobs::JobFile;
        let models = s.checkpoints().into_iter().map(|(_, id)| (id.clone(), Paths.model(&id))).collect();
        let data = s
            .data_files()
            .into_iter()
            .map(|f| (JobFile::data_key(f.data, f.heldout), Paths.data(f.data, f.heldout)))
            .collect();
        JobFile { backend: "ndarray".into(), spec: s.clone(), resume, models, data }
    }

    /// `run-job` builds the subcommand's arguments field by field; they are
    /// exactly what the CLI parses from the same job typed as a command
    /// line, for every kind (inputs, parameters, the defaults of what the
    /// spec does not set).
    #[test]
    fn run_job_s_typed_arguments_equal_the_parsed_command_line() {
        let d = |n: &str, heldout: bool| {
            let mut v = serde_json::json!({"name": n, "upload": U, "weight": 2.0, "original": true});
            if heldout {
                v["heldout"] = serde_json::json!(B);
            }
            v
        };
        let two = |h: bool| serde_json::json!([d("en", h), d("hu", h)]);
        let specs = [
            serde_json::json!({"kind": "upcycle", "model": A, "experts": 4, "top_k": 1, "noise": 0.1, "dtype": "bf16"}),
            serde_json::json!({"kind": "upcycle", "model": A, "experts_per_layer": [2, null], "frozen": []}),
            serde_json::json!({"kind": "moerge", "models": [A, B], "top_k": 2, "seed": 1, "dtype": "f32"}),
            serde_json::json!({"kind": "moerge", "models": [A, B], "frozen": []}),
            serde_json::json!({"kind": "route", "model": A, "domains": two(true), "lambda": 0.5, "max_tokens": 99}),
            serde_json::json!({"kind": "route", "model": A, "domains": two(false)}),
            serde_json::json!({"kind": "graft", "target": A, "base": B, "instruct": A, "scale": -0.5}),
            serde_json::json!({"kind": "merge", "method": "ties", "models": [A, B], "base": A, "density": 0.3}),
            serde_json::json!({"kind": "merge", "method": "linear", "models": [A, B]}),
            serde_json::json!({"kind": "neurons", "model": A, "langs": two(false), "new": ["hu"], "top_n": 10}),
            serde_json::json!({"kind": "train", "model": A, "stage": "router", "data": two(false), "steps": 40,
                "lr": 0.001, "seed": 7}),
            serde_json::json!({"kind": "train", "model": A, "stage": "experts", "data": two(false), "steps": 10,
                "engine": "torch"}),
            serde_json::json!({"kind": "eval", "model": A, "data": two(false), "window": 64, "routing": "random"}),
            serde_json::json!({"kind": "task", "model": A, "tasks": two(false), "target_delimiter": "", "limit": 5,
                "batch": 2}),
            serde_json::json!({"kind": "task", "model": A, "tasks": two(false)}),
            serde_json::json!({"kind": "convert", "model": A, "layout": "qwen3_moe", "experts_format": "packed",
                "dtype": "bf16"}),
            serde_json::json!({"kind": "convert", "model": A}),
        ];
        let mut kinds = std::collections::BTreeSet::new();
        for v in specs {
            let s = spec(v);
            kinds.insert(s.kind());
            for resume in [false, true] {
                let file = job_file(&s, resume);
                file.check().unwrap();
                let typed = run_job::command(&file);
                let mut argv = vec!["moe-studio".to_string(), "--backend=ndarray".to_string()];
                argv.extend(s.cli_args(&Paths, resume));
                let mut parsed = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}")).command;
                // The command line says "no frozen expert" as `--no-frozen`
                // (what the commands apply first); the typed spec says it as
                // an empty list.
                match &mut parsed {
                    Command::Upcycle(a) if a.no_frozen => (a.no_frozen, a.params.frozen) = (false, Vec::new()),
                    Command::Moerge(a) if a.no_frozen => (a.no_frozen, a.params.frozen) = (false, Vec::new()),
                    _ => {}
                }
                assert_eq!(format!("{typed:?}"), format!("{parsed:?}"), "{argv:?}");
            }
        }
        // Every registered kind has an example here (a new one fails until it has).
        assert_eq!(kinds.len(), moe_shared::jobs::JobKind::ALL.len(), "every job kind: {kinds:?}");
    }

    /// A job file that does not place an input, or whose spec the server
    /// would refuse, is refused before anything runs, naming the field.
    #[test]
    fn a_job_file_without_its_inputs_is_refused() {
        let s = spec(serde_json::json!({"kind": "graft", "target": A, "base": B, "instruct": A}));
        let mut f = job_file(&s, false);
        f.models.remove(B);
        assert_eq!(f.check().unwrap_err(), format!("spec.base: checkpoint {B} is not in the job file's `models`"));
        let s = spec(serde_json::json!({"kind": "route", "model": A, "domains": [
            {"name": "en", "upload": U, "heldout": B}, {"name": "hu", "upload": U}]}));
        let mut f = job_file(&s, false);
        f.data.remove("en/heldout");
        assert_eq!(f.check().unwrap_err(), "spec.domains[0].heldout: `en/heldout` is not in the job file's `data`");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("job.json");
        let mut v = serde_json::to_value(job_file(&s, false)).unwrap();
        v["spec"]["lambda"] = serde_json::json!(-1.0);
        std::fs::write(&p, v.to_string()).unwrap();
        let e = format!("{:#}", run_job::read(&p).unwrap_err());
        assert!(e.contains("job.json: spec.lambda"), "{e}");
        std::fs::write(&p, "{\"backend\": \"cpu\"}").unwrap();
        let e = format!("{:#}", run_job::read(&p).unwrap_err());
        assert!(e.contains("not a moe-studio job file") && e.contains("spec"), "{e}");
    }

    #[test]
    fn stage_is_a_typed_value_that_clap_checks() {
        let args = |stage: &str| {
            let a = ["moe-studio", "train", "m", "--stage", stage, "--data", "a=b.txt", "--steps", "1", "--out", "o"];
            Cli::try_parse_from(a)
        };
        let Ok(Cli { command: Command::Train(t), .. }) = args("routers") else { panic!("train") };
        assert_eq!(t.stage, moe_shared::train::Stage::Router, "the accepted alias");
        let e = args("expert").unwrap_err().to_string();
        assert!(
            e.contains("'expert'") && e.contains("--stage") && e.contains("experts, router, all, dense, ffn"),
            "{e}"
        );
        let e = Cli::try_parse_from(["moe-studio", "bench", "train", "m", "--stage", "x"]).unwrap_err().to_string();
        assert!(e.contains("'x'") && e.contains("--stage"), "{e}");
    }
}
