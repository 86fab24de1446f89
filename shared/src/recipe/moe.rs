//! mergekit-moe recipes (mergekit 0.1.5's `MoEMergeConfig`) and the
//! studio's own pipeline recipes, which are the same YAML shape plus the
//! studio's keys (docs/methods.md §6.1 "mergekit recipes").
//!
//! mergekit-moe keys: `base_model` (every non-FFN tensor is the base's),
//! `experts[]` (`source_model`: its FFNs become expert `i` of every layer;
//! `positive_prompts` / `negative_prompts` for the gate), `gate_mode`
//! (`hidden` (default), `cheap_embed`, `random`), `experts_per_token`
//! (default 2), `dtype`, `architecture` (`mixtral`, `qwen`, `deepseek`: the
//! output layout), `tokenizer_source` (only `base`: the base model's
//! tokenizer is what the studio copies; `union` and other models are
//! refused by name), `shared_experts` (each `source_model`'s FFN always on,
//! gated by its prompts or not: [`super::shared`]). A `train` stage is
//! refused (continued pre-training is its own resumable job, between the
//! recipe's MoE and its graft).
//!
//! Studio keys, so that a whole pipeline is one file:
//! - `gate_mode: ridge` (DUME's ridge router: every expert gives `data`,
//!   optionally `heldout` text; `ridge:` takes the `route` operation's
//!   parameters, [`crate::ops::route::RouteParams`]) and `gate_mode: zeros`;
//! - no `base_model` with `gate_mode: ridge`: the shared tensors are the
//!   experts' mean (DUME's MoErge);
//! - `upcycle:` instead of `experts`: upcycle `base_model` (DeltaMoE /
//!   NeuronMoE) with the `upcycle` job's fields ([`crate::api::UpcycleSpec`]:
//!   `experts` / `experts_per_layer` or `allocation: FILE` (the output of
//!   `moe-studio allocate`), and [`UpcycleParams`] — `noise`, `drop_ratio`,
//!   shared experts, ... — less what the top level sets);
//! - `frozen_experts`, `temperature`, `router_std`, `seed`, `layout`;
//! - `graft:` (`base`, `instruct`, `scale`: the `graft` job's fields,
//!   [`crate::api::GraftInputs`] less the target, and
//!   [`crate::ops::graft::GraftParams`]) as the last stage.

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use super::keys::{check_keys, fields_of, get, kind, nearest, number, string, strings, Refused};
use super::shared::{shared_experts, SharedExperts};
use crate::api::{GraftInputs, UpcycleInputs, UpcycleSpec};
use crate::error::{Result, StudioError};
use crate::ops::graft::GraftParams;
use crate::ops::moerge::MoergeParams;
use crate::ops::route::RouteParams;
use crate::ops::upcycle::{RouterInitArg, UpcycleParams};
use crate::tensor_io::DType;

/// The top-level keys of an MoE recipe: mergekit-moe's, then the
/// studio's.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct MoeKeys {
    base_model: Value,
    experts: Value,
    gate_mode: Value,
    dtype: Value,
    experts_per_token: Value,
    architecture: Value,
    tokenizer_source: Value,
    shared_experts: Value,
    // studio
    upcycle: Value,
    allocation: Value,
    frozen_experts: Value,
    temperature: Value,
    router_std: Value,
    seed: Value,
    layout: Value,
    ridge: Value,
    graft: Value,
}

/// The keys of one `experts` entry: mergekit-moe's, then the studio's.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct ExpertKeys {
    source_model: Value,
    positive_prompts: Value,
    negative_prompts: Value,
    // studio
    name: Value,
    data: Value,
    heldout: Value,
}

const REFUSED_TOP: &[Refused] = &[(
    "train",
    "continued pre-training is not a recipe stage (a long, resumable job with its own checkpoints): run the \
         recipe without `graft`, train its output with `moe-studio train`, then graft with `moe-studio graft`",
)];

const REFUSED_EXPERT: &[Refused] = &[
    (
        "noise_scale",
        "mergekit adds unseeded Gaussian noise to the expert's weights; use `moe-studio upcycle --noise` (seeded)",
    ),
    ("residual_scale", "scaling an expert's down projection is not implemented"),
];

