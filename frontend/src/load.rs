//! Models from the user's files (or the bundled demo): Hugging Face files
//! (`*.safetensors` + `config.json` [+ `tokenizer.json`,
//! `model.safetensors.index.json`]), a `.gguf`, or a llama2.c `.bin` with its
//! tokenizer `.bin`. The same readers as the CLI (`moe_shared::checkpoint`).

use moe_shared::checkpoint::load::{from_gguf_bytes, from_hf_parts, from_llama2c_bytes};
use moe_shared::checkpoint::LoadedModel;
use moe_shared::config::{HfConfig, ModelConfig, MoeConfig};
use moe_shared::tensor_io::safetensors_io::{parse_index, SafetensorsFile, SafetensorsModel};
use moe_shared::tensor_io::Bytes;
use moe_shared::tokenizer::Tokenizer;

use crate::web::PickedFile;

/// The most f32 weight bytes the studio lets one model take in the tab
/// (wasm32 memory is 4 GiB and methods hold copies: input, output, the
/// serialised download).
pub const MAX_MODEL_F32_BYTES: u64 = 1 << 30;

/// Parameter count in `u64` (the shared `num_parameters` counts in `usize`,
/// which is 32 bits in wasm32 and overflows for models the check must
/// refuse): the same formula as `ModelConfig::num_parameters` and
/// `MoeConfig::num_parameters`.
pub fn params_u64(c: &ModelConfig, moe: Option<&MoeConfig>) -> u64 {
    let u = |x: usize| x as u64;
    let d = u(c.hidden_size);
    let q = u(c.num_heads) * u(c.head_dim);
    let kv = u(c.num_kv_heads) * u(c.head_dim);
    let bias = if c.attention_bias { q + 2 * kv } else { 0 };
    let attn = d * q + 2 * d * kv + q * d + bias;
    let ffn = 3 * d * u(c.intermediate_size);
    let layer = attn + ffn + 2 * d;
    let head = if c.tie_word_embeddings { 0 } else { u(c.vocab_size) * d };
    let n = u(c.vocab_size) * d + u(c.num_layers) * layer + d + head;
    // The MoE blocks (routed experts, routers, shared experts): shared's
    // count, in u64.
    moe.map_or(n, |m| m.num_parameters_on(c, n))
}

/// Parameters one token uses: the dense part plus, per MoE layer, its
/// `top_k` experts (not all of them) and the router (as model cards give
/// "active parameters"). Equals [`params_u64`] for a dense model.
pub fn active_params_u64(c: &ModelConfig, moe: Option<&MoeConfig>) -> u64 {
    let n = params_u64(c, None);
    moe.map_or(n, |m| m.num_active_parameters_on(c, n))
}

/// The Load page's parameter cell: the total, and for an MoE the
/// parameters active per token (`756.7K (426.4K active per token)`).
pub fn params_label(c: &ModelConfig, moe: Option<&MoeConfig>) -> String {
    let total = crate::format_params(params_u64(c, moe));
    match moe {
        Some(m) => format!("{total} ({} active per token)", crate::format_params(active_params_u64(c, Some(m)))),
        None => total,
    }
}

/// Refuses a model whose f32 weights would not fit the tab.
///
/// # Errors
/// A message naming the model, its size and the limit.
pub fn check_fits(name: &str, config: &ModelConfig, moe: Option<&MoeConfig>) -> Result<(), String> {
    let params = params_u64(config, moe);
    let bytes = params.saturating_mul(4);
    if bytes > MAX_MODEL_F32_BYTES {
        return Err(format!(
            "{name} is too large for the browser: {} parameters need {} in f32, and the studio keeps models under {} in a tab. \
             Use the CLI (`moe-studio upcycle ...`) or the server's Jobs page for this model.",
            crate::format_params(params),
            crate::format_bytes(bytes),
            crate::format_bytes(MAX_MODEL_F32_BYTES)
        ));
    }
    Ok(())
}

fn ext(name: &str) -> String {
    name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default()
}

/// A llama2.c vocabulary file name (`tok512.bin`, `tokenizer.bin`), as the
/// CLI and the server tell it from the checkpoint beside it.
pub fn is_vocab_bin(name: &str) -> bool {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name).to_ascii_lowercase();
    base.ends_with(".bin") && base.starts_with("tok")
}

fn err(e: moe_shared::StudioError) -> String {
    e.to_string()
}

