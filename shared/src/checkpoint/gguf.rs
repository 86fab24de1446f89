//! GGUF files as models: a [`TensorSource`] view ([`GgufModel`]) that
//! exposes llama.cpp tensors under Hugging Face names and PyTorch shapes
//! (dequantized to f32, q/k rows un-permuted), and the model configuration
//! read from the metadata (llama.cpp `llama-model.cpp`, gguf-py
//! `constants.py` / `tensor_mapping.py`). The container itself — header,
//! key/values, tensor infos, bounds checks — is [`crate::tensor_io::gguf`].

use std::collections::HashMap;

use crate::config::{ModelConfig, RopeScaling};
use crate::error::{Result, StudioError};
use crate::tensor_io::gguf::{unsupported, GgufFile, GgufTensorInfo, GgufValue, FORMAT};
use crate::tensor_io::quant;
use crate::tensor_io::{Bytes, TensorInfo, TensorSource};

/// Maps a llama.cpp tensor name to its Hugging Face name, or `None` for a
/// name outside the dense llama/qwen2 set.
///
/// `token_embd.weight` → `model.embed_tokens.weight`, `output_norm.weight` →
/// `model.norm.weight`, `output.weight` → `lm_head.weight`, and per block
/// `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm,
/// attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}.{weight,bias}` →
/// `model.layers.N.{input_layernorm, self_attn.q_proj, self_attn.k_proj,
/// self_attn.v_proj, self_attn.o_proj, self_attn.q_norm, self_attn.k_norm,
/// post_attention_layernorm, mlp.gate_proj, mlp.up_proj,
/// mlp.down_proj}.{weight,bias}`.
pub fn hf_name(gguf_name: &str) -> Option<String> {
    match gguf_name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) || (layer.len() > 1 && layer.starts_with('0')) {
        return None;
    }
    let (module, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let hf = match module {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// Which rows of a tensor need llama.cpp's q/k permutation undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Permute {
    None,
    Q,
    K,
}

#[derive(Debug, Clone)]
struct Entry {
    /// Index into `GgufFile::tensors`.
    index: usize,
    info: TensorInfo,
    permute: Permute,
    /// `(e, E)`: expert `e` of a stacked `[E, ...]` expert tensor.
    slice: Option<(usize, usize)>,
    /// `(i, N)`: the `i`-th of `N` equal column blocks of a 2-D tensor
    /// (shared expert `i` of DeepSeek's concatenated `ffn_down_shexp`).
    cols: Option<(usize, usize)>,
    /// The file holds `1 + w` for an RMSNorm weight the family applies as
    /// `1 + w` (llama.cpp's Gemma converter); read back as `w`.
    minus_one: bool,
}

/// [`hf_name`] with a family's own block names
/// ([`crate::config::family::Family::gguf_block_names`]) taking precedence.
fn family_hf_name(family: Option<&crate::config::family::Family>, gguf_name: &str) -> Option<String> {
    let own = |f: &crate::config::family::Family| -> Option<String> {
        let (layer, rest) = gguf_name.strip_prefix("blk.")?.split_once('.')?;
        let (module, suffix) = rest.rsplit_once('.')?;
        let (_, hf) = f.gguf_block_names.iter().find(|(g, _)| *g == module)?;
        // Same layer / suffix rules as the common names.
        hf_name(&format!("blk.{layer}.attn_q.{suffix}"))?;
        Some(format!("model.layers.{layer}.{hf}.{suffix}"))
    };
    family.and_then(own).or_else(|| hf_name(gguf_name))
}

/// llama.cpp's DeepSeek-MoE v1 architecture (Llama attention; leading dense
/// layers, ungated shared experts, un-normalised top-k:
/// [`crate::layout::deepseek_moe`]).
const DEEPSEEK: &str = "deepseek";

/// The family whose blocks a GGUF architecture holds: the family registry's
/// (`llama`, `qwen2`, ...), and Llama's for `deepseek`.
fn reader_family(arch: &str) -> Option<&'static crate::config::family::Family> {
    crate::config::family::by_gguf_arch(arch)
        .or_else(|| (arch == DEEPSEEK).then(|| crate::config::family::of(crate::config::Architecture::Llama)))
}

/// The GGUF architectures the reader takes, for errors.
fn supported_archs() -> String {
    format!("{}, {DEEPSEEK}", crate::config::family::supported_gguf_archs())
}