/// How the routers of an MoE recipe start.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// mergekit-moe `hidden` (`hidden_avg`, `hidden_last`): mean FFN input
    /// of each expert's prompts on the base model (methods/hidden.rs: the
    /// studio reads the vector the router sees, averaged over all tokens).
    Hidden,
    /// mergekit-moe `cheap_embed`: normalised sum of the prompts' token
    /// embeddings, the same in every layer.
    CheapEmbed,
    /// mergekit-moe `random`: `N(0, std^2)` (mergekit's std is 1).
    Random {
        /// Standard deviation.
        std: f64,
    },
    /// All zeros (studio).
    Zeros,
    /// DUME's ridge router fitted on each expert's `data` (studio).
    Ridge,
}

impl Gate {
    /// The router initialisation of the first stage (`ridge` starts at
    /// zeros).
    pub fn router_kind(&self) -> RouterInitArg {
        match self {
            Gate::Hidden => RouterInitArg::Hidden,
            Gate::CheapEmbed => RouterInitArg::CheapEmbed,
            Gate::Random { .. } => RouterInitArg::Random,
            Gate::Zeros | Gate::Ridge => RouterInitArg::Zeros,
        }
    }

    /// The `--router-init` of the first stage ([`Gate::router_kind`]'s name).
    pub fn router_init(&self) -> &'static str {
        self.router_kind().name()
    }

    /// Whether the gate reads the experts' prompts.
    pub fn needs_prompts(&self) -> bool {
        matches!(self, Gate::Hidden | Gate::CheapEmbed)
    }

    /// The MoErge stage's router parameters: `router_init` this gate's
    /// kind and, for `random`, its std (mergekit-moe's 1 unless the recipe
    /// sets `router_std`).
    pub fn set_moerge(&self, p: &mut MoergeParams) {
        p.router_init = Some(self.router_kind());
        p.router_std = if let Gate::Random { std } = self { Some(*std) } else { None };
    }

    /// The upcycle stage's router parameters: `router_init` this gate's
    /// kind and, for `random`, its std (the other kinds keep the
    /// operation's default std, which they do not read).
    pub fn set_upcycle(&self, p: &mut UpcycleParams) {
        p.router_init = self.router_kind();
        if let Gate::Random { std } = self {
            p.router_std = *std;
        }
    }
}

/// One expert of an MoE recipe.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Expert {
    /// Its model (a path as written).
    pub source_model: String,
    /// Prompts it should take (hidden / cheap_embed gates).
    pub positive_prompts: Vec<String>,
    /// Prompts it should not take.
    pub negative_prompts: Vec<String>,
    /// Domain name for the ridge router (default `expert{i}`).
    pub name: String,
    /// Domain text of the ridge router (a path).
    pub data: Option<String>,
    /// Held-out text of the ridge router (a path).
    pub heldout: Option<String>,
}

/// Where the MoE of the first stage comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum MoeSource {
    /// MoErge `experts` (on `base_model` when given: mergekit-moe).
    Experts(Vec<Expert>),
    /// Upcycle `base_model` (studio): the `upcycle` job's fields (`model`
    /// unset) and an optional allocation file.
    Upcycle {
        /// `experts` / `experts_per_layer` / `noise` of the `upcycle` job.
        spec: UpcycleSpec,
        /// `allocation: FILE` (the output of `moe-studio allocate`).
        allocation: Option<String>,
    },
}