/// Builds a model from the files the user picked for it.
///
/// # Errors
/// A readable message: no files, an unsupported file type, a missing
/// `config.json` or tokenizer, a model too large for the tab, and every
/// parse error of the readers (naming file and tensor).
pub fn model_from_files(files: Vec<PickedFile>) -> Result<(String, LoadedModel, u64), String> {
    model_from_files_named(files, "")
}

/// [`model_from_files`] under the name the user gave (`""`: none): the
/// model is called `name`, and every error and source name says
/// `name/file` (two models loaded from files both called
/// `model.safetensors` are told apart by their names).
///
/// # Errors
/// As [`model_from_files`].
pub fn model_from_files_named(mut files: Vec<PickedFile>, name: &str) -> Result<(String, LoadedModel, u64), String> {
    let name = name.trim();
    if !name.is_empty() {
        for f in &mut files {
            f.name = format!("{name}/{}", f.name);
        }
    }
    let (file_name, mut m, total) = parse_files(files)?;
    if name.is_empty() {
        return Ok((file_name, m, total));
    }
    m.path = name.to_string();
    Ok((name.to_string(), m, total))
}

/// The base name of a picked file (after any `name/` prefix).
fn base(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn parse_files(files: Vec<PickedFile>) -> Result<(String, LoadedModel, u64), String> {
    if files.is_empty() {
        return Err("no files chosen".into());
    }
    let total: u64 = files.iter().map(|f| f.bytes.len() as u64).sum();
    let unknown: Vec<&str> = files
        .iter()
        .filter(|f| !matches!(ext(&f.name).as_str(), "safetensors" | "json" | "gguf" | "bin"))
        .map(|f| f.name.as_str())
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "unsupported file type: {}. Choose a .gguf file, a llama2.c .bin (+ its tokenizer .bin), \
             or Hugging Face files (.safetensors + config.json + tokenizer.json).",
            unknown.join(", ")
        ));
    }
    if let Some(g) = files.iter().find(|f| ext(&f.name) == "gguf") {
        let name = g.name.clone();
        let bytes = files.into_iter().find(|f| f.name == name).map(|f| f.bytes).unwrap_or_default();
        let m = from_gguf_bytes(Bytes::from_vec(bytes), &name).map_err(err)?;
        check_fits(&name, &m.config, None)?;
        return Ok((name, m, total));
    }
    if files.iter().any(|f| ext(&f.name) == "safetensors") {
        return hf_model(files, total);
    }
    let mut bins: Vec<PickedFile> = files.into_iter().filter(|f| ext(&f.name) == "bin").collect();
    if bins.is_empty() {
        return Err("no model file: choose a .gguf, a llama2.c .bin or .safetensors files".into());
    }
    // As the CLI: the vocabulary is `tok*.bin` / `tokenizer.bin`, the
    // checkpoint the other `.bin` (by size only when the names do not tell:
    // a truncated checkpoint can be smaller than its vocabulary).
    bins.sort_by_key(|f| (is_vocab_bin(&f.name), std::cmp::Reverse(f.bytes.len())));
    let model = bins.remove(0);
    let tok = bins.first().map(|t| (t.bytes.as_slice(), t.name.as_str()));
    let m = from_llama2c_bytes(Bytes::from_vec(model.bytes), &model.name, tok).map_err(err)?;
    check_fits(&model.name, &m.config, None)?;
    Ok((model.name, m, total))
}

fn hf_model(files: Vec<PickedFile>, total: u64) -> Result<(String, LoadedModel, u64), String> {
    let cfg = files
        .iter()
        .find(|f| base(&f.name) == "config.json")
        .ok_or("Hugging Face files need their config.json (pick it together with the .safetensors files)")?;
    let (config, moe) = match moe_shared::layout::read_config_json(&cfg.bytes, &cfg.name).map_err(err)? {
        Some((_, base, moe)) => (base, Some(moe)),
        None => {
            (HfConfig::from_json(&cfg.bytes, &cfg.name).map_err(err)?.to_model_config(&cfg.name).map_err(err)?, None)
        }
    };
    let cfg_bytes = cfg.bytes.clone();
    let first = files.iter().find(|f| ext(&f.name) == "safetensors").map(|f| f.name.clone()).unwrap_or_default();
    let name = base(&first).trim_end_matches(".safetensors").to_string();
    check_fits(&name, &config, moe.as_ref())?;
    let tokenizer = match files.iter().find(|f| base(&f.name) == "tokenizer.json") {
        Some(t) => Some(Tokenizer::from_hf_json(&t.bytes, &t.name).map_err(err)?),
        None => None,
    };
    let index = match files.iter().find(|f| base(&f.name) == "model.safetensors.index.json") {
        Some(i) => Some(parse_index(&i.bytes, &i.name).map_err(err)?),
        None => None,
    };
    let mut shards = Vec::new();
    for f in files.into_iter().filter(|f| ext(&f.name) == "safetensors") {
        shards.push(SafetensorsFile::parse(Bytes::from_vec(f.bytes), &f.name).map_err(err)?);
    }
    let source = SafetensorsModel::from_files(&name, shards, index.as_ref()).map_err(err)?;
    // `from_hf_parts` runs the same check as `inspect` and the server's
    // registration (`check_tensors`, on the canonical view).
    let m = from_hf_parts(&name, &cfg_bytes, "config.json", Box::new(source), tokenizer).map_err(err)?;
    Ok((name, m, total))
}

