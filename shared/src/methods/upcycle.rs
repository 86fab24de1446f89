//! Sparse upcycling, dense -> MoE (DeltaMoE phase 1 initialisation,
//! methods.md §1; per-layer counts from NeuronMoE, §3), and the ways the
//! field builds the experts (methods.md "Upcycling variants").
//!
//! Every FFN of an MoE layer `l` becomes `E_l` experts, each a copy of the
//! dense `gate/up/down` projections (`w1 = gate_proj [f, d]`,
//! `w3 = up_proj [f, d]`, `w2 = down_proj [d, f]`), plus a new router
//! `[E_l, d]` ([`RouterInit`]). Every other tensor is copied unchanged.
//! Expert 0 is the original FFN and is frozen by default. Options, each one
//! function below with its source:
//!
//! - noise on the non-frozen copies ([`CopyNoise`]);
//! - Drop-Upcycling ([`drop_upcycle`], Nakamura et al. 2025): each
//!   non-frozen copy re-initialises a fraction `r` of its intermediate units;
//! - granular (fine-grained) upcycling ([`granular_slice`], Megatron-Core
//!   `--moe-upcycling-granularity`, He et al. 2024, arXiv 2410.07524): each
//!   copy split into `G` experts of width `f / G`, top-(k·G) routing, the
//!   router rows shared by a copy's slices ([`granular_router`]) and the
//!   output scale corrected ([`routed_output_scale`]);
//! - shared experts ([`shared_expert_values`], DeepSeekMoE / Qwen1.5-MoE):
//!   always-active experts beside the routed ones, zero-initialised (the
//!   default) or copies of the FFN with the scale that keeps the function;
//! - un-normalised top-k weights (`norm_topk_prob: false`, Switch
//!   Transformers), with its scale correction ([`routed_output_scale`]).
//!
//! Without noise and drop the upcycled model computes exactly the dense
//! function: for any router with renormalised top-k weights (they sum to 1;
//! granular copies are chosen whole because their slices share one router
//! row), for the zero router with un-normalised weights.
//!
//! Streaming: the dense tensors are read once each, in plan order, and
//! written (with their `E_l` copies) before the next is read, so memory
//! holds about one dense tensor (in f32 and in output bytes) at a time.

use serde::Serialize;

use super::allocation::ExpertCounts;
use super::router_init::RouterInit;
use crate::checkpoint::output::{
    check_dense_source, config_json, layout_sink, planned_tensors, LayoutChoice, LayoutRequest,
};
use crate::checkpoint::plan::{MoeTensor, Origin};
use crate::config::{ModelConfig, MoeConfig, MoeLayerSpec};
use crate::error::{Param, Result, StudioError};
use crate::layout::ExpertsFormat;
pub use crate::layout::Proj;
use crate::rng::{sample_indices, NormalRng};
use crate::tensor_io::sink::{to_bytes, write_values, TensorSink};
use crate::tensor_io::{DType, PlannedTensor, TensorSource};

/// How noise combines with an expert copy's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NoiseKind {
    /// `w * (1 + std * n)`, `n ~ N(0, 1)`: relative to each weight.
    Multiplicative,
    /// `w + std * n`.
    Additive,
}

/// Seeded Gaussian noise on the non-frozen expert copies.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CopyNoise {
    /// How it combines with the weights.
    pub kind: NoiseKind,
    /// Standard deviation (0 = no noise).
    pub std: f64,
}

impl CopyNoise {
    /// No noise.
    pub const NONE: CopyNoise = CopyNoise { kind: NoiseKind::Multiplicative, std: 0.0 };

    /// Perturbs `w` with the generator of tensor `name` under `seed`.
    pub fn apply(&self, w: &[f32], seed: u64, name: &str) -> Vec<f32> {
        let mut rng = NormalRng::for_tensor(seed, name);
        match self.kind {
            NoiseKind::Multiplicative => {
                w.iter().map(|&x| (f64::from(x) * (1.0 + self.std * rng.next_normal())) as f32).collect()
            }
            NoiseKind::Additive => w.iter().map(|&x| (f64::from(x) + self.std * rng.next_normal()) as f32).collect(),
        }
    }
}

