//! Recipes: one YAML file that says what to build, run by
//! `moe-studio recipe FILE.yml` (docs/methods.md §6.1 "mergekit recipes").
//!
//! Three kinds, told apart by their keys:
//! - a **mergekit** merge config (`merge_method: ...`, [`mergekit`]);
//! - a **mergekit-moe** config (`base_model` + `experts[].source_model`,
//!   [`moe`]);
//! - a **studio** recipe: the mergekit-moe shape plus the studio's keys
//!   (`gate_mode: ridge`, `upcycle`, `allocation`, `frozen_experts`,
//!   `graft`, `layout`, ...), so a DUME or DeltaMoE pipeline is one file.
//!
//! Reading ([`parse`]) checks every key against the types the sections
//! become (unknown keys refused by name with the nearest supported one;
//! keys mergekit has and the studio does not implement refused with the
//! reason) before anything runs. Planning ([`plan`]) turns a recipe into
//! `moe-studio` command lines, one per stage, built from the same job specs
//! the server runs ([`crate::api::JobSpec`], [`crate::jobs`]), so a recipe
//! stage, a job and a typed command do the same thing. Nothing here touches
//! the file system: the CLI checks the inputs exist, runs the stages into a
//! temporary sibling of the output and moves the last stage's output into
//! place, so a failed or refused recipe leaves nothing behind.

pub mod keys;
pub mod mergekit;
pub mod moe;
pub mod shared;

use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;

use crate::api::{DataRef, JobSpec};
use crate::error::{Result, StudioError};
use crate::jobs::PathInputs;
use crate::ops::moerge::{MoergeParams, MoergeShared};
pub use mergekit::MergeRecipe;
pub use moe::{Gate, MoeRecipe, MoeSource};

/// A parsed, validated recipe.
// One value per recipe file, parsed once: the size difference of the
// variants costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Recipe {
    /// A mergekit merge (`merge_method`).
    Merge(MergeRecipe),
    /// A mergekit-moe or studio MoE recipe.
    Moe(MoeRecipe),
}

impl Recipe {
    /// `mergekit`, `mergekit-moe` or `studio`.
    pub fn kind(&self) -> &'static str {
        match self {
            Recipe::Merge(_) => "mergekit",
            Recipe::Moe(m) if m.studio => "studio",
            Recipe::Moe(_) => "mergekit-moe",
        }
    }

    /// Notes for the user found while reading.
    pub fn warnings(&self) -> &[String] {
        match self {
            Recipe::Merge(m) => &m.warnings,
            Recipe::Moe(m) => &m.warnings,
        }
    }
}

/// Reads a recipe from YAML text; `source` names it in errors (the path).
///
/// # Errors
/// [`StudioError::Config`] naming `source`: YAML syntax errors (with line
/// and column), a document that is not a mapping, one that is neither a
/// merge (`merge_method`) nor an MoE recipe (`experts` / `upcycle`), and
/// those of [`MergeRecipe::from_yaml`] / [`MoeRecipe::from_yaml`].
pub fn parse(text: &str, source: &str) -> Result<Recipe> {
    let top: Value = serde_yaml_ng::from_str(text).map_err(|e| StudioError::config(source, format!("YAML: {e}")))?;
    let Value::Mapping(map) = &top else {
        return Err(StudioError::config(source, "a recipe is a mapping of keys to values"));
    };
    if map.contains_key("merge_method") {
        return Ok(Recipe::Merge(MergeRecipe::from_yaml(source, &top)?));
    }
    if ["experts", "upcycle", "gate_mode", "base_model"].iter().any(|k| map.contains_key(*k)) {
        return Ok(Recipe::Moe(MoeRecipe::from_yaml(source, &top)?));
    }
    let keys: Vec<&str> = map.keys().filter_map(Value::as_str).collect();
    let hint = keys
        .iter()
        .find_map(|k| {
            keys::nearest(k, ["merge_method", "experts", "base_model", "gate_mode", "upcycle"]).map(|n| (k, n))
        })
        .map(|(k, n)| format!(" (`{k}`: did you mean `{n}`?)"))
        .unwrap_or_default();
    Err(StudioError::config(
        source,
        format!("not a recipe: expected `merge_method` (a mergekit merge) or `experts` / `upcycle` (an MoE){hint}"),
    ))
}