/// Where the demo model is served from: `scripts/demo_model.sh` copies it
/// into the build (`frontend/dist/demo/`, never committed) with a
/// `manifest.json` naming its files.
pub const DEMO_DIR: &str = "demo";

/// `demo/manifest.json`: `{"name": "stories260K", "files": ["stories260K.bin", "tok512.bin"]}`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct DemoManifest {
    /// Display name of the model.
    pub name: String,
    /// File names under `demo/`, in the form [`model_from_files`] takes
    /// (a llama2.c `.bin` + tokenizer `.bin`, a `.gguf`, or HF files).
    pub files: Vec<String>,
    /// One sentence for the Load page.
    #[serde(default)]
    pub description: Option<String>,
    /// Why the build has no teaching preset (`scripts/demo_dist.sh` writes
    /// it when `scripts/demo_preset.sh` could not build one: its texts
    /// could not be fetched or its teaching checks failed); the Load page
    /// shows it.
    #[serde(default)]
    pub preset_absent: Option<String>,
}

impl Default for DemoManifest {
    /// stories260K, what the build carries when there is no manifest.
    fn default() -> Self {
        DemoManifest {
            name: "stories260K".into(),
            files: vec!["stories260K.bin".into(), "tok512.bin".into()],
            description: Some(
                "stories260K — a 260K-parameter Llama trained on TinyStories (llama2.c format, 512-token vocabulary)."
                    .into(),
            ),
            preset_absent: None,
        }
    }
}

/// One model of the teaching preset (`demo/preset/manifest.json`).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PresetModel {
    /// Display name.
    pub name: String,
    /// Its files, relative to `demo/preset/` (Hugging Face files).
    pub files: Vec<String>,
    /// Its domain's text (the router's input), relative to `demo/preset/`.
    #[serde(default)]
    pub text: Option<String>,
    /// Its domain's held-out lines (never trained on), relative to
    /// `demo/preset/`: appended after `text` so that the router page's
    /// held-out 10% falls on them.
    #[serde(default)]
    pub heldout: Option<String>,
}

/// The base model entry of `demo/preset/manifest.json`: its name (files
/// are the build's demo model, which `scripts/demo_dist.sh` makes the
/// base).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PresetBase {
    /// Display name (`stories260K`, or `scratch260K` for the preset built
    /// from fetched text on a machine without `../shared/data`).
    pub name: String,
}

/// `demo/preset/manifest.json`, written by `scripts/demo_preset.sh` (issue
/// 19 item 3): a small base (stories260K, or scratch260K trained from
/// scratch by the CLI on fetched text) fine-tuned by the CLI into domain
/// experts (one text each) and an "instruct"-style model for the graft.
/// The base is the build's demo model.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PresetManifest {
    /// Display name of the preset.
    pub name: String,
    /// The base model (its name; absent in manifests before the fetched
    /// preset: stories260K).
    #[serde(default)]
    pub base: Option<PresetBase>,
    /// The domain experts, in expert order.
    pub experts: Vec<PresetModel>,
    /// The "instruct" model (base + an ability) for the graft.
    pub instruct: PresetModel,
    /// The settings the preset's own CLI run used (and its checks hold
    /// with): the pages' defaults on it.
    #[serde(default)]
    pub settings: PresetSettings,
}

