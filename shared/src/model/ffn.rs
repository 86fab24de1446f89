//! SwiGLU feed-forward network: `down( silu(gate(x)) * up(x) )`.
//!
//! Source: Shazeer, "GLU Variants Improve Transformer" (2020); the Llama
//! MLP (transformers `LlamaMLP`).

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{activation::silu, backend::Backend, Tensor};

use super::linear::forward_rows;

/// A SwiGLU FFN with `gate_proj`, `up_proj` (`d -> f`) and `down_proj`
/// (`f -> d`), no biases.
#[derive(Module, Debug)]
pub struct SwiGlu<B: Backend> {
    /// `gate_proj`, Burn weight `[d, f]`.
    pub gate_proj: Linear<B>,
    /// `up_proj`, Burn weight `[d, f]`.
    pub up_proj: Linear<B>,
    /// `down_proj`, Burn weight `[f, d]`.
    pub down_proj: Linear<B>,
}

impl<B: Backend> SwiGlu<B> {
    /// `x: [..., d] -> [..., d]` (each projection one 2-D product over
    /// all leading positions, [`forward_rows`]).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let g = silu(forward_rows(&self.gate_proj, x.clone()));
        forward_rows(&self.down_proj, g * forward_rows(&self.up_proj, x))
    }

    /// [`SwiGlu::forward`] that also hands `gate_proj`, `up_proj` and
    /// `down_proj` outputs (`[..., f]`, `[..., f]`, `[..., d]`) to `capture`.
    pub fn forward_capture<const D: usize>(
        &self,
        x: Tensor<B, D>,
        capture: &mut dyn FnMut(&'static str, Tensor<B, D>),
    ) -> Tensor<B, D> {
        let g = forward_rows(&self.gate_proj, x.clone());
        let u = forward_rows(&self.up_proj, x);
        capture("gate_proj", g.clone());
        capture("up_proj", u.clone());
        let out = forward_rows(&self.down_proj, silu(g) * u);
        capture("down_proj", out.clone());
        out
    }

    /// The FFN's hidden activations `silu(gate(x)) * up(x)`, `[..., f]`
    /// (the input of `down_proj`).
    pub fn hidden<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        silu(forward_rows(&self.gate_proj, x.clone())) * forward_rows(&self.up_proj, x)
    }
}
