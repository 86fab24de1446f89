//! GGUF v3 writer (`convert --to gguf`): a dense or MoE model in one of
//! llama.cpp's architectures ([`GGUF_ARCHS`], one file each), so llama.cpp's
//! own loader reads and evaluates it.
//!
//! Format: ggml's `docs/gguf.md` (see [`super::gguf`] for the layout);
//! names, metadata keys and the q/k row permutation follow llama.cpp's
//! `convert_hf_to_gguf.py` (`LlamaModel`, `DeepseekModel`) and
//! `src/models/{llama,deepseek}.cpp`. Common to every architecture
//! (`{arch}` = `general.architecture`):
//!
//! - `token_embd.weight`, `output_norm.weight`, `output.weight` (absent when
//!   the embeddings are tied: llama.cpp then reuses `token_embd`);
//! - per block `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
//!   ffn_norm}.weight` (and `attn_{q,k,v}.bias` when the attention has
//!   biases: llama.cpp reads them when present, so a Qwen2 base fits too);
//!   q/k rows (weights and biases) permuted to the interleaved RoPE order of
//!   `LlamaModel.permute`;
//! - dense blocks `blk.N.ffn_{gate,up,down}.weight` (the dense
//!   `intermediate_size`); MoE blocks as the architecture writes them
//!   ([`GgufArch::moe_block`]): `blk.N.ffn_gate_inp.weight` (router `[E, d]`,
//!   kept F32 as llama.cpp's converter keeps it, a router temperature folded
//!   in), the stacked experts `blk.N.ffn_{gate,up}_exps.weight` (`[E, f, d]`)
//!   and `blk.N.ffn_down_exps.weight` (`[E, d, f]`), and what the
//!   architecture adds (DeepSeek's shared experts);
//! - metadata `{arch}.{block_count, context_length, embedding_length,
//!   feed_forward_length, attention.head_count, attention.head_count_kv,
//!   attention.key_length, attention.value_length,
//!   attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count,
//!   vocab_size}`, the architecture's MoE keys ([`GgufArch::moe_keys`]),
//!   `general.file_type`, and the tokenizer as `tokenizer.ggml.*` including
//!   `pre` ([`crate::tokenizer::gguf_export`]), without which llama.cpp
//!   refuses the vocabulary;
//! - a Llama 3.1 RoPE scaling (or any per-frequency divisors) as the F32
//!   tensor `rope_freqs.weight` (`[head_dim / 2]`,
//!   [`crate::config::rope::llama3_freq_factors`]), as
//!   `LlamaModel.generate_extra_tensors` writes it, with no
//!   `rope.scaling.*` keys (architectures that read it:
//!   [`GgufArch::reads_rope_freqs`]); a linear scaling as
//!   `{arch}.rope.scaling.type` / `.factor`;
//! - `moe_studio.frozen_experts` (a JSON string, one list per layer:
//!   llama.cpp ignores it and refuses arrays of arrays; the studio's GGUF
//!   reader reads it back) and `moe_studio.router_aux_loss_coef`.
//!
//! The architecture is the first of [`GGUF_ARCHS`] whose graph computes the
//! model exactly ([`gguf_arch`]): `llama` for dense models and the plain
//! MoE with renormalised top-k ([`llama`]), `deepseek` for leading dense
//! layers, ungated shared experts and un-normalised top-k ([`deepseek`]);
//! anything else is refused before anything is written, naming each
//! architecture's reason. Expert counts llama.cpp's backends handle badly
//! are warned about, not refused ([`expert_count_warnings`]). Tensor types:
//! 1-D tensors and routers F32; the others in the requested type (F32, F16,
//! BF16 or Q8_0; a Q8_0 tensor whose rows are not a multiple of 32 stays
//! F32).
//!
//! **Adding an architecture** touches its own file (a unit struct
//! implementing [`GgufArch`]), one line of [`GGUF_ARCHS`], and the reader
//! ([`super::gguf`]) for its MoE keys.

use crate::config::{ModelConfig, MoeConfig, MoeLayerSpec, RopeScaling};
use crate::error::{Result, StudioError};
use crate::layout::names::{self, Proj};
use crate::layout::Blocker;
use crate::tensor_io::dtype::f32_to_bytes;
use crate::tensor_io::gguf::GgufValue;
use crate::tensor_io::{DType, TensorSource};

pub mod deepseek;
pub mod llama;

/// One llama.cpp GGUF architecture the writer emits (see the module docs).
/// Implementations are unit structs, one per file, listed in [`GGUF_ARCHS`].
pub trait GgufArch: Sync + Send {
    /// `general.architecture`, also the prefix of its metadata keys.
    fn name(&self) -> &'static str;