/// `(layer, projection)` of DeepSeek's shared FFN `blk.N.ffn_{gate,up,down}_shexp.weight`.
fn shexp_name(gguf_name: &str) -> Option<(usize, crate::layout::names::Proj)> {
    use crate::layout::names::Proj;
    let (layer, rest) = gguf_name.strip_prefix("blk.")?.split_once('.')?;
    let proj = match rest {
        "ffn_gate_shexp.weight" => Proj::Gate,
        "ffn_up_shexp.weight" => Proj::Up,
        "ffn_down_shexp.weight" => Proj::Down,
        _ => return None,
    };
    Some((layer.parse().ok()?, proj))
}

/// The studio shared experts (each of the dense width) behind a `deepseek`
/// file's shared FFN of width `expert_feed_forward_length ·
/// expert_shared_count`: `moe_studio.shared_experts` when the studio wrote
/// the file (0: the FFN is a zero stand-in), else that width over
/// `feed_forward_length`.
///
/// # Errors
/// [`StudioError::Config`] naming the file when a key is missing or the
/// width is not a whole number of dense FFNs.
fn deepseek_shared_experts(file: &GgufFile) -> Result<usize> {
    if let Some(n) = file.get("moe_studio.shared_experts").and_then(GgufValue::as_u64) {
        return Ok(n as usize);
    }
    let get = |k: &str| {
        file.get(&format!("{DEEPSEEK}.{k}")).and_then(GgufValue::as_u64).map(|v| v as usize).ok_or_else(|| {
            StudioError::config(&file.file, format!("GGUF metadata `{DEEPSEEK}.{k}` is missing or not an integer"))
        })
    };
    let (w, n, f) = (get("expert_feed_forward_length")?, get("expert_shared_count")?, get("feed_forward_length")?);
    if f == 0 || (w * n) % f != 0 {
        return Err(StudioError::config(
            &file.file,
            format!(
                "the shared FFN is {w} x {n} = {} units wide, not a whole number of dense FFNs of \
                 `{DEEPSEEK}.feed_forward_length` = {f} (the studio's shared experts have the dense width)",
                w * n
            ),
        ));
    }
    Ok(w * n / f)
}

/// The canonical MoE names of a llama.cpp MoE tensor: `blk.N.ffn_gate_inp.weight`
/// is the router of layer `N`; `blk.N.ffn_{gate,up,down}_exps.weight` (ne
/// `[in, out, E]`) stack the `E` experts' projections.
fn moe_names(gguf_name: &str, ne: &[u64]) -> Option<Vec<String>> {
    use crate::layout::names::{expert_weight_name, router_weight_name, Proj};
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let proj = match rest {
        "ffn_gate_inp.weight" => return Some(vec![router_weight_name(layer)]),
        "ffn_gate_exps.weight" => Proj::Gate,
        "ffn_up_exps.weight" => Proj::Up,
        "ffn_down_exps.weight" => Proj::Down,
        _ => return None,
    };
    let e = *ne.get(2)? as usize;
    (ne.len() == 3).then(|| (0..e).map(|x| expert_weight_name(layer, x, proj)).collect())
}

/// A GGUF checkpoint viewed as a [`TensorSource`] with Hugging Face names
/// and PyTorch shapes.
///
/// Tensors with a known llama.cpp name are renamed by [`hf_name`]; others
/// keep their GGUF name. Shapes are `ne` reversed (`[out_features,
/// in_features]` for linear weights). [`TensorInfo::dtype`] is the GGML
/// storage type. A family's own block names come first
/// ([`crate::config::family::Family::gguf_block_names`]: Gemma's sandwich
/// norms, Phi-3's fused `attn_qkv` / `ffn_up`, split later by
/// [`crate::checkpoint::fused::FusedSource`]); for a family applying its
/// RMSNorms as `1 + w` (Gemma), every `*norm.weight` is read as the stored
/// value minus 1, since llama.cpp's converter stores `1 + w` (transformers'
/// GGUF loader subtracts 1 the same way). For architecture `llama`, the rows of q_proj and k_proj
/// (weights and biases) are un-permuted on read, undoing the interleaved-RoPE
/// permutation of llama.cpp's `convert_hf_to_gguf.py` exactly as
/// transformers' GGUF loader does (`reverse_permute_weights`): for `n` heads
/// (`attention.head_count` for q, `attention.head_count_kv` for k), view the
/// rows as `[n, head_dim / 2, 2, ...]`, swap axes 1 and 2, and flatten back,
/// i.e. HF row `h*hd + j*hd/2 + i` = GGUF row `h*hd + 2*i + j`. For `qwen2`
/// nothing is permuted. `deepseek` (DeepSeek-MoE v1) reads as Llama blocks;
/// its shared FFN `blk.N.ffn_{gate,up,down}_shexp.weight` is shown as the
/// studio's shared experts of the dense width (gate/up: row blocks; down:
/// column blocks; [`deepseek_shared_experts`]), or keeps its GGUF names when
/// it is the studio's zero stand-in.
#[derive(Debug, Clone)]
pub struct GgufModel {
    /// The parsed file.
    pub file: GgufFile,
    /// `general.architecture` (empty when absent).
    pub architecture: String,
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
}

