//! Opening a model of any supported format: a Hugging Face directory
//! (`config.json` + safetensors + `tokenizer.json`), a `.gguf` file, or a
//! llama2.c `.bin` (with its `tok{V}.bin` / `tokenizer.bin` beside it).

use super::check::check_tensors;
use super::gguf::GgufModel;
use super::llama2c::Llama2cModel;
use crate::config::{ModelConfig, MoeConfig};
use crate::error::Result;
use crate::layout::{ExpertsFormat, MoeLayout};
use crate::tensor_io::{Bytes, TensorSource};
use crate::tokenizer::{Llama2cTokenizer, Tokenizer};
#[cfg(not(target_arch = "wasm32"))]
use {crate::error::StudioError, crate::tensor_io::safetensors_io::SafetensorsModel};

/// The on-disk format a model was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    /// Hugging Face directory with safetensors.
    Safetensors,
    /// GGUF file.
    Gguf,
    /// llama2.c binary.
    Llama2c,
}

/// A model's configuration, its tensors and (when found) its tokenizer.
pub struct LoadedModel {
    /// Where it was read from.
    pub path: String,
    /// Its format.
    pub format: ModelFormat,
    /// The validated dense configuration (the base of an MoE model).
    pub config: ModelConfig,
    /// The MoE structure, for MoE checkpoints.
    pub moe: Option<MoeConfig>,
    /// The on-disk layout of an MoE checkpoint ([`crate::layout::REGISTRY`]).
    pub layout: Option<&'static dyn crate::layout::MoeLayout>,
    /// How an MoE checkpoint stores its routed experts (per expert, or
    /// packed `gate_up_proj` / `down_proj`: [`crate::layout::packed`]);
    /// `None` for a dense model and for GGUF (llama.cpp's own stacked
    /// `ffn_*_exps`, shown per expert by the reader).
    pub experts_format: Option<ExpertsFormat>,
    /// Its tensors, by Hugging Face name (canonical MoE names,
    /// [`crate::layout::names`], whatever the on-disk layout).
    pub source: Box<dyn TensorSource + Send + Sync>,
    /// The tokenizer, when the model carries or sits beside one.
    pub tokenizer: Option<Tokenizer>,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel").field("path", &self.path).field("format", &self.format).finish()
    }
}

/// The canonical view of an on-disk source: `src` itself for a dense model,
/// else [`crate::layout::wrap_source`] for its layout (which shows packed
/// experts per expert, and checks and drops a Qwen2-MoE zero shared
/// expert); with how the experts are stored (`None`: dense).
///
/// # Errors
/// Those of [`crate::layout::LayoutSource::new`].
pub fn layout_view(
    src: Box<dyn TensorSource + Send + Sync>,
    layout: Option<&'static dyn MoeLayout>,
    config: &ModelConfig,
    moe: Option<&MoeConfig>,
) -> Result<(Box<dyn TensorSource + Send + Sync>, Option<ExpertsFormat>)> {
    match (layout, moe) {
        (Some(l), Some(m)) => crate::layout::wrap_source(src, l, config, m).map(|(s, f)| (s, Some(f))),
        _ => Ok((src, None)),
    }
}

/// Builds a [`LoadedModel`] from a Hugging Face `config.json` and the
/// on-disk tensors `source` (any platform; the CLI's directory reader and
/// the browser's picked files both end here): a dense config, or an MoE
/// whose layout ([`crate::layout::read_config_json`]) decides the
/// canonical view of `source`.
///
/// # Errors
/// Configuration errors naming `cfg_name`; those of [`layout_view`] and
/// [`check_tensors`] (a tensor missing or of the wrong shape, by canonical
/// name).
pub fn from_hf_parts(
    path: &str,
    config_json: &[u8],
    cfg_name: &str,
    source: Box<dyn TensorSource + Send + Sync>,
    tokenizer: Option<Tokenizer>,
) -> Result<LoadedModel> {
    let (config, moe, layout) = match crate::layout::read_config_json(config_json, cfg_name)? {
        Some((layout, base, moe)) => (base, Some(moe), Some(layout)),
        None => (crate::config::HfConfig::from_json(config_json, cfg_name)?.to_model_config(cfg_name)?, None, None),
    };
    let source = super::fused::FusedSource::wrap(source, &config)?;
    let (source, experts_format) = layout_view(source, layout, &config, moe.as_ref())?;
    check_tensors(source.as_ref(), &config, moe.as_ref())?;
    Ok(LoadedModel {
        path: path.into(),
        format: ModelFormat::Safetensors,
        config,
        moe,
        layout,
        experts_format,
        source,
        tokenizer,
    })
}