    /// Whether llama.cpp's graph of this architecture computes `moe` on
    /// `base` (`None`: a dense model) exactly.
    ///
    /// # Errors
    /// The first [`Blocker`] found, naming the field.
    fn check(&self, base: &ModelConfig, moe: Option<&MoeConfig>) -> std::result::Result<(), Blocker>;

    /// `{arch}.feed_forward_length` (default: the dense `intermediate_size`).
    fn feed_forward_length(&self, base: &ModelConfig, _moe: Option<&MoeConfig>) -> usize {
        base.intermediate_size
    }

    /// Whether the architecture reads `rope_freqs.weight` (per-frequency
    /// RoPE divisors: a Llama 3.1 scaling).
    fn reads_rope_freqs(&self) -> bool {
        false
    }

    /// The MoE metadata of `moe` (full keys), once [`GgufArch::check`] holds.
    fn moe_keys(&self, base: &ModelConfig, moe: &MoeConfig) -> Vec<(String, GgufValue)>;

    /// The tensors of MoE block `layer` (spec `spec`; router weights scaled
    /// by `router_scale`): GGUF name, ggml `ne` (innermost first), what it is
    /// built from, and a forced type (`None`: the requested one).
    fn moe_block(
        &self,
        base: &ModelConfig,
        layer: usize,
        spec: &MoeLayerSpec,
        router_scale: f32,
    ) -> Vec<(String, Vec<u64>, From, Option<DType>)>;
}

/// The architectures, in the order [`gguf_arch`] tries them.
pub static GGUF_ARCHS: &[&dyn GgufArch] = &[&llama::Llama, &deepseek::Deepseek];

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

/// The first architecture of [`GGUF_ARCHS`] whose graph computes `moe` on
/// `base` (`None`: dense) exactly.
///
/// # Errors
/// Why none does, one reason per architecture (`llama: ...; deepseek: ...`).
pub fn gguf_arch(base: &ModelConfig, moe: Option<&MoeConfig>) -> std::result::Result<&'static dyn GgufArch, String> {
    let mut why = Vec::new();
    for a in GGUF_ARCHS {
        match a.check(base, moe) {
            Ok(()) => return Ok(*a),
            Err(b) => why.push(format!("{}: {b}", a.name())),
        }
    }
    Err(why.join("; "))
}

/// Why `moe` on `base` cannot be written as a llama.cpp GGUF exactly (one
/// reason per architecture of [`GGUF_ARCHS`]), or `None` when it can.
pub fn gguf_blocker(base: &ModelConfig, moe: Option<&MoeConfig>) -> Option<String> {
    gguf_arch(base, moe).err()
}

/// Checks shared by every architecture: the base's blocks are Llama's and
/// its RoPE is one llama.cpp computes.
pub(crate) fn llama_blocks(base: &ModelConfig) -> std::result::Result<(), Blocker> {
    if let RopeScaling::LongRope { .. } = base.rope_scaling {
        return Err(Blocker::new("rope_scaling", "LongRoPE (Phi-3) has no place in llama.cpp's Llama blocks"));
    }
    if let Some(why) = base.architecture.family().not_llama_blocks() {
        return Err(Blocker::new(
            "architecture",
            format!("{why}, and llama.cpp's `llama` blocks have no place for that"),
        ));
    }
    Ok(())
}