/// Parses a GGUF file into a [`GgufModel`].
///
/// Any architecture parses (so metadata and the tokenizer can be inspected);
/// [`GgufModel::model_config`] checks the architecture is supported.
///
/// # Errors
/// Those of [`GgufFile::parse`]; [`StudioError::Format`] when two tensors map
/// to the same Hugging Face name.
pub fn open(bytes: Bytes, file_name: &str) -> Result<GgufModel> {
    GgufModel::new(GgufFile::parse(bytes, file_name)?)
}

impl GgufModel {
    /// Builds the Hugging Face view of a parsed file.
    ///
    /// # Errors
    /// [`StudioError::Format`] when two tensors map to the same name.
    pub fn new(file: GgufFile) -> Result<GgufModel> {
        let architecture = file.get_str("general.architecture").unwrap_or("").to_string();
        let family = reader_family(&architecture);
        // (A file the studio cannot hold still parses, its shared FFN under
        // its GGUF names; `moe_config` says why.)
        let deepseek_shared = if architecture == DEEPSEEK { deepseek_shared_experts(&file).unwrap_or(0) } else { 0 };
        let permuted = family.is_some_and(|f| f.gguf_permuted_qk);
        let plus_one = family.is_some_and(|f| f.norm_plus_one);
        let mut entries = Vec::with_capacity(file.tensors.len());
        let mut by_name = HashMap::with_capacity(file.tensors.len());
        for (index, t) in file.tensors.iter().enumerate() {
            if let Some(experts) = moe_names(&t.name, &t.ne) {
                let n = experts.len();
                let shape = t.torch_shape();
                for (e, name) in experts.into_iter().enumerate() {
                    let (shape, slice) = if n == 1 && shape.len() == 2 {
                        (shape.clone(), None)
                    } else {
                        (shape[1..].to_vec(), Some((e, n)))
                    };
                    if by_name.insert(name.clone(), entries.len()).is_some() {
                        return Err(StudioError::format(
                            &file.file,
                            FORMAT,
                            format!("tensor `{}` maps to `{name}`, which another tensor already has", t.name),
                        ));
                    }
                    entries.push(Entry {
                        index,
                        info: TensorInfo { name, dtype: t.dtype, shape },
                        permute: Permute::None,
                        slice,
                        cols: None,
                        minus_one: false,
                    });
                }
                continue;
            }
            if let Some((layer, proj)) = shexp_name(&t.name).filter(|_| deepseek_shared > 0) {
                // DeepSeek's shared FFN: the studio's shared experts side by
                // side (none: a zero stand-in, checked by `moe_config`, that
                // keeps its GGUF names).
                for i in 0..deepseek_shared {
                    let name = crate::layout::names::shared_expert_weight_name(layer, i, proj);
                    let full = t.torch_shape();
                    let (shape, slice, cols) = match (proj, full.as_slice()) {
                        (crate::layout::names::Proj::Down, [d, w]) => {
                            (vec![*d, w / deepseek_shared], None, Some((i, deepseek_shared)))
                        }
                        (_, [w, d]) => (vec![w / deepseek_shared, *d], Some((i, deepseek_shared)), None),
                        _ => (full.clone(), None, None),
                    };
                    if by_name.insert(name.clone(), entries.len()).is_some() {
                        return Err(StudioError::format(
                            &file.file,
                            FORMAT,
                            format!("tensor `{}` maps to `{name}`, which another tensor already has", t.name),
                        ));
                    }
                    entries.push(Entry {
                        index,
                        info: TensorInfo { name, dtype: t.dtype, shape },
                        permute: Permute::None,
                        slice,
                        cols,
                        minus_one: false,
                    });
                }
                continue;
            }
            let name = family_hf_name(family, &t.name).unwrap_or_else(|| t.name.clone());
            let permute = if !permuted {
                Permute::None
            } else if name.contains(".self_attn.q_proj.") {
                Permute::Q
            } else if name.contains(".self_attn.k_proj.") {
                Permute::K
            } else {
                Permute::None
            };
            if by_name.insert(name.clone(), entries.len()).is_some() {
                return Err(StudioError::format(
                    &file.file,
                    FORMAT,
                    format!("tensor `{}` maps to Hugging Face name `{name}`, which another tensor already has", t.name),
                ));
            }
            let minus_one = plus_one && name.starts_with("model.") && name.ends_with("norm.weight");
            entries.push(Entry {
                index,
                info: TensorInfo { name, dtype: t.dtype, shape: t.torch_shape() },
                permute,
                slice: None,
                cols: None,
                minus_one,
            });
        }
        Ok(GgufModel { file, architecture, entries, by_name })
    }