/// How shared experts are initialised ([`shared_expert_values`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SharedInit {
    /// `w1`, `w3` copies of the dense FFN, `w2 = 0`: each shared expert
    /// outputs exactly 0, so the model still equals the dense one, and
    /// `w2` gets a gradient at once (all-zero experts would stay zero).
    #[default]
    Zero,
    /// Copies of the dense FFN (Qwen1.5-MoE's upcycled shared expert),
    /// with the routed experts' and shared experts' `w2` scaled so that
    /// every shared expert and the routed part each contribute `1 / (N+1)`
    /// of the dense output (see [`routed_output_scale`]).
    Copy,
}

/// Always-active shared experts added to every MoE layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SharedExperts {
    /// How many (0 = none).
    pub count: usize,
    /// Scale each by `sigmoid(g_i · x)` (Qwen2-MoE) instead of adding it as
    /// it is (DeepSeekMoE). The gate starts at zero (`sigmoid(0) = 1/2`).
    pub gate: bool,
    /// Initialisation.
    pub init: SharedInit,
    /// Keep the shared experts and their gate frozen in training.
    pub frozen: bool,
}

/// Options of [`upcycle`].
#[derive(Debug, Clone)]
pub struct UpcycleOptions {
    /// Experts per layer (totals, the original FFN included), counted in
    /// whole copies of the FFN: with granularity `G` a layer of `E` copies
    /// has `E·G` experts.
    pub experts: ExpertCounts,
    /// Where `experts` came from, for error messages (the allocation
    /// file's path, or `--experts`).
    pub experts_source: String,
    /// Experts per token `k` (DeltaMoE / MoE-LPR: 2), in copies: the
    /// layer routes top-(k·G).
    pub top_k: usize,
    /// Frozen copies of every MoE layer (default `[0]`, the original FFN;
    /// copy `c` is experts `c·G .. c·G + G`).
    pub frozen: Vec<usize>,
    /// Router initialisation.
    pub router_init: RouterInit,
    /// Noise on the non-frozen copies.
    pub noise: CopyNoise,
    /// Seed of the random router and the noise.
    pub seed: u64,
    /// Router temperature `T` of every MoE layer (folded into the router
    /// weight in every public layout).
    pub temperature: f64,
    /// Output dtype (default: each tensor's source float dtype, f32 for
    /// quantised tensors).
    pub dtype: Option<DType>,
    /// Load-balancing loss coefficient recorded in the config (0.01).
    pub router_aux_loss_coef: f64,
    /// Shared experts (none by default).
    pub shared: SharedExperts,
    /// Drop-Upcycling ratio `r` in `[0, 1]` (0 = plain copies; the paper's
    /// default is 0.5), seeded by `seed`.
    pub drop_ratio: f64,
    /// Granularity `G >= 1` (1 = full copies); must divide the FFN width.
    pub granularity: usize,
    /// Renormalise the top-k weights (`true`, Mixtral) or weigh by the
    /// softmax over all experts (`false`, Switch / Qwen2-MoE).
    pub norm_topk_prob: bool,
    /// On-disk layout (`--layout`; default `auto`).
    pub layout: LayoutRequest,
    /// How the routed experts are stored (`--experts-format`; default per
    /// expert).
    pub experts_format: ExpertsFormat,
}

impl Default for UpcycleOptions {
    /// The DeltaMoE reference: 4 experts, top-2, expert 0 frozen, zero
    /// router, no noise, seed 0, temperature 1, no shared experts, no drop,
    /// granularity 1, renormalised top-k.
    fn default() -> Self {
        UpcycleOptions {
            experts: ExpertCounts::Uniform(4),
            experts_source: "--experts".into(),
            top_k: 2,
            frozen: vec![0],
            router_init: RouterInit::Zeros,
            noise: CopyNoise::NONE,
            seed: 0,
            temperature: 1.0,
            dtype: None,
            router_aux_loss_coef: 0.01,
            shared: SharedExperts::default(),
            drop_ratio: 0.0,
            granularity: 1,
            norm_topk_prob: true,
            layout: LayoutRequest::Auto,
            experts_format: ExpertsFormat::PerExpert,
        }
    }
}

/// A validated upcycle: layout, tensors and `config.json`, nothing written.
#[derive(Debug, Clone)]
pub struct UpcyclePlan {
    /// The MoE layout as requested (temperature included).
    pub moe: MoeConfig,
    /// Layout choice, written config and router scales.
    pub choice: LayoutChoice,
    /// Output tensors and their origins, in write order.
    pub tensors: Vec<MoeTensor>,
    /// The writer's plan: `tensors` with output dtypes under the layout's
    /// names, then the layout's zero tensors.
    pub planned: Vec<PlannedTensor>,
    /// `config.json`.
    pub config_json: serde_json::Value,
    /// Notes for the user.
    pub warnings: Vec<String>,
}

