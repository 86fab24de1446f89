//! The token ids a model is scored on for a text: what `perplexity --text`,
//! `logits --text` and the browser's perplexity read.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Token ids of `text` as the model's own tokenizer encodes a document:
/// with its special tokens, i.e. the BOS its configuration adds (GGUF
/// `tokenizer.ggml.add_bos_token`, the post-processor of a
/// `tokenizer.json`, llama2.c's BOS) and nothing for tokenizers that add
/// none (SmolLM2, Qwen2).
///
/// This is transformers' `tokenizer(text)` default (`add_special_tokens =
/// True`) and llama.cpp's `perplexity` (`common_tokenize(..., add_special
/// = true)`, which honours the vocabulary's `add_bos`), and how the studio
/// tokenizes training and `eval` documents
/// ([`crate::corpus::document_ids`]). It matters for models
/// trained to see a BOS first: Gemma's GGUF says `add_bos_token = true`
/// (Gemma 3 270M: `<bos>` = id 2), and without it the first window is
/// scored out of distribution and the ids differ from transformers' at
/// index 0.
///
/// # Errors
/// [`crate::error::StudioError::Tokenizer`] when encoding fails.
pub fn text_ids(tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    tok.encode(text, true)
}