/// A validated mergekit-moe or studio MoE recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeRecipe {
    /// `base_model` (optional only for a ridge-routed MoErge).
    pub base_model: Option<String>,
    /// MoErge or upcycle.
    pub source: MoeSource,
    /// `shared_experts` (MoErge on `base_model` only; empty: none).
    pub shared: SharedExperts,
    /// Router initialisation.
    pub gate: Gate,
    /// `experts_per_token` (mergekit-moe's default 2).
    pub top_k: usize,
    /// Output dtype.
    pub dtype: Option<DType>,
    /// Output layout name (`layout`, or `architecture` mapped), `None` = auto.
    pub layout: Option<String>,
    /// Frozen experts of every layer (`None`: the command's default).
    pub frozen: Option<Vec<usize>>,
    /// Router temperature.
    pub temperature: Option<f64>,
    /// Seed (random router, upcycle noise).
    pub seed: Option<u64>,
    /// The ridge router's options (`ridge:`; `model` / `domains` are
    /// filled by the runner).
    pub ridge: Option<RouteParams>,
    /// The graft stage (`graft:`): the delta's models as written (`target`
    /// is filled by the runner) and the graft's parameters.
    pub graft: Option<(GraftInputs, GraftParams)>,
    /// Whether any studio key is used (else a plain mergekit-moe recipe).
    pub studio: bool,
    /// Notes for the user.
    pub warnings: Vec<String>,
}

