//! mergekit merge recipes (`mergekit-yaml` configs, mergekit 0.1.5's
//! `MergeConfiguration`): `merge_method` linear / task_arithmetic / ties /
//! dare_linear / dare_ties over `models` (each `model` + `parameters`
//! `weight` / `density`), `base_model`, top-level `parameters`
//! (`normalize`, `rescale`, `lambda`, `int8_mask`, and `weight` / `density`
//! as defaults for every model), `dtype`, `out_dtype`. They run with
//! [`crate::methods::merge`] (docs/methods.md §6).
//!
//! mergekit's semantics are kept where they differ from the `merge`
//! command's defaults: `density` defaults to 1 (no sparsification),
//! `rescale` defaults to true for the DARE methods (mergekit 0.1.5 rescales
//! to the delta's L1 norm: [`Rescale::L1`]), a `base_model` also listed in
//! `models` is the base and not merged as a model, and `linear` ignores
//! `base_model`. mergekit requires a `weight` for every merged model; so
//! does this reader.

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use super::keys::{boolean, check_keys, fields_of, get, nearest, number, string, Refused};
use crate::error::{Result, StudioError};
use crate::methods::merge::{MergeMethod, MergeOptions, Rescale};
use crate::tensor_io::DType;

/// The top-level keys of a merge recipe (field names: the keys; the
/// values are read by [`MergeRecipe::from_yaml`]).
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct MergeKeys {
    merge_method: Value,
    models: Value,
    base_model: Value,
    parameters: Value,
    dtype: Value,
    out_dtype: Value,
}

/// The keys of one `models` entry.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct ModelKeys {
    model: Value,
    parameters: Value,
}

/// The per-model `parameters` keys.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct ModelParamKeys {
    weight: Value,
    density: Value,
}

/// The top-level `parameters` keys.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct SharedParamKeys {
    weight: Value,
    density: Value,
    normalize: Value,
    rescale: Value,
    lambda: Value,
    int8_mask: Value,
}

/// mergekit top-level keys the studio does not run.
const REFUSED_TOP: &[Refused] = &[
    (
        "slices",
        "layer slices (frankenmerges, passthrough stacks) are not implemented; merge whole models with `models`",
    ),
    ("modules", "per-module merges are not implemented; merge whole models with `models`"),
    (
        "tokenizer_source",
        "the merged model takes the first model's tokenizer and every model must have the same vocabulary; \
         vocabulary unions are not implemented (remove the key)",
    ),
    ("tokenizer", "tokenizer surgery is not implemented; the first model's tokenizer is copied (remove the key)"),
    ("chat_template", "the first model's tokenizer files (chat template included) are copied as they are"),
];

/// mergekit parameters of methods the studio does not run.
const REFUSED_PARAMS: &[Refused] = &[
    ("gamma", "breadcrumbs' outlier fraction: breadcrumbs is not implemented"),
    ("epsilon", "DELLA's magnitude window: della is not implemented"),
    ("t", "SLERP's interpolation factor: slerp is not implemented"),
    ("filter_wise", "model_stock's option: model_stock is not implemented"),
    ("select_topk", "SCE's option: sce is not implemented"),
];

/// mergekit 0.1.5's merge methods that the studio does not implement.
const OTHER_MERGEKIT_METHODS: &[&str] = &[
    "slerp",
    "nuslerp",
    "multislerp",
    "karcher",
    "model_stock",
    "breadcrumbs",
    "breadcrumbs_ties",
    "della",
    "della_linear",
    "passthrough",
    "nearswap",
    "arcee_fusion",
    "sce",
];

/// The mergekit names of the methods the studio runs, and ours.
pub const METHODS: &[(&str, MergeMethod)] = &[
    ("linear", MergeMethod::Linear),
    ("task_arithmetic", MergeMethod::TaskArithmetic),
    ("ties", MergeMethod::Ties),
    ("dare_linear", MergeMethod::Dare),
    ("dare_ties", MergeMethod::DareTies),
];

