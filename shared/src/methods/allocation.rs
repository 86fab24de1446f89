//! How many experts each layer gets when upcycling, and the allocation file
//! that carries a per-layer list (NeuronMoE, methods.md §3).
//!
//! An allocation file is a JSON object with exactly one of two keys:
//!
//! ```json
//! {"experts_per_layer": [2, 2, 4, null, 2]}
//! {"new_experts_per_layer": [1, 1, 3, null, 1], "method": "neuronmoe"}
//! ```
//!
//! - `experts_per_layer`: the **total** experts of each layer, the original
//!   FFN (expert 0) included; every entry >= 1.
//! - `new_experts_per_layer`: the experts **added** to each layer, as
//!   NeuronMoE's `E_l` (the paper's Llama-3.2-3B result is
//!   `1,1,...,6,1,4,2,2,4,3` new experts); the total is `1 + E_l`.
//! - `null` keeps that layer a dense FFN (in both forms).
//!
//! Optional keys `method` and `comment` (strings) are kept for the reader and
//! ignored; any other key is an error, so a typo cannot silently change the
//! meaning of the numbers. The list needs one entry per decoder layer.

use serde::{Deserialize, Serialize};

use crate::error::{Result, StudioError};

/// Experts per layer of an upcycled model (totals: the original FFN counts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertCounts {
    /// Every layer becomes MoE with this many experts.
    Uniform(usize),
    /// One entry per layer: `Some(E_l)` experts, or `None` to keep the layer
    /// dense.
    PerLayer(Vec<Option<usize>>),
}

impl ExpertCounts {
    /// The per-layer counts for a model of `num_layers` layers.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming `source_name` when a per-layer list
    /// has the wrong length.
    pub fn per_layer(&self, num_layers: usize, source_name: &str) -> Result<Vec<Option<usize>>> {
        match self {
            ExpertCounts::Uniform(e) => Ok(vec![Some(*e); num_layers]),
            ExpertCounts::PerLayer(v) if v.len() != num_layers => Err(StudioError::config(
                source_name,
                format!(
                    "the allocation lists {} layers but the model has {num_layers} (give one entry per layer)",
                    v.len()
                ),
            )),
            ExpertCounts::PerLayer(v) => Ok(v.clone()),
        }
    }
}

/// The JSON allocation file (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocationFile {
    /// Total experts per layer (original included); `null` = dense.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts_per_layer: Option<Vec<Option<usize>>>,
    /// New experts per layer (NeuronMoE `E_l`); total = 1 + entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_experts_per_layer: Option<Vec<Option<usize>>>,
    /// Free text: which method produced the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

const FORMS: &str = "expected {\"experts_per_layer\": [...]} (total experts per layer, original included) \
                     or {\"new_experts_per_layer\": [...]} (experts added per layer, NeuronMoE's E_l)";

impl AllocationFile {
    /// Parses an allocation file into total expert counts.
    ///
    /// # Errors
    /// [`StudioError::Format`] / [`StudioError::Config`] naming
    /// `source_name`: invalid JSON, a bare array, both or neither key, a
    /// zero in `experts_per_layer`.
    pub fn parse(bytes: &[u8], source_name: &str) -> Result<ExpertCounts> {
        let raw: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| StudioError::format(source_name, "allocation JSON", e.to_string()))?;
        if !raw.is_object() {
            return Err(StudioError::format(source_name, "allocation JSON", FORMS));
        }
        let f: AllocationFile = serde_json::from_value(raw)
            .map_err(|e| StudioError::format(source_name, "allocation JSON", format!("{e}; {FORMS}")))?;
        f.counts(source_name)
    }

    /// The total expert counts this file describes.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming `source_name` for both or neither key
    /// or a zero total.
    pub fn counts(&self, source_name: &str) -> Result<ExpertCounts> {
        let err = |what: String| Err(StudioError::config(source_name, what));
        match (&self.experts_per_layer, &self.new_experts_per_layer) {
            (Some(_), Some(_)) => err(format!("give only one of the two lists; {FORMS}")),
            (None, None) => err(FORMS.to_string()),
            (Some(total), None) => {
                if let Some(l) = total.iter().position(|e| *e == Some(0)) {
                    return err(format!(
                        "experts_per_layer[{l}] is 0: an MoE layer needs at least 1 expert \
                         (use null to keep a layer dense)"
                    ));
                }
                Ok(ExpertCounts::PerLayer(total.clone()))
            }
            (None, Some(new)) => Ok(ExpertCounts::PerLayer(new.iter().map(|e| e.map(|n| n + 1)).collect())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_parse_to_totals() {
        let t = AllocationFile::parse(br#"{"experts_per_layer": [2, null, 4]}"#, "a.json").unwrap();
        assert_eq!(t, ExpertCounts::PerLayer(vec![Some(2), None, Some(4)]));
        let n = AllocationFile::parse(br#"{"new_experts_per_layer": [1, 0, 3], "method": "neuronmoe"}"#, "a").unwrap();
        assert_eq!(n, ExpertCounts::PerLayer(vec![Some(2), Some(1), Some(4)]));
        assert_eq!(n.per_layer(3, "a").unwrap().len(), 3);
    }

    #[test]
    fn bad_files_are_explained() {
        let e = AllocationFile::parse(b"[1, 2]", "alloc.json").unwrap_err().to_string();
        assert!(e.contains("alloc.json") && e.contains("new_experts_per_layer"), "{e}");
        let e = AllocationFile::parse(br#"{"experts": [1]}"#, "alloc.json").unwrap_err().to_string();
        assert!(e.contains("unknown field"), "{e}");
        let e = AllocationFile::parse(br#"{"experts_per_layer": [2, 0]}"#, "alloc.json").unwrap_err().to_string();
        assert!(e.contains("experts_per_layer[1] is 0"), "{e}");
        let e = ExpertCounts::PerLayer(vec![Some(2); 3]).per_layer(5, "alloc.json").unwrap_err().to_string();
        assert!(e.contains("3 layers") && e.contains("has 5"), "{e}");
    }
}
