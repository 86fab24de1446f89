//! Weight-merging baselines (methods.md §1 "Baselines"): linear averaging
//! ("model soup"), task arithmetic, TIES and DARE, with mergekit's semantics
//! and defaults (mergekit 0.1.5, `mergekit/merge_methods/linear.py`,
//! `generalized_task_arithmetic.py`, `sparsify.py`).
//!
//! Per tensor, with models `x_1..x_N`, weights `w_i` (default 1), and for
//! the methods with a base `b`, deltas `d_i = x_i - b`:
//!
//! - **linear** (Wortsman et al. 2022, "Model soups"):
//!   `sum_i w_i x_i`, divided by `sum_i w_i` when normalising (mergekit's
//!   default `normalize: true`). No base.
//! - **task-arithmetic** (Ilharco et al. 2023, "Editing models with task
//!   arithmetic"): `b + lambda * sum_i w_i d_i` (not normalised by default;
//!   with `normalize` the sum is divided by `sum_i w_i`).
//! - **ties** (Yadav et al. 2023, "TIES-merging"): each `d_i` is trimmed to
//!   its `k = max(1, floor(density * n))` largest magnitudes (per tensor);
//!   the weighted deltas `w_i d_i` elect a sign per element by their sum
//!   (`>= 0` elects +); the merged delta is the sum of the weighted deltas
//!   that agree with the elected sign (a zero never agrees), divided by the
//!   sum of their weights (mergekit's default `normalize: true`; a zero
//!   divisor counts as 1): the disjoint mean. Then `b + lambda * delta`.
//! - **dare** (Yu et al. 2024, "Language models are Super Mario"; mergekit's
//!   `dare_linear`): each element of each `d_i` is dropped with probability
//!   `1 - density` and the survivors rescaled, then summed as task arithmetic
//!   (not normalised by default).
//! - **dare-ties** (mergekit's `dare_ties`): DARE's drop and rescale, then
//!   TIES' sign election and disjoint sum (not normalised by default).
//!
//! Rescaling of a sparsified delta ([`Rescale`]): none (TIES' default), by
//! `1 / density` (the DARE paper, our DARE default), or so that its L1 norm
//! equals the unsparsified delta's (mergekit 0.1.5's `rescale: true`, which
//! replaced `1 / density`; choose it to match mergekit).
//!
//! # Determinism and mergekit
//! Everything is computed in f32 from the inputs' f32 values (bf16/f16
//! upcast exactly) and rounded once to the output dtype, in the order
//! mergekit sums (models in the given order). mergekit computes in the
//! inputs' dtype unless its config says `dtype: float32`; with that setting
//! and `out_dtype` equal to ours, linear and task arithmetic agree to f32
//! rounding (the golden test `shared/tests/merge.rs`). TIES breaks
//! magnitude ties by position (earlier elements kept first), where torch's
//! `argsort` is unspecified. DARE draws its masks from a SplitMix64 stream
//! seeded by `(seed, tensor name, model index)`, not torch's generator: the
//! same seed gives the same output here on every machine, but not
//! mergekit's masks, so DARE is checked by its statistics (kept fraction,
//! rescaled values, expectation), never bitwise against mergekit.
//!
//! # Differences from mergekit
//! Tensors whose shapes differ across models are an error here (mergekit
//! truncates embeddings to the base's vocabulary with a warning); every
//! model must hold the same tensor names.
//!
//! # Streaming
//! One output tensor at a time: linear, task arithmetic and DARE keep the
//! base, one model's tensor and the running sum; TIES and DARE-TIES keep all
//! `N` weighted deltas of the current tensor (the sign election needs them).

use serde::Serialize;

use super::delta::check_same_tensors;
use crate::error::{Result, StudioError};
use crate::rng::fnv1a;
use crate::tensor_io::sink::{to_bytes, TensorSink};
use crate::tensor_io::{DType, PlannedTensor, TensorSource};

/// A merge method (see the module docs); also the `method` of the server's
/// merge job spec (`crate::api::MergeSpec`), in the same kebab-case spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MergeMethod {
    /// Weighted average of the models (mergekit `linear`).
    Linear,
    /// Base plus the weighted sum of deltas (mergekit `task_arithmetic`).
    TaskArithmetic,
    /// Trim, elect sign, disjoint mean (mergekit `ties`).
    Ties,
    /// Random drop and rescale, then sum (mergekit `dare_linear`).
    Dare,
    /// Random drop and rescale, then TIES' sign election (mergekit
    /// `dare_ties`).
    DareTies,
}

