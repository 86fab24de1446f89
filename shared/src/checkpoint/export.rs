//! Writing a model in Hugging Face layout (`config.json`, safetensors,
//! `tokenizer.json`) from any [`TensorSource`], streaming one tensor at a
//! time: a dense model ([`export_dense`]) or an MoE in any layout of
//! [`crate::layout`] ([`export_moe`], `convert --layout`).

use crate::tensor_io::DType;
#[cfg(not(target_arch = "wasm32"))]
use {
    crate::checkpoint::plan::dense_tensor_plan,
    crate::config::ModelConfig,
    crate::error::{Result, StudioError},
    crate::tensor_io::{PlannedTensor, TensorSource},
};

/// Output dtype of a tensor: `dtype` when given, else the source's float
/// dtype, else F32 (quantised GGUF tensors are written dequantised).
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
fn out_dtype(src: DType, dtype: Option<DType>) -> DType {
    dtype.unwrap_or(if src.float_size().is_some() { src } else { DType::F32 })
}

/// Writes `src` as a Hugging Face dense checkpoint into `out_dir`
/// (atomically), converting every tensor to `dtype` (or keeping its float
/// dtype), with `config.json` and, when given, `tokenizer.json`.
///
/// # Errors
/// [`StudioError::Tensor`] when a tensor is missing or mis-shaped;
/// [`StudioError::Invalid`] when `out_dir` exists and is not empty; I/O.
#[cfg(not(target_arch = "wasm32"))]
pub fn export_dense(
    src: &dyn TensorSource,
    config: &ModelConfig,
    out_dir: &std::path::Path,
    dtype: Option<DType>,
    tokenizer_json: Option<Vec<u8>>,
    opts: crate::tensor_io::WriteOptions,
) -> Result<()> {
    let plan_shapes = dense_tensor_plan(config);
    let mut plan = Vec::with_capacity(plan_shapes.len());
    for (name, shape) in &plan_shapes {
        let info = src.info(name).ok_or_else(|| StudioError::tensor(src.source_name(), name, "missing"))?;
        if &info.shape != shape {
            return Err(StudioError::tensor(
                src.source_name(),
                name,
                format!("shape {:?} does not match the configuration (expected {shape:?})", info.shape),
            ));
        }
        plan.push(PlannedTensor { name: name.clone(), dtype: out_dtype(info.dtype, dtype), shape: shape.clone() });
    }
    // Families that store fused projections (Phi-3) get them fused again.
    let fused = super::fused::fuse_plan(config, &plan_shapes);
    let plan: Vec<PlannedTensor> = fused
        .iter()
        .map(|(name, shape, parts)| {
            let first = if parts.is_empty() { name } else { &parts[0] };
            let dt = plan.iter().find(|p| &p.name == first).map_or(DType::F32, |p| p.dtype);
            PlannedTensor { name: name.clone(), dtype: dt, shape: shape.clone() }
        })
        .collect();
    let mut opts = opts;
    opts.card_detail("architecture", config.architecture.model_type());
    opts.card_detail(
        "dtype",
        dtype.map_or("as the input's tensors (f32 for quantised ones)".into(), |d| d.to_string()),
    );
    let mut w = crate::tensor_io::SafetensorsWriter::create(out_dir, plan, opts)?;
    for (name, _, parts) in &fused {
        let values = if parts.is_empty() {
            src.read_f32(name)?
        } else {
            let mut v = Vec::new();
            for p in parts {
                v.extend(src.read_f32(p)?);
            }
            v
        };
        w.write_f32(name, &values)?;
    }
    let cfg = config.to_config_json(Some(dtype.unwrap_or(DType::F32)));
    let mut extra = vec![("config.json", serde_json::to_vec_pretty(&cfg).expect("json"))];
    if let Some(t) = tokenizer_json {
        extra.push(("tokenizer.json", t));
    }
    w.finish(&extra)?;
    Ok(())
}

/// Writes the MoE `src` (canonical names; structure `moe` on `config`) in
/// the layout `request` picks, its routed experts stored as `experts` (per
/// expert or packed, [`crate::layout::packed`]), into `out_dir`
/// (atomically): every tensor
/// converted to `dtype` (or kept in its float dtype), router weights scaled
/// by `1 / T` where the layout folds temperatures, the layout's zero
/// tensors, `config.json` (with `moe_studio.provenance`), when given
/// `tokenizer.json`, and the card of `opts` with the layout's facts.
/// Returns the layout choice.
///
/// # Errors
/// [`StudioError::Config`] when a named layout cannot hold the model
/// (nothing is written); [`StudioError::Tensor`] for a missing or
/// mis-shaped tensor; [`StudioError::Invalid`] when `out_dir` exists and is
/// not empty; I/O.
#[cfg(not(target_arch = "wasm32"))]
#[allow(clippy::too_many_arguments)]
pub fn export_moe(
    src: &dyn TensorSource,
    config: &ModelConfig,
    moe: &crate::config::MoeConfig,
    request: crate::layout::LayoutRequest,
    experts: crate::layout::ExpertsFormat,
    out_dir: &std::path::Path,
    dtype: Option<DType>,
    tokenizer_json: Option<Vec<u8>>,
    opts: crate::tensor_io::WriteOptions,
) -> Result<crate::layout::LayoutChoice> {
    use crate::layout::names::{self, TensorRole};
    use crate::tensor_io::sink::{write_values, TensorSink};
    let choice = crate::layout::choose(config, moe, request)?.with_experts(experts);
    let plan = crate::checkpoint::plan::moe_tensor_plan(config, moe);
    let mut canonical = Vec::with_capacity(plan.len());
    for t in &plan {
        let info = src.info(&t.name).ok_or_else(|| StudioError::tensor(src.source_name(), &t.name, "missing"))?;
        if info.shape != t.shape {
            return Err(StudioError::tensor(
                src.source_name(),
                &t.name,
                format!("shape {:?} does not match the configuration (expected {:?})", info.shape, t.shape),
            ));
        }
        canonical.push(PlannedTensor {
            name: t.name.clone(),
            dtype: out_dtype(info.dtype, dtype),
            shape: t.shape.clone(),
        });
    }
    let planned = choice.disk_plan(config, &canonical);
    let mut opts = opts;
    if let Some(c) = opts.card.as_mut() {
        crate::checkpoint::output::card_moe_details(c, config, &choice, &planned);
    }
    let mut w = crate::tensor_io::SafetensorsWriter::create(out_dir, choice.file_plan(&planned)?, opts)?;
    let mut packing = choice.packing_sink(&mut w, &planned)?;
    let mut sink = crate::layout::LayoutSink::new(&mut packing, choice.layout, &planned[canonical.len()..]);
    for p in &canonical {
        let mut values = src.read_f32(&p.name)?;
        if let TensorRole::Router { layer } = names::parse(&p.name) {
            let s = choice.router_scale[layer] as f32;
            if s != 1.0 {
                values.iter_mut().for_each(|x| *x *= s);
            }
        }
        write_values(&mut sink as &mut dyn TensorSink, &p.name, p.dtype, &values)?;
    }
    sink.finish()?;
    let out_type = canonical.first().map(|p| p.dtype).unwrap_or(DType::F32);
    let provenance = serde_json::json!({"method": "convert", "source": src.source_name()});
    let cfg = crate::checkpoint::output::config_json(config, &choice, out_type, provenance);
    let mut extra = vec![("config.json", serde_json::to_vec_pretty(&cfg).expect("json"))];
    if let Some(t) = tokenizer_json {
        extra.push(("tokenizer.json", t));
    }
    w.finish(&extra)?;
    Ok(choice)
}