/// The MoE layout in whole copies (before granular splitting): what the
/// router initialisation and the user's counts refer to.
fn copies_config(base: &ModelConfig, opts: &UpcycleOptions) -> Result<MoeConfig> {
    let counts = opts.experts.per_layer(base.num_layers, &opts.experts_source)?;
    if counts.iter().all(Option::is_none) {
        return Err(StudioError::config(&opts.experts_source, "every layer stays dense: nothing to upcycle"));
    }
    let layers = counts
        .iter()
        .map(|c| {
            c.map(|e| MoeLayerSpec {
                num_experts: e,
                top_k: opts.top_k,
                frozen: opts.frozen.clone(),
                temperature: opts.temperature,
                ..Default::default()
            })
        })
        .collect();
    let moe = MoeConfig { layers, router_aux_loss_coef: opts.router_aux_loss_coef };
    moe.validate(base, &opts.experts_source)?;
    Ok(moe)
}

/// The written MoE layout: each copy split into `G` experts of width
/// `f / G` (copy-major: expert `c·G + s` is slice `s` of copy `c`), top-(k·G),
/// frozen copies expanded to their slices, shared experts and
/// `norm_topk_prob` from the options.
fn granular_config(base: &ModelConfig, copies: &MoeConfig, opts: &UpcycleOptions) -> MoeConfig {
    let g = opts.granularity;
    let layers = copies
        .layers
        .iter()
        .map(|s| {
            s.as_ref().map(|s| MoeLayerSpec {
                num_experts: s.num_experts * g,
                top_k: s.top_k * g,
                frozen: s.frozen.iter().flat_map(|&c| c * g..(c + 1) * g).collect(),
                expert_intermediate_size: (g > 1).then(|| base.intermediate_size / g),
                shared_experts: opts.shared.count,
                shared_expert_gate: opts.shared.count > 0 && opts.shared.gate,
                shared_frozen: opts.shared.count > 0 && opts.shared.frozen,
                norm_topk_prob: opts.norm_topk_prob,
                ..s.clone()
            })
        })
        .collect();
    MoeConfig { layers, router_aux_loss_coef: copies.router_aux_loss_coef }
}

/// Checks the variant options before anything is read or written.
///
/// # Errors
/// [`StudioError::Param`] naming the option: a drop ratio outside
/// `[0, 1]`, a granularity of 0 or one that does not divide the FFN width
/// (the divisors are listed), shared-expert options without shared experts.
fn validate_variants(base: &ModelConfig, opts: &UpcycleOptions) -> Result<()> {
    if !(opts.drop_ratio.is_finite() && (0.0..=1.0).contains(&opts.drop_ratio)) {
        return Err(StudioError::param(
            "--drop-ratio",
            Param::DropRatio,
            format!(
                "the Drop-Upcycling ratio must be in [0, 1] (the fraction of intermediate units re-initialised; got {})",
                opts.drop_ratio
            ),
        ));
    }
    let (g, f) = (opts.granularity, base.intermediate_size);
    if g == 0 || !f.is_multiple_of(g) {
        let divisors: Vec<String> = (2..=f.min(64)).filter(|x| f.is_multiple_of(*x)).map(|x| x.to_string()).collect();
        return Err(StudioError::param(
            "--granularity",
            Param::Granularity,
            format!(
                "G = {g} must divide the FFN width (intermediate_size {f}) so that every expert is a slice of f/G units; \
                 divisors of {f}: {}",
                if divisors.is_empty() { "none but 1".to_string() } else { divisors.join(", ") }
            ),
        ));
    }
    let sh = &opts.shared;
    if sh.count == 0 && (sh.gate || sh.frozen || sh.init != SharedInit::Zero) {
        return Err(StudioError::param(
            "--shared-experts",
            Param::SharedExperts,
            "--shared-gate, --shared-init and --shared-frozen need --shared-experts N (N >= 1)",
        ));
    }
    Ok(())
}

