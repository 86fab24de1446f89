//! The page's list of the models the worker holds ([`ModelInfo`]), kept in
//! step by the worker's `Models` events, and what the pages read from it:
//! the model pickers and a tensor list to plan an upcycle on the page.

use leptos::prelude::*;
use moe_shared::tensor_io::{DType, TensorInfo, TensorSource};

use crate::store::ModelRef;
use crate::worker::protocol::ModelInfo;

/// The models, as the worker last reported them (provided as context).
#[derive(Clone, Copy)]
pub struct Models(pub RwSignal<Vec<ModelInfo>>);

impl Models {
    /// The app's model list.
    pub fn get() -> Self {
        use_context::<Models>().expect("Models is provided by App")
    }

    /// One model's info (tracked).
    pub fn find(&self, r: &ModelRef) -> Option<ModelInfo> {
        self.0.with(|v| v.iter().find(|m| &m.r == r).cloned())
    }

    /// `(reference, label, is_moe)` of every model (tracked).
    pub fn choices(&self) -> Vec<(ModelRef, String, bool)> {
        self.0.with(|v| {
            v.iter()
                .map(|m| {
                    let label = match &m.method {
                        None => format!("{} — {}", m.name, crate::summary_line(&m.config, m.moe.as_ref())),
                        Some(method) => {
                            let e = m.moe.as_ref().map(|x| x.total_experts()).unwrap_or(0);
                            format!("{} — {method} ({e} experts in all)", m.name)
                        }
                    };
                    (m.r.clone(), label, m.is_moe())
                })
                .collect()
        })
    }
}

/// The dtype a tensor list names (`DType`'s display names; other names
/// count as a quantised type, which is all the upcycle plan asks of them).
pub fn dtype_named(name: &str) -> DType {
    match name {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "Q4_0" => DType::Q4_0,
        "Q4_1" => DType::Q4_1,
        "Q5_0" => DType::Q5_0,
        "Q5_1" => DType::Q5_1,
        "Q2_K" => DType::Q2K,
        "Q3_K" => DType::Q3K,
        "Q4_K" => DType::Q4K,
        "Q5_K" => DType::Q5K,
        "Q6_K" => DType::Q6K,
        "Q8_K" => DType::Q8K,
        _ => DType::Q8_0,
    }
}

/// A model's tensor list as a [`TensorSource`] without values: enough for
/// the plans the pages preview (`plan_upcycle` reads names, dtypes and
/// shapes only).
pub struct InfoSource {
    name: String,
    tensors: Vec<TensorInfo>,
}

impl InfoSource {
    /// The tensor list of `m`.
    pub fn of(m: &ModelInfo) -> Self {
        InfoSource {
            name: m.name.clone(),
            tensors: m
                .tensors
                .iter()
                .map(|t| TensorInfo { name: t.name.clone(), dtype: dtype_named(&t.dtype), shape: t.shape.clone() })
                .collect(),
        }
    }
}

impl TensorSource for InfoSource {
    fn source_name(&self) -> &str {
        &self.name
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.tensors.clone()
    }

    fn read_f32(&self, name: &str) -> moe_shared::Result<Vec<f32>> {
        Err(moe_shared::StudioError::tensor(&self.name, name, "the page holds no tensor values (the worker does)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in [DType::F32, DType::F16, DType::BF16, DType::Q4_1, DType::Q6K, DType::Q8_0] {
            assert_eq!(dtype_named(&d.to_string()), d);
        }
    }
}