/// Builds a [`LoadedModel`] from a GGUF buffer (any platform).
///
/// # Errors
/// Parse, configuration and tokenizer errors naming `file_name`.
pub fn from_gguf_bytes(bytes: Bytes, file_name: &str) -> Result<LoadedModel> {
    let model: GgufModel = super::gguf::open(bytes, file_name)?;
    let config = model.model_config()?;
    let moe = model.moe_config(config.num_layers)?;
    if let Some(m) = &moe {
        m.validate(&config, file_name)?;
    }
    // A llama.cpp MoE has the canonical (Mixtral) structure; it is labelled
    // with the layout `auto` would write it in.
    let layout = match &moe {
        Some(m) => Some(crate::layout::choose(&config, m, crate::layout::LayoutRequest::Auto)?.layout),
        None => None,
    };
    let tokenizer = if model.file.get("tokenizer.ggml.model").is_some() {
        Some(Tokenizer::Hf(Box::new(crate::tokenizer::gguf::tokenizer_from_gguf(&model)?)))
    } else {
        None
    };
    // Phi-3's fused `attn_qkv` / `ffn_up` are shown as their parts.
    let source = super::fused::FusedSource::wrap(Box::new(model), &config)?;
    check_tensors(source.as_ref(), &config, moe.as_ref())?;
    Ok(LoadedModel {
        path: file_name.into(),
        format: ModelFormat::Gguf,
        config,
        moe,
        layout,
        // llama.cpp's own stacking (`ffn_*_exps`), shown per expert.
        experts_format: None,
        source,
        tokenizer,
    })
}

/// Builds a [`LoadedModel`] from llama2.c checkpoint and tokenizer buffers
/// (any platform).
///
/// # Errors
/// Parse errors naming the files.
pub fn from_llama2c_bytes(bytes: Bytes, file_name: &str, tokenizer: Option<(&[u8], &str)>) -> Result<LoadedModel> {
    let model = Llama2cModel::parse(bytes, file_name)?;
    let config = model.config().clone();
    let tokenizer = match tokenizer {
        Some((b, name)) => Some(Tokenizer::Llama2c(Llama2cTokenizer::parse(b, config.vocab_size, name)?)),
        None => None,
    };
    Ok(LoadedModel {
        path: file_name.into(),
        format: ModelFormat::Llama2c,
        config,
        moe: None,
        layout: None,
        experts_format: None,
        source: Box::new(model),
        tokenizer,
    })
}