/// Warnings for expert counts llama.cpp's backends handle badly
/// ([`crate::layout::llama_cpp_expert_count_warnings`]): a warning, never a
/// refusal, since the file is exact either way.
pub fn expert_count_warnings(moe: Option<&MoeConfig>) -> Vec<String> {
    moe.map(crate::layout::llama_cpp_expert_count_warnings).unwrap_or_default()
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

/// What a GGUF tensor is built from.
#[derive(Debug, Clone)]
pub enum From {
    /// A canonical tensor times `scale`.
    Tensor {
        /// Canonical name.
        name: String,
        /// Heads of llama's q/k row permutation, when permuted.
        permute: Option<usize>,
        /// Factor on every value (a folded router temperature).
        scale: f32,
    },
    /// The routed experts of one projection of a layer, stacked (`[E, out, in]`).
    Experts {
        /// Decoder layer.
        layer: usize,
        /// Routed experts `E`.
        experts: usize,
        /// Projection.
        proj: Proj,
    },
    /// The shared experts of one projection of a layer as one FFN, their
    /// intermediate units concatenated: gate/up `[count·f, d]` (rows
    /// stacked), down `[d, count·f]` (row `r` = the experts' rows `r` side by
    /// side).
    Shared {
        /// Decoder layer.
        layer: usize,
        /// Shared experts.
        count: usize,
        /// Projection.
        proj: Proj,
    },
    /// Exact zeros (a tensor the architecture requires that the model has
    /// not: DeepSeek's zero shared expert).
    Zeros,
    /// Values computed from the configuration (`rope_freqs.weight`).
    Values(Vec<f32>),
}

/// llama.cpp's per-frequency RoPE divisors for `config`'s scaling
/// (`[head_dim / 2]`), or `None` when the scaling needs none.
fn rope_freqs(config: &ModelConfig) -> Option<Vec<f32>> {
    let v = match &config.rope_scaling {
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            crate::config::rope::llama3_freq_factors(
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
    /// `general.architecture` ([`gguf_arch`]: `llama` or `deepseek`).
    pub architecture: String,
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

fn encode(dtype: DType, values: &[f32], name: &str) -> Result<Vec<u8>> {
    match dtype {
        DType::Q8_0 => Ok(quantize_q8_0(values)),
        d => f32_to_bytes(d, values, "the GGUF output", name),
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
    architecture: &'static str,
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
    let arch = gguf_arch(config, moe).map_err(|why| {
        StudioError::config(src.source_name(), format!("cannot be written as a llama.cpp GGUF exactly: {why}"))
    })?;
    let (d, f, v) = (config.hidden_size as u64, config.intermediate_size as u64, config.vocab_size as u64);
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
    if let Some(f) = rope_freqs(config).filter(|_| arch.reads_rope_freqs()) {
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
                let s_l = scale.as_ref().map_or(1.0, |v| v[l]);
                for (name, ne, from, kind) in arch.moe_block(config, l, s, s_l) {
                    add(name, ne, from, kind);
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
            From::Shared { layer, count, proj } => {
                (0..*count).map(|i| (names::shared_expert_weight_name(*layer, i, *proj), n / *count as u64)).collect()
            }
            From::Values(_) | From::Zeros => Vec::new(),
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
    let a = arch.name();
    let mut kv: Vec<(String, GgufValue)> = vec![
        ("general.architecture".into(), GgufValue::String(a.into())),
        ("general.name".into(), GgufValue::String("moe-studio export".into())),
        ("general.file_type".into(), GgufValue::U32(file_type(dtype))),
        ("general.quantization_version".into(), GgufValue::U32(2)),
        (format!("{a}.block_count"), u32v(config.num_layers)),
        (format!("{a}.context_length"), u32v(config.max_position_embeddings)),
        (format!("{a}.embedding_length"), u32v(config.hidden_size)),
        (format!("{a}.feed_forward_length"), u32v(arch.feed_forward_length(config, moe))),
        (format!("{a}.attention.head_count"), u32v(config.num_heads)),
        (format!("{a}.attention.head_count_kv"), u32v(config.num_kv_heads)),
        (format!("{a}.attention.key_length"), u32v(config.head_dim)),
        (format!("{a}.attention.value_length"), u32v(config.head_dim)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), GgufValue::F32(config.rms_norm_eps as f32)),
        (format!("{a}.rope.freq_base"), GgufValue::F32(config.rope_theta as f32)),
        (format!("{a}.rope.dimension_count"), u32v(config.head_dim)),
        (format!("{a}.vocab_size"), u32v(config.vocab_size)),
    ];
    if let RopeScaling::Linear { factor } = config.rope_scaling {
        kv.push((format!("{a}.rope.scaling.type"), GgufValue::String("linear".into())));
        kv.push((format!("{a}.rope.scaling.factor"), GgufValue::F32(factor as f32)));
    }
    if let Some(m) = moe {
        kv.extend(arch.moe_keys(config, m));
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
    while header.len() % crate::tensor_io::gguf::DEFAULT_ALIGNMENT != 0 {
        header.push(0);
    }
    Ok(Plan { architecture: a, header, tensors, types, warnings })
}

fn align(x: u64) -> u64 {
    let a = crate::tensor_io::gguf::DEFAULT_ALIGNMENT as u64;
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
        From::Shared { layer, count, proj } => {
            let parts: Vec<Vec<f32>> = (0..*count)
                .map(|i| src.read_f32(&names::shared_expert_weight_name(*layer, i, *proj)))
                .collect::<Result<_>>()?;
            match proj {
                Proj::Gate | Proj::Up => parts.concat(),
                Proj::Down => {
                    // [d, f] each -> [d, count·f]: row r = the rows r side by side.
                    let rows = t.ne[1] as usize;
                    let mut v = Vec::with_capacity(rows * t.ne[0] as usize);
                    for r in 0..rows {
                        for p in &parts {
                            let w = p.len() / rows;
                            v.extend_from_slice(&p[r * w..(r + 1) * w]);
                        }
                    }
                    v
                }
            }
        }
        From::Zeros => vec![0.0; t.ne.iter().product::<u64>() as usize],
        From::Values(v) => v.clone(),
    };
    encode(t.dtype, &values, &t.name)
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
        architecture: p.architecture.to_string(),
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
        let back = crate::tensor_io::quant::dequantize(DType::Q8_0, &q, 64).unwrap();
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
