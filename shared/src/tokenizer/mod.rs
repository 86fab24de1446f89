//! Tokenizers: Hugging Face `tokenizer.json` through the `tokenizers`
//! crate, tokenizers built from GGUF metadata, and llama2.c vocabularies.

pub mod gguf;
pub mod gguf_export;
pub mod llama2c;
pub mod train;

pub use llama2c::Llama2cTokenizer;

use crate::error::{Result, StudioError};

/// A tokenizer of any supported kind.
#[derive(Clone)]
pub enum Tokenizer {
    /// A Hugging Face tokenizer (from `tokenizer.json` or GGUF metadata).
    Hf(Box<tokenizers::Tokenizer>),
    /// A llama2.c `tokenizer.bin` / `tok512.bin` vocabulary.
    Llama2c(Llama2cTokenizer),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tokenizer::Hf(t) => write!(f, "Tokenizer::Hf(vocab {})", t.get_vocab_size(true)),
            Tokenizer::Llama2c(t) => write!(f, "Tokenizer::Llama2c(vocab {})", t.vocab_size()),
        }
    }
}

impl Tokenizer {
    /// Parses a Hugging Face `tokenizer.json`.
    ///
    /// # Errors
    /// [`StudioError::Tokenizer`] naming `source_name`.
    pub fn from_hf_json(bytes: &[u8], source_name: &str) -> Result<Self> {
        tokenizers::Tokenizer::from_bytes(bytes)
            .map(|t| Tokenizer::Hf(Box::new(t)))
            .map_err(|e| StudioError::Tokenizer { source_name: source_name.into(), what: e.to_string() })
    }

    /// Token ids of `text`. `add_special_tokens` follows the Hugging Face
    /// meaning (e.g. BOS where the tokenizer's post-processor adds one); for
    /// llama2.c vocabularies it prepends BOS (id 1) as `run.c` does.
    ///
    /// # Errors
    /// [`StudioError::Tokenizer`] when encoding fails.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Hf(t) => t
                .encode(text, add_special_tokens)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| StudioError::Tokenizer { source_name: "tokenizer".into(), what: e.to_string() }),
            Tokenizer::Llama2c(t) => Ok(t.encode(text, add_special_tokens)),
        }
    }

    /// Text of `ids` (special tokens skipped).
    ///
    /// # Errors
    /// [`StudioError::Tokenizer`] when decoding fails.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Tokenizer::Hf(t) => t
                .decode(ids, true)
                .map_err(|e| StudioError::Tokenizer { source_name: "tokenizer".into(), what: e.to_string() }),
            Tokenizer::Llama2c(t) => Ok(t.decode(ids)),
        }
    }

    /// The Hugging Face `tokenizer.json` text, when this is a Hugging Face
    /// tokenizer, or a llama2.c vocabulary converted to one (see
    /// [`Llama2cTokenizer::to_hf`]).
    pub fn to_hf_json(&self) -> Option<String> {
        match self {
            Tokenizer::Hf(t) => t.to_string(true).ok(),
            Tokenizer::Llama2c(t) => t.to_hf("llama2.c vocabulary").ok().and_then(|t| t.to_string(true).ok()),
        }
    }

    /// The text of token `id` as the vocabulary spells it (special tokens
    /// included, e.g. `<s>`; `None` for an unknown id or a piece that is
    /// not UTF-8): what transformers' `decode([id])` gives for a special
    /// token.
    pub fn token_text(&self, id: u32) -> Option<String> {
        match self {
            Tokenizer::Hf(t) => t.id_to_token(id),
            Tokenizer::Llama2c(t) => t.piece(id).and_then(|p| String::from_utf8(p.to_vec()).ok()),
        }
    }

    /// The pieces of the vocabulary, by id, as Hugging Face spells them (a
    /// llama2.c vocabulary through its `tokenizer.json` form: `▁` for
    /// spaces, `<0x00>` byte pieces), so that a `.bin` and a converted copy
    /// compare equal (MoErge's tokenizer check, a token file's vocabulary
    /// hash); `None` for an id without a piece.
    pub fn hf_pieces(&self) -> Vec<Option<Vec<u8>>> {
        let hf_pieces = |t: &tokenizers::Tokenizer| {
            (0..t.get_vocab_size(true) as u32).map(|id| t.id_to_token(id).map(String::into_bytes)).collect()
        };
        match self {
            Tokenizer::Hf(t) => hf_pieces(t),
            Tokenizer::Llama2c(t) => match t.to_hf("llama2.c vocabulary") {
                Ok(h) => hf_pieces(&h),
                Err(_) => (0..t.vocab_size() as u32).map(|id| Some(t.piece_bytes(0, id))).collect(),
            },
        }
    }

    /// Vocabulary size (with added tokens).
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Hf(t) => t.get_vocab_size(true),
            Tokenizer::Llama2c(t) => t.vocab_size(),
        }
    }
}
