//! How an MoE checkpoint is written: its on-disk layout and how its routed
//! experts are stored. [`LayoutParams`] is the `--layout` /
//! `--experts-format` pair of every CLI command that writes an MoE
//! (`upcycle`, `moerge`, `route`, `graft`, `convert`: flattened with the
//! `cli` feature), and all the server's `convert` job asks besides its
//! inputs ([`crate::api::ConvertSpec`] flattens it; the job form's inputs
//! are [`LayoutParams::form_fields`]).
//!
//! What stays with the caller: the model, the output dtype and path, the
//! output format (the job writes safetensors; `--to gguf` is the CLI's).

use serde::{Deserialize, Serialize};

use super::{Field, Input, ParamError};
use crate::layout::{ExpertsFormat, LayoutRequest};

/// How an MoE is written (see the module docs). `Default` is the CLI's:
/// the first public layout that holds the model exactly (`auto`), one
/// tensor per expert.
///
/// Source: the layouts' own formats (transformers' Mixtral, Qwen2-MoE,
/// Qwen3-MoE, DeepSeek-MoE; the packed experts of transformers 5 and
/// mergekit-moe 0.1.5), docs/compatibility.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct LayoutParams {
    /// On-disk MoE layout: `auto` (the first public layout that holds the
    /// model exactly: mixtral, then qwen2_moe; else moe_studio, with the
    /// reason) or one of mixtral, qwen2_moe, qwen3_moe, deepseek_moe,
    /// moe_studio (`studio`). A layout that cannot hold the model exactly is
    /// refused, naming the field and the layouts that can, before anything
    /// is written.
    #[cfg_attr(feature = "cli", arg(long))]
    pub layout: Option<String>,
    /// How the routed experts are stored: `per-expert` (one tensor per
    /// expert and projection; what transformers 4, llama.cpp's converter,
    /// vLLM and candle read) or `packed` (`experts.gate_up_proj [E, 2f, d]`
    /// and `experts.down_proj [E, d, f]` per layer: transformers 5's own
    /// layout, as mergekit-moe 0.1.5 writes it).
    #[cfg_attr(feature = "cli", arg(long, value_name = "per-expert|packed", default_value = "per-expert"))]
    pub experts_format: String,
}

impl Default for LayoutParams {
    fn default() -> Self {
        LayoutParams { layout: None, experts_format: ExpertsFormat::PerExpert.name().into() }
    }
}

impl LayoutParams {
    /// Checks the names (the layout is checked against the model when it
    /// is written: a layout that cannot hold it is refused then, naming
    /// why and which can).
    ///
    /// # Errors
    /// The field (`layout`, `experts_format`) and the names accepted.
    pub fn check(&self) -> Result<(), ParamError> {
        self.request()?;
        self.experts()?;
        Ok(())
    }

    /// The parsed layout (`auto` when unset).
    ///
    /// # Errors
    /// An unknown layout name (field `layout`; the message lists the names).
    pub fn request(&self) -> Result<LayoutRequest, ParamError> {
        self.request_or(LayoutRequest::Auto)
    }

    /// The parsed layout, `default` when unset (a command whose own
    /// default is not `auto`, e.g. `route --add-expert` keeps its input's).
    ///
    /// # Errors
    /// As [`LayoutParams::request`].
    pub fn request_or(&self, default: LayoutRequest) -> Result<LayoutRequest, ParamError> {
        match &self.layout {
            Some(l) => LayoutRequest::parse(l).map_err(|e| ParamError { field: "layout", message: what(e) }),
            None => Ok(default),
        }
    }

    /// The parsed expert storage.
    ///
    /// # Errors
    /// A name other than `per-expert` / `packed` (field `experts_format`).
    pub fn experts(&self) -> Result<ExpertsFormat, ParamError> {
        ExpertsFormat::parse(&self.experts_format).map_err(|e| ParamError { field: "experts_format", message: what(e) })
    }

    /// The field that asks for something only an MoE has (a layout other
    /// than `auto`, packed experts), or `None`: what a dense model refuses.
    pub fn moe_only_field(&self) -> Option<&'static str> {
        if self.layout.as_deref().is_some_and(|l| l != "auto") {
            Some("layout")
        } else if self.experts_format != ExpertsFormat::PerExpert.name() {
            Some("experts_format")
        } else {
            None
        }
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

/// What is wrong, without the parser's own flag prefix (the `ParamError`
/// names the field, the CLI the flag, once).
fn what(e: crate::error::StudioError) -> String {
    match e {
        crate::error::StudioError::Config { what, .. } => what,
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_field_and_the_choices_are_the_registry_s() {
        assert_eq!(LayoutParams::default().check(), Ok(()));
        let bad = LayoutParams { layout: Some("mixtrl".into()), ..LayoutParams::default() };
        let e = bad.check().unwrap_err();
        assert_eq!(e.field, "layout");
        assert!(e.message.contains("mixtral"), "{e}");
        let bad = LayoutParams { experts_format: "stacked".into(), ..LayoutParams::default() };
        assert_eq!(bad.check().unwrap_err().field, "experts_format");
        // What a dense model refuses: a layout other than auto, packed experts.
        assert_eq!(LayoutParams::default().moe_only_field(), None);
        let auto = LayoutParams { layout: Some("auto".into()), ..LayoutParams::default() };
        assert_eq!(auto.moe_only_field(), None);
        let l = LayoutParams { layout: Some("mixtral".into()), ..LayoutParams::default() };
        assert_eq!(l.moe_only_field(), Some("layout"));
        let packed = LayoutParams { experts_format: "packed".into(), ..LayoutParams::default() };
        assert_eq!(packed.moe_only_field(), Some("experts_format"));
        assert_eq!(packed.experts(), Ok(ExpertsFormat::Packed));
        // Every word the form offers is a name `check` accepts.
        for f in LayoutParams::form_fields() {
            let Input::Choice(words) = f.input else { panic!("{}", f.key) };
            for w in words {
                let p = match f.key {
                    "layout" => LayoutParams { layout: Some(w.to_string()), ..LayoutParams::default() },
                    _ => LayoutParams { experts_format: w.to_string(), ..LayoutParams::default() },
                };
                assert_eq!(p.check(), Ok(()), "{}={w}", f.key);
            }
        }
    }
}