/// Validates everything and plans the output (reads tensor headers only).
///
/// # Errors
/// [`StudioError::Config`]: an allocation list of the wrong length;
/// [`StudioError::Param`] naming the parameter: a zero-expert layer, top-k
/// outside `1..=E_l`, a frozen expert that does not exist, a non-positive
/// temperature, bad router, noise or variant options;
/// [`StudioError::Tensor`] when `src` lacks a dense tensor or its shape
/// disagrees with `base`; [`StudioError::Invalid`] for a non-float dtype.
pub fn plan_upcycle(src: &dyn TensorSource, base: &ModelConfig, opts: &UpcycleOptions) -> Result<UpcyclePlan> {
    validate_variants(base, opts)?;
    let copies = copies_config(base, opts)?;
    opts.router_init.validate(&copies, base.hidden_size, &opts.experts_source)?;
    let moe = granular_config(base, &copies, opts);
    moe.validate(base, &opts.experts_source)?;
    if !(opts.noise.std.is_finite() && opts.noise.std >= 0.0) {
        return Err(StudioError::param(
            "--noise",
            Param::Noise,
            format!("noise std must be >= 0 (got {})", opts.noise.std),
        ));
    }
    if let Some(d) = opts.dtype.filter(|d| d.float_size().is_none()) {
        return Err(StudioError::Invalid(format!("cannot write dtype {d} (use f32, f16 or bf16)")));
    }
    check_dense_source(src, base)?;
    let choice = crate::layout::choose(base, &moe, opts.layout)?.with_experts(opts.experts_format);
    let (tensors, planned) = planned_tensors(src, base, &choice.written, opts.dtype);
    let planned = choice.disk_plan(base, &planned);
    let mut warnings = choice.warnings.clone();
    if !opts.norm_topk_prob && opts.router_init != RouterInit::Zeros {
        warnings.push(
            "with un-normalised top-k weights the upcycled model equals the dense one only for the zero router \
             (the routed output is scaled for uniform router probabilities)"
                .into(),
        );
    }
    let mut provenance = serde_json::json!({
        "method": "upcycle",
        "source": src.source_name(),
        "router_init": opts.router_init,
        "noise": opts.noise,
        "seed": opts.seed,
        "temperature": opts.temperature,
    });
    // Recorded only when used, so that plain upcycles keep their bytes.
    let obj = provenance.as_object_mut().expect("object");
    if opts.shared.count > 0 {
        obj.insert("shared_experts".into(), serde_json::to_value(opts.shared).expect("json"));
    }
    if opts.drop_ratio > 0.0 {
        obj.insert("drop_ratio".into(), opts.drop_ratio.into());
    }
    if opts.granularity > 1 {
        obj.insert("granularity".into(), opts.granularity.into());
    }
    if !opts.norm_topk_prob {
        obj.insert("norm_topk_prob".into(), false.into());
    }
    let dtype = planned.first().map(|p| p.dtype).unwrap_or(DType::F32);
    let config_json = config_json(base, &choice, dtype, provenance);
    Ok(UpcyclePlan { moe, choice, tensors, planned, config_json, warnings })
}