/// The settings `scripts/demo_preset.sh` ran the teaching pipeline with
/// (`manifest.json`'s `settings`): the router page's and the lessons'
/// defaults, so the tab shows what `preset.json` checked.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct PresetSettings {
    /// top-k of the MoErged, ridge-routed MoE (`route --top-k`).
    #[serde(default = "one")]
    pub dume_top_k: usize,
    /// Statistics tokens per domain (`route --max-tokens`).
    #[serde(default = "two_thousand")]
    pub route_tokens: usize,
    /// N of NeuronMoE's top-N (`neurons --top-n`).
    #[serde(default = "hundred")]
    pub neurons_top_n: usize,
    /// NeuronMoE's `E_max` (`allocate --max`; `E_min` is 1).
    #[serde(default = "four")]
    pub neurons_max: usize,
}

fn one() -> usize {
    1
}
fn two_thousand() -> usize {
    2000
}
fn hundred() -> usize {
    100
}
fn four() -> usize {
    4
}

impl Default for PresetSettings {
    fn default() -> Self {
        PresetSettings { dume_top_k: 1, route_tokens: 2000, neurons_top_n: 100, neurons_max: 4 }
    }
}

/// Where the teaching preset is served from.
pub const PRESET_DIR: &str = "demo/preset";

/// The served preset manifest, `None` when the build has no preset.
pub async fn preset_manifest() -> Option<PresetManifest> {
    let b = crate::web::fetch_bytes(&format!("{PRESET_DIR}/manifest.json")).await.ok()?;
    serde_json::from_slice(&b).ok()
}

/// The absolute URL of `path` under the page's base (the worker's fetches
/// must not depend on its own script URL).
pub fn page_url(path: &str) -> String {
    let base = web_sys::window().and_then(|w| w.document()).and_then(|d| d.base_uri().ok().flatten());
    match base.and_then(|b| web_sys::Url::new_with_base(path, &b).ok()) {
        Some(u) => u.href(),
        None => path.to_string(),
    }
}

/// The served `demo/manifest.json`, or [`DemoManifest::default`] without one.
///
/// # Errors
/// A manifest that is served but does not parse.
pub async fn demo_manifest() -> Result<DemoManifest, String> {
    match manifest_in(DEMO_DIR).await {
        Some(m) => m,
        None => Ok(DemoManifest::default()),
    }
}

/// `DIR/manifest.json` parsed, `None` when it is not served.
async fn manifest_in(dir: &str) -> Option<Result<DemoManifest, String>> {
    let b = crate::web::fetch_bytes(&format!("{dir}/manifest.json")).await.ok()?;
    Some(serde_json::from_slice::<DemoManifest>(&b).map_err(|e| format!("{dir}/manifest.json: {e}")))
}

/// Where the "real model" (SmolLM2-135M-Instruct GGUF) is served from when
/// the build's demo is stories260K (`scripts/studio.sh` puts it there).
pub const REAL_DIR: &str = "demo/real";

/// The served `demo/real/manifest.json`, `None` when the build has none.
pub async fn real_manifest() -> Option<DemoManifest> {
    manifest_in(REAL_DIR).await.and_then(Result::ok)
}

/// Fetches and parses the bundled demo model: the files `demo/manifest.json`
/// lists (stories260K when `$MOE_STUDIO_DATA` was there at build time, else
/// SmolLM2-135M-Instruct GGUF); without a manifest, stories260K.
///
/// # Errors
/// A readable message when the demo files are not served or do not parse.
pub async fn demo_model() -> Result<(String, LoadedModel, u64), String> {
    model_in(DEMO_DIR, demo_manifest().await?).await
}

/// Fetches and parses the "real model" of [`REAL_DIR`].
///
/// # Errors
/// No manifest there, or files that are not served or do not parse.
pub async fn real_model() -> Result<(String, LoadedModel, u64), String> {
    let m = manifest_in(REAL_DIR).await.ok_or_else(|| format!("{REAL_DIR}/manifest.json is not served"))??;
    model_in(REAL_DIR, m).await
}

