//! Writing an in-memory [`Transformer`] back to a checkpoint directory in
//! Hugging Face layout (dense) or an MoE layout of [`crate::layout`], one
//! tensor at a time (training checkpoints, browser downloads).

use burn::nn::{Linear, RmsNorm};
use burn::tensor::backend::Backend;

use super::linear::linear_to_hf;
use super::transformer::Mlp;
use super::Transformer;
use crate::checkpoint::plan::dense_tensor_plan;
use crate::checkpoint::plan::moe_tensor_plan;
use crate::config::MoeConfig;
use crate::error::{Result, StudioError};
use crate::layout::names::{self, Proj, TensorRole};

/// The checkpoint tensor names and shapes of `model`, in write order, and
/// its MoE layout (if any).
pub fn tensor_plan<B: Backend>(model: &Transformer<B>) -> (Vec<(String, Vec<usize>)>, Option<MoeConfig>) {
    match model.moe_config() {
        None => (dense_tensor_plan(&model.config), None),
        Some(moe) => {
            let plan = moe_tensor_plan(&model.config, &moe).into_iter().map(|t| (t.name, t.shape)).collect();
            (plan, Some(moe))
        }
    }
}

fn vec1<B: Backend>(t: burn::tensor::Tensor<B, 1>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().expect("f32")
}

fn norm<B: Backend>(n: &RmsNorm<B>) -> Vec<f32> {
    vec1(n.gamma.val())
}

fn lin_w<B: Backend>(l: &Linear<B>) -> Vec<f32> {
    linear_to_hf(l).0
}

fn lin_b<B: Backend>(l: &Linear<B>) -> Option<Vec<f32>> {
    linear_to_hf(l).2
}

/// Projection `proj` of a SwiGLU FFN (an expert or a shared expert).
fn swiglu_w<B: Backend>(ex: &super::SwiGlu<B>, proj: Proj) -> Vec<f32> {
    lin_w(match proj {
        Proj::Gate => &ex.gate_proj,
        Proj::Up => &ex.up_proj,
        Proj::Down => &ex.down_proj,
    })
}

/// The values (row-major, Hugging Face layout) of the checkpoint tensor
/// `name` of `model`, or `None` if the model has no such tensor. Router
/// weights are returned as stored in the model (temperature not folded).
pub fn tensor_values<B: Backend>(model: &Transformer<B>, name: &str) -> Option<Vec<f32>> {
    // Gemma stores RMSNorm weights as `w` and the model holds `1 + w`.
    let one = model.config.architecture.family().norm_plus_one;
    let norm_out = |n: &RmsNorm<B>| {
        let mut v = norm(n);
        if one {
            v.iter_mut().for_each(|x| *x -= 1.0);
        }
        v
    };
    match name {
        "model.embed_tokens.weight" => {
            return Some(model.embed_tokens.weight.val().into_data().convert::<f32>().to_vec().expect("f32"))
        }
        "model.norm.weight" => return Some(norm_out(&model.norm)),
        "lm_head.weight" => return model.lm_head.as_ref().map(lin_w),
        _ => {}
    }
    let role = names::parse(name);
    let (l, rest) = names::split_layer(name)?;
    let block = model.layers.get(l)?;
    let a = &block.self_attn;
    let sandwich = model.config.architecture.family().sandwich_norms;
    match (&role, &block.mlp) {
        (TensorRole::DenseFfn { proj, .. }, Mlp::Dense(m)) => {
            return Some(lin_w(match proj {
                Proj::Gate => &m.gate_proj,
                Proj::Up => &m.up_proj,
                Proj::Down => &m.down_proj,
            }))
        }
        (TensorRole::Router { .. }, Mlp::Moe(m)) => return Some(lin_w(&m.gate)),
        (TensorRole::RouterBias { .. }, Mlp::Moe(m)) => return lin_b(&m.gate),
        (TensorRole::SelectionBias { .. }, Mlp::Moe(m)) => return m.selection_bias.clone(),
        (TensorRole::SharedExpertGate { .. }, Mlp::Moe(m)) => return m.shared_expert_gate.as_ref().map(lin_w),
        (TensorRole::Expert { expert, proj, .. }, Mlp::Moe(m)) => {
            return Some(swiglu_w(m.experts.get(*expert)?, *proj))
        }
        (TensorRole::SharedExpert { index, proj, .. }, Mlp::Moe(m)) => {
            return Some(swiglu_w(m.shared_experts.get(*index)?, *proj))
        }
        (TensorRole::Other(_), _) => {}
        _ => return None,
    }
    match rest {
        "input_layernorm.weight" => Some(norm_out(&block.input_layernorm)),
        "post_attention_layernorm.weight" if sandwich => block.attn_out_norm.as_ref().map(norm_out),
        "post_attention_layernorm.weight" => Some(norm_out(&block.post_attention_layernorm)),
        "pre_feedforward_layernorm.weight" if sandwich => Some(norm_out(&block.post_attention_layernorm)),
        "post_feedforward_layernorm.weight" => block.ffn_out_norm.as_ref().map(norm_out),
        "self_attn.q_proj.weight" => Some(lin_w(&a.q_proj)),
        "self_attn.k_proj.weight" => Some(lin_w(&a.k_proj)),
        "self_attn.v_proj.weight" => Some(lin_w(&a.v_proj)),
        "self_attn.o_proj.weight" => Some(lin_w(&a.o_proj)),
        "self_attn.q_norm.weight" => a.q_norm.as_ref().map(norm_out),
        "self_attn.k_norm.weight" => a.k_norm.as_ref().map(norm_out),
        "self_attn.q_proj.bias" => lin_b(&a.q_proj),
        "self_attn.k_proj.bias" => lin_b(&a.k_proj),
        "self_attn.v_proj.bias" => lin_b(&a.v_proj),
        _ => None,
    }
}