impl MergeMethod {
    /// Parses a CLI name: `linear`, `task-arithmetic`, `ties`, `dare`
    /// (alias `dare-linear`), `dare-ties` (underscores accepted).
    pub fn parse(s: &str) -> Option<MergeMethod> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "linear" => Some(MergeMethod::Linear),
            "task-arithmetic" => Some(MergeMethod::TaskArithmetic),
            "ties" => Some(MergeMethod::Ties),
            "dare" | "dare-linear" => Some(MergeMethod::Dare),
            "dare-ties" => Some(MergeMethod::DareTies),
            _ => None,
        }
    }

    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            MergeMethod::Linear => "linear",
            MergeMethod::TaskArithmetic => "task-arithmetic",
            MergeMethod::Ties => "ties",
            MergeMethod::Dare => "dare",
            MergeMethod::DareTies => "dare-ties",
        }
    }

    /// Whether the method works on deltas from a base model.
    pub fn needs_base(self) -> bool {
        self != MergeMethod::Linear
    }

    /// mergekit's default for `normalize`.
    pub fn default_normalize(self) -> bool {
        matches!(self, MergeMethod::Linear | MergeMethod::Ties)
    }

    /// The default rescaling of sparsified deltas.
    pub fn default_rescale(self) -> Rescale {
        match self {
            MergeMethod::Dare | MergeMethod::DareTies => Rescale::InverseDensity,
            _ => Rescale::None,
        }
    }

    /// The sparsification it applies to deltas.
    pub fn sparsification(self) -> Option<Sparsification> {
        match self {
            MergeMethod::Ties => Some(Sparsification::Magnitude),
            MergeMethod::Dare | MergeMethod::DareTies => Some(Sparsification::Random),
            _ => None,
        }
    }

    /// Whether it elects a sign per element (TIES' consensus by sum).
    pub fn sign_consensus(self) -> bool {
        matches!(self, MergeMethod::Ties | MergeMethod::DareTies)
    }
}

/// How a delta is sparsified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sparsification {
    /// Keep the `max(1, floor(density * n))` largest magnitudes.
    Magnitude,
    /// Keep each element with probability `density` (seeded).
    Random,
}

/// How a sparsified delta is rescaled; in job specs and recipes by its
/// CLI name (`none`, `inverse-density`, `l1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rescale {
    /// No rescaling.
    None,
    /// Multiply the survivors by `1 / density` (the DARE paper).
    InverseDensity,
    /// Multiply by `||d||_1 / ||sparse(d)||_1` (mergekit 0.1.5's
    /// `rescale: true`; skipped when either norm is below 1e-7).
    L1,
}

impl Rescale {
    /// Parses `none`, `inverse-density` (alias `density`), `l1`.
    pub fn parse(s: &str) -> Option<Rescale> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "none" | "false" => Some(Rescale::None),
            "inverse-density" | "density" => Some(Rescale::InverseDensity),
            "l1" => Some(Rescale::L1),
            _ => None,
        }
    }
}

/// Options of [`merge`].
#[derive(Debug, Clone, PartialEq)]
pub struct MergeOptions {
    /// The method.
    pub method: MergeMethod,
    /// One weight per model (default: all 1). Must be finite.
    pub weights: Option<Vec<f64>>,
    /// Fraction of each delta kept by TIES / DARE, in `(0, 1]` (1 = no
    /// sparsification, mergekit's implicit default; the CLI's default is
    /// 0.5).
    pub density: f64,
    /// Divide by the sum of weights (default per method, as mergekit).
    pub normalize: Option<bool>,
    /// Rescaling of sparsified deltas (default per method).
    pub rescale: Option<Rescale>,
    /// Factor on the merged delta (mergekit's `lambda`, default 1).
    pub lambda: f64,
    /// Seed of DARE's random drop.
    pub seed: u64,
    /// Output dtype (default: the first model's dtype per tensor).
    pub dtype: Option<DType>,
}

impl MergeOptions {
    /// Defaults for `method`: unit weights, density 0.5, the method's
    /// normalise / rescale defaults, lambda 1, seed 0, dtype of the first
    /// model.
    pub fn new(method: MergeMethod) -> Self {
        MergeOptions {
            method,
            weights: None,
            density: 0.5,
            normalize: None,
            rescale: None,
            lambda: 1.0,
            seed: 0,
            dtype: None,
        }
    }
}

