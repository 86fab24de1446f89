//! Writing an in-memory [`Transformer`] back to a checkpoint directory in
//! Hugging Face layout (dense), the Mixtral layout or the studio layout
//! (MoE), one tensor at a time (training checkpoints, browser downloads).

use burn::nn::{Linear, RmsNorm};
use burn::tensor::backend::Backend;

use super::linear::linear_to_hf;
use super::transformer::Mlp;
use super::Transformer;
use crate::checkpoint::export::dense_tensor_plan;
#[cfg(not(target_arch = "wasm32"))]
use crate::config::ModelConfig;
use crate::config::MoeConfig;
#[cfg(not(target_arch = "wasm32"))]
use crate::error::{Result, StudioError};
use crate::methods::moe_plan::moe_tensor_plan;

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

/// The values (row-major, Hugging Face layout) of the checkpoint tensor
/// `name` of `model`, or `None` if the model has no such tensor. Router
/// weights are returned as stored in the model (temperature not folded).
pub fn tensor_values<B: Backend>(model: &Transformer<B>, name: &str) -> Option<Vec<f32>> {
    match name {
        "model.embed_tokens.weight" => {
            return Some(model.embed_tokens.weight.val().into_data().convert::<f32>().to_vec().expect("f32"))
        }
        "model.norm.weight" => return Some(norm(&model.norm)),
        "lm_head.weight" => return model.lm_head.as_ref().map(lin_w),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let block = model.layers.get(l.parse::<usize>().ok()?)?;
    let a = &block.self_attn;
    match rest {
        "input_layernorm.weight" => Some(norm(&block.input_layernorm)),
        "post_attention_layernorm.weight" => Some(norm(&block.post_attention_layernorm)),
        "self_attn.q_proj.weight" => Some(lin_w(&a.q_proj)),
        "self_attn.k_proj.weight" => Some(lin_w(&a.k_proj)),
        "self_attn.v_proj.weight" => Some(lin_w(&a.v_proj)),
        "self_attn.o_proj.weight" => Some(lin_w(&a.o_proj)),
        "self_attn.q_proj.bias" => lin_b(&a.q_proj),
        "self_attn.k_proj.bias" => lin_b(&a.k_proj),
        "self_attn.v_proj.bias" => lin_b(&a.v_proj),
        _ => match &block.mlp {
            Mlp::Dense(m) => match rest {
                "mlp.gate_proj.weight" => Some(lin_w(&m.gate_proj)),
                "mlp.up_proj.weight" => Some(lin_w(&m.up_proj)),
                "mlp.down_proj.weight" => Some(lin_w(&m.down_proj)),
                _ => None,
            },
            Mlp::Moe(m) => {
                let r = rest.strip_prefix("block_sparse_moe.")?;
                match r {
                    "gate.weight" => Some(lin_w(&m.gate)),
                    "gate.bias" => lin_b(&m.gate),
                    "gate.e_score_correction_bias" => m.selection_bias.clone(),
                    "shared_expert_gate.weight" => m.shared_expert_gate.as_ref().map(lin_w),
                    _ => {
                        let (list, r) = match r.strip_prefix("experts.") {
                            Some(r) => (&m.experts, r),
                            None => (&m.shared_experts, r.strip_prefix("shared_experts.")?),
                        };
                        let (e, w) = r.split_once('.')?;
                        let ex = list.get(e.parse::<usize>().ok()?)?;
                        match w {
                            "w1.weight" => Some(lin_w(&ex.gate_proj)),
                            "w3.weight" => Some(lin_w(&ex.up_proj)),
                            "w2.weight" => Some(lin_w(&ex.down_proj)),
                            _ => None,
                        }
                    }
                }
            }
        },
    }
}

/// Writes `model` into `out_dir` (atomic; refuses a non-empty directory):
/// weights in `dtype`, `config.json` (dense HF, Mixtral or studio layout;
/// router temperatures folded into the weights for Mixtral), and
/// `extra_files`.
///
/// # Errors
/// [`StudioError::Invalid`] for a non-float dtype or an existing output;
/// I/O errors.
#[cfg(not(target_arch = "wasm32"))]
pub fn save_model<B: Backend>(
    model: &Transformer<B>,
    out_dir: &std::path::Path,
    dtype: crate::checkpoint::DType,
    mut extra_files: Vec<(&str, Vec<u8>)>,
    provenance: serde_json::Value,
) -> Result<()> {
    use crate::checkpoint::{PlannedTensor, SafetensorsWriter, WriteOptions};
    if dtype.float_size().is_none() {
        return Err(StudioError::Invalid(format!("cannot save weights as {dtype}")));
    }
    let (plan, moe) = tensor_plan(model);
    let (config_json, router_scale) = config_for(&model.config, moe.as_ref(), dtype, provenance);
    let planned = plan.iter().map(|(n, s)| PlannedTensor { name: n.clone(), dtype, shape: s.clone() }).collect();
    let mut w = SafetensorsWriter::create(out_dir, planned, WriteOptions::default())?;
    for (name, _) in &plan {
        let mut v = tensor_values(model, name)
            .ok_or_else(|| StudioError::Invalid(format!("the model has no tensor `{name}`")))?;
        if let Some(l) = router_layer(name) {
            let s = router_scale.get(l).copied().unwrap_or(1.0) as f32;
            if s != 1.0 && name.ends_with("gate.weight") {
                v.iter_mut().for_each(|x| *x *= s);
            }
        }
        w.write_f32(name, &v)?;
    }
    extra_files.push(("config.json", serde_json::to_vec_pretty(&config_json).expect("json")));
    w.finish(&extra_files)?;
    Ok(())
}

#[cfg(not(target_arch = "wasm32"))]
fn router_layer(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("model.layers.")?;
    let (l, rest) = rest.split_once('.')?;
    rest.starts_with("block_sparse_moe.gate.").then(|| l.parse().ok()).flatten()
}

/// `config.json` for a model and the per-layer router scale (`1/T` folded
/// in the Mixtral layout).
#[cfg(not(target_arch = "wasm32"))]
fn config_for(
    base: &ModelConfig,
    moe: Option<&MoeConfig>,
    dtype: crate::checkpoint::DType,
    provenance: serde_json::Value,
) -> (serde_json::Value, Vec<f64>) {
    match moe {
        Some(moe) => {
            let choice = crate::methods::output::choose_layout(base, moe);
            (crate::methods::output::config_json(base, &choice.written, dtype, provenance), choice.router_scale)
        }
        None => {
            let mut v = base.to_config_json(Some(dtype));
            if let Some(o) = v.as_object_mut() {
                o.insert("moe_studio".into(), serde_json::json!({"version": 1, "provenance": provenance}));
            }
            (v, vec![])
        }
    }
}
