//! Gated feed-forward network: SwiGLU `down( silu(gate(x)) * up(x) )`, or
//! GeGLU `down( gelu_tanh(gate(x)) * up(x) )` for the families whose
//! activation is gelu tanh (Gemma; [`GateActivation`]).
//!
//! Source: Shazeer, "GLU Variants Improve Transformer" (2020); the Llama
//! MLP (transformers `LlamaMLP`), `GemmaMLP` (`gelu_pytorch_tanh`).

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

pub use crate::config::family::GateActivation;

use super::cpu_ops::gated_product;
use super::linear::forward_rows;

/// A gated FFN with `gate_proj`, `up_proj` (`d -> f`) and `down_proj`
/// (`f -> d`), no biases; the gate activation is `activation` (SwiGLU by
/// default, GeGLU for Gemma).
#[derive(Module, Debug)]
pub struct SwiGlu<B: Backend> {
    /// `gate_proj`, Burn weight `[d, f]`.
    pub gate_proj: Linear<B>,
    /// `up_proj`, Burn weight `[d, f]`.
    pub up_proj: Linear<B>,
    /// `down_proj`, Burn weight `[f, d]`.
    pub down_proj: Linear<B>,
    /// The gate activation (not a parameter).
    #[module(skip)]
    pub activation: GateActivation,
}

impl<B: Backend> SwiGlu<B> {
    /// `x: [..., d] -> [..., d]` (each projection one 2-D product over
    /// all leading positions, [`forward_rows`]).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        forward_rows(&self.down_proj, self.hidden(x))
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
        let out = forward_rows(&self.down_proj, gated_product(g, u, self.activation));
        capture("down_proj", out.clone());
        out
    }

    /// The FFN's hidden activations `act(gate(x)) * up(x)`, `[..., f]`
    /// (the input of `down_proj`).
    pub fn hidden<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let g = forward_rows(&self.gate_proj, x.clone());
        gated_product(g, forward_rows(&self.up_proj, x), self.activation)
    }
}
