//! GGUF v3 writer (`convert --to gguf`): a dense or MoE model in llama.cpp's
//! `llama` architecture, so llama.cpp's own loader reads and evaluates it.
//!
//! Format: ggml's `docs/gguf.md` (see [`super::gguf`] for the layout);
//! names, metadata keys and the q/k row permutation follow llama.cpp's
//! `convert_hf_to_gguf.py` (`LlamaModel`) and `src/models/llama.cpp`:
//!
//! - `token_embd.weight`, `output_norm.weight`, `output.weight` (absent when
//!   the embeddings are tied: llama.cpp then reuses `token_embd`);
//! - per block `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
//!   ffn_norm}.weight` (and `attn_{q,k,v}.bias` when the attention has
//!   biases: llama.cpp's `llama` architecture reads them when present, so a
//!   Qwen2 base fits too); q/k rows (weights and biases) permuted to the
//!   interleaved RoPE order of `LlamaModel.permute`;
//! - dense blocks `blk.N.ffn_{gate,up,down}.weight`; MoE blocks
//!   `blk.N.ffn_gate_inp.weight` (router `[E, d]`, kept F32 as llama.cpp's
//!   converter keeps it) and the stacked experts `blk.N.ffn_{gate,up}_exps.weight`
//!   (`[E, f, d]`) and `blk.N.ffn_down_exps.weight` (`[E, d, f]`);
//! - metadata `llama.{block_count, context_length, embedding_length,
//!   feed_forward_length, attention.head_count, attention.head_count_kv,
//!   attention.key_length, attention.value_length,
//!   attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count,
//!   vocab_size}`, `llama.expert_count` / `llama.expert_used_count` for an
//!   MoE, `general.file_type`, and the tokenizer as `tokenizer.ggml.*`
//!   including `pre` ([`crate::tokenizer::gguf_export`]), without which
//!   llama.cpp refuses the vocabulary;
//! - a Llama 3.1 RoPE scaling (or any per-frequency divisors) as the F32
//!   tensor `rope_freqs.weight` (`[head_dim / 2]`,
//!   [`crate::model::rope::llama3_freq_factors`]), as
//!   `LlamaModel.generate_extra_tensors` writes it, with no
//!   `rope.scaling.*` keys; a linear scaling as `llama.rope.scaling.type` /
//!   `.factor`;
//! - `moe_studio.frozen_experts` (a JSON string, one list per layer:
//!   llama.cpp ignores it and refuses arrays of arrays; the studio's GGUF
//!   reader reads it back).
//!
//! llama.cpp's `llama` MoE weights the top-k by the softmax over all `E`
//! logits renormalised over the `k` (`build_moe_ffn(..., norm_w = true)`):
//! the studio's routing. It needs every layer MoE with one `E`, `k` and
//! expert width, no router bias, no shared experts, no selection bias and
//! renormalised top-k weights ([`gguf_blocker`]; methods.md §5); granular
//! experts are written with `feed_forward_length` = their width; a router
//! temperature is folded into
//! `ffn_gate_inp`. Tensor types: 1-D tensors and routers F32; the others in
//! the requested type (F32, F16, BF16 or Q8_0; a Q8_0 tensor whose rows are
//! not a multiple of 32 stays F32).

use super::dtype::f32_to_bytes;
use super::gguf::GgufValue;
use super::{DType, TensorSource};
use crate::config::{ModelConfig, MoeConfig, RopeScaling};
use crate::error::{Result, StudioError};
use crate::layout::names::{self, Proj};

/// ggml type ids of the types the writer emits.
fn type_id(d: DType) -> u32 {
    match d {
        DType::F16 => 1,
        DType::Q8_0 => 8,
        DType::BF16 => 30,
        _ => 0,
    }
}

/// `general.file_type` (llama.cpp's `llama_ftype`) of a requested type.
fn file_type(d: DType) -> u32 {
    match d {
        DType::F16 => 1,
        DType::Q8_0 => 7,
        DType::BF16 => 32,
        _ => 0,
    }
}

