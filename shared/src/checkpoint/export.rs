//! Writing a dense model in Hugging Face layout (`config.json`,
//! safetensors, `tokenizer.json`) from any [`TensorSource`], streaming one
//! tensor at a time.

use super::DType;
use crate::config::ModelConfig;
#[cfg(not(target_arch = "wasm32"))]
use {
    super::{PlannedTensor, TensorSource},
    crate::error::{Result, StudioError},
};

/// The Hugging Face tensor names and shapes of a dense model, in the order
/// transformers writes them.
pub fn dense_tensor_plan(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (d, f, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, d])];
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![d]));
        out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, d]));
        out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, d]));
        out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, d]));
        if c.attention_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![d, q]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![d]));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![f, d]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![f, d]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![d, f]));
    }
    out.push(("model.norm.weight".to_string(), vec![d]));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, d]));
    }
    out
}

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
    opts: super::WriteOptions,
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
    let mut w = super::SafetensorsWriter::create(out_dir, plan, opts)?;
    for (name, _) in &plan_shapes {
        let values = src.read_f32(name)?;
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