impl MoeRecipe {
    /// Reads an MoE recipe from its top-level mapping.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming `source` and the key: unknown keys
    /// (with the nearest), refused mergekit keys (with the reason), a
    /// missing `base_model` (except a ridge-routed MoErge), fewer than two
    /// experts, experts without prompts for a hidden / cheap_embed gate
    /// (as mergekit), without `data` for the ridge router, an unknown gate
    /// mode or architecture, options of the reused job specs out of range
    /// (named under their section, e.g. `ridge.lambda`), and those of
    /// [`shared_experts`] (plus shared experts with `upcycle:`).
    pub fn from_yaml(source: &str, top: &Value) -> Result<MoeRecipe> {
        let cfg = |what: String| StudioError::config(source, what);
        let map = check_keys(source, "", top, fields_of::<MoeKeys>(), REFUSED_TOP)?;
        let studio_keys = [
            "upcycle",
            "allocation",
            "frozen_experts",
            "temperature",
            "router_std",
            "seed",
            "layout",
            "ridge",
            "graft",
        ];
        let mut studio = studio_keys.iter().any(|k| get(map, k).is_some());
        let mut warnings = Vec::new();
        let s = |key: &str| get(map, key).map(|v| string(source, key, v)).transpose();
        let base_model = s("base_model")?;
        // mergekit-moe's default is `hidden`; an upcycled MoE (studio)
        // starts at zeros.
        let default_gate = if get(map, "upcycle").is_some() { "zeros" } else { "hidden" };
        let gate_name = s("gate_mode")?.unwrap_or_else(|| default_gate.into());
        let router_std = get(map, "router_std").map(|v| number(source, "router_std", v)).transpose()?;
        let gate =
            match gate_name.as_str() {
                "hidden" | "hidden_avg" | "hidden_last" => {
                    warnings.push(format!(
                        "`gate_mode: {gate_name}`: the studio's hidden router is the mean FFN input (the vector the \
                     router sees, after the post-attention norm) over all prompt tokens; mergekit reads the residual \
                     stream entering each layer, so the routers differ from mergekit's"
                    ));
                    Gate::Hidden
                }
                "cheap_embed" => Gate::CheapEmbed,
                "random" => Gate::Random { std: router_std.unwrap_or(1.0) },
                "zeros" => {
                    studio = true;
                    Gate::Zeros
                }
                "ridge" => {
                    studio = true;
                    Gate::Ridge
                }
                "uniform_random" => return Err(cfg(
                    "`gate_mode: uniform_random` is not implemented; use `random` (Gaussian, `router_std` sets its \
                     std)"
                        .into(),
                )),
                other => {
                    let modes = ["hidden", "cheap_embed", "random", "zeros", "ridge"];
                    let hint = nearest(other, modes).map(|n| format!("did you mean `{n}`? ")).unwrap_or_default();
                    return Err(cfg(format!("unknown `gate_mode: {other}`: {hint}(supported: {})", modes.join(", "))));
                }
            };
        if router_std.is_some() && !matches!(gate, Gate::Random { .. }) {
            return Err(cfg("`router_std` is for `gate_mode: random` only".into()));
        }
        let top_k = match get(map, "experts_per_token") {
            Some(v) => uint(source, "experts_per_token", v)?,
            None => 2,
        };
        if top_k == 0 {
            return Err(cfg("`experts_per_token` must be at least 1".into()));
        }
        let dtype = s("dtype")?
            .map(|d| {
                DType::parse_float(&d)
                    .ok_or_else(|| cfg(format!("`dtype: {d}`: expected float32, float16 or bfloat16")))
            })
            .transpose()?;
        let layout = match (s("architecture")?, s("layout")?) {
            (Some(_), Some(_)) => return Err(cfg("give `layout` or `architecture`, not both".into())),
            (Some(a), None) => Some(
                match a.to_ascii_lowercase().as_str() {
                    "mixtral" => "mixtral",
                    "qwen" => "qwen2_moe",
                    "qwen3" => "qwen3_moe",
                    "deepseek" => "deepseek_moe",
                    other => {
                        return Err(cfg(format!(
                            "unknown `architecture: {other}` (mergekit-moe's mixtral, qwen, qwen3, deepseek; or the \
                             studio's `layout`)"
                        )))
                    }
                }
                .to_string(),
            ),
            (None, l) => l,
        };
        let frozen = get(map, "frozen_experts")
            .map(|v| match v {
                Value::Sequence(s) => {
                    s.iter().enumerate().map(|(i, x)| uint(source, &format!("frozen_experts[{i}]"), x)).collect()
                }
                other => Err(cfg(format!("`frozen_experts`: expected a list of expert indices, got {}", kind(other)))),
            })
            .transpose()?;
        let temperature = get(map, "temperature").map(|v| number(source, "temperature", v)).transpose()?;
        let seed = get(map, "seed").map(|v| uint(source, "seed", v).map(|x| x as u64)).transpose()?;

        let source_kind = match (get(map, "experts"), get(map, "upcycle")) {
            (Some(_), Some(_)) => return Err(cfg("give `experts` (MoErge) or `upcycle` (one model), not both".into())),
            (None, None) => {
                return Err(cfg(
                    "`experts` is missing: list the expert models (`- source_model: PATH`), or upcycle `base_model` \
                     with `upcycle:`"
                        .into(),
                ))
            }
            (Some(e), None) => MoeSource::Experts(experts(source, e, &gate)?),
            (None, Some(u)) => {
                let allocation = s("allocation")?;
                MoeSource::Upcycle { spec: upcycle_spec(source, u, allocation.is_some())?, allocation }
            }
        };
        if get(map, "allocation").is_some() && matches!(source_kind, MoeSource::Experts(_)) {
            return Err(cfg("`allocation` is for `upcycle:` (MoErge has one expert per model)".into()));
        }
        match (&source_kind, &base_model, &gate) {
            (_, Some(_), _) => {}
            (MoeSource::Experts(_), None, Gate::Ridge) => warnings
                .push("no `base_model`: the shared (non-FFN) tensors are the experts' mean (DUME's MoErge)".into()),
            _ => return Err(cfg("`base_model` is missing".into())),
        }
        if let MoeSource::Upcycle { .. } = source_kind {
            if gate.needs_prompts() || gate == Gate::Ridge {
                return Err(cfg(format!(
                    "`gate_mode: {gate_name}` needs per-expert prompts or data; an upcycled MoE starts with `zeros` \
                     or `random`"
                )));
            }
        }
        let ridge = match get(map, "ridge") {
            Some(_) if gate != Gate::Ridge => return Err(cfg("`ridge` options need `gate_mode: ridge`".into())),
            Some(v) => Some(job_section::<RouteParams>(source, "ridge", v, &[])?),
            None if gate == Gate::Ridge => {
                Some(job_section::<RouteParams>(source, "ridge", &Value::Mapping(Mapping::new()), &[])?)
            }
            None => None,
        };
        let shared = match get(map, "shared_experts") {
            None => SharedExperts::default(),
            Some(_) if matches!(source_kind, MoeSource::Upcycle { .. }) => {
                return Err(cfg(
                    "`shared_experts` names models whose FFN becomes a shared expert of a MoErge; an upcycled \
                     MoE's shared experts are copies of its own FFN: set `upcycle: {shared_experts: N}` \
                     (as `moe-studio upcycle --shared-experts N`)"
                        .into(),
                ))
            }
            Some(v) => shared_experts(source, v, &gate, layout.as_deref(), REFUSED_EXPERT)?,
        };
        let graft = get(map, "graft").map(|v| params_section(source, "graft", v, &["target"])).transpose()?;
        if let Some(t) = s("tokenizer_source")? {
            match (t.as_str(), &base_model) {
                ("base", Some(_)) => {}
                (t, Some(b)) if t == b => {}
                ("base", None) => {
                    return Err(cfg(
                        "`tokenizer_source: base` without `base_model`: the first expert's tokenizer is copied \
                         (remove the key)"
                            .into(),
                    ))
                }
                (other, _) => {
                    return Err(cfg(format!(
                        "`tokenizer_source: {other}` is not supported: only `base` (the base model's tokenizer, \
                         which the studio copies; every expert must share its vocabulary); a `union` or another \
                         model's vocabulary needs tokenizer surgery, which is not implemented"
                    )))
                }
            }
        }
        Ok(MoeRecipe {
            base_model,
            source: source_kind,
            shared,
            gate,
            top_k,
            dtype,
            layout,
            frozen,
            temperature,
            seed,
            ridge,
            graft,
            studio,
            warnings,
        })
    }
}