/// The resolved parameters of a merge (defaults applied).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResolvedMerge {
    /// The method.
    pub method: MergeMethod,
    /// One weight per model.
    pub weights: Vec<f64>,
    /// Density (TIES / DARE only, else `None`).
    pub density: Option<f64>,
    /// Whether the sum is divided by the sum of weights.
    pub normalize: bool,
    /// Rescaling of sparsified deltas (TIES / DARE only).
    pub rescale: Option<Rescale>,
    /// Factor on the merged delta (methods with a base).
    pub lambda: Option<f64>,
    /// DARE's seed.
    pub seed: Option<u64>,
}

/// A validated merge: output tensors in write order, nothing written.
#[derive(Debug, Clone)]
pub struct MergePlan {
    /// The resolved parameters.
    pub params: ResolvedMerge,
    /// Output tensors (the first model's order), with output dtypes.
    pub planned: Vec<PlannedTensor>,
    /// Notes for the user.
    pub warnings: Vec<String>,
}

/// Per-tensor statistics of a merge.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MergeTensorStat {
    /// Tensor name.
    pub name: String,
    /// `||out - base||_2` in f32 before rounding (methods with a base), or
    /// `||out - first model||_2` (linear).
    pub change_l2: f64,
    /// Fraction of delta elements kept by sparsification, over all models
    /// (TIES / DARE only).
    pub kept_fraction: Option<f64>,
}

/// Summary of a merge (the CLI's `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct MergeReport {
    /// Always `"merge"`.
    pub operation: &'static str,
    /// The resolved parameters.
    pub params: ResolvedMerge,
    /// The models, in order.
    pub models: Vec<String>,
    /// The base model (methods with a base).
    pub base: Option<String>,
    /// Output directory, when written to disk.
    pub out_dir: Option<String>,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub tensor_bytes: u64,
    /// Output dtype of the first tensor.
    pub dtype: String,
    /// Fraction of delta elements kept over the whole model (TIES / DARE).
    pub kept_fraction: Option<f64>,
    /// Wall time in seconds (native [`merge`] only).
    pub seconds: Option<f64>,
    /// Per-tensor statistics, in write order.
    pub per_tensor: Vec<MergeTensorStat>,
    /// Notes for the user.
    pub warnings: Vec<String>,
}