/// Streams the upcycled tensors of `plan` from `src` into `sink`.
///
/// Any sub-range of the plan's tensors can be written on its own (the
/// browser writes runs with yields between): every tensor's values depend
/// only on the options and its name.
///
/// # Errors
/// Read errors of `src`, write errors of `sink`.
pub fn write_upcycle(
    src: &dyn TensorSource,
    plan: &UpcyclePlan,
    opts: &UpcycleOptions,
    sink: &mut dyn TensorSink,
) -> Result<()> {
    let mut out = layout_sink(sink, &plan.choice, &plan.planned, plan.tensors.len());
    let sink: &mut dyn TensorSink = &mut out;
    let mut current: Option<DenseTensor> = None;
    let g = opts.granularity.max(1);
    for (t, p) in plan.tensors.iter().zip(&plan.planned) {
        let spec = |layer: usize| plan.moe.layers[layer].as_ref().expect("an MoE layer");
        match &t.origin {
            Origin::Dense { .. } => {
                current = None;
                let v = src.read_f32(&t.name)?;
                write_values(sink, &t.name, p.dtype, &v)?;
            }
            Origin::RouterWeight { layer } => {
                let [e, d] = [t.shape[0], t.shape[1]];
                let scale = plan.choice.router_scale[*layer];
                let w = opts.router_init.weight(*layer, e / g, d, opts.seed, &t.name, scale);
                write_values(sink, &t.name, p.dtype, &granular_router(&w, d, g))?;
            }
            Origin::RouterBias { .. } | Origin::SelectionBias { .. } | Origin::SharedGate { .. } => {
                write_values(sink, &t.name, p.dtype, &vec![0.0; t.shape.iter().product()])?;
            }
            Origin::SharedExpert { layer, dense_name, .. } => {
                let (_, values, _) = load_dense(&mut current, src, dense_name)?;
                let proj = proj_of(dense_name);
                let s = spec(*layer);
                let v = shared_expert_values(opts.shared.init, proj, values, s.shared_experts, s.shared_expert_gate);
                write_values(sink, &t.name, p.dtype, &v)?;
            }
            Origin::Expert { layer, expert, dense_name } => {
                let (_, values, bytes) = load_dense(&mut current, src, dense_name)?;
                let s = spec(*layer);
                let frozen = s.frozen.contains(expert);
                let proj = proj_of(dense_name);
                let scale = if proj == Proj::Down { routed_output_scale(s, opts) } else { 1.0 };
                let drop = opts.drop_ratio > 0.0 && !frozen;
                let noise = opts.noise.std > 0.0 && !frozen;
                if g == 1 && scale == 1.0 && !drop && !noise {
                    // A plain copy: the same bytes for every expert.
                    if p.dtype == DType::F32 {
                        write_values(sink, &t.name, p.dtype, values)?;
                    } else {
                        if bytes.is_none() {
                            *bytes = Some(to_bytes(p.dtype, values, &t.name)?);
                        }
                        sink.write_tensor(&t.name, bytes.as_deref().expect("set above"))?;
                    }
                    continue;
                }
                let mut v = if g > 1 { granular_slice(values, &t.shape, proj, g, expert % g) } else { values.clone() };
                if drop {
                    let f_e = if proj == Proj::Down { t.shape[1] } else { t.shape[0] };
                    let cols = drop_columns(f_e, opts.drop_ratio, opts.seed, *layer, *expert);
                    v = drop_upcycle(&v, &t.shape, proj, &cols, opts.seed, &t.name);
                }
                if noise {
                    v = opts.noise.apply(&v, opts.seed, &t.name);
                }
                if scale != 1.0 {
                    let s = scale as f32;
                    v.iter_mut().for_each(|x| *x *= s);
                }
                write_values(sink, &t.name, p.dtype, &v)?;
            }
        }
    }
    out.finish()
}

/// The dense FFN tensor being copied: its name, f32 values and (lazily)
/// its output bytes for the plain copies.
type DenseTensor = (String, Vec<f32>, Option<Vec<u8>>);

/// The dense tensor `name` in `current` (read unless it is already there).
fn load_dense<'a>(
    current: &'a mut Option<DenseTensor>,
    src: &dyn TensorSource,
    name: &str,
) -> Result<&'a mut DenseTensor> {
    if current.as_ref().map(|c| c.0.as_str()) != Some(name) {
        *current = Some((name.to_string(), src.read_f32(name)?, None));
    }
    Ok(current.as_mut().expect("set above"))
}

/// The projection of the dense tensor `model.layers.{l}.mlp.{proj}.weight`
/// (the intermediate axis is the rows of `gate`/`up` `[f, d]` and the
/// columns of `down` `[d, f]`).
fn proj_of(dense_name: &str) -> Proj {
    match crate::layout::names::parse(dense_name) {
        crate::layout::TensorRole::DenseFfn { proj, .. } => proj,
        _ => unreachable!("the plan derives experts from dense FFN projections only: {dense_name}"),
    }
}

/// Granular (fine-grained) upcycling, one slice: the `slice`-th of `g`
/// equal parts of a dense FFN projection along its intermediate axis —
/// rows `s·f/G .. (s+1)·f/G` of `gate`/`up` (`[f, d] -> [f/G, d]`), the
/// same columns of `down` (`[d, f] -> [d, f/G]`). `shape` is the slice's
/// (output) shape. A SwiGLU FFN is the sum of its slices' outputs, since
/// each intermediate unit contributes `down[:, j] · silu(gate_j x) up_j x`.
///
/// Source: Megatron-Core `--moe-upcycling-granularity` (`upcycling_utils.py`,
/// `tensor_split` of `fc1`/`fc2`), He et al., "Upcycling Large Language
/// Models into Mixture of Experts" (2024, arXiv 2410.07524) §3 — the
/// fine-grained experts of Qwen1.5-MoE and DeepSeekMoE.
pub fn granular_slice(dense: &[f32], shape: &[usize], proj: Proj, g: usize, slice: usize) -> Vec<f32> {
    match proj {
        Proj::Down => {
            let (d, fe) = (shape[0], shape[1]);
            let f = fe * g;
            (0..d).flat_map(|r| dense[r * f + slice * fe..r * f + (slice + 1) * fe].iter().copied()).collect()
        }
        Proj::Gate | Proj::Up => {
            let (fe, d) = (shape[0], shape[1]);
            dense[slice * fe * d..(slice + 1) * fe * d].to_vec()
        }
    }
}