/// The model files of a directory without `config.json`: `.gguf` files and
/// llama2.c `.bin` files other than tokenizers (`tok*.bin`,
/// `tokenizer.bin`), sorted by name.
#[cfg(not(target_arch = "wasm32"))]
fn single_file_candidates(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| StudioError::io(dir.display(), e))?;
    let mut out = Vec::new();
    for entry in rd {
        let p = entry.map_err(|e| StudioError::io(dir.display(), e))?.path();
        if !p.is_file() {
            continue;
        }
        let file = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
        let tokenizer = file.starts_with("tok") && ext == "bin";
        if ext == "gguf" || (ext == "bin" && !tokenizer) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// A directory without `config.json`: opens its one `.gguf` or llama2.c
/// `.bin` (the tokenizer beside it as for the file), else says what was
/// found.
#[cfg(not(target_arch = "wasm32"))]
fn open_single_file_dir(dir: &std::path::Path, cfg_path: &std::path::Path) -> Result<LoadedModel> {
    let found = single_file_candidates(dir)?;
    match found.as_slice() {
        [one] => open_model(one),
        [] => Err(StudioError::config(
            cfg_path.display(),
            "not found: a model directory needs config.json (Hugging Face layout) or exactly one .gguf or \
             llama2.c .bin file (tok*.bin / tokenizer.bin are tokenizers)",
        )),
        many => Err(StudioError::config(
            dir.display(),
            format!(
                "no config.json and {} model files ({}): pass the file to open",
                many.len(),
                many.iter()
                    .map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// Opens a model from a path (native only): a directory in Hugging Face
/// layout (or one holding a single `.gguf` / llama2.c `.bin` and no
/// `config.json`), a `.gguf` file or a llama2.c `.bin`.
///
/// # Errors
/// [`StudioError::Io`] for a missing path, [`StudioError::Config`] for an
/// unknown kind of file, and the format errors of each reader.
#[cfg(not(target_arch = "wasm32"))]
pub fn open_model(path: &std::path::Path) -> Result<LoadedModel> {
    let name = path.display().to_string();
    if !path.exists() {
        return Err(StudioError::io(
            &name,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        ));
    }
    if path.is_dir() {
        let cfg_path = path.join("config.json");
        if !cfg_path.exists() {
            return open_single_file_dir(path, &cfg_path);
        }
        let raw = std::fs::read(&cfg_path).map_err(|e| StudioError::io(cfg_path.display(), e))?;
        let cfg_name = cfg_path.display().to_string();
        crate::tensor_io::bytes::refuse_lfs_pointer(&raw, &cfg_name, "config.json")?;
        // Parse the configuration before mapping the weights: a bad
        // config.json is reported first.
        crate::layout::read_config_json(&raw, &cfg_name)?;
        let source = SafetensorsModel::open_dir(path)?;
        let tok_path = path.join("tokenizer.json");
        let tokenizer = if tok_path.exists() {
            let b = std::fs::read(&tok_path).map_err(|e| StudioError::io(tok_path.display(), e))?;
            crate::tensor_io::bytes::refuse_lfs_pointer(&b, &tok_path.display().to_string(), "tokenizer.json")?;
            Some(Tokenizer::from_hf_json(&b, &tok_path.display().to_string())?)
        } else {
            None
        };
        return from_hf_parts(&name, &raw, &cfg_name, Box::new(source), tokenizer);
    }
    let bytes = Bytes::map_file(path)?;
    crate::tensor_io::bytes::refuse_lfs_pointer(bytes.as_slice(), &name, "model file")?;
    let magic = bytes.as_slice().get(..4);
    if magic == Some(b"GGUF".as_slice()) {
        return from_gguf_bytes(bytes, &name);
    }
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext {
        "gguf" => from_gguf_bytes(bytes, &name),
        "bin" => {
            let model = Llama2cModel::parse(bytes.clone(), &name)?;
            let dir = path.parent().unwrap_or(std::path::Path::new("."));
            let v = model.config().vocab_size;
            let candidates = [dir.join(format!("tok{v}.bin")), dir.join("tokenizer.bin")];
            let tok = candidates.iter().find(|p| p.exists());
            let tok_bytes = match tok {
                Some(p) => {
                    Some((std::fs::read(p).map_err(|e| StudioError::io(p.display(), e))?, p.display().to_string()))
                }
                None => None,
            };
            from_llama2c_bytes(bytes, &name, tok_bytes.as_ref().map(|(b, n)| (b.as_slice(), n.as_str())))
        }
        "safetensors" => Err(StudioError::config(
            &name,
            "pass the model's directory (with config.json), not the .safetensors file itself",
        )),
        _ => Err(StudioError::config(
            &name,
            "unknown model file: expected a Hugging Face directory, a .gguf file or a llama2.c .bin",
        )),
    }
}