async fn model_in(dir: &str, manifest: DemoManifest) -> Result<(String, LoadedModel, u64), String> {
    let hint = "(scripts/demo_model.sh copies the demo model into the build; is it there?)";
    let mut files = Vec::with_capacity(manifest.files.len());
    for f in &manifest.files {
        let bytes = crate::web::fetch_bytes(&format!("{dir}/{f}")).await.map_err(|e| format!("{e} {hint}"))?;
        files.push(PickedFile { name: f.clone(), bytes });
    }
    let (_, m, total) = model_from_files(files)?;
    Ok((manifest.name, m, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_file_types_are_refused_with_a_hint() {
        let e = model_from_files(vec![PickedFile { name: "notes.txt".into(), bytes: vec![1, 2] }]).unwrap_err();
        assert!(e.contains("unsupported file type: notes.txt"), "{e}");
    }

    #[test]
    fn safetensors_without_config_is_explained() {
        let e =
            model_from_files(vec![PickedFile { name: "model.safetensors".into(), bytes: vec![0; 16] }]).unwrap_err();
        assert!(e.contains("config.json"), "{e}");
    }

    #[test]
    fn parameter_count_matches_the_shared_one() {
        let cfg = br#"{"model_type":"llama","vocab_size":100,"hidden_size":16,"intermediate_size":40,
            "num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2}"#;
        let c = HfConfig::from_json(cfg, "c").unwrap().to_model_config("c").unwrap();
        assert_eq!(params_u64(&c, None), c.num_parameters() as u64);
    }

    /// stories260K's shape (dim 64, FFN 172, 5 layers, 8/4 heads, vocab 512).
    fn stories260k() -> ModelConfig {
        let cfg = br#"{"model_type":"llama","vocab_size":512,"hidden_size":64,"intermediate_size":172,
            "num_hidden_layers":5,"num_attention_heads":8,"num_key_value_heads":4,"tie_word_embeddings":true}"#;
        HfConfig::from_json(cfg, "c").unwrap().to_model_config("c").unwrap()
    }

    #[test]
    fn an_moe_counts_all_its_experts_and_its_active_ones() {
        use moe_shared::config::MoeLayerSpec;
        let c = stories260k();
        let spec = MoeLayerSpec { num_experts: 4, top_k: 2, frozen: vec![0], ..Default::default() };
        let moe = MoeConfig::uniform(c.num_layers, spec);
        // The count the CLI's upcycle report prints (shared).
        assert_eq!(params_u64(&c, Some(&moe)), moe.num_parameters(&c) as u64);
        assert_eq!(crate::format_params(params_u64(&c, None)), "260.0K");
        // Per token: the dense model + one more expert FFN and the router per layer.
        let ffn = 3 * 64 * 172;
        assert_eq!(active_params_u64(&c, Some(&moe)), c.num_parameters() as u64 + 5 * (ffn + 4 * 64));
        // ... which is what the CLI's `inspect` prints (shared, usize)
        assert_eq!(active_params_u64(&c, Some(&moe)), moe.num_active_parameters(&c) as u64);
        assert_eq!(params_label(&c, Some(&moe)), "756.7K (426.4K active per token)");
        assert_eq!(params_label(&c, None), "260.0K");
        // The "loaded ..." line and the model pickers count the same way.
        assert_eq!(
            crate::summary_line(&c, Some(&moe)),
            "llama · 5 layers · d=64 · 756.7K params (426.4K active per token)"
        );
        assert_eq!(crate::summary_line(&c, None), "llama · 5 layers · d=64 · 260.0K params");
        assert_eq!(active_params_u64(&c, None), params_u64(&c, None));
    }

    #[test]
    fn the_llama2c_checkpoint_is_told_by_name_not_size() {
        assert!(is_vocab_bin("tok512.bin") && is_vocab_bin("tokenizer.bin") && is_vocab_bin("dir/Tok4096.bin"));
        assert!(!is_vocab_bin("tr.bin") && !is_vocab_bin("stories260K.bin"));
        // A truncated checkpoint smaller than its vocabulary: the error names the checkpoint.
        let files = vec![
            PickedFile { name: "tok512.bin".into(), bytes: vec![0; 6000] },
            PickedFile { name: "tr.bin".into(), bytes: vec![0; 40] },
        ];
        let e = model_from_files(files).unwrap_err();
        assert!(e.starts_with("tr.bin"), "{e}");
        assert!(!e.contains("tok512.bin"), "{e}");
    }

    #[test]
    fn a_70b_config_is_too_large() {
        let cfg = br#"{"model_type":"llama","vocab_size":128256,"hidden_size":8192,"intermediate_size":28672,
            "num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8}"#;
        let files = vec![
            PickedFile { name: "config.json".into(), bytes: cfg.to_vec() },
            PickedFile { name: "model.safetensors".into(), bytes: vec![0; 16] },
        ];
        let e = model_from_files(files).unwrap_err();
        assert!(e.contains("too large for the browser"), "{e}");
    }
}
