//! DUME's incremental step: add one more domain expert to an MoErged model
//! without revisiting the old models or data.
//!
//! Source: DUME (2026), "incremental" (methods.md §2). The MoErged model's
//! non-FFN tensors are the mean of the `N` dense models, so with a new dense
//! model they become `(N * mean + new) / (N + 1)` (computed in f64, rounded
//! once); every MoE layer gets the new model's FFN as expert `N`; router
//! rows of the old experts are kept and the new row starts at zero (the
//! ridge router is re-solved afterwards from the saved statistics plus the
//! new domain's, see `route`).

use crate::checkpoint::plan::{moe_tensor_plan, MoeTensor, Origin};
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{Result, StudioError};
use crate::layout::names::{self, router_bias_name, router_weight_name, TensorRole};
use crate::tensor_io::sink::{write_values, TensorSink};
use crate::tensor_io::{DType, PlannedTensor, TensorSource};

/// A validated plan: the grown MoE layout and its tensors.
#[derive(Debug, Clone)]
pub struct AddExpertPlan {
    /// The layout with one more expert in every MoE layer.
    pub moe: MoeConfig,
    /// Output tensors in write order.
    pub tensors: Vec<MoeTensor>,
    /// Output tensors with dtypes (those of the MoE checkpoint).
    pub planned: Vec<PlannedTensor>,
    /// Number of models the current shared tensors average (`N`).
    pub models: usize,
}

/// Checks that `dense` can join the MoE (same architecture and vocabulary,
/// every MoE layer with `models` experts) and plans the grown checkpoint.
///
/// # Errors
/// [`StudioError::Config`] / [`StudioError::Tensor`] naming the file and
/// the mismatch.
pub fn plan_add_expert(
    moe_src: &dyn TensorSource,
    base: &ModelConfig,
    moe: &MoeConfig,
    dense_src: &dyn TensorSource,
    dense: &ModelConfig,
    models: usize,
) -> Result<AddExpertPlan> {
    super::compat::check_architecture(moe_src.source_name(), base, dense_src.source_name(), dense)?;
    if base.vocab_size != dense.vocab_size {
        return Err(StudioError::config(
            dense_src.source_name(),
            format!(
                "vocabulary of {} tokens, the MoE has {}: add an expert of the same vocabulary",
                dense.vocab_size, base.vocab_size
            ),
        ));
    }
    crate::checkpoint::output::check_dense_source(dense_src, dense)?;
    let mut grown = moe.clone();
    for (l, s) in grown.layers.iter_mut().enumerate() {
        if let Some(s) = s {
            if s.num_experts != models {
                return Err(StudioError::config(
                    moe_src.source_name(),
                    format!("layer {l} has {} experts but the statistics describe {models} domains", s.num_experts),
                ));
            }
            s.num_experts += 1;
        }
    }
    let tensors = moe_tensor_plan(base, &grown);
    let router_dtype = |l: usize| moe_src.info(&router_weight_name(l)).map(|i| i.dtype).unwrap_or(DType::F32);
    let mut planned = Vec::with_capacity(tensors.len());
    for t in &tensors {
        let dtype = match &t.origin {
            Origin::RouterWeight { layer } | Origin::RouterBias { layer } | Origin::SelectionBias { layer } => {
                router_dtype(*layer)
            }
            Origin::Expert { expert, .. } if *expert == models => {
                let first = match names::parse(&t.name) {
                    TensorRole::Expert { layer, proj, .. } => names::expert_weight_name(layer, 0, proj),
                    _ => t.name.clone(),
                };
                moe_src.info(&first).map(|i| i.dtype).unwrap_or(DType::F32)
            }
            _ => {
                let info = moe_src
                    .info(&t.name)
                    .ok_or_else(|| StudioError::tensor(moe_src.source_name(), &t.name, "missing from the MoE"))?;
                if info.shape != t.shape {
                    return Err(StudioError::tensor(
                        moe_src.source_name(),
                        &t.name,
                        format!("shape {:?}, expected {:?}", info.shape, t.shape),
                    ));
                }
                info.dtype
            }
        };
        planned.push(PlannedTensor {
            name: t.name.clone(),
            dtype: crate::checkpoint::output::out_dtype(dtype, None),
            shape: t.shape.clone(),
        });
    }
    Ok(AddExpertPlan { moe: grown, tensors, planned, models })
}

/// Streams the grown checkpoint into `sink` (see the module docs).
///
/// # Errors
/// Read errors of either source; sink errors.
pub fn write_add_expert(
    moe_src: &dyn TensorSource,
    dense_src: &dyn TensorSource,
    plan: &AddExpertPlan,
    sink: &mut dyn TensorSink,
) -> Result<()> {
    let n = plan.models as f64;
    for (t, p) in plan.tensors.iter().zip(&plan.planned) {
        let values: Vec<f32> = match &t.origin {
            Origin::Dense { ffn: false } => {
                let old = moe_src.read_f32(&t.name)?;
                let new = dense_src.read_f32(&t.name)?;
                old.iter().zip(&new).map(|(o, x)| ((n * f64::from(*o) + f64::from(*x)) / (n + 1.0)) as f32).collect()
            }
            // A layer that stays dense keeps its FFN.
            Origin::Dense { ffn: true } => moe_src.read_f32(&t.name)?,
            Origin::Expert { expert, dense_name, .. } if *expert == plan.models => dense_src.read_f32(dense_name)?,
            Origin::Expert { .. } => moe_src.read_f32(&t.name)?,
            Origin::RouterWeight { layer } => {
                let mut w = moe_src.read_f32(&router_weight_name(*layer))?;
                w.extend(std::iter::repeat_n(0.0, t.shape[1]));
                w
            }
            Origin::RouterBias { layer } => {
                let mut b = moe_src.read_f32(&router_bias_name(*layer)).unwrap_or_else(|_| vec![0.0; plan.models]);
                b.push(0.0);
                b
            }
            // The new expert starts with no selection bias.
            Origin::SelectionBias { layer } => {
                let mut b = moe_src.read_f32(&names::selection_bias_name(*layer))?;
                b.push(0.0);
                b
            }
            Origin::SharedGate { .. } | Origin::SharedExpert { .. } => moe_src.read_f32(&t.name)?,
        };
        write_values(sink, &t.name, p.dtype, &values)?;
    }
    Ok(())
}