/// Validates a merge and plans its output (reads tensor headers only).
///
/// # Errors
/// [`StudioError::Config`] for no models, a missing `base` (task
/// arithmetic, TIES, DARE) or one given to `linear`, a weight count that
/// differs from the model count, non-finite weights or lambda, weights that
/// sum to zero when normalising a linear merge, a density outside `(0, 1]`;
/// [`StudioError::Invalid`] for a non-float `dtype`; those of
/// [`check_same_tensors`] when the models (and base) differ in tensor names
/// or shapes.
pub fn plan_merge(
    models: &[&dyn TensorSource],
    base: Option<&dyn TensorSource>,
    opts: &MergeOptions,
) -> Result<MergePlan> {
    let m = opts.method;
    let arg = |what: String| Err(StudioError::config("arguments", what));
    if models.is_empty() {
        return arg("merge needs at least one model".into());
    }
    match (m.needs_base(), base.is_some()) {
        (true, false) => return arg(format!("{} needs --base (the model the deltas are taken from)", m.name())),
        (false, true) => {
            return arg("linear takes no --base: list every model to average (the base too, if wanted)".into())
        }
        _ => {}
    }
    let weights = match &opts.weights {
        Some(w) if w.len() != models.len() => {
            return arg(format!("{} weights for {} models: give one weight per model", w.len(), models.len()))
        }
        Some(w) => w.clone(),
        None => vec![1.0; models.len()],
    };
    if let Some(w) = weights.iter().find(|w| !w.is_finite()) {
        return arg(format!("weights must be finite numbers (got {w})"));
    }
    let normalize = opts.normalize.unwrap_or(m.default_normalize());
    if m == MergeMethod::Linear && normalize && weights.iter().map(|&w| w as f32).sum::<f32>() == 0.0 {
        return arg(
            "the weights sum to 0, so the weighted average is undefined (pass --no-normalize or other weights)".into(),
        );
    }
    if !opts.lambda.is_finite() {
        return arg(format!("lambda must be a finite number (got {})", opts.lambda));
    }
    let sparsify = m.sparsification().is_some();
    if sparsify && !(opts.density > 0.0 && opts.density <= 1.0) {
        return arg(format!("density must be in (0, 1] (got {})", opts.density));
    }
    if let Some(d) = opts.dtype.filter(|d| d.float_size().is_none()) {
        return Err(StudioError::Invalid(format!("cannot write dtype {d} (use f32, f16 or bf16)")));
    }
    let first = models[0];
    for (i, other) in models.iter().enumerate().skip(1) {
        check_same_tensors(first, "model 1", *other, &format!("model {}", i + 1))?;
    }
    if let Some(b) = base {
        check_same_tensors(b, "base", first, "model 1")?;
    } else {
        // check_same_tensors refuses an empty first model; do it here too.
        if first.tensors().is_empty() {
            return Err(StudioError::Invalid(format!("model 1 {} holds no tensors", first.source_name())));
        }
    }
    let mut warnings = Vec::new();
    if models.len() == 1 && m == MergeMethod::Linear {
        warnings.push("linear merge of a single model: the output equals it (up to rounding)".into());
    }
    if !sparsify && opts.density != 0.5 && opts.density != 1.0 {
        warnings.push(format!("density {} is ignored by {}", opts.density, m.name()));
    }
    let planned = first
        .tensors()
        .into_iter()
        .map(|t| {
            let dtype = opts.dtype.unwrap_or(if t.dtype.float_size().is_some() { t.dtype } else { DType::F32 });
            PlannedTensor { name: t.name, dtype, shape: t.shape }
        })
        .collect();
    let params = ResolvedMerge {
        method: m,
        weights,
        density: sparsify.then_some(opts.density),
        normalize,
        rescale: sparsify.then(|| opts.rescale.unwrap_or(m.default_rescale())),
        lambda: m.needs_base().then_some(opts.lambda),
        seed: matches!(m, MergeMethod::Dare | MergeMethod::DareTies).then_some(opts.seed),
    };
    Ok(MergePlan { params, planned, warnings })
}

