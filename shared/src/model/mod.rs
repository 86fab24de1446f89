//! The decoder-only transformer in Burn, generic over the backend:
//! token embedding, RMSNorm, RoPE, grouped-query attention (optional q/k/v
//! bias), SwiGLU FFN, tied or untied LM head, a KV cache and right padding
//! for batches of texts of different lengths.
//!
//! Layout follows Hugging Face's `LlamaForCausalLM` / `Qwen2ForCausalLM`
//! (transformers `modeling_llama.py`), so tensor names map one to one.

pub mod attention;
pub mod cache;
pub mod cpu_attention;
#[cfg(not(target_arch = "wasm32"))]
pub mod cpu_grad;
pub mod cpu_ops;
pub mod ffn;
pub mod init;
pub mod linear;
pub mod load;
pub mod moe;
pub mod padding;
pub mod rope;
pub mod save;
pub mod transformer;
pub mod weights;

pub use attention::Attention;
pub use cache::KvCache;
pub use ffn::SwiGlu;
pub use init::{random_dense_model, RandomInit};
pub use load::{load_model, load_model_as, load_transformer, load_transformer_as};
pub use moe::{MoeLayer, Routing, RoutingTrace};
pub use padding::Padding;
pub use rope::{Rope, RopeTables};
pub use save::model_to_bytes;
#[cfg(not(target_arch = "wasm32"))]
pub use save::save_model;
pub use transformer::{DecoderBlock, ForwardOptions, LayerNeurons, Mlp, Pooling, Trace, Transformer};
pub use weights::WeightsDtype;