fn uint(source: &str, path: &str, v: &Value) -> Result<usize> {
    v.as_u64()
        .map(|x| x as usize)
        .ok_or_else(|| StudioError::config(source, format!("`{path}`: expected a whole number >= 0, got {}", kind(v))))
}

fn experts(source: &str, v: &Value, gate: &Gate) -> Result<Vec<Expert>> {
    let cfg = |what: String| StudioError::config(source, what);
    let Value::Sequence(list) = v else {
        return Err(cfg(format!("`experts`: expected a list, got {}", kind(v))));
    };
    if list.len() < 2 {
        return Err(cfg(format!("`experts` lists {} model(s): an MoE needs at least two", list.len())));
    }
    let mut out = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let path = format!("experts[{i}]");
        let m = check_keys(source, &path, e, fields_of::<ExpertKeys>(), REFUSED_EXPERT)?;
        let s = |key: &str| get(m, key).map(|v| string(source, &format!("{path}.{key}"), v)).transpose();
        let l = |key: &str| -> Result<Vec<String>> {
            Ok(get(m, key).map(|v| strings(source, &format!("{path}.{key}"), v)).transpose()?.unwrap_or_default())
        };
        let ex = Expert {
            source_model: s("source_model")?.ok_or_else(|| cfg(format!("`{path}.source_model` is missing")))?,
            positive_prompts: l("positive_prompts")?,
            negative_prompts: l("negative_prompts")?,
            name: s("name")?.unwrap_or_else(|| format!("expert{i}")),
            data: s("data")?,
            heldout: s("heldout")?,
        };
        if gate.needs_prompts() && ex.positive_prompts.is_empty() {
            return Err(cfg(format!(
                "`{path}.positive_prompts` is missing: the {} gate needs prompts for every expert (or use \
                 `gate_mode: random`)",
                gate.router_init()
            )));
        }
        if *gate == Gate::Ridge && ex.data.is_none() {
            return Err(cfg(format!("`{path}.data` is missing: the ridge router needs each expert's domain text")));
        }
        if *gate != Gate::Ridge && (ex.data.is_some() || ex.heldout.is_some()) {
            return Err(cfg(format!("`{path}.data` / `heldout` are for `gate_mode: ridge`")));
        }
        out.push(ex);
    }
    if gate.needs_prompts() {
        let key = |e: &Expert| (e.positive_prompts.clone(), e.negative_prompts.clone());
        if out.iter().all(|e| key(e) == key(&out[0])) {
            return Err(cfg(
                "every expert has the same prompts: the routers would be identical (mergekit-moe refuses this too)"
                    .into(),
            ));
        }
    }
    Ok(out)
}

