//! What the MoE-producing methods (upcycle, MoErge, route) share on the way
//! out: the tensor plan with output dtypes, `config.json` (from the layout
//! [`crate::layout::choose`] picked), and the report.

use serde::Serialize;

use super::plan::{moe_tensor_plan, MoeTensor, Origin};
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};
use crate::layout::LayoutSink;
use crate::tensor_io::sink::TensorSink;
use crate::tensor_io::{DType, PlannedTensor, TensorSource};

pub use crate::layout::{LayoutChoice, LayoutRequest};

/// Output dtype: `explicit` when given, else the source's float dtype,
/// else F32 (quantised GGUF tensors are written dequantised).
pub fn out_dtype(src: DType, explicit: Option<DType>) -> DType {
    explicit.unwrap_or(if src.float_size().is_some() { src } else { DType::F32 })
}

/// Checks that `src` holds every dense tensor of `base` with the right
/// shape (before any output is created).
///
/// # Errors
/// [`StudioError::Tensor`] naming the source and tensor.
pub fn check_dense_source(src: &dyn TensorSource, base: &ModelConfig) -> Result<()> {
    for (name, shape) in crate::checkpoint::plan::dense_tensor_plan(base) {
        let info = src.info(&name).ok_or_else(|| {
            StudioError::tensor(src.source_name(), &name, format!("missing (expected shape {shape:?})"))
        })?;
        if info.shape != shape {
            return Err(StudioError::tensor(
                src.source_name(),
                &name,
                format!("shape {:?} does not match the configuration (expected {shape:?})", info.shape),
            ));
        }
    }
    Ok(())
}

/// The MoE tensors with their output dtypes: each tensor takes the dtype of
/// the dense tensor it comes from (routers: the layer's `mlp.gate_proj`),
/// converted by [`out_dtype`]. `src` must hold every dense tensor (see
/// [`check_dense_source`]).
pub fn planned_tensors(
    src: &dyn TensorSource,
    base: &ModelConfig,
    moe: &MoeConfig,
    explicit: Option<DType>,
) -> (Vec<MoeTensor>, Vec<PlannedTensor>) {
    let tensors = moe_tensor_plan(base, moe);
    let src_dtype = |name: &str| src.info(name).map(|i| i.dtype).unwrap_or(DType::F32);
    let planned = tensors
        .iter()
        .map(|t| {
            let from = match &t.origin {
                Origin::Dense { .. } => src_dtype(&t.name),
                Origin::Expert { dense_name, .. } | Origin::SharedExpert { dense_name, .. } => src_dtype(dense_name),
                Origin::RouterWeight { layer }
                | Origin::RouterBias { layer }
                | Origin::SelectionBias { layer }
                | Origin::SharedGate { layer } => src_dtype(&format!("model.layers.{layer}.mlp.gate_proj.weight")),
            };
            PlannedTensor { name: t.name.clone(), dtype: out_dtype(from, explicit), shape: t.shape.clone() }
        })
        .collect();
    (tensors, planned)
}

/// `config.json` of the output: the layout's
/// [`crate::layout::MoeLayout::write_config`] of `choice.written`, plus
/// `torch_dtype` and a `moe_studio.provenance` object (how the checkpoint
/// was made; transformers ignores it).
pub fn config_json(
    base: &ModelConfig,
    choice: &LayoutChoice,
    dtype: DType,
    provenance: serde_json::Value,
) -> serde_json::Value {
    let mut v = choice.layout.write_config(base, &choice.written);
    let name = dtype.torch_name();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("torch_dtype".into(), name.into());
        if let Some(studio) = obj.get_mut("moe_studio").and_then(|s| s.as_object_mut()) {
            studio.insert("provenance".into(), provenance);
        }
    }
    v
}

