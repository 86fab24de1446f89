//! Turning a method's in-memory output into an [`Artifact`]: the download's
//! bytes, parsed back as a model for the next step.

use moe_shared::checkpoint::load::from_hf_parts;
use moe_shared::tensor_io::card::{ModelCard, CARD_FILE};
use moe_shared::tensor_io::safetensors_io::SafetensorsFile;
use moe_shared::tensor_io::Bytes;
use moe_shared::tokenizer::Tokenizer;

use super::msg;
use crate::store::Artifact;

/// Everything an output directory holds, before parsing.
pub struct Output {
    /// Short name (download folder).
    pub name: String,
    /// Method that made it.
    pub method: &'static str,
    /// `model.safetensors`.
    pub safetensors: Vec<u8>,
    /// `config.json` bytes.
    pub config_json: Vec<u8>,
    /// The tokenizer to carry along.
    pub tokenizer: Option<Tokenizer>,
    /// `tokenizer.json` bytes (when it has a Hugging Face form).
    pub tokenizer_json: Option<Vec<u8>>,
    /// Other files.
    pub extra: Vec<(String, Vec<u8>)>,
    /// Milliseconds it took.
    pub millis: f64,
}

/// Parses `out` back into a model.
///
/// # Errors
/// Parse errors (they would mean a bug: the bytes were just written).
pub fn into_artifact(out: Output) -> Result<Artifact, String> {
    let bytes = Bytes::from_vec(out.safetensors);
    let file = SafetensorsFile::parse(bytes.clone(), &out.name).map_err(msg)?;
    let model =
        from_hf_parts(&out.name, &out.config_json, "config.json", Box::new(file), out.tokenizer).map_err(msg)?;
    Ok(Artifact {
        name: out.name,
        method: out.method.to_string(),
        safetensors: bytes,
        config_json: out.config_json,
        tokenizer_json: out.tokenizer_json,
        extra: out.extra,
        model,
        millis: out.millis,
        kept: std::cell::Cell::new(false),
    })
}

/// `serde_json::to_vec_pretty`, as the CLI writes `config.json`.
pub fn pretty(v: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec_pretty(v).expect("JSON values serialise")
}

/// The `tokenizer.json` the CLI writes beside an output.
pub fn tokenizer_json(t: Option<&Tokenizer>) -> Option<Vec<u8>> {
    t.and_then(|t| t.to_hf_json()).map(String::into_bytes)
}

/// The model card (`README.md`) of a tab output, as the CLI writes one
/// beside the weights (`moe_shared::tensor_io::card`): `card`, titled
/// `name`, with the options the output's `config.json` records
/// (`moe_studio.provenance`) as its recipe. The tab has no command line and
/// does not read the inputs' own cards, so no license is carried over.
pub fn card_file(mut card: ModelCard, name: &str, config_json: &serde_json::Value) -> (String, Vec<u8>) {
    card.title = name.to_string();
    if let Some(p) = config_json.pointer("/moe_studio/provenance").filter(|p| !p.is_null()) {
        card.recipe = Some(("json".into(), serde_json::to_string_pretty(p).expect("JSON values serialise")));
    }
    card.detail("made in", "the moe-studio browser tab");
    (CARD_FILE.to_string(), card.render().into_bytes())
}