/// Where a recipe runs.
#[derive(Debug, Clone)]
pub struct RecipeContext {
    /// Directory relative model and data paths are read from (the CLI:
    /// the current directory, as mergekit).
    pub base_dir: PathBuf,
    /// Scratch directory of the intermediate stages (empty, the runner's).
    pub work_dir: PathBuf,
    /// Final output directory (the last stage writes it).
    pub out: PathBuf,
    /// Seed of DARE's drop / the random router / the upcycle noise when the
    /// recipe gives none.
    pub seed: Option<u64>,
}

/// One stage of a recipe: what it runs, typed ([`StageOp`], which the CLI
/// turns into the subcommand's arguments), and the same as a `moe-studio`
/// command line (what the recipe shows, logs and writes into the model
/// card). A backend test checks that the two are the same command.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// The command (`merge`, `moerge`, `upcycle`, `route`, `graft`).
    pub command: &'static str,
    /// What it runs.
    pub op: StageOp,
    /// Its command line after the global options (the command name first).
    pub argv: Vec<String>,
    /// The directory it writes.
    pub out: PathBuf,
}

/// What a recipe stage runs.
#[derive(Debug, Clone, PartialEq)]
pub enum StageOp {
    /// A job spec whose checkpoint ids and uploads are paths
    /// ([`crate::jobs::PathInputs`]) — merge, upcycle, route, graft — with
    /// the output choices a job does not have.
    Job {
        /// The spec.
        spec: JobSpec,
        /// `--layout` (`None`: auto).
        layout: Option<String>,
        /// Upcycle's `--allocation` file (the recipe's, or the one written
        /// from `experts_per_layer` into the work directory).
        allocation: Option<PathBuf>,
    },
    /// MoErging, with the inputs the moerge job does not have (a base,
    /// routing prompts, shared experts).
    Moerge(MoergeStage),
}

/// A recipe's moerge stage (the CLI's `moerge` arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct MoergeStage {
    /// The expert models, in order.
    pub models: Vec<PathBuf>,
    /// The base model (attention, norms, embeddings; prompt routers).
    pub base: Option<PathBuf>,
    /// What the MoErge does.
    pub params: MoergeParams,
    /// The routing prompts per expert (JSON, written by the runner).
    pub expert_prompts: Option<PathBuf>,
    /// The shared experts: source models, a sigmoid gate, the gate's
    /// prompts (JSON, written by the runner).
    pub shared: MoergeShared,
    /// Output dtype (`f32`, `f16`, `bf16`; `None`: the input's).
    pub dtype: Option<String>,
    /// `--layout` (`None`: auto).
    pub layout: Option<String>,
}

impl MoergeStage {
    /// The `moerge` command line that does this stage, writing `out`: the
    /// one place its argv is made from the typed stage (the backend's
    /// recipe test parses it back and compares).
    pub fn argv(&self, out: &Path) -> Vec<String> {
        let mut argv = vec!["moerge".to_string()];
        argv.extend(self.models.iter().map(|p| s(p)));
        if let Some(b) = &self.base {
            argv.push(format!("--base={}", s(b)));
        }
        argv.extend(crate::ops::flags(&self.params));
        if let Some(p) = &self.expert_prompts {
            argv.push(format!("--expert-prompts={}", s(p)));
        }
        argv.extend(self.shared.flags());
        if let Some(d) = &self.dtype {
            argv.push(format!("--dtype={d}"));
        }
        if let Some(l) = &self.layout {
            argv.push(format!("--layout={l}"));
        }
        argv.push(format!("--out={}", s(out)));
        argv
    }
}

/// A recipe as commands, with the files they read.
#[derive(Debug, Clone, PartialEq)]
pub struct RecipePlan {
    /// The stages in order; the last writes [`RecipeContext::out`].
    pub stages: Vec<Stage>,
    /// Files the runner writes into the work directory first (prompt sets,
    /// allocations): `(path, bytes)`.
    pub files: Vec<(PathBuf, Vec<u8>)>,
    /// Every input path with the recipe key naming it (checked by the
    /// runner before anything is written).
    pub inputs: Vec<(String, PathBuf)>,
}

/// A placeholder id for [`JobSpec::validate`] (which checks ids, not paths).
const ID: &str = "00000000-0000-4000-8000-000000000000";