/// `upcycle:` as the `upcycle` job's spec (the keys the recipe sets at its
/// top level are refused here, naming the top-level key).
fn upcycle_spec(source: &str, v: &Value, has_allocation: bool) -> Result<UpcycleSpec> {
    const TOP: &[Refused] = &[
        ("top_k", "set `experts_per_token` at the top level"),
        ("frozen", "set `frozen_experts` at the top level"),
        ("router_init", "set `gate_mode` (zeros or random) at the top level"),
        ("router_std", "set `router_std` at the top level"),
        ("temperature", "set `temperature` at the top level"),
        ("seed", "set `seed` at the top level"),
        ("dtype", "set `dtype` at the top level"),
    ];
    let (inputs, params): (UpcycleInputs, UpcycleParams) = params_section_with(source, "upcycle", v, &["model"], TOP)?;
    let spec = UpcycleSpec::new(inputs, params);
    if has_allocation == (spec.experts.is_some() || spec.experts_per_layer.is_some()) {
        return Err(StudioError::config(
            source,
            "give exactly one of `upcycle.experts`, `upcycle.experts_per_layer` and `allocation`",
        ));
    }
    Ok(spec)
}

/// A section that takes a job spec's fields (less `filled`, which the
/// runner sets): key-checked against the spec type, then read by serde.
pub fn job_section<T: serde::de::DeserializeOwned>(source: &str, path: &str, v: &Value, filled: &[&str]) -> Result<T> {
    job_section_with(source, path, v, filled, &[])
}

/// [`job_section`] for a job whose spec is its inputs `I` and a flattened
/// parameter struct `P` (`ops/`): the keys of both are accepted, the
/// values split as the server's spec splits them
/// ([`crate::ops::split_params`]).
///
/// # Errors
/// As [`job_section`].
pub fn params_section<I: serde::de::DeserializeOwned, P: serde::de::DeserializeOwned>(
    source: &str,
    path: &str,
    v: &Value,
    filled: &[&str],
) -> Result<(I, P)> {
    params_section_with(source, path, v, filled, &[])
}

/// [`params_section`] refusing the keys of `refused` with their notes.
fn params_section_with<I: serde::de::DeserializeOwned, P: serde::de::DeserializeOwned>(
    source: &str,
    path: &str,
    v: &Value,
    filled: &[&str],
    refused: &[Refused],
) -> Result<(I, P)> {
    let allowed: Vec<&str> = fields_of::<I>()
        .iter()
        .chain(fields_of::<P>())
        .copied()
        .filter(|f| !filled.contains(f) && !refused.iter().any(|(r, _)| r == f))
        .collect();
    let map = check_keys(source, path, v, &allowed, refused)?;
    let mut json: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
    for (k, val) in map {
        let k = k.as_str().unwrap_or_default().to_string();
        let at = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
        json.insert(k, super::keys::to_json(source, &at, val)?);
    }
    // Placeholders for what the runner fills (it replaces them).
    for f in filled {
        json.insert((*f).to_string(), serde_json::json!(""));
    }
    crate::ops::split_params(serde_json::Value::Object(json))
        .map_err(|e| StudioError::config(source, format!("`{path}`: {e}")))
}

fn job_section_with<T: serde::de::DeserializeOwned>(
    source: &str,
    path: &str,
    v: &Value,
    filled: &[&str],
    refused: &[Refused],
) -> Result<T> {
    let allowed: Vec<&str> = fields_of::<T>()
        .iter()
        .copied()
        .filter(|f| !filled.contains(f) && !refused.iter().any(|(r, _)| r == f))
        .collect();
    let map = check_keys(source, path, v, &allowed, refused)?;
    let mut json: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
    for (k, val) in map {
        let k = k.as_str().unwrap_or_default().to_string();
        let at = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
        json.insert(k, super::keys::to_json(source, &at, val)?);
    }
    // Placeholders for what the runner fills (never used: the runner
    // replaces them).
    for f in filled {
        let placeholder = match *f {
            "domains" => serde_json::json!([]),
            _ => serde_json::json!(""),
        };
        json.insert((*f).to_string(), placeholder);
    }
    serde_json::from_value(serde_json::Value::Object(json))
        .map_err(|e| StudioError::config(source, format!("`{path}`: {e}")))
}