    /// The GGUF tensor info behind a Hugging Face name.
    pub fn gguf_tensor(&self, hf_name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(hf_name).map(|&i| &self.file.tensors[self.entries[i].index])
    }

    /// Checks that every tensor can be dequantized.
    ///
    /// # Errors
    /// [`StudioError::UnsupportedDType`] naming the file and the first
    /// tensor (Hugging Face name) of an unsupported GGML type.
    pub fn check_dtypes(&self) -> Result<()> {
        for e in &self.entries {
            if !quant::is_supported(e.info.dtype) {
                return Err(unsupported(&self.file.file, &e.info.name, e.info.dtype));
            }
        }
        Ok(())
    }

    /// `{general.architecture}.{suffix}`.
    pub(crate) fn meta_key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.architecture)
    }

    /// The integer metadata `{arch}.{suffix}` (`None` when absent and not
    /// `required`).
    ///
    /// # Errors
    /// [`StudioError::Config`] naming the file and key when it is missing but
    /// required, or not a non-negative integer.
    pub(crate) fn meta_usize(&self, suffix: &str, required: bool) -> Result<Option<usize>> {
        let key = self.meta_key(suffix);
        match self.file.get(&key) {
            None if required => Err(StudioError::config(&self.file.file, format!("GGUF metadata `{key}` is missing"))),
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|x| usize::try_from(x).ok()) {
                Some(x) => Ok(Some(x)),
                None => Err(StudioError::config(
                    &self.file.file,
                    format!("GGUF metadata `{key}` must be a non-negative integer, found {} {v:?}", v.type_name()),
                )),
            },
        }
    }

    /// The numeric metadata `{arch}.{suffix}`, `None` when absent.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming the file and key when it is not a number.
    pub(crate) fn meta_f64(&self, suffix: &str) -> Result<Option<f64>> {
        let key = self.meta_key(suffix);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                StudioError::config(
                    &self.file.file,
                    format!("GGUF metadata `{key}` must be a number, found {} {v:?}", v.type_name()),
                )
            }),
        }
    }

    fn heads(&self) -> Result<(usize, usize)> {
        let n_head = self.meta_usize("attention.head_count", true)?.unwrap_or(0);
        let n_kv = self.meta_usize("attention.head_count_kv", false)?.unwrap_or(n_head);
        Ok((n_head, n_kv))
    }

    /// The model configuration from the `{arch}.*` and `tokenizer.ggml.*`
    /// metadata.
    ///
    /// Keys (for `arch` = `general.architecture`): `embedding_length` (d),
    /// `feed_forward_length` (f), `block_count` (L), `attention.head_count`,
    /// `attention.head_count_kv` (default: head_count),
    /// `attention.key_length` (head_dim; default d / head_count),
    /// `attention.layer_norm_rms_epsilon`, `rope.freq_base` (default 10000),
    /// `context_length` (default 2048), `rope.dimension_count` (must equal
    /// head_dim: partial rotary is not supported), `rope.scaling.type` /
    /// `rope.scaling.factor` (none or linear), the tensor `rope_freqs.weight`
    /// (llama.cpp's per-frequency divisors: read back as the Llama 3.1
    /// scaling they encode, [`crate::config::rope::llama3_from_freq_factors`]).
    /// The vocabulary size is the
    /// length of `tokenizer.ggml.tokens` (else `{arch}.vocab_size`, else the
    /// embedding rows); embeddings are tied when there is no `output.weight`;
    /// attention biases are on for qwen2 or when `blk.0.attn_q.bias` exists;
    /// bos/eos come from `tokenizer.ggml.{bos,eos}_token_id`; then the
    /// family's own keys (`checkpoint/gguf_family.rs`:
    /// Gemma's soft-caps and sliding-window pattern, Phi-3's LongRoPE).
    ///
    /// # Errors
    /// [`StudioError::Config`] naming the file for an architecture outside
    /// [`crate::config::family::supported_gguf_archs`] (listed), a missing or mistyped required key, an unsupported
    /// RoPE scaling (or both a scaling type and `rope_freqs.weight`), or
    /// inconsistent sizes ([`ModelConfig::validate`]);
    /// [`StudioError::UnsupportedDType`] naming the file and tensor when a
    /// tensor's GGML type cannot be dequantized.
    pub fn model_config(&self) -> Result<ModelConfig> {
        let src = &self.file.file;
        let family = reader_family(&self.architecture);
        let architecture = match (self.architecture.as_str(), family) {
            (_, Some(f)) => f.architecture,
            ("", _) => {
                return Err(StudioError::config(
                    src,
                    format!("GGUF metadata `general.architecture` is missing (supported: {})", supported_archs()),
                ))
            }
            (other, None) => {
                return Err(StudioError::config(
                    src,
                    format!("unsupported GGUF architecture `{other}` (supported: {})", supported_archs()),
                ))
            }
        };
        self.check_dtypes()?;
        let req = |k: &str| -> Result<usize> { Ok(self.meta_usize(k, true)?.unwrap_or(0)) };
        let hidden_size = req("embedding_length")?;
        let intermediate_size = req("feed_forward_length")?;
        let num_layers = req("block_count")?;
        let (num_heads, num_kv_heads) = self.heads()?;
        if num_heads == 0 {
            return Err(StudioError::config(src, format!("`{}` must be > 0", self.meta_key("attention.head_count"))));
        }
        let head_dim = match self.meta_usize("attention.key_length", false)? {
            Some(k) => k,
            None => hidden_size / num_heads,
        };
        if let Some(rot) = self.meta_usize("rope.dimension_count", false)? {
            if rot != head_dim {
                return Err(StudioError::config(
                    src,
                    format!(
                        "`{}` = {rot} differs from head_dim {head_dim}: partial rotary embeddings are not supported",
                        self.meta_key("rope.dimension_count")
                    ),
                ));
            }
        }
        let rms_norm_eps = self.meta_f64("attention.layer_norm_rms_epsilon")?.ok_or_else(|| {
            StudioError::config(
                src,
                format!("GGUF metadata `{}` is missing", self.meta_key("attention.layer_norm_rms_epsilon")),
            )
        })?;
        let rope_theta = self.meta_f64("rope.freq_base")?.unwrap_or(10000.0);
        let max_position_embeddings = self.meta_usize("context_length", false)?.unwrap_or(2048);
        let scaling_type = self.file.get_str(&self.meta_key("rope.scaling.type"));
        let rope_scaling = match scaling_type {
            None | Some("none") => RopeScaling::Default,
            Some("linear") => {
                let factor = self.meta_f64("rope.scaling.factor")?.ok_or_else(|| {
                    StudioError::config(
                        src,
                        format!("linear RoPE scaling needs `{}`", self.meta_key("rope.scaling.factor")),
                    )
                })?;
                RopeScaling::Linear { factor }
            }
            Some(other) => {
                return Err(StudioError::config(
                    src,
                    format!(
                        "unsupported RoPE scaling `{}` = \"{other}\" (supported: none, linear)",
                        self.meta_key("rope.scaling.type")
                    ),
                ))
            }
        };
        let rope_scaling = match self.rope_freq_factors(head_dim)? {
            None => rope_scaling,
            Some(_) if rope_scaling != RopeScaling::Default => {
                return Err(StudioError::config(
                    src,
                    format!(
                        "the file has both `{}` and a `rope_freqs.weight` tensor: two RoPE scalings at once are not supported",
                        self.meta_key("rope.scaling.type")
                    ),
                ))
            }
            Some(f) => crate::config::rope::llama3_from_freq_factors(&f, head_dim, rope_theta),
        };
        let vocab_size = match self.file.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array) {
            Some(a) => a.len(),
            None => match self.meta_usize("vocab_size", false)? {
                Some(v) => v,
                None => self.gguf_tensor("model.embed_tokens.weight").map(|t| t.torch_shape()[0]).unwrap_or(0),
            },
        };
        let tie_word_embeddings = self.file.tensor("output.weight").is_none();
        let attention_bias = architecture.family().qkv_bias || self.file.tensor("blk.0.attn_q.bias").is_some();
        let id = |k: &str| self.file.get(k).and_then(GgufValue::as_u64).and_then(|v| u32::try_from(v).ok());
        let cfg = ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings,
            attention_bias,
            bos_token_id: id("tokenizer.ggml.bos_token_id"),
            eos_token_id: id("tokenizer.ggml.eos_token_id"),
            family_params: Default::default(),
        };
        let mut cfg = cfg;
        super::gguf_family::read_family_params(self, &mut cfg)?;
        cfg.validate(src)?;
        Ok(cfg)
    }
}