/// Granular upcycling's router: Megatron's virtual groups. `copies` is the
/// router of the whole copies (`[E, d]` row-major); each row is repeated for
/// the copy's `g` slices (`[E·G, d]`, copy-major). Slices of one copy then
/// have equal logits and top-(k·G) takes whole copies, so at
/// initialisation the layer computes the dense FFN for any router (random
/// or hidden included). Identity for `g = 1`.
///
/// Source: Megatron-Core `upcycling_utils.py` (`_process_router_param`);
/// He et al. 2024 (arXiv 2410.07524) §3 "virtual group" initialisation.
pub fn granular_router(copies: &[f32], d: usize, g: usize) -> Vec<f32> {
    if g == 1 {
        return copies.to_vec();
    }
    copies.chunks(d).flat_map(|row| std::iter::repeat_n(row, g).flatten().copied()).collect()
}

/// The factor on every routed expert's `w2` that keeps the upcycled layer
/// equal to the dense FFN at initialisation (the scale correction):
///
/// - renormalised top-k (`norm_topk_prob`): each chosen slice has weight
///   `p_c / G` (its copy's weight shared by `G` equal logits), so slices are
///   scaled by `G`; 1 without granularity;
/// - un-normalised (`softmax` over all `E·G`): with the zero router each
///   chosen expert weighs `1 / (E·G)` and `k` whole copies are chosen, so
///   the scale is `E·G / k` (Megatron's `moe_activation_scale` for
///   pre-softmax routing, `expansion_rate · G² / topk`); exact for the zero
///   router only;
/// - times `1 / (N + 1)` when `N` shared experts are initialised as copies
///   ([`SharedInit::Copy`]): the routed part then contributes its share.
///
/// Megatron spreads the factor as `s^(1/3)` over `fc1` and `fc2`, which is
/// exact only for positively homogeneous activations; SiLU is not, so the
/// studio puts all of it on the linear `w2`, which is exact.
///
/// Source: He et al. 2024 (arXiv 2410.07524) §3 "weight scaling";
/// Megatron-Core `upcycling_utils.py` `_get_moe_activation_scale`.
pub fn routed_output_scale(spec: &MoeLayerSpec, opts: &UpcycleOptions) -> f64 {
    let g = opts.granularity.max(1) as f64;
    let routed = if spec.norm_topk_prob { g } else { spec.num_experts as f64 / (spec.top_k as f64 / g) };
    let share = if spec.shared_experts > 0 && opts.shared.init == SharedInit::Copy {
        1.0 / (spec.shared_experts as f64 + 1.0)
    } else {
        1.0
    };
    routed * share
}

/// One shared expert's projection `proj` from the dense FFN projection
/// `dense` (`n` shared experts, gated or not):
///
/// - [`SharedInit::Zero`]: `w1`, `w3` copies, `w2 = 0` — the expert outputs
///   0, the model keeps the dense function, and `w2` still gets a gradient;
/// - [`SharedInit::Copy`]: copies with `w2` scaled by `1 / ((N+1)·g)`,
///   `g = 1/2` for a gated expert (its gate starts at zero,
///   `sigmoid(0) = 1/2`) and 1 for an ungated one, so each shared expert
///   contributes `1 / (N+1)` of the dense output and the routed experts the
///   rest ([`routed_output_scale`]).
///
/// Sources: Dai et al., "DeepSeekMoE" (2024) §3.2 (shared expert
/// isolation, ungated); Qwen1.5-MoE (2024, upcycled from Qwen-1.8B, one
/// shared expert) and Qwen2-MoE (`shared_expert_gate`, sigmoid); mergekit
/// #273 (several shared experts).
pub fn shared_expert_values(init: SharedInit, proj: Proj, dense: &[f32], n: usize, gated: bool) -> Vec<f32> {
    match (init, proj) {
        (_, Proj::Gate | Proj::Up) => dense.to_vec(),
        (SharedInit::Zero, Proj::Down) => vec![0.0; dense.len()],
        (SharedInit::Copy, Proj::Down) => {
            let gate_at_init = if gated { 0.5 } else { 1.0 };
            let s = (1.0 / ((n as f64 + 1.0) * gate_at_init)) as f32;
            dense.iter().map(|&x| x * s).collect()
        }
    }
}