/// Validates a stage's job spec as the server would (ranges, counts) and
/// renders its command line with the output `out`.
fn job_stage(spec: &JobSpec, placeholder: JobSpec, section: &str, out: &Path) -> Result<Vec<String>> {
    placeholder.validate().map_err(|e| {
        let field = e.field.unwrap_or_default().replacen("spec.", &format!("{section}."), 1);
        StudioError::config("recipe", format!("`{field}`: {}", e.error))
    })?;
    let mut argv = spec.cli_args(&PathInputs, false);
    argv.retain(|a| a != "--json");
    for a in argv.iter_mut() {
        if a == "--out=out" {
            *a = format!("--out={}", out.display());
        }
    }
    Ok(argv)
}

fn resolve(ctx: &RecipeContext, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        ctx.base_dir.join(p)
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Turns a recipe into its stages.
///
/// # Errors
/// [`StudioError::Config`] for job-spec values out of range (named under
/// the recipe section, e.g. `ridge.lambda`) and frozen experts / top-k the
/// expert count cannot hold.
pub fn plan(recipe: &Recipe, ctx: &RecipeContext) -> Result<RecipePlan> {
    let mut inputs: Vec<(String, PathBuf)> = Vec::new();
    let mut files = Vec::new();
    let mut stages = Vec::new();
    match recipe {
        Recipe::Merge(r) => {
            let o = &r.options;
            let mut argv = vec!["merge".to_string(), o.method.name().to_string()];
            for (i, m) in r.models.iter().enumerate() {
                let p = resolve(ctx, m);
                argv.push(s(&p));
                inputs.push((format!("models[{i}].model"), p));
            }
            if let Some(b) = &r.base {
                let p = resolve(ctx, b);
                argv.push(format!("--base={}", s(&p)));
                inputs.push(("base_model".into(), p));
            }
            let params = crate::ops::merge::MergeParams {
                seed: ctx.seed.unwrap_or(o.seed),
                ..crate::ops::merge::MergeParams::of(o)
            };
            argv.extend(crate::ops::flags(&params));
            let dtype = o.dtype.map(|d| d.to_string().to_ascii_lowercase());
            if let Some(d) = &dtype {
                argv.push(format!("--dtype={d}"));
            }
            argv.push(format!("--out={}", s(&ctx.out)));
            let spec = JobSpec::Merge(crate::api::MergeSpec {
                method: o.method,
                models: r.models.iter().map(|m| s(&resolve(ctx, m))).collect(),
                base: r.base.as_ref().map(|b| s(&resolve(ctx, b))),
                dtype,
                params,
            });
            let op = StageOp::Job { spec, layout: None, allocation: None };
            stages.push(Stage { command: "merge", op, argv, out: ctx.out.clone() });
        }
        Recipe::Moe(r) => plan_moe(r, ctx, &mut stages, &mut files, &mut inputs)?,
    }
    Ok(RecipePlan { stages, files, inputs })
}

fn plan_moe(
    r: &MoeRecipe,
    ctx: &RecipeContext,
    stages: &mut Vec<Stage>,
    files: &mut Vec<(PathBuf, Vec<u8>)>,
    inputs: &mut Vec<(String, PathBuf)>,
) -> Result<()> {
    let n_stages = 1 + usize::from(r.gate == Gate::Ridge) + usize::from(r.graft.is_some());
    let stage_out = |i: usize, name: &str| {
        if i + 1 == n_stages {
            ctx.out.clone()
        } else {
            ctx.work_dir.join(format!("{}-{name}", i + 1))
        }
    };
    let seed = r.seed.or(ctx.seed);
    let base = r.base_model.as_ref().map(|b| resolve(ctx, b));
    if let Some(b) = &base {
        inputs.push(("base_model".into(), b.clone()));
    }
    // Stage 1: the MoE.
    let first_out = stage_out(0, "moe");
    match &r.source {
        MoeSource::Experts(experts) => {
            for (i, e) in experts.iter().enumerate() {
                inputs.push((format!("experts[{i}].source_model"), resolve(ctx, &e.source_model)));
            }
            let d = MoergeParams::default();
            let mut params = MoergeParams {
                top_k: r.top_k,
                temperature: r.temperature.unwrap_or(d.temperature),
                frozen: r.frozen.clone().unwrap_or_default(),
                seed: seed.unwrap_or(d.seed),
                ..d
            };
            r.gate.set_moerge(&mut params);
            let mut op = MoergeStage {
                models: experts.iter().map(|e| resolve(ctx, &e.source_model)).collect(),
                base: base.clone(),
                params,
                expert_prompts: None,
                shared: MoergeShared::new(
                    r.shared.experts.iter().map(|e| resolve(ctx, &e.source_model)).collect(),
                    r.shared.gated,
                ),
                dtype: r.dtype.map(|d| d.to_string().to_ascii_lowercase()),
                layout: r.layout.clone(),
            };
            let prompt_file = |name: &str, experts: &[moe::Expert], files: &mut Vec<(PathBuf, Vec<u8>)>| {
                let path = ctx.work_dir.join(name);
                let body = serde_json::json!({"experts": experts.iter().map(|e| serde_json::json!({
                    "positive": e.positive_prompts, "negative": e.negative_prompts})).collect::<Vec<_>>()});
                files.push((path.clone(), serde_json::to_vec_pretty(&body).expect("json")));
                path
            };
            if r.gate.needs_prompts() {
                op.expert_prompts = Some(prompt_file("expert_prompts.json", experts, files));
            }
            for (i, p) in op.shared.shared_expert.iter().enumerate() {
                inputs.push((format!("shared_experts[{i}].source_model"), p.clone()));
            }
            if r.shared.prompt_gate(&r.gate) {
                op.shared.shared_prompts = Some(prompt_file("shared_prompts.json", &r.shared.experts, files));
            }
            let argv = op.argv(&first_out);
            stages.push(Stage { command: "moerge", op: StageOp::Moerge(op), argv, out: first_out.clone() });
        }
        MoeSource::Upcycle { spec, allocation } => {
            let b = base.clone().expect("checked by MoeRecipe::from_yaml");
            let mut spec = spec.clone();
            spec.model = s(&b);
            spec.dtype = r.dtype.map(|d| d.to_string().to_ascii_lowercase());
            let p = &mut spec.params;
            p.top_k = r.top_k;
            if let Some(f) = &r.frozen {
                p.frozen = f.clone();
            }
            r.gate.set_upcycle(p);
            if let Some(t) = r.temperature {
                p.temperature = t;
            }
            if let Some(seed) = seed {
                p.seed = seed;
            }
            let placeholder = JobSpec::Upcycle(crate::api::UpcycleSpec {
                model: ID.into(),
                experts_per_layer: spec.experts_per_layer.clone().or(allocation.as_ref().map(|_| vec![Some(2)])),
                ..spec.clone()
            });
            let mut argv = job_stage(&JobSpec::Upcycle(spec.clone()), placeholder, "upcycle", &first_out)?;
            let mut alloc = None;
            let alloc_path = match (allocation, &spec.experts_per_layer) {
                (Some(a), _) => {
                    let p = resolve(ctx, a);
                    inputs.push(("allocation".into(), p.clone()));
                    argv.push(format!("--allocation={}", s(&p)));
                    alloc = Some(p);
                    None
                }
                (None, Some(l)) => {
                    let p = ctx.work_dir.join(crate::jobs::ALLOCATION_FILE);
                    let body = serde_json::json!({ "experts_per_layer": l });
                    files.push((p.clone(), serde_json::to_vec_pretty(&body).expect("json")));
                    Some(p)
                }
                (None, None) => None,
            };
            for a in argv.iter_mut() {
                if a == &format!("--allocation={}", crate::jobs::ALLOCATION_FILE) {
                    *a = format!("--allocation={}", s(alloc_path.as_ref().expect("experts_per_layer set")));
                }
            }
            if let Some(l) = &r.layout {
                argv.push(format!("--layout={l}"));
            }
            let op = StageOp::Job {
                spec: JobSpec::Upcycle(spec),
                layout: r.layout.clone(),
                allocation: alloc.or(alloc_path),
            };
            stages.push(Stage { command: "upcycle", op, argv, out: first_out.clone() });
        }
    }
    let mut prev = first_out;
    // Stage 2: the ridge router.
    if let (Gate::Ridge, Some(ridge), MoeSource::Experts(experts)) = (&r.gate, &r.ridge, &r.source) {
        let out = stage_out(stages.len(), "route");
        let mut domains = Vec::new();
        let mut placeholder_domains = Vec::new();
        for (i, e) in experts.iter().enumerate() {
            let data = resolve(ctx, e.data.as_deref().expect("checked"));
            inputs.push((format!("experts[{i}].data"), data.clone()));
            let heldout = e.heldout.as_ref().map(|h| resolve(ctx, h));
            if let Some(h) = &heldout {
                inputs.push((format!("experts[{i}].heldout"), h.clone()));
            }
            let d = DataRef {
                name: e.name.clone(),
                upload: s(&data),
                weight: None,
                original: false,
                heldout: heldout.as_deref().map(s),
            };
            placeholder_domains.push(DataRef {
                upload: ID.into(),
                heldout: d.heldout.as_ref().map(|_| ID.into()),
                ..d.clone()
            });
            domains.push(d);
        }
        // The recipe's `temperature` is the routed MoE's too.
        let params =
            crate::ops::route::RouteParams { temperature: r.temperature.unwrap_or(ridge.temperature), ..ridge.clone() };
        let spec = JobSpec::Route(crate::api::RouteSpec { model: s(&prev), domains, params: params.clone() });
        let placeholder =
            JobSpec::Route(crate::api::RouteSpec { model: ID.into(), domains: placeholder_domains, params });
        let mut argv = job_stage(&spec, placeholder, "ridge", &out).map_err(rename_experts)?;
        if let Some(l) = &r.layout {
            argv.push(format!("--layout={l}"));
        }
        let op = StageOp::Job { spec, layout: r.layout.clone(), allocation: None };
        stages.push(Stage { command: "route", op, argv, out: out.clone() });
        prev = out;
    }
    // Stage 3: the graft.
    if let Some(g) = &r.graft {
        let out = stage_out(stages.len(), "graft");
        let (gb, gi) = (resolve(ctx, &g.0.base), resolve(ctx, &g.0.instruct));
        inputs.push(("graft.base".into(), gb.clone()));
        inputs.push(("graft.instruct".into(), gi.clone()));
        let params = g.1.clone();
        let spec = JobSpec::Graft(crate::api::GraftSpec {
            target: s(&prev),
            base: s(&gb),
            instruct: s(&gi),
            params: params.clone(),
        });
        let placeholder =
            JobSpec::Graft(crate::api::GraftSpec { target: ID.into(), base: ID.into(), instruct: ID.into(), params });
        let mut argv = job_stage(&spec, placeholder, "graft", &out)?;
        if let Some(l) = &r.layout {
            argv.push(format!("--layout={l}"));
        }
        let op = StageOp::Job { spec, layout: r.layout.clone(), allocation: None };
        stages.push(Stage { command: "graft", op, argv, out });
    }
    Ok(())
}

/// `ridge.domains[i]` (the route job's field) is `experts[i]` in a recipe.
fn rename_experts(e: StudioError) -> StudioError {
    match e {
        StudioError::Config { source_name, what } => {
            StudioError::Config { source_name, what: what.replace("ridge.domains", "experts") }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> RecipeContext {
        RecipeContext { base_dir: "/r".into(), work_dir: "/w".into(), out: "/o".into(), seed: None }
    }

    #[test]
    fn a_studio_pipeline_becomes_moerge_route_graft() {
        let y =
            "experts:\n  - source_model: a\n    data: a.txt\n  - source_model: b\n    data: b.txt\n    heldout: b.h\n\
                 gate_mode: ridge\nexperts_per_token: 1\nridge: {lambda: 0.5, context: 64}\nlayout: moe_studio\n\
                 graft: {base: base, instruct: inst, scale: 0.5}\n";
        let r = parse(y, "p.yml").unwrap();
        assert_eq!(r.kind(), "studio");
        let p = plan(&r, &ctx()).unwrap();
        let cmds: Vec<_> = p.stages.iter().map(|s| s.command).collect();
        assert_eq!(cmds, ["moerge", "route", "graft"]);
        assert_eq!(p.stages[0].argv[..3], ["moerge", "/r/a", "/r/b"]);
        assert!(p.stages[0].argv.contains(&"--out=/w/1-moe".to_string()));
        let route = &p.stages[1].argv;
        assert_eq!(route[1], "/w/1-moe");
        assert!(route.contains(&"--domain=expert1=/r/b.txt:/r/b.h".to_string()), "{route:?}");
        assert!(route.contains(&"--lambda=0.5".to_string()) && route.contains(&"--out=/w/2-route".to_string()));
        let graft = &p.stages[2].argv;
        assert_eq!(graft[..4], ["graft", "/w/2-route", "--base=/r/base", "--instruct=/r/inst"]);
        assert!(graft.contains(&"--scale=0.5".to_string()) && graft.contains(&"--out=/o".to_string()));
        assert_eq!(p.inputs.len(), 7);
        // The route job's own range checks, named under the recipe section.
        let bad = y.replace("lambda: 0.5", "lambda: -1");
        let e = plan(&parse(&bad, "p.yml").unwrap(), &ctx()).unwrap_err().to_string();
        assert!(e.contains("`ridge.lambda`"), "{e}");
        // YAML's infinities and NaN are refused by key, never read as a field's default (JSON
        // has no infinity: `scale: .inf` once ran as scale 1).
        for (from, to, key) in [
            ("scale: 0.5", "scale: .inf", "`graft.scale`: inf"),
            ("scale: 0.5", "scale: -.inf", "`graft.scale`: -inf"),
            ("lambda: 0.5", "lambda: .nan", "`ridge.lambda`: NaN"),
        ] {
            let e = parse(&y.replace(from, to), "p.yml").map(|r| plan(&r, &ctx()).map(|_| ())).and_then(|r| r);
            let e = e.unwrap_err().to_string();
            assert!(e.contains("p.yml") && e.contains(key) && e.contains("not a finite number"), "{to}: {e}");
        }
    }

    #[test]
    fn an_upcycle_recipe_writes_its_allocation() {
        let y = "base_model: m\nupcycle: {experts_per_layer: [2, null, 4], drop_ratio: 0.5}\ngate_mode: random\n\
                 router_std: 0.02\nfrozen_experts: [0]\nseed: 3\ndtype: bfloat16\ntemperature: 0.5\n";
        let p = plan(&parse(y, "u.yml").unwrap(), &ctx()).unwrap();
        let a = &p.stages[0].argv;
        assert!(a.contains(&"--allocation=/w/allocation.json".to_string()), "{a:?}");
        assert!(a.contains(&"--router-std=0.02".to_string()) && a.contains(&"--seed=3".to_string()));
        // The top level's dtype and temperature and the section's own
        // parameters (Drop-Upcycling here) reach the command.
        for want in ["--dtype=bf16", "--temperature=0.5", "--drop-ratio=0.5", "--router-init=random"] {
            assert!(a.contains(&want.to_string()), "{want}: {a:?}");
        }
        let e = parse("base_model: m\nupcycle: {experts: 4, router_std: 1}\n", "u.yml").unwrap_err().to_string();
        assert!(e.contains("set `router_std` at the top level"), "{e}");
        assert_eq!(p.files[0].0, PathBuf::from("/w/allocation.json"));
        let e = parse("base_model: m\nupcycle: {experts: 4, top_k: 2}\n", "u.yml").unwrap_err().to_string();
        assert!(e.contains("`upcycle.top_k` is not supported: set `experts_per_token`"), "{e}");
    }

    #[test]
    fn tokenizer_source_base_only_and_no_train_stage() {
        let y = "base_model: m\ngate_mode: random\nexperts:\n  - source_model: a\n  - source_model: b\n";
        for ok in ["base", "m"] {
            let r = parse(&format!("{y}tokenizer_source: {ok}\n"), "t.yml");
            assert!(r.is_ok(), "{ok}: {r:?}");
        }
        for (extra, want) in [
            ("tokenizer_source: union\n", "`tokenizer_source: union` is not supported: only `base`"),
            ("tokenizer_source: a\n", "`tokenizer_source: a` is not supported"),
            ("train: {steps: 5}\n", "`train` is not supported: continued pre-training is not a recipe stage"),
        ] {
            let e = parse(&format!("{y}{extra}"), "t.yml").unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("t.yml"), "{extra}: {e}");
        }
        let e = parse("gate_mode: ridge\ntokenizer_source: base\nexperts:\n  - {source_model: a, data: a.txt}\n  - {source_model: b, data: b.txt}\n", "t.yml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("without `base_model`"), "{e}");
    }
}