impl GgufModel {
    /// llama.cpp's per-frequency RoPE divisors, the tensor
    /// `rope_freqs.weight` (`[head_dim / 2]`, F32; written by
    /// `convert_hf_to_gguf.py` for a Llama 3.1 `rope_scaling`), or `None`
    /// when the file has none.
    ///
    /// # Errors
    /// As [`GgufModel::positive_factors`].
    fn rope_freq_factors(&self, head_dim: usize) -> Result<Option<Vec<f64>>> {
        self.positive_factors("rope_freqs.weight", head_dim / 2)
    }

    /// A vector of `len` RoPE frequency factors stored as the tensor `name`
    /// (GGUF name; `rope_freqs.weight`, Phi-3's `rope_factors_{short,long}.weight`),
    /// or `None` when the file has no such tensor.
    ///
    /// # Errors
    /// [`StudioError::Tensor`] naming the file and tensor when its length is
    /// not `len` or a value is not a positive finite number;
    /// [`StudioError::UnsupportedDType`] for a type that cannot be decoded.
    pub(crate) fn positive_factors(&self, name: &str, len: usize) -> Result<Option<Vec<f64>>> {
        let Some(t) = self.file.tensor(name) else { return Ok(None) };
        if !quant::is_supported(t.dtype) {
            return Err(unsupported(&self.file.file, name, t.dtype));
        }
        if t.n_elements != len {
            return Err(StudioError::tensor(
                &self.file.file,
                name,
                format!("{} values, expected head_dim / 2 = {len} (one RoPE frequency factor each)", t.n_elements),
            ));
        }
        let v = quant::dequantize(t.dtype, self.file.tensor_bytes(t), t.n_elements)
            .map_err(|m| StudioError::tensor(&self.file.file, name, m))?;
        if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !(x.is_finite() && **x > 0.0)) {
            return Err(StudioError::tensor(
                &self.file.file,
                name,
                format!("value {i} is {x}: RoPE frequency factors must be positive and finite"),
            ));
        }
        Ok(Some(v.into_iter().map(f64::from).collect()))
    }

    /// The MoE structure of a llama.cpp MoE (`{arch}.expert_count` > 0):
    /// every layer with `expert_count` experts and `expert_used_count` per
    /// token, no router bias, temperature 1, frozen experts from
    /// `moe_studio.frozen_experts` (JSON) when the studio wrote the file; `None`
    /// for a dense model. `llama`: every layer MoE, top-k renormalised.
    /// `deepseek`: the first `leading_dense_block_count` layers dense, the
    /// experts `expert_feed_forward_length` wide, top-k not renormalised
    /// (`norm_topk_prob: false`; for `k = E` the two are the same function),
    /// ungated shared experts as [`deepseek_shared_experts`] says
    /// (`moe_studio.shared_frozen` when recorded).
    ///
    /// # Errors
    /// [`StudioError::Config`] for a mistyped key, a malformed `moe_studio.*`
    /// record or a `deepseek` file the studio cannot hold
    /// ([`GgufModel::deepseek_moe`]); [`StudioError::Tensor`] when the zero
    /// shared expert stand-in is not zero.
    pub fn moe_config(&self, num_layers: usize) -> Result<Option<crate::config::MoeConfig>> {
        let Some(e) = self.meta_usize("expert_count", false)?.filter(|&e| e > 0) else { return Ok(None) };
        let k = self.meta_usize("expert_used_count", true)?.unwrap_or(0);
        let json_meta = |key: &str| -> Result<Option<serde_json::Value>> {
            match self.file.get_str(key) {
                Some(json) => serde_json::from_str(json)
                    .map(Some)
                    .map_err(|e| StudioError::config(&self.file.file, format!("GGUF metadata `{key}`: {e}"))),
                None => Ok(None),
            }
        };
        let frozen: Vec<Vec<usize>> = match json_meta("moe_studio.frozen_experts")? {
            Some(v) => crate::layout::frozen_record(
                v,
                num_layers,
                &self.file.file,
                "GGUF metadata `moe_studio.frozen_experts`",
            )?,
            None => Vec::new(),
        };
        let shared_frozen: Vec<bool> = match json_meta("moe_studio.shared_frozen")? {
            Some(v) => serde_json::from_value(v).map_err(|e| {
                StudioError::config(&self.file.file, format!("GGUF metadata `moe_studio.shared_frozen`: {e}"))
            })?,
            None => Vec::new(),
        };
        let coef = self.file.get("moe_studio.router_aux_loss_coef").and_then(GgufValue::as_f64).unwrap_or(0.01);
        let deepseek = self.architecture == DEEPSEEK;
        let (lead, width, shared) = if deepseek { self.deepseek_moe(num_layers)? } else { (0, None, 0) };
        let layers = (0..num_layers)
            .map(|l| {
                (l >= lead).then(|| crate::config::MoeLayerSpec {
                    num_experts: e,
                    top_k: k,
                    frozen: frozen.get(l).cloned().unwrap_or_default(),
                    expert_intermediate_size: width,
                    shared_experts: shared,
                    shared_frozen: shared > 0 && shared_frozen.get(l).copied().unwrap_or(false),
                    norm_topk_prob: !deepseek,
                    ..Default::default()
                })
            })
            .collect();
        Ok(Some(crate::config::MoeConfig { layers, router_aux_loss_coef: coef }))
    }

    /// A `deepseek` file's leading dense layers, expert width (`None`: the
    /// dense width) and shared experts ([`deepseek_shared_experts`]).
    ///
    /// # Errors
    /// [`StudioError::Config`] for an `expert_weights_scale` other than 0 or
    /// 1 (the studio has no such scale); [`StudioError::Tensor`] when the
    /// studio's zero shared expert stand-in is not zero.
    fn deepseek_moe(&self, num_layers: usize) -> Result<(usize, Option<usize>, usize)> {
        let lead = self.meta_usize("leading_dense_block_count", false)?.unwrap_or(0);
        let w = self.meta_usize("expert_feed_forward_length", true)?.unwrap_or(0);
        let f = self.meta_usize("feed_forward_length", true)?.unwrap_or(0);
        match self.meta_f64("expert_weights_scale")? {
            None => {}
            Some(x) if x == 0.0 || x == 1.0 => {}
            Some(x) => {
                return Err(StudioError::config(
                    &self.file.file,
                    format!(
                        "`{DEEPSEEK}.expert_weights_scale` = {x}: the studio has no factor on the routed experts' \
                         weights (0 or 1 expected)"
                    ),
                ))
            }
        }
        let shared = deepseek_shared_experts(&self.file)?;
        if shared == 0 {
            for l in lead..num_layers {
                let name = format!("blk.{l}.ffn_down_shexp.weight");
                let t =
                    self.file.tensor(&name).ok_or_else(|| StudioError::tensor(&self.file.file, &name, "missing"))?;
                if !quant::is_supported(t.dtype) {
                    return Err(unsupported(&self.file.file, &name, t.dtype));
                }
                let v = quant::dequantize(t.dtype, self.file.tensor_bytes(t), t.n_elements)
                    .map_err(|m| StudioError::tensor(&self.file.file, &name, m))?;
                if let Some(x) = v.iter().find(|x| **x != 0.0) {
                    return Err(StudioError::tensor(
                        &self.file.file,
                        &name,
                        format!(
                            "holds {x}, not zero, and `moe_studio.shared_experts` is 0 (the shared FFN was the \
                             studio's zero stand-in): the file was changed after it was written"
                        ),
                    ));
                }
            }
        }
        Ok((lead, (w != f).then_some(w), shared))
    }
}