/// A validated mergekit merge recipe: model references as written (paths;
/// the runner resolves them) and the merge options.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeRecipe {
    /// The models merged, in order (a `base_model` listed in `models` is
    /// left out: it is the base).
    pub models: Vec<String>,
    /// The base (`base_model`; methods with a base only).
    pub base: Option<String>,
    /// Method, weights, density, normalize, rescale, lambda, output dtype
    /// (DARE's `seed` is the runner's).
    pub options: MergeOptions,
    /// Notes for the user (ignored `base_model`, `int8_mask`, the compute
    /// dtype).
    pub warnings: Vec<String>,
}

impl MergeRecipe {
    /// Reads a merge recipe from its top-level mapping.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming `source` and the key: unknown keys
    /// (with the nearest supported key), keys and methods mergekit has but
    /// the studio does not implement (with the reason), gradient / filter
    /// parameter lists, a missing `weight`, per-model densities that differ
    /// (the studio merges with one density), a method that needs a
    /// `base_model` without one, a non-float dtype.
    pub fn from_yaml(source: &str, top: &Value) -> Result<MergeRecipe> {
        let cfg = |what: String| StudioError::config(source, what);
        let map = check_keys(source, "", top, fields_of::<MergeKeys>(), REFUSED_TOP)?;
        let method_name = string(
            source,
            "merge_method",
            get(map, "merge_method").ok_or_else(|| {
                cfg("`merge_method` is missing (one of linear, task_arithmetic, ties, dare_linear, dare_ties)".into())
            })?,
        )?;
        let method = parse_method(source, &method_name)?;
        let mut warnings = Vec::new();
        let shared = match get(map, "parameters") {
            Some(p) => check_keys(source, "parameters", p, fields_of::<SharedParamKeys>(), REFUSED_PARAMS)?.clone(),
            None => Mapping::new(),
        };
        let base = get(map, "base_model").map(|v| model_ref(source, "base_model", v)).transpose()?;
        let entries = match get(map, "models") {
            Some(Value::Sequence(s)) if !s.is_empty() => s,
            Some(Value::Sequence(_)) | None => {
                return Err(cfg("`models` is missing or empty: list the models to merge".into()))
            }
            Some(other) => return Err(cfg(format!("`models`: expected a list, got {}", super::keys::kind(other)))),
        };
        let mut models = Vec::new();
        let mut weights = Vec::new();
        let mut densities: Vec<(String, f64)> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            let path = format!("models[{i}]");
            let m = check_keys(source, &path, e, fields_of::<ModelKeys>(), &[])?;
            let name = model_ref(
                source,
                &format!("{path}.model"),
                get(m, "model").ok_or_else(|| cfg(format!("`{path}.model` is missing")))?,
            )?;
            let params = match get(m, "parameters") {
                Some(p) => {
                    check_keys(source, &format!("{path}.parameters"), p, fields_of::<ModelParamKeys>(), REFUSED_PARAMS)?
                        .clone()
                }
                None => Mapping::new(),
            };
            if method.needs_base() && base.as_deref() == Some(name.as_str()) {
                // mergekit: the base in `models` is the base, its
                // parameters unused.
                continue;
            }
            let param = |key: &str| -> Result<Option<f64>> {
                match (get(&params, key), get(&shared, key)) {
                    (Some(v), _) => number(source, &format!("{path}.parameters.{key}"), v).map(Some),
                    (None, Some(v)) => number(source, &format!("parameters.{key}"), v).map(Some),
                    (None, None) => Ok(None),
                }
            };
            let w = param("weight")?.ok_or_else(|| {
                cfg(format!("`{path}.parameters.weight` is missing: mergekit needs a weight for every merged model"))
            })?;
            weights.push(w);
            if let Some(d) = param("density")? {
                densities.push((path.clone(), d));
            }
            models.push(name);
        }
        if models.is_empty() {
            return Err(cfg("`models` lists only the base model: nothing to merge".into()));
        }
        let sparsify = method.sparsification().is_some();
        let density = match densities.first() {
            Some((_, d)) => {
                if let Some((p, other)) = densities.iter().find(|(_, x)| x != d) {
                    return Err(cfg(format!(
                        "`{p}.parameters.density` is {other} but {} has {d}: the studio merges with one density for \
                         every model",
                        densities[0].0
                    )));
                }
                if densities.len() != models.len() && *d != 1.0 {
                    return Err(cfg(format!(
                        "`density` is given for {} of {} models (the others default to 1): the studio merges with \
                         one density for every model; give the same density to all",
                        densities.len(),
                        models.len()
                    )));
                }
                *d
            }
            None => 1.0,
        };
        if !sparsify && densities.iter().any(|(_, d)| *d != 1.0) {
            warnings.push(format!("`density` is ignored by {method_name}"));
        }
        let flag = |key: &str| get(&shared, key).map(|v| boolean(source, &format!("parameters.{key}"), v)).transpose();
        let normalize = flag("normalize")?;
        let rescale = match flag("rescale")? {
            Some(true) => Some(Rescale::L1),
            Some(false) => Some(Rescale::None),
            None if matches!(method, MergeMethod::Dare | MergeMethod::DareTies) => Some(Rescale::L1),
            None => Some(Rescale::None),
        };
        if flag("int8_mask")? == Some(true) {
            warnings.push(
                "`parameters.int8_mask`: mergekit's memory saving for sign masks; the studio's masks are booleans \
                 already (no effect on the values)"
                    .into(),
            );
        }
        let lambda = get(&shared, "lambda").map(|v| number(source, "parameters.lambda", v)).transpose()?.unwrap_or(1.0);
        let dtype_of = |key: &str| -> Result<Option<DType>> {
            get(map, key)
                .map(|v| {
                    let s = string(source, key, v)?;
                    DType::parse_float(&s)
                        .ok_or_else(|| cfg(format!("`{key}: {s}`: expected float32, float16 or bfloat16")))
                })
                .transpose()
        };
        let compute = dtype_of("dtype")?;
        let out = dtype_of("out_dtype")?;
        if let Some(c) = compute.filter(|&c| c != DType::F32) {
            warnings.push(format!(
                "`dtype: {}`: mergekit computes in that dtype; the studio computes in float32 and rounds once to \
                 the output dtype (values can differ by a rounding step; use `dtype: float32` and `out_dtype` to \
                 match mergekit bit for bit)",
                c.torch_name()
            ));
        }
        let base = if method.needs_base() {
            Some(base.ok_or_else(|| cfg(format!("`base_model` is missing: {method_name} merges deltas from a base")))?)
        } else {
            if let Some(b) = &base {
                warnings.push(format!("`base_model` ({b}) is not used by linear (mergekit ignores it too)"));
            }
            None
        };
        let options = MergeOptions {
            method,
            weights: Some(weights),
            density,
            normalize,
            rescale: if sparsify { rescale } else { None },
            lambda,
            seed: 0,
            dtype: out.or(compute),
        };
        Ok(MergeRecipe { models, base, options, warnings })
    }
}