/// Why `moe` on `base` cannot be written as a llama.cpp `llama` MoE, or
/// `None` when it can (dense models always can).
pub fn gguf_blocker(base: &ModelConfig, moe: Option<&MoeConfig>) -> Option<String> {
    if let RopeScaling::LongRope { .. } = base.rope_scaling {
        return Some("LongRoPE (Phi-3) has no place in llama.cpp's `llama` architecture".into());
    }
    if let Some(why) = base.architecture.family().not_llama_blocks() {
        return Some(format!("{why}: the llama.cpp `llama` architecture this writer emits has no place for that"));
    }
    let moe = moe?;
    if let Some(l) = moe.layers.iter().position(Option::is_none) {
        return Some(format!(
            "layer {l} stays dense: llama.cpp's llama architecture makes every layer MoE (`experts_per_layer`)"
        ));
    }
    match crate::layout::plain_moe(base, moe, "llama.cpp's llama MoE", "llama.feed_forward_length") {
        Ok(_) => None,
        Err(b) => Some(format!(
            "{b} (llama.cpp's llama MoE has one `llama.expert_count`, `llama.expert_used_count` and expert width, \
             renormalised top-k weights, no router bias, no shared experts and no selection bias)"
        )),
    }
}

/// The FFN width the file records (`llama.feed_forward_length`): the
/// experts' width in an MoE (every layer is MoE there, so granular experts
/// of width `f / G` are held exactly), else the dense `intermediate_size`.
fn ffn_width(config: &ModelConfig, moe: Option<&MoeConfig>) -> usize {
    moe.and_then(|m| m.layers.iter().flatten().next()).map_or(config.intermediate_size, |s| s.expert_width(config))
}

/// Warnings for expert counts llama.cpp's backends handle badly (as
/// mergekit warns for its Mixtral output): not a power of two, or more
/// than 64 (some backends' `mul_mat_id` kernels).
pub fn expert_count_warnings(moe: Option<&MoeConfig>) -> Vec<String> {
    let Some(e) = moe.and_then(|m| m.layers.iter().flatten().next()).map(|s| s.num_experts) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if !e.is_power_of_two() {
        out.push(format!(
            "{e} experts is not a power of two: some llama.cpp backends (and quantisation tooling) handle such expert counts poorly"
        ));
    }
    if e > 64 {
        out.push(format!("{e} experts: more than some llama.cpp GPU backends support in one layer"));
    }
    out
}

/// One tensor of the GGUF plan.
#[derive(Debug, Clone)]
struct Planned {
    name: String,
    /// ggml `ne` (innermost first).
    ne: Vec<u64>,
    dtype: DType,
    /// How to build it from the canonical source.
    from: From,
}

#[derive(Debug, Clone)]
enum From {
    /// A canonical tensor; `permute` = heads for llama's q/k row permutation.
    Tensor { name: String, permute: Option<usize>, scale: f32 },
    /// The `E` expert tensors of one projection, stacked.
    Experts { layer: usize, experts: usize, proj: Proj },
    /// Values computed from the configuration (`rope_freqs.weight`).
    Values(Vec<f32>),
}

/// llama.cpp's per-frequency RoPE divisors for `config`'s scaling
/// (`[head_dim / 2]`), or `None` when the scaling needs none.
fn rope_freqs(config: &ModelConfig) -> Option<Vec<f32>> {
    let v = match &config.rope_scaling {
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            crate::model::rope::llama3_freq_factors(
                config.head_dim,
                config.rope_theta,
                *factor,
                *low_freq_factor,
                *high_freq_factor,
                *original_max_position_embeddings,
            )
        }
        RopeScaling::FreqFactors { factors } => factors.clone(),
        _ => return None,
    };
    Some(v.into_iter().map(|x| x as f32).collect())
}