/// How `model` is written: the planned tensors on disk (canonical order,
/// then the layout's zero tensors), the canonical names in write order,
/// `config.json`, each layer's router scale and the chosen MoE layout.
struct WritePlan {
    dtype: crate::tensor_io::DType,
    planned: Vec<crate::tensor_io::PlannedTensor>,
    plan: Vec<(String, Vec<usize>)>,
    config_json: serde_json::Value,
    router_scale: Vec<f64>,
    choice: Option<crate::layout::LayoutChoice>,
}

fn write_plan<B: Backend>(
    model: &Transformer<B>,
    dtype: crate::tensor_io::DType,
    provenance: serde_json::Value,
    layout: crate::layout::LayoutRequest,
) -> Result<WritePlan> {
    use crate::tensor_io::PlannedTensor;
    if dtype.float_size().is_none() {
        return Err(StudioError::Invalid(format!("cannot save weights as {dtype}")));
    }
    let (plan, moe) = tensor_plan(model);
    let planned: Vec<PlannedTensor> =
        plan.iter().map(|(n, s)| PlannedTensor { name: n.clone(), dtype, shape: s.clone() }).collect();
    Ok(match moe.as_ref() {
        Some(moe) => {
            let choice = crate::layout::choose(&model.config, moe, layout)?;
            let config_json = crate::checkpoint::output::config_json(&model.config, &choice, dtype, provenance);
            let planned = choice.disk_plan(&model.config, &planned);
            WritePlan {
                dtype,
                planned,
                plan,
                config_json,
                router_scale: choice.router_scale.clone(),
                choice: Some(choice),
            }
        }
        None => {
            let mut v = model.config.to_config_json(Some(dtype));
            if let Some(o) = v.as_object_mut() {
                o.insert("moe_studio".into(), serde_json::json!({"version": 1, "provenance": provenance}));
            }
            WritePlan { dtype, planned, plan, config_json: v, router_scale: vec![], choice: None }
        }
    })
}

/// Streams `model`'s tensors into `inner` in the plan's order, renamed by
/// the layout, router scales folded in, then the layout's zero tensors.
fn write_tensors<B: Backend>(
    model: &Transformer<B>,
    wp: &WritePlan,
    inner: &mut dyn crate::tensor_io::sink::TensorSink,
) -> Result<()> {
    use crate::tensor_io::sink::TensorSink;
    let layout: &dyn crate::layout::MoeLayout = wp.choice.as_ref().map_or(&crate::layout::studio::Studio, |c| c.layout);
    let mut sink = crate::layout::LayoutSink::new(inner, layout, &wp.planned[wp.plan.len()..]);
    for (name, _) in &wp.plan {
        let mut v = tensor_values(model, name)
            .ok_or_else(|| StudioError::Invalid(format!("the model has no tensor `{name}`")))?;
        if let TensorRole::Router { layer } = names::parse(name) {
            let s = wp.router_scale.get(layer).copied().unwrap_or(1.0) as f32;
            if s != 1.0 {
                v.iter_mut().for_each(|x| *x *= s);
            }
        }
        let bytes = crate::tensor_io::sink::to_bytes(wp.dtype, &v, name)?;
        sink.write_tensor(name, &bytes)?;
    }
    sink.finish()
}

/// `model` as the bytes [`save_model`] would write: `model.safetensors`
/// and `config.json` (pretty JSON). The browser's trained checkpoints
/// (`frontend/src/compute/train.rs`) are made this way, so a download has
/// the CLI's files.
///
/// # Errors
/// As [`save_model`], without the file-system ones.
pub fn model_to_bytes<B: Backend>(
    model: &Transformer<B>,
    dtype: crate::tensor_io::DType,
    provenance: serde_json::Value,
    layout: crate::layout::LayoutRequest,
) -> Result<(Vec<u8>, Vec<u8>)> {
    let wp = write_plan(model, dtype, provenance, layout)?;
    let mut mem = crate::tensor_io::sink::MemorySink::new(wp.planned.clone());
    write_tensors(model, &wp, &mut mem)?;
    Ok((mem.into_safetensors()?, serde_json::to_vec_pretty(&wp.config_json).expect("json")))
}

/// Writes `model` into `out_dir` (atomic; refuses a non-empty directory):
/// weights in `dtype`, `config.json` (dense HF, or the MoE layout `layout`
/// picks, router temperatures folded into the weights where the layout
/// folds them), and `extra_files`.
///
/// # Errors
/// [`StudioError::Invalid`] for a non-float dtype or an existing output;
/// [`StudioError::Config`] when a named `layout` cannot hold the model;
/// I/O errors.
#[cfg(not(target_arch = "wasm32"))]
pub fn save_model<B: Backend>(
    model: &Transformer<B>,
    out_dir: &std::path::Path,
    dtype: crate::tensor_io::DType,
    mut extra_files: Vec<(&str, Vec<u8>)>,
    provenance: serde_json::Value,
    layout: crate::layout::LayoutRequest,
) -> Result<()> {
    use crate::tensor_io::{SafetensorsWriter, WriteOptions};
    let wp = write_plan(model, dtype, provenance, layout)?;
    let mut w = SafetensorsWriter::create(out_dir, wp.planned.clone(), WriteOptions::default())?;
    write_tensors(model, &wp, &mut w)?;
    extra_files.push(("config.json", serde_json::to_vec_pretty(&wp.config_json).expect("json")));
    w.finish(&extra_files)?;
    Ok(())
}