/// SplitMix64 (Steele, Lea & Flood 2014): the DARE mask generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The stream of `(seed, tensor name, model index)`.
    pub fn for_tensor(seed: u64, name: &str, model: usize) -> Self {
        let mut s = SplitMix64(seed ^ fnv1a(name).rotate_left(17));
        let x = s.next_u64() ^ (model as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        SplitMix64(x)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform `f64` in `[0, 1)` (53 random bits).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Keeps the `max(1, floor(density * n))` largest magnitudes of `delta`
/// and zeroes the rest (mergekit `sparsify.magnitude`); equal magnitudes at
/// the threshold are kept in index order. `density >= 1` keeps everything.
/// Returns the number kept.
pub fn magnitude_trim(delta: &mut [f32], density: f64) -> usize {
    let n = delta.len();
    if density >= 1.0 || n == 0 {
        return n;
    }
    if density <= 0.0 {
        delta.fill(0.0);
        return 0;
    }
    let k = ((density * n as f64) as usize).max(1);
    if k >= n {
        return n;
    }
    let mut mags: Vec<f32> = delta.iter().map(|x| x.abs()).collect();
    let (_, kth, _) = mags.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    let t = *kth;
    drop(mags);
    let greater = delta.iter().filter(|x| x.abs().total_cmp(&t).is_gt()).count();
    let mut ties = k - greater;
    for x in delta.iter_mut() {
        match x.abs().total_cmp(&t) {
            std::cmp::Ordering::Greater => {}
            std::cmp::Ordering::Equal if ties > 0 => ties -= 1,
            _ => *x = 0.0,
        }
    }
    k
}

/// Drops each element of `delta` with probability `1 - density` (kept when
/// a uniform draw is `< density`), drawing from `rng`. `density >= 1`
/// keeps everything. Returns the number kept.
pub fn random_drop(delta: &mut [f32], density: f64, rng: &mut SplitMix64) -> usize {
    if density >= 1.0 {
        return delta.len();
    }
    let mut kept = 0;
    for x in delta.iter_mut() {
        if rng.next_f64() < density {
            kept += 1;
        } else {
            *x = 0.0;
        }
    }
    kept
}

/// Rescales a sparsified delta in place (`x / density` for
/// [`Rescale::InverseDensity`], in f32); `l1_before` is `||d||_1` of the
/// unsparsified delta (used by [`Rescale::L1`]).
pub fn rescale(sparse: &mut [f32], how: Rescale, density: f64, l1_before: f64) {
    match how {
        Rescale::None => {}
        Rescale::InverseDensity => {
            let d = density as f32;
            sparse.iter_mut().for_each(|x| *x /= d);
        }
        Rescale::L1 => {
            let after: f64 = sparse.iter().map(|x| f64::from(x.abs())).sum();
            if l1_before >= 1e-7 && after >= 1e-7 {
                let f = (l1_before / after) as f32;
                sparse.iter_mut().for_each(|x| *x *= f);
            }
        }
    }
}

/// Merges one tensor's values (all slices of equal length): `models[i]` are
/// the models' values, `base` the base's (methods with a base). `name` and
/// `seed` seed DARE. Returns the merged f32 values (before rounding to the
/// output dtype) and the number of delta elements kept by sparsification.
///
/// This is the whole per-tensor computation of [`write_merge`]; it is
/// public for tests and for callers that hold small tensors in memory.
pub fn merge_values(
    params: &ResolvedMerge,
    name: &str,
    models: Vec<Vec<f32>>,
    base: Option<&[f32]>,
) -> (Vec<f32>, usize) {
    let mut stream = models.into_iter().enumerate().map(Ok::<_, StudioError>);
    merge_stream(params, name, &mut stream, base).expect("in-memory inputs do not fail")
}

type ModelStream<'a> = dyn Iterator<Item = Result<(usize, Vec<f32>)>> + 'a;

fn merge_stream(
    params: &ResolvedMerge,
    name: &str,
    models: &mut ModelStream<'_>,
    base: Option<&[f32]>,
) -> Result<(Vec<f32>, usize)> {
    let w32: Vec<f32> = params.weights.iter().map(|&w| w as f32).collect();
    let Some(base) = base else {
        // Linear: sum_i w_i x_i (then / sum_i w_i), as mergekit.
        let mut acc: Vec<f32> = Vec::new();
        for item in models {
            let (i, x) = item?;
            if acc.is_empty() {
                acc = vec![0.0; x.len()];
            }
            for (a, v) in acc.iter_mut().zip(&x) {
                *a += v * w32[i];
            }
        }
        if params.normalize {
            let denom: f32 = w32.iter().sum();
            acc.iter_mut().for_each(|a| *a /= denom);
        }
        return Ok((acc, 0));
    };
    let n = base.len();
    let mut kept_total = 0usize;
    let mut weighted: Vec<Vec<f32>> = Vec::new();
    let mut mixed = vec![0f32; n];
    let consensus = params.method.sign_consensus();
    for item in models {
        let (i, mut d) = item?;
        for (x, &b) in d.iter_mut().zip(base) {
            *x -= b;
        }
        if let (Some(sp), Some(density)) = (params.method.sparsification(), params.density) {
            let how = params.rescale.unwrap_or(Rescale::None);
            let l1: f64 = if how == Rescale::L1 { d.iter().map(|x| f64::from(x.abs())).sum() } else { 0.0 };
            kept_total += match sp {
                Sparsification::Magnitude => magnitude_trim(&mut d, density),
                Sparsification::Random => {
                    random_drop(&mut d, density, &mut SplitMix64::for_tensor(params.seed.unwrap_or(0), name, i))
                }
            };
            if density < 1.0 {
                rescale(&mut d, how, density, l1);
            }
        }
        d.iter_mut().for_each(|x| *x *= w32[i]);
        if consensus {
            weighted.push(d);
        } else {
            for (m, x) in mixed.iter_mut().zip(&d) {
                *m += x;
            }
        }
    }
    let mut divisor_all: Option<f32> = None;
    let mut divisor_elem: Vec<f32> = Vec::new();
    if consensus {
        let mut sign_sum = vec![0f32; n];
        for d in &weighted {
            for (s, x) in sign_sum.iter_mut().zip(d) {
                *s += x;
            }
        }
        divisor_elem = vec![0f32; n];
        for (i, d) in weighted.iter().enumerate() {
            for j in 0..n {
                let x = d[j];
                let agrees = if sign_sum[j] >= 0.0 { x > 0.0 } else { x < 0.0 };
                if agrees {
                    mixed[j] += x;
                    divisor_elem[j] += w32[i];
                }
            }
        }
        divisor_elem.iter_mut().filter(|d| **d == 0.0).for_each(|d| *d = 1.0);
    } else {
        let s: f32 = w32.iter().sum();
        divisor_all = Some(if s.abs() < 1e-8 { 1.0 } else { s });
    }
    if params.normalize {
        match divisor_all {
            Some(s) => mixed.iter_mut().for_each(|m| *m /= s),
            None => mixed.iter_mut().zip(&divisor_elem).for_each(|(m, d)| *m /= d),
        }
    }
    let lambda = params.lambda.unwrap_or(1.0);
    if lambda != 1.0 {
        let l = lambda as f32;
        mixed.iter_mut().for_each(|m| *m *= l);
    }
    for (m, &b) in mixed.iter_mut().zip(base) {
        *m += b;
    }
    Ok((mixed, kept_total))
}

/// Streams the merged tensors of `plan` into `sink`, one tensor at a time;
/// returns per-tensor statistics.
///
/// # Errors
/// Read errors of the sources; write errors of `sink`.
pub fn write_merge(
    models: &[&dyn TensorSource],
    base: Option<&dyn TensorSource>,
    plan: &MergePlan,
    sink: &mut dyn TensorSink,
) -> Result<Vec<MergeTensorStat>> {
    let mut stats = Vec::with_capacity(plan.planned.len());
    for p in &plan.planned {
        let n: usize = p.shape.iter().product();
        let read = |src: &dyn TensorSource| -> Result<Vec<f32>> {
            let v = src.read_f32(&p.name)?;
            if v.len() != n {
                return Err(StudioError::tensor(
                    src.source_name(),
                    &p.name,
                    format!("read {} values but shape {:?} needs {n}", v.len(), p.shape),
                ));
            }
            Ok(v)
        };
        let b = base.map(read).transpose()?;
        let mut stream = models.iter().enumerate().map(|(i, m)| read(*m).map(|v| (i, v)));
        let (out, kept) = merge_stream(&plan.params, &p.name, &mut stream, b.as_deref())?;
        let change_l2 = match &b {
            Some(b) => l2_diff(&out, b),
            None => l2_diff(&out, &read(models[0])?),
        };
        let kept_fraction = plan.params.density.map(|_| kept as f64 / (n.max(1) * models.len()) as f64);
        stats.push(MergeTensorStat { name: p.name.clone(), change_l2, kept_fraction });
        sink.write_tensor(&p.name, &to_bytes(p.dtype, &out, &p.name)?)?;
    }
    Ok(stats)
}

fn l2_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum::<f64>().sqrt()
}

/// A report for `plan` with its statistics.
pub fn merge_report(
    models: &[&dyn TensorSource],
    base: Option<&dyn TensorSource>,
    plan: &MergePlan,
    per_tensor: Vec<MergeTensorStat>,
) -> MergeReport {
    let kept_fraction = plan.params.density.map(|_| {
        let (mut kept, mut total) = (0f64, 0f64);
        for (s, p) in per_tensor.iter().zip(&plan.planned) {
            let n = p.shape.iter().product::<usize>() as f64;
            kept += s.kept_fraction.unwrap_or(0.0) * n;
            total += n;
        }
        if total > 0.0 {
            kept / total
        } else {
            0.0
        }
    });
    MergeReport {
        operation: "merge",
        params: plan.params.clone(),
        models: models.iter().map(|m| m.source_name().to_string()).collect(),
        base: base.map(|b| b.source_name().to_string()),
        out_dir: None,
        tensors: plan.planned.len(),
        tensor_bytes: plan.planned.iter().map(|p| p.byte_len() as u64).sum(),
        dtype: plan.planned.first().map(|p| p.dtype.to_string()).unwrap_or_default(),
        kept_fraction,
        seconds: None,
        per_tensor,
        warnings: plan.warnings.clone(),
    }
}

/// Sets `torch_dtype` (and `dtype`, when present: transformers 5) of a
/// `config.json` to `dtype`; returns the input unchanged when it is not a
/// JSON object.
pub fn set_config_dtype(config_json: &[u8], dtype: DType) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(config_json) else {
        return config_json.to_vec();
    };
    let name = dtype.torch_name();
    let Some(obj) = v.as_object_mut() else { return config_json.to_vec() };
    if obj.contains_key("dtype") {
        obj.insert("dtype".into(), name.into());
    }
    if obj.contains_key("torch_dtype") || !obj.contains_key("dtype") {
        obj.insert("torch_dtype".into(), name.into());
    }
    serde_json::to_vec_pretty(&v).expect("json")
}