/// A model reference: a string (a path; mergekit's `model+lora` and
/// mappings are refused).
fn model_ref(source: &str, path: &str, v: &Value) -> Result<String> {
    let s = string(source, path, v)?;
    if s.contains('+') && !std::path::Path::new(&s).exists() {
        return Err(StudioError::config(
            source,
            format!("`{path}: {s}`: LoRA adapters (`model+lora`) are not supported; merge the adapter first"),
        ));
    }
    Ok(s)
}

/// Our method for a mergekit `merge_method` name.
///
/// # Errors
/// [`StudioError::Config`]: a mergekit method the studio does not run
/// (with the supported list), or an unknown name (with the nearest).
pub fn parse_method(source: &str, name: &str) -> Result<MergeMethod> {
    if let Some((_, m)) = METHODS.iter().find(|(n, _)| *n == name) {
        return Ok(*m);
    }
    let supported = METHODS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
    let what = if OTHER_MERGEKIT_METHODS.contains(&name) {
        format!("`merge_method: {name}` is a mergekit method the studio does not implement (supported: {supported})")
    } else {
        match nearest(name, METHODS.iter().map(|(n, _)| *n)) {
            Some(n) => format!("unknown `merge_method: {name}`: did you mean `{n}`? (supported: {supported})"),
            None => format!("unknown `merge_method: {name}` (supported: {supported})"),
        }
    };
    Err(StudioError::config(source, what))
}
