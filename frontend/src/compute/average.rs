//! DUME's "averaging" baseline seen from an MoE checkpoint: a dense model
//! whose FFN in every MoE layer is the mean of that layer's experts (for a
//! MoErged model, whose shared tensors are already the models' mean, this is
//! the plain weight average of the dense models).
//!
//! It stays on the CPU even with WebGPU: the mean is taken inside the
//! synchronous [`TensorSource::read_f32`] that the CPU forward pass reads
//! while building its model (the kernel is asynchronous), it only feeds the
//! perplexity table, and for three or more experts the kernel's f32 sum is
//! not the f64 mean used here (see `moe_shared::methods::average::weighted_mean`).

use moe_shared::config::{ModelConfig, MoeConfig};
use moe_shared::layout::names::{self, expert_weight_name, Proj, TensorRole};
use moe_shared::tensor_io::{TensorInfo, TensorSource};
use moe_shared::Result;

/// A dense [`TensorSource`] over an MoE source.
pub struct AveragedExperts<'a> {
    src: &'a dyn TensorSource,
    moe: MoeConfig,
    tensors: Vec<TensorInfo>,
}

impl<'a> AveragedExperts<'a> {
    /// The dense view of `src` (layout `moe` on `base`).
    pub fn new(src: &'a dyn TensorSource, base: &ModelConfig, moe: &MoeConfig) -> Self {
        let tensors = moe_shared::checkpoint::plan::dense_tensor_plan(base)
            .into_iter()
            .map(|(name, shape)| TensorInfo { name, dtype: moe_shared::tensor_io::DType::F32, shape })
            .collect();
        AveragedExperts { src, moe: moe.clone(), tensors }
    }

    fn expert_of(&self, name: &str) -> Option<(usize, usize, Proj)> {
        let TensorRole::DenseFfn { layer, proj } = names::parse(name) else { return None };
        let e = self.moe.layers.get(layer)?.as_ref()?.num_experts;
        Some((layer, e, proj))
    }
}

impl TensorSource for AveragedExperts<'_> {
    fn source_name(&self) -> &str {
        self.src.source_name()
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.tensors.clone()
    }

    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let Some((l, e, w)) = self.expert_of(name) else { return self.src.read_f32(name) };
        let mut acc: Vec<f64> = Vec::new();
        for i in 0..e {
            let v = self.src.read_f32(&expert_weight_name(l, i, w))?;
            if acc.is_empty() {
                acc = vec![0.0; v.len()];
            }
            acc.iter_mut().zip(&v).for_each(|(a, &x)| *a += f64::from(x));
        }
        Ok(acc.into_iter().map(|a| (a / e as f64) as f32).collect())
    }
}