/// Merges `models` (and `base`) per `opts` into `out_dir`, atomically:
/// safetensors plus `extra_files` (`config.json`, tokenizer files: the
/// caller copies the first model's, see [`super::delta::companion_files`]
/// and [`set_config_dtype`]). Validated before any output exists.
///
/// # Errors
/// Those of [`plan_merge`] and [`write_merge`]; [`StudioError::Invalid`]
/// when `out_dir` exists and is not empty; I/O.
#[cfg(not(target_arch = "wasm32"))]
pub fn merge(
    models: &[&dyn TensorSource],
    base: Option<&dyn TensorSource>,
    opts: &MergeOptions,
    out_dir: &std::path::Path,
    extra_files: &[(&str, Vec<u8>)],
    write_opts: crate::tensor_io::WriteOptions,
) -> Result<MergeReport> {
    let start = std::time::Instant::now();
    let plan = plan_merge(models, base, opts)?;
    let mut w = crate::tensor_io::SafetensorsWriter::create(out_dir, plan.planned.clone(), write_opts)?;
    let stats = write_merge(models, base, &plan, &mut w)?;
    w.finish(extra_files)?;
    let mut report = merge_report(models, base, &plan, stats);
    report.out_dir = Some(out_dir.display().to_string());
    report.seconds = Some(start.elapsed().as_secs_f64());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(method: MergeMethod, weights: Vec<f64>) -> ResolvedMerge {
        let o = MergeOptions::new(method);
        let sparse = method.sparsification().is_some();
        ResolvedMerge {
            method,
            weights,
            density: sparse.then_some(o.density),
            normalize: method.default_normalize(),
            rescale: sparse.then_some(method.default_rescale()),
            lambda: method.needs_base().then_some(1.0),
            seed: Some(0),
        }
    }

    #[test]
    fn ties_elects_the_sign_and_averages_the_agreeing_deltas() {
        // Two deltas, density 1 (no trimming): element 0 both positive,
        // element 1 disagree (sum negative), element 2 one zero.
        let mut p = params(MergeMethod::Ties, vec![1.0, 1.0]);
        p.density = Some(1.0);
        let base = [0.0f32; 3];
        let (out, _) = merge_values(&p, "t", vec![vec![1.0, 1.0, 2.0], vec![3.0, -3.0, 0.0]], Some(&base));
        assert_eq!(out, vec![2.0, -3.0, 2.0]);
    }

    #[test]
    fn magnitude_trim_keeps_the_largest_and_breaks_ties_by_position() {
        let mut d = vec![0.1, -5.0, 2.0, -2.0, 0.0, 3.0];
        assert_eq!(magnitude_trim(&mut d, 0.5), 3);
        assert_eq!(d, vec![0.0, -5.0, 2.0, 0.0, 0.0, 3.0]);
        let mut one = vec![1.0, 2.0];
        assert_eq!(magnitude_trim(&mut one, 0.1), 1, "at least one element is kept");
        assert_eq!(one, vec![0.0, 2.0]);
    }

    #[test]
    fn splitmix_is_reproducible_and_depends_on_every_key() {
        let a: Vec<u64> = (0..4).map(|_| SplitMix64::for_tensor(1, "x", 0).next_u64()).collect();
        assert!(a.iter().all(|&v| v == a[0]));
        assert_ne!(SplitMix64::for_tensor(1, "x", 0).next_u64(), SplitMix64::for_tensor(2, "x", 0).next_u64());
        assert_ne!(SplitMix64::for_tensor(1, "x", 0).next_u64(), SplitMix64::for_tensor(1, "y", 0).next_u64());
        assert_ne!(SplitMix64::for_tensor(1, "x", 0).next_u64(), SplitMix64::for_tensor(1, "x", 1).next_u64());
    }

    #[test]
    fn method_names_round_trip() {
        for m in [
            MergeMethod::Linear,
            MergeMethod::TaskArithmetic,
            MergeMethod::Ties,
            MergeMethod::Dare,
            MergeMethod::DareTies,
        ] {
            assert_eq!(MergeMethod::parse(m.name()), Some(m));
        }
        assert_eq!(MergeMethod::parse("task_arithmetic"), Some(MergeMethod::TaskArithmetic));
        assert_eq!(MergeMethod::parse("dare_linear"), Some(MergeMethod::Dare));
    }
}