/// What [`write_gguf`] wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GgufReport {
    /// The output file.
    pub path: String,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of the file.
    pub bytes: u64,
    /// `general.file_type`.
    pub file_type: u32,
    /// Tensor count per type.
    pub types: std::collections::BTreeMap<String, usize>,
    /// Warnings (expert counts; tensors kept F32).
    pub warnings: Vec<String>,
}

fn permute_rows(data: &[f32], rows: usize, n_head: usize) -> Vec<f32> {
    let cols = data.len() / rows.max(1);
    let hd = rows / n_head;
    let half = hd / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_head {
        for j in 0..2 {
            for i in 0..half {
                // GGUF row h*hd + 2i + j holds HF row h*hd + j*half + i.
                let dst = h * hd + 2 * i + j;
                let src = h * hd + j * half + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// Quantises f32 values to GGML Q8_0 (blocks of 32: an f16 scale
/// `d = max|x| / 127`, then `round(x / d)` as i8), as ggml's
/// `quantize_row_q8_0_ref`. `values.len()` must be a multiple of 32.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 32 * 34);
    for block in values.chunks_exact(32) {
        let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|&x| (x * id).round() as i8 as u8));
    }
    out
}

fn encode(dtype: DType, values: &[f32]) -> Result<Vec<u8>> {
    match dtype {
        DType::Q8_0 => Ok(quantize_q8_0(values)),
        d => f32_to_bytes(d, values).ok_or_else(|| StudioError::Invalid(format!("cannot write GGUF tensors as {d}"))),
    }
}

fn byte_len(dtype: DType, n: usize) -> usize {
    match dtype {
        DType::Q8_0 => n / 32 * 34,
        d => n * d.float_size().unwrap_or(4),
    }
}

fn push_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// The GGUF header (metadata and tensor infos) and the tensor plan.
struct Plan {
    header: Vec<u8>,
    tensors: Vec<Planned>,
    types: std::collections::BTreeMap<String, usize>,
    warnings: Vec<String>,
}

fn plan(
    src: &dyn TensorSource,
    config: &ModelConfig,
    moe: Option<&MoeConfig>,
    dtype: DType,
    tokenizer: Vec<(String, GgufValue)>,
) -> Result<Plan> {
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0) {
        return Err(StudioError::config(
            "--dtype",
            format!("GGUF output type {dtype}: expected f32, f16, bf16 or q8_0"),
        ));
    }
    if let Some(why) = gguf_blocker(config, moe) {
        return Err(StudioError::config(
            src.source_name(),
            format!("cannot be written as a llama.cpp GGUF exactly: {why}"),
        ));
    }
    let (d, f, v) = (config.hidden_size as u64, ffn_width(config, moe) as u64, config.vocab_size as u64);
    let hd = config.head_dim as u64;
    let (q, kv) = (config.num_heads as u64 * hd, config.num_kv_heads as u64 * hd);
    let scale = moe.map(|m| {
        m.layers.iter().map(|s| s.as_ref().map_or(1.0, |s| (1.0 / s.temperature) as f32)).collect::<Vec<f32>>()
    });
    let mut warnings = expert_count_warnings(moe);
    let mut tensors: Vec<Planned> = Vec::new();
    let mut add = |name: String, ne: Vec<u64>, from: From, kind: Option<DType>| {
        let t = match kind {
            Some(k) => k,
            None if ne.len() == 1 => DType::F32,
            None if dtype == DType::Q8_0 && !ne[0].is_multiple_of(32) => {
                warnings.push(format!("{name}: rows of {} values are not a multiple of 32, kept F32", ne[0]));
                DType::F32
            }
            None => dtype,
        };
        tensors.push(Planned { name, ne, dtype: t, from });
    };
    let plain = |name: &str| From::Tensor { name: name.to_string(), permute: None, scale: 1.0 };
    if let Some(f) = rope_freqs(config) {
        add("rope_freqs.weight".into(), vec![f.len() as u64], From::Values(f), Some(DType::F32));
    }
    add("token_embd.weight".into(), vec![d, v], plain("model.embed_tokens.weight"), None);
    for l in 0..config.num_layers {
        let p = format!("model.layers.{l}");
        let b = format!("blk.{l}");
        let perm = |name: String, heads: usize| From::Tensor { name, permute: Some(heads), scale: 1.0 };
        add(format!("{b}.attn_norm.weight"), vec![d], plain(&format!("{p}.input_layernorm.weight")), None);
        add(
            format!("{b}.attn_q.weight"),
            vec![d, q],
            perm(format!("{p}.self_attn.q_proj.weight"), config.num_heads),
            None,
        );
        add(
            format!("{b}.attn_k.weight"),
            vec![d, kv],
            perm(format!("{p}.self_attn.k_proj.weight"), config.num_kv_heads),
            None,
        );
        add(format!("{b}.attn_v.weight"), vec![d, kv], plain(&format!("{p}.self_attn.v_proj.weight")), None);
        if config.attention_bias {
            add(
                format!("{b}.attn_q.bias"),
                vec![q],
                perm(format!("{p}.self_attn.q_proj.bias"), config.num_heads),
                None,
            );
            add(
                format!("{b}.attn_k.bias"),
                vec![kv],
                perm(format!("{p}.self_attn.k_proj.bias"), config.num_kv_heads),
                None,
            );
            add(format!("{b}.attn_v.bias"), vec![kv], plain(&format!("{p}.self_attn.v_proj.bias")), None);
        }
        add(format!("{b}.attn_output.weight"), vec![q, d], plain(&format!("{p}.self_attn.o_proj.weight")), None);
        add(format!("{b}.ffn_norm.weight"), vec![d], plain(&format!("{p}.post_attention_layernorm.weight")), None);
        match moe.and_then(|m| m.layers[l].as_ref()) {
            None => {
                for (proj, g) in [(Proj::Gate, "ffn_gate"), (Proj::Up, "ffn_up"), (Proj::Down, "ffn_down")] {
                    let ne = if proj == Proj::Down { vec![f, d] } else { vec![d, f] };
                    add(format!("{b}.{g}.weight"), ne, plain(&names::dense_ffn_name(l, proj)), None);
                }
            }
            Some(s) => {
                let e = s.num_experts as u64;
                let s_l = scale.as_ref().map_or(1.0, |v| v[l]);
                add(
                    format!("{b}.ffn_gate_inp.weight"),
                    vec![d, e],
                    From::Tensor { name: names::router_weight_name(l), permute: None, scale: s_l },
                    Some(DType::F32),
                );
                for (proj, g) in
                    [(Proj::Gate, "ffn_gate_exps"), (Proj::Up, "ffn_up_exps"), (Proj::Down, "ffn_down_exps")]
                {
                    let ne = if proj == Proj::Down { vec![f, d, e] } else { vec![d, f, e] };
                    add(format!("{b}.{g}.weight"), ne, From::Experts { layer: l, experts: s.num_experts, proj }, None);
                }
            }
        }
    }
    add("output_norm.weight".into(), vec![d], plain("model.norm.weight"), None);
    if !config.tie_word_embeddings {
        add("output.weight".into(), vec![d, v], plain("lm_head.weight"), None);
    }
    // Every source tensor must be there with the right element count.
    for t in &tensors {
        let n: u64 = t.ne.iter().product();
        let parts: Vec<(String, u64)> = match &t.from {
            From::Tensor { name, .. } => vec![(name.clone(), n)],
            From::Experts { layer, experts, proj } => {
                (0..*experts).map(|e| (names::expert_weight_name(*layer, e, *proj), n / *experts as u64)).collect()
            }
            From::Values(_) => Vec::new(),
        };
        for (name, want) in parts {
            let info = src.info(&name).ok_or_else(|| StudioError::tensor(src.source_name(), &name, "missing"))?;
            if info.numel() as u64 != want {
                return Err(StudioError::tensor(
                    src.source_name(),
                    &name,
                    format!("shape {:?} does not match the configuration ({want} values expected)", info.shape),
                ));
            }
        }
    }
    let u32v = |x: usize| GgufValue::U32(x as u32);
    let mut kv: Vec<(String, GgufValue)> = vec![
        ("general.architecture".into(), GgufValue::String("llama".into())),
        ("general.name".into(), GgufValue::String("moe-studio export".into())),
        ("general.file_type".into(), GgufValue::U32(file_type(dtype))),
        ("general.quantization_version".into(), GgufValue::U32(2)),
        ("llama.block_count".into(), u32v(config.num_layers)),
        ("llama.context_length".into(), u32v(config.max_position_embeddings)),
        ("llama.embedding_length".into(), u32v(config.hidden_size)),
        ("llama.feed_forward_length".into(), u32v(ffn_width(config, moe))),
        ("llama.attention.head_count".into(), u32v(config.num_heads)),
        ("llama.attention.head_count_kv".into(), u32v(config.num_kv_heads)),
        ("llama.attention.key_length".into(), u32v(config.head_dim)),
        ("llama.attention.value_length".into(), u32v(config.head_dim)),
        ("llama.attention.layer_norm_rms_epsilon".into(), GgufValue::F32(config.rms_norm_eps as f32)),
        ("llama.rope.freq_base".into(), GgufValue::F32(config.rope_theta as f32)),
        ("llama.rope.dimension_count".into(), u32v(config.head_dim)),
        ("llama.vocab_size".into(), u32v(config.vocab_size)),
    ];
    if let RopeScaling::Linear { factor } = config.rope_scaling {
        kv.push(("llama.rope.scaling.type".into(), GgufValue::String("linear".into())));
        kv.push(("llama.rope.scaling.factor".into(), GgufValue::F32(factor as f32)));
    }
    if let Some(m) = moe {
        let s = m.layers.iter().flatten().next().expect("an MoE has an MoE layer");
        kv.push(("llama.expert_count".into(), u32v(s.num_experts)));
        kv.push(("llama.expert_used_count".into(), u32v(s.top_k)));
        // JSON in a string: llama.cpp refuses arrays of arrays.
        let frozen: Vec<Vec<usize>> =
            m.layers.iter().map(|s| s.as_ref().map(|s| s.frozen.clone()).unwrap_or_default()).collect();
        let frozen = serde_json::to_string(&frozen).expect("json");
        kv.push(("moe_studio.frozen_experts".into(), GgufValue::String(frozen)));
        kv.push(("moe_studio.router_aux_loss_coef".into(), GgufValue::F64(m.router_aux_loss_coef)));
    }
    kv.extend(tokenizer);
    let mut header = Vec::new();
    header.extend_from_slice(b"GGUF");
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    header.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, v) in &kv {
        push_str(&mut header, k);
        header.extend_from_slice(&GgufValue::type_id(v).to_le_bytes());
        v.encode(&mut header);
    }
    let mut offset = 0u64;
    let mut types = std::collections::BTreeMap::new();
    for t in &tensors {
        push_str(&mut header, &t.name);
        header.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
        for &x in &t.ne {
            header.extend_from_slice(&x.to_le_bytes());
        }
        header.extend_from_slice(&type_id(t.dtype).to_le_bytes());
        header.extend_from_slice(&offset.to_le_bytes());
        offset += align(byte_len(t.dtype, t.ne.iter().product::<u64>() as usize) as u64);
        *types.entry(t.dtype.to_string()).or_insert(0) += 1;
    }
    while header.len() % super::gguf::DEFAULT_ALIGNMENT != 0 {
        header.push(0);
    }
    Ok(Plan { header, tensors, types, warnings })
}