/// The intermediate units that Drop-Upcycling re-initialises in expert
/// `expert` of layer `layer`: `floor(r · f)` distinct indices of `0..f`
/// (the public code's `int(target_size * ratio)`), drawn uniformly and
/// seeded by `(seed, layer, expert)` — the same set for the expert's
/// `w1`, `w3` and `w2`, as in the paper's Eq. 3.
pub fn drop_columns(f: usize, ratio: f64, seed: u64, layer: usize, expert: usize) -> Vec<usize> {
    let m = (ratio * f as f64).floor() as usize;
    sample_indices(seed, &format!("model.layers.{layer}.block_sparse_moe.experts.{expert}#drop-upcycling"), f, m)
}

/// Drop-Upcycling of one expert projection: the intermediate units `cols`
/// (rows of `w1`/`w3` `[f, d]`, columns of `w2` `[d, f]`) are re-drawn from
/// `N(mean, std^2)`, `mean` and `std` (unbiased, as `torch.std`) of the
/// original values being replaced, seeded by `(seed, name)`; every other
/// value is kept. Breaks the symmetry of the copies while keeping
/// `1 - r` of each expert's knowledge.
///
/// Source: Nakamura et al., "Drop-Upcycling: Training Sparse Mixture of
/// Experts with Partial Re-initialization" (ICLR 2025) §3, Eq. 3; public
/// code `conversions/drop_upcycling.py` (the statistics of the selected
/// part, per projection). Differences on purpose: the code draws a new
/// index set per projection, the paper (and the studio) one per expert; the
/// frozen expert 0 of DeltaMoE is never dropped.
pub fn drop_upcycle(w: &[f32], shape: &[usize], proj: Proj, cols: &[usize], seed: u64, name: &str) -> Vec<f32> {
    if cols.is_empty() {
        return w.to_vec();
    }
    let [rows, inner] = [shape[0], shape[1]];
    // Flat indices of the values to replace, in row-major order.
    let picked: Vec<usize> = match proj {
        Proj::Down => (0..rows).flat_map(|r| cols.iter().map(move |&c| r * inner + c)).collect(),
        Proj::Gate | Proj::Up => cols.iter().flat_map(|&r| r * inner..(r + 1) * inner).collect(),
    };
    let n = picked.len() as f64;
    let mean = picked.iter().map(|&i| f64::from(w[i])).sum::<f64>() / n;
    let var = if picked.len() > 1 {
        picked.iter().map(|&i| (f64::from(w[i]) - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    let std = var.sqrt();
    let mut rng = NormalRng::for_tensor(seed, &format!("{name}#drop-upcycling"));
    let mut out = w.to_vec();
    for i in picked {
        out[i] = (mean + std * rng.next_normal()) as f32;
    }
    out
}

/// Upcycles the dense model `src` (configuration `base`) into an MoE
/// checkpoint directory `out_dir`: safetensors (sharded per `write_opts`),
/// `config.json` (Mixtral layout whenever possible, else the studio
/// layout) and `tokenizer.json` when given. Everything is validated before
/// the output is created; the output appears atomically at the end and no
/// partial directory is left on error.
///
/// # Errors
/// Those of [`plan_upcycle`] and [`write_upcycle`];
/// [`StudioError::Invalid`] when `out_dir` exists and is not empty; I/O.
#[cfg(not(target_arch = "wasm32"))]
pub fn upcycle(
    src: &dyn TensorSource,
    base: &ModelConfig,
    opts: &UpcycleOptions,
    out_dir: &std::path::Path,
    tokenizer_json: Option<Vec<u8>>,
    write_opts: crate::tensor_io::WriteOptions,
) -> Result<crate::checkpoint::output::MoeReport> {
    let plan = plan_upcycle(src, base, opts)?;
    let mut write_opts = write_opts;
    if let Some(c) = write_opts.card.as_mut() {
        crate::checkpoint::output::card_moe_details(c, base, &plan.choice, &plan.planned);
        c.detail("router", format!("{} initialisation, seed {}", opts.router_init.kind(), opts.seed));
    }
    let file_plan = plan.choice.file_plan(&plan.planned)?;
    let mut w = crate::tensor_io::SafetensorsWriter::create(out_dir, file_plan, write_opts)?;
    write_upcycle(src, &plan, opts, &mut plan.choice.packing_sink(&mut w, &plan.planned)?)?;
    let mut extra = vec![("config.json", serde_json::to_vec_pretty(&plan.config_json).expect("json"))];
    if let Some(t) = tokenizer_json {
        extra.push(("tokenizer.json", t));
    }
    w.finish(&extra)?;
    let mut report = crate::checkpoint::output::MoeReport::new(
        "upcycle",
        vec![src.source_name().to_string()],
        base,
        &plan.choice,
        &plan.planned,
        opts.router_init.kind(),
        plan.warnings,
    );
    report.out_dir = Some(out_dir.display().to_string());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::plan::dense_tensor_plan;
    use crate::config::HfConfig;
    use crate::tensor_io::safetensors_io::SafetensorsFile;
    use crate::tensor_io::sink::MemorySink;
    use crate::tensor_io::writer::serialize_to_vec;
    use crate::tensor_io::Bytes;

    fn tiny() -> (ModelConfig, SafetensorsFile) {
        let json =
            br#"{"model_type":"llama","vocab_size":16,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":2,
            "num_attention_heads":2,"num_key_value_heads":1,"tie_word_embeddings":true}"#;
        let base = HfConfig::from_json(json, "c").unwrap().to_model_config("c").unwrap();
        let tensors: Vec<(PlannedTensor, Vec<u8>)> = dense_tensor_plan(&base)
            .into_iter()
            .enumerate()
            .map(|(k, (name, shape))| {
                let n: usize = shape.iter().product();
                let v: Vec<f32> = (0..n).map(|i| ((i * 7 + k) as f32 * 0.1).sin()).collect();
                (PlannedTensor { name, dtype: DType::F32, shape }, to_bytes(DType::F32, &v, "test").unwrap())
            })
            .collect();
        let pairs: Vec<(PlannedTensor, &[u8])> = tensors.iter().map(|(p, b)| (p.clone(), b.as_slice())).collect();
        let bytes = serialize_to_vec(&pairs, &Default::default()).unwrap();
        (base, SafetensorsFile::parse(Bytes::from_vec(bytes), "tiny").unwrap())
    }

    #[test]
    fn in_memory_upcycle_copies_freezes_and_perturbs() {
        let (base, src) = tiny();
        let opts = UpcycleOptions {
            experts: ExpertCounts::PerLayer(vec![Some(3), None]),
            top_k: 2,
            noise: CopyNoise { kind: NoiseKind::Additive, std: 0.01 },
            temperature: 0.5,
            dtype: Some(DType::BF16),
            ..Default::default()
        };
        let plan = plan_upcycle(&src, &base, &opts).unwrap();
        assert_eq!(plan.choice.name(), "qwen2_moe", "a dense layer 1 fits Qwen2-MoE's mlp_only_layers");
        let plan = plan_upcycle(
            &src,
            &base,
            &UpcycleOptions { layout: LayoutRequest::parse("studio").unwrap(), ..opts.clone() },
        )
        .unwrap();
        assert_eq!(plan.config_json["model_type"], "moe_studio");
        assert_eq!(plan.config_json["moe_layers"][0]["temperature"], 0.5, "studio layout keeps T");
        let mut sink = MemorySink::new(plan.planned.clone());
        write_upcycle(&src, &plan, &opts, &mut sink).unwrap();
        let out = SafetensorsFile::parse(Bytes::from_vec(sink.into_safetensors().unwrap()), "out").unwrap();
        let dense = src.read_f32("model.layers.0.mlp.up_proj.weight").unwrap();
        let bf16 = |v: &[f32]| v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect::<Vec<_>>();
        let e =
            |i: usize| out.read_f32(&crate::layout::names::expert_weight_name(0, i, crate::layout::Proj::Up)).unwrap();
        assert_eq!(e(0), bf16(&dense), "frozen expert 0 is an exact copy");
        assert_ne!(e(1), e(0));
        assert_ne!(e(1), e(2), "each copy has its own noise");
        let max = e(1).iter().zip(&e(0)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max < 0.1, "additive noise of std 0.01 (max {max})");
        assert!(out.info("model.layers.1.mlp.down_proj.weight").is_some());
        assert!(out.read_f32(&crate::layout::names::router_weight_name(0)).unwrap().iter().all(|&w| w == 0.0));
    }
}
