//! The convert operation's parameters: how a model is written again (its
//! MoE layout and how its routed experts are stored), for the server's
//! `convert` job ([`crate::api::ConvertSpec`] flattens it) and the job
//! form's inputs ([`ConvertParams::form_fields`]). The CLI's `moe-studio
//! convert` reads the same two flags through its `--layout` /
//! `--experts-format` group, which every command that writes an MoE shares.
//!
//! What stays with the caller: the model, the output dtype and path, the
//! output format (the job writes safetensors; `--to gguf` is the CLI's).

use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};
use crate::layout::{ExpertsFormat, LayoutRequest};

/// What a conversion is asked to do, besides its inputs (see the module
/// docs). `Default` is the CLI's: the first public layout that holds the
/// model exactly (`auto`), one tensor per expert.
///
/// Source: the layouts' own formats (transformers' Mixtral, Qwen2-MoE,
/// Qwen3-MoE, DeepSeek-MoE; the packed experts of transformers 5 and
/// mergekit-moe 0.1.5), docs/compatibility.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConvertParams {
    /// On-disk MoE layout (`auto`, or a name of the layout registry:
    /// mixtral, qwen2_moe, qwen3_moe, deepseek_moe, moe_studio); unset = auto.
    pub layout: Option<String>,
    /// How the routed experts are stored: `per-expert` or `packed`.
    pub experts_format: String,
}

impl Default for ConvertParams {
    fn default() -> Self {
        ConvertParams { layout: None, experts_format: ExpertsFormat::PerExpert.name().into() }
    }
}

impl ConvertParams {
    /// Checks the names (the layout is checked against the model when it
    /// is written: a layout that cannot hold it is refused then, naming
    /// why and which can).
    ///
    /// # Errors
    /// The field (`layout`, `experts_format`) and the names accepted.
    pub fn check(&self) -> Result<(), ParamError> {
        if let Some(l) = &self.layout {
            LayoutRequest::parse(l).map_err(|e| ParamError { field: "layout", message: e.to_string() })?;
        }
        ExpertsFormat::parse(&self.experts_format)
            .map_err(|e| ParamError { field: "experts_format", message: e.to_string() })?;
        Ok(())
    }

    /// The job form's inputs for these parameters.
    pub fn form_fields() -> Vec<Field> {
        vec![
            Field::new(
                "layout",
                "MoE layout",
                Input::Choice(&["auto", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_moe", "moe_studio"]),
                "auto (the first public layout that holds the model exactly)",
            ),
            Field::new(
                "experts_format",
                "experts stored",
                Input::Choice(&["per-expert", "packed"]),
                "per-expert (packed: transformers 5's gate_up_proj / down_proj)",
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_field_and_the_choices_are_the_registry_s() {
        assert_eq!(ConvertParams::default().check(), Ok(()));
        let bad = ConvertParams { layout: Some("mixtrl".into()), ..ConvertParams::default() };
        let e = bad.check().unwrap_err();
        assert_eq!(e.field, "layout");
        assert!(e.message.contains("mixtral"), "{e}");
        let bad = ConvertParams { experts_format: "stacked".into(), ..ConvertParams::default() };
        assert_eq!(bad.check().unwrap_err().field, "experts_format");
        // Every word the form offers is a name `check` accepts.
        for f in ConvertParams::form_fields() {
            let Input::Choice(words) = f.input else { panic!("{}", f.key) };
            for w in words {
                let p = match f.key {
                    "layout" => ConvertParams { layout: Some(w.to_string()), ..ConvertParams::default() },
                    _ => ConvertParams { experts_format: w.to_string(), ..ConvertParams::default() },
                };
                assert_eq!(p.check(), Ok(()), "{}={w}", f.key);
            }
        }
    }
}