fn align(x: u64) -> u64 {
    let a = super::gguf::DEFAULT_ALIGNMENT as u64;
    x.div_ceil(a) * a
}

/// The data of one planned tensor.
fn tensor_data(src: &dyn TensorSource, t: &Planned) -> Result<Vec<u8>> {
    let values = match &t.from {
        From::Tensor { name, permute, scale } => {
            let mut v = src.read_f32(name)?;
            if *scale != 1.0 {
                v.iter_mut().for_each(|x| *x *= *scale);
            }
            match permute {
                Some(heads) => {
                    let rows = *t.ne.last().expect("a tensor has dims") as usize;
                    permute_rows(&v, rows, *heads)
                }
                None => v,
            }
        }
        From::Experts { layer, experts, proj } => {
            let mut v = Vec::new();
            for e in 0..*experts {
                v.extend(src.read_f32(&names::expert_weight_name(*layer, e, *proj))?);
            }
            v
        }
        From::Values(v) => v.clone(),
    };
    encode(t.dtype, &values)
}

/// Writes `src` (canonical names; `config`, `moe`) as a GGUF file at `out`
/// (atomically: a temporary sibling renamed into place; an existing file is
/// refused) with tensors in `dtype` and the tokenizer metadata `tokenizer`
/// ([`crate::tokenizer::gguf_export::gguf_tokenizer`]).
///
/// # Errors
/// [`StudioError::Config`] when the model cannot be written exactly
/// ([`gguf_blocker`]) or `dtype` is not F32/F16/BF16/Q8_0;
/// [`StudioError::Tensor`] for a missing tensor; [`StudioError::Invalid`]
/// when `out` exists; I/O.
pub fn write_gguf(
    src: &dyn TensorSource,
    config: &ModelConfig,
    moe: Option<&MoeConfig>,
    dtype: DType,
    tokenizer: Vec<(String, GgufValue)>,
    out: &std::path::Path,
) -> Result<GgufReport> {
    use std::io::Write;
    if out.exists() {
        return Err(StudioError::Invalid(format!("{} exists; refusing to overwrite it", out.display())));
    }
    let p = plan(src, config, moe, dtype, tokenizer)?;
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".moe-studio-gguf-")
        .tempfile_in(dir)
        .map_err(|e| StudioError::io(dir.display(), e))?;
    {
        let mut w = std::io::BufWriter::new(tmp.as_file());
        let io = |e| StudioError::io(out.display(), e);
        w.write_all(&p.header).map_err(io)?;
        for t in &p.tensors {
            let data = tensor_data(src, t)?;
            w.write_all(&data).map_err(io)?;
            let pad = align(data.len() as u64) as usize - data.len();
            w.write_all(&vec![0u8; pad]).map_err(io)?;
        }
        w.flush().map_err(io)?;
    }
    tmp.as_file().sync_all().map_err(|e| StudioError::io(out.display(), e))?;
    tmp.persist_noclobber(out).map_err(|e| StudioError::io(out.display(), e.error))?;
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(GgufReport {
        path: out.display().to_string(),
        tensors: p.tensors.len(),
        bytes,
        file_type: file_type(dtype),
        types: p.types,
        warnings: p.warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_round_trips_through_the_reader_within_half_a_step() {
        let v: Vec<f32> = (0..64).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        let q = quantize_q8_0(&v);
        assert_eq!(q.len(), 68);
        let back = super::super::quant::dequantize(DType::Q8_0, &q, 64).unwrap();
        for (block, bb) in v.chunks(32).zip(back.chunks(32)) {
            let d = block.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
            for (a, b) in block.iter().zip(bb) {
                // half a step, plus the f16 rounding of the scale times |q| <= 127
                assert!((a - b).abs() <= d * (0.5 + 127.0 / 2048.0) * 1.001, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn permutation_is_the_inverse_of_the_readers() {
        // 2 heads of head_dim 4, 1 column: HF row r -> value r.
        let data: Vec<f32> = (0..8).map(|r| r as f32).collect();
        assert_eq!(permute_rows(&data, 8, 2), vec![0., 2., 1., 3., 4., 6., 5., 7.]);
        // 1 head of head_dim 6: GGUF row 2i + j = HF row 3j + i.
        let data: Vec<f32> = (0..6).map(|r| r as f32).collect();
        assert_eq!(permute_rows(&data, 6, 1), vec![0., 3., 1., 4., 2., 5.]);
    }
}