/// Adds an MoE output's facts to `card`: the layout and its loaders (or why no public layout holds it), the
/// experts per layer, top-k, shared experts and frozen experts, how the
/// experts are stored, the dtype and the parameter counts; marks the card
/// as an MoE's (`moe`, `mixture-of-experts` tags).
pub fn card_moe_details(
    card: &mut crate::tensor_io::card::ModelCard,
    base: &ModelConfig,
    choice: &LayoutChoice,
    planned: &[PlannedTensor],
) {
    card.moe = true;
    let layout = match &choice.reason {
        Some(why) => format!("`{}` (transformers cannot load it: {why})", choice.name()),
        None => format!("`{}` ({})", choice.name(), choice.layout.loaders()),
    };
    card.detail("layout", layout);
    let moe = &choice.written;
    // Runs of layers with the same description: (first, last, text).
    let mut runs: Vec<(usize, usize, String)> = Vec::new();
    for (l, s) in moe.layers.iter().enumerate() {
        let text = match s {
            None => "dense".to_string(),
            Some(s) => {
                let mut t = format!("{} experts, top-{}", s.num_experts, s.top_k);
                if s.shared_experts > 0 {
                    t.push_str(&format!(", {} shared", s.shared_experts));
                }
                if !s.frozen.is_empty() {
                    t.push_str(&format!(", frozen {:?}", s.frozen));
                }
                t
            }
        };
        match runs.last_mut() {
            Some(run) if run.2 == text => run.1 = l,
            _ => runs.push((l, l, text)),
        }
    }
    let counts: Vec<String> = runs
        .iter()
        .map(|(a, b, t)| if a == b { format!("layer {a}: {t}") } else { format!("layers {a}-{b}: {t}") })
        .collect();
    card.detail("experts", counts.join("; "));
    let storage = match choice.experts {
        crate::layout::ExpertsFormat::PerExpert => "per expert (one tensor per expert and projection)",
        crate::layout::ExpertsFormat::Packed => {
            "packed (`experts.gate_up_proj [E, 2f, d]`, `experts.down_proj [E, d, f]`: transformers 5's layout)"
        }
    };
    card.detail("expert storage", storage);
    card.detail(
        "parameters",
        format!("{} ({} active per token)", moe.num_parameters(base), moe.num_active_parameters(base)),
    );
    if let Some(p) = planned.first() {
        card.detail("dtype", p.dtype.to_string());
    }
}

/// A sink writing canonical names into `sink` under `choice`'s layout;
/// `planned` is the writer's plan ([`LayoutChoice::disk_plan`]) and
/// `canonical` the number of canonical tensors at its head (the rest are the
/// layout's zero tensors, written by [`LayoutSink::finish`]).
pub fn layout_sink<'a>(
    sink: &'a mut dyn TensorSink,
    choice: &'a LayoutChoice,
    planned: &'a [PlannedTensor],
    canonical: usize,
) -> LayoutSink<'a> {
    LayoutSink::new(sink, choice.layout, &planned[canonical.min(planned.len())..])
}

/// Summary of a written MoE checkpoint (printed by the CLI's `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct MoeReport {
    /// `upcycle` or `moerge`.
    pub method: &'static str,
    /// The input model(s).
    pub sources: Vec<String>,
    /// Output directory, when written to disk.
    pub out_dir: Option<String>,
    /// On-disk layout (a [`crate::layout::REGISTRY`] name).
    pub layout: &'static str,
    /// Why no public layout was used (studio layout under `auto`).
    pub layout_reason: Option<String>,
    /// The public layouts that hold this MoE exactly.
    pub public_layouts: Vec<&'static str>,
    /// Experts per layer (0 = the layer stayed dense).
    pub experts_per_layer: Vec<usize>,
    /// The MoE config as written to `config.json`.
    pub moe: MoeConfig,
    /// Router initialisation (`zeros`, `random`, `hidden`).
    pub router_init: &'static str,
    /// Parameters of the MoE model.
    pub parameters: usize,
    /// Parameters of the dense base.
    pub dense_parameters: usize,
    /// Number of tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written (headers and JSON files excluded).
    pub tensor_bytes: u64,
    /// Output dtype of the token embedding (tensors keep their own dtype
    /// unless one was forced).
    pub dtype: String,
    /// Things the user should know (aligned shapes, tokenizer differences,
    /// layout fallbacks).
    pub warnings: Vec<String>,
}

impl MoeReport {
    /// A report for `planned` tensors written with `choice` on `base`.
    pub fn new(
        method: &'static str,
        sources: Vec<String>,
        base: &ModelConfig,
        choice: &LayoutChoice,
        planned: &[PlannedTensor],
        router_init: &'static str,
        warnings: Vec<String>,
    ) -> Self {
        let dtype = planned.first().map(|p| p.dtype.to_string()).unwrap_or_default();
        MoeReport {
            method,
            sources,
            out_dir: None,
            layout: choice.name(),
            layout_reason: choice.reason.clone(),
            public_layouts: crate::layout::holding(base, &choice.written),
            experts_per_layer: choice.written.layers.iter().map(|s| s.as_ref().map_or(0, |s| s.num_experts)).collect(),
            moe: choice.written.clone(),
            router_init,
            parameters: choice.written.num_parameters(base),
            dense_parameters: base.num_parameters(),
            tensors: planned.len(),
            tensor_bytes: planned.iter().map(|p| p.byte_len() as u64).sum(),
            dtype,
            warnings,
        }
    }
}