/// Undoes llama.cpp's q/k row permutation in place: `data` is `rows × cols`
/// row-major with `rows = n_head * head_dim`; HF row `h*hd + j*hd/2 + i`
/// takes GGUF row `h*hd + 2*i + j`.
fn unpermute_rows(data: &[f32], rows: usize, cols: usize, n_head: usize) -> Vec<f32> {
    let hd = rows / n_head;
    let half = hd / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_head {
        for j in 0..2 {
            for i in 0..half {
                let dst = h * hd + j * half + i;
                let src = h * hd + 2 * i + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

impl AsRef<GgufFile> for GgufModel {
    /// The container under the model view (its metadata, for the tokenizer).
    fn as_ref(&self) -> &GgufFile {
        &self.file
    }
}

impl TensorSource for GgufModel {
    fn source_name(&self) -> &str {
        &self.file.file
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.entries.iter().map(|e| e.info.clone()).collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.by_name.get(name).map(|&i| self.entries[i].info.clone())
    }

    /// Dequantizes one tensor (Hugging Face name) to f32, row-major in the
    /// PyTorch shape, un-permuting llama q/k rows.
    ///
    /// # Errors
    /// [`StudioError::Tensor`] when the tensor is missing or its rows do not
    /// split into the metadata's heads; [`StudioError::UnsupportedDType`] for
    /// a GGML type that cannot be dequantized; [`StudioError::Config`] when
    /// a llama q/k tensor is read but the head counts are missing.
    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let Some(&i) = self.by_name.get(name) else {
            return Err(StudioError::tensor(&self.file.file, name, "not found in the GGUF file"));
        };
        let e = &self.entries[i];
        let t = &self.file.tensors[e.index];
        if !quant::is_supported(t.dtype) {
            return Err(unsupported(&self.file.file, name, t.dtype));
        }
        let data = match e.slice {
            None => quant::dequantize(t.dtype, self.file.tensor_bytes(t), t.n_elements),
            Some((x, n)) => {
                let bytes = self.file.tensor_bytes(t);
                let (per_bytes, per) = (bytes.len() / n, t.n_elements / n);
                if per_bytes * n != bytes.len() || quant::byte_size(t.dtype, per) != Some(per_bytes) {
                    return Err(StudioError::tensor(
                        &self.file.file,
                        name,
                        format!("the {n} experts of `{}` do not split into whole {} blocks", t.name, t.dtype),
                    ));
                }
                quant::dequantize(t.dtype, &bytes[x * per_bytes..(x + 1) * per_bytes], per)
            }
        }
        .map_err(|m| StudioError::tensor(&self.file.file, name, m))?;
        let data = match e.cols {
            None => data,
            Some((i, n)) => {
                let rows = e.info.shape[0];
                let w = data.len() / rows.max(1);
                let part = w / n;
                (0..rows).flat_map(|r| data[r * w + i * part..r * w + (i + 1) * part].iter().copied()).collect()
            }
        };
        if e.minus_one {
            return Ok(data.into_iter().map(|x| x - 1.0).collect());
        }
        if e.permute == Permute::None {
            return Ok(data);
        }
        let (n_head, n_kv) = self.heads()?;
        let n = if e.permute == Permute::Q { n_head } else { n_kv };
        let rows = e.info.shape.first().copied().unwrap_or(0);
        let cols = if e.info.shape.len() > 1 { e.info.shape[1..].iter().product() } else { 1 };
        if n == 0 || rows % n != 0 || (rows / n) % 2 != 0 {
            return Err(StudioError::tensor(
                &self.file.file,
                name,
                format!(
                    "{rows} rows do not split into {n} heads of even size (needed to undo llama.cpp's q/k permutation)"
                ),
            ));
        }
        Ok(unpermute_rows(&data, rows, cols, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map() {
        assert_eq!(hf_name("blk.12.attn_q.bias").as_deref(), Some("model.layers.12.self_attn.q_proj.bias"));
        assert_eq!(hf_name("blk.0.ffn_down.weight").as_deref(), Some("model.layers.0.mlp.down_proj.weight"));
        assert_eq!(hf_name("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("blk.01.attn_q.weight"), None);
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }

    #[test]
    fn unpermute_matches_definition() {
        // 2 heads of head_dim 4, 1 column: GGUF rows r -> value r.
        let data: Vec<f32> = (0..8).map(|r| r as f32).collect();
        let out = unpermute_rows(&data, 8, 1, 2);
        assert_eq!(out, vec![0., 2., 1., 3., 4., 6., 5., 7.]);
    }
}
