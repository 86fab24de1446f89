//! Builds a Hugging Face `tokenizers` tokenizer from the `tokenizer.ggml.*`
//! metadata of a GGUF file (which carries no `tokenizer.json`).
//!
//! The construction mirrors transformers' GGUF tokenizer support
//! (`integrations/gguf/gguf_tokenizer_mapping.py` and, before it,
//! `GGUFGPTConverter` / `GGUFLlamaConverter` in `integrations/ggml.py`):
//!
//! * `tokenizer.ggml.model = "gpt2"`: byte-level BPE over `tokens` and
//!   `merges` (`"left right"` strings). Tokens that are not already spelled
//!   in the GPT-2 byte alphabet are respelled byte by byte. The
//!   pre-tokenizer is chosen by `tokenizer.ggml.pre`:
//!   - `smollm`: `Sequence[Digits(individual), ByteLevel(no prefix space)]`
//!     with a `ByteLevel` decoder and no normalizer/post-processor —
//!     identical to SmolLM2's `tokenizer.json`;
//!   - `default`, `gpt2` (or absent): `ByteLevel(add_prefix_space = false)`;
//!   - `llama-bpe`/`llama3` family, `qwen2` family, `tekken`, `gpt-4o`
//!     family: `Sequence[Split(regex, isolated), ByteLevel(use_regex =
//!     false)]` with the regex of that family (as transformers'
//!     `GGUF_PRE_TOKENIZER_SPLITS`);
//!   - anything else: the `default` one, with a warning.
//! * `tokenizer.ggml.model = "llama"` (SentencePiece BPE): BPE over `tokens`
//!   with merges from the file or, when absent, recovered from `scores`
//!   (transformers' `generate_merges`), `byte_fallback` (`<0xXX>` tokens),
//!   `fuse_unk`, `unk_token` from `tokenizer.ggml.unknown_token_id`, a
//!   `Metaspace("▁", prepend_scheme = first | never per
//!   tokenizer.ggml.add_space_prefix (default true), split = false)`
//!   pre-tokenizer and a `Replace("▁", " "), ByteFallback, Fuse,
//!   Strip(left 1)` decoder (as transformers' `LlamaTokenizer`).
//!
//!   By `general.architecture` (transformers' `GGUF_SENTENCEPIECE_BUILDERS`,
//!   [`SpmFlavor`]): Gemma (`gemma`, `gemma2`, `gemma3`) respells tokens made
//!   only of whitespace with a space in them as that many `▁`, rebuilds the
//!   merges from the token *order* (Gemma's scores do not follow its merge
//!   order), and uses `GemmaTokenizer`'s shape: a `Replace(" ", "▁")`
//!   normalizer, no prefix `▁`, `Split(" ", merged_with_previous)`, decoder
//!   without the Strip; Phi-3 (`phi3`) puts the prefix `▁` and the space
//!   replacement into the normalizer (`Prepend("▁"), Replace(" ", "▁")`) with
//!   no pre-tokenizer, so text starting with spaces keeps them all.
//!
//! In both cases tokens of `token_type` 3 (control) are added as special
//! tokens (`normalized = false`; in a byte-level vocabulary only those
//! spelled in the byte alphabet, as transformers does), tokens of type 4
//! (user-defined) as non-special added tokens, and a `TemplateProcessing`
//! post-processor adds BOS / EOS when `tokenizer.ggml.add_bos_token` /
//! `add_eos_token` say so (default: BOS for `llama`, nothing for `gpt2`).

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{Result, StudioError};
use crate::tensor_io::gguf::{GgufFile, GgufValue};

/// GGUF `token_type` of control tokens (`<|endoftext|>`, `<s>`, ...).
pub const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF `token_type` of user-defined tokens (`<think>`, ...).
pub const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The Llama 3 split regex (`llama-bpe`, `llama3`, `llama-v3`, `falcon3`,
/// `dbrx`, `smaug-bpe`, ...).
pub const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen2 split regex (`qwen2`, `deepseek-r1-qwen`, `megrez`).
pub const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Mistral Tekken split regex (`tekken`).
pub const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// The GPT-4o split regex (`gpt-4o`, `llama4`).
pub const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The split regex transformers uses for a `tokenizer.ggml.pre` value, if
/// any (`None` for `smollm`, `default`, `gpt2` and unknown values).
pub fn pre_split_regex(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "dbrx"
        | "smaug-bpe" => LLAMA3_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" => QWEN2_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "gpt-4o" | "llama4" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// GPT-2's `bytes_to_unicode`: the printable character standing for each
/// byte in a byte-level BPE vocabulary.
pub fn bytes_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).expect("latin-1")
        } else {
            n += 1;
            char::from_u32(255 + n).expect("valid char")
        };
    }
    map
}

/// What [`build_tokenizer`] read from the file.
struct Meta<'a> {
    src: &'a str,
    tokens: Vec<&'a str>,
    token_types: Option<Vec<i64>>,
}

fn tok_err(src: &str, what: impl Into<String>) -> StudioError {
    StudioError::Tokenizer { source_name: src.to_string(), what: what.into() }
}

/// Largest vocabulary read from GGUF metadata (real ones are at most a
/// few hundred thousand tokens; the tokenizer built from them costs
/// about a hundred bytes per token).
pub const MAX_VOCAB: usize = 1 << 21;
/// Most BPE merges read from GGUF metadata.
pub const MAX_MERGES: usize = 1 << 22;

fn string_array<'a>(file: &'a GgufFile, key: &str, max: usize) -> Result<Option<Vec<&'a str>>> {
    let src = file.file_name();
    match file.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(a)) => {
            if a.len() > max {
                return Err(tok_err(src, format!("`{key}` has {} entries, over the limit of {max}", a.len())));
            }
            match a.strs() {
                Some(items) => Ok(Some(items.collect())),
                None => Err(tok_err(src, format!("`{key}` is an array of {}, not of strings", a.elem_type_name()))),
            }
        }
        Some(v) => Err(tok_err(src, format!("`{key}` must be an array of strings, found {}", v.type_name()))),
    }
}

fn number_array(file: &GgufFile, key: &str, n: usize) -> Result<Option<Vec<f64>>> {
    let src = file.file_name();
    match file.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(items)) => {
            if items.len() != n {
                return Err(tok_err(src, format!("`{key}` has {} entries but there are {n} tokens", items.len())));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_f64().ok_or_else(|| tok_err(src, format!("`{key}`[{i}] is a {}, not a number", v.type_name())))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some)
        }
        Some(v) => Err(tok_err(src, format!("`{key}` must be an array of numbers, found {}", v.type_name()))),
    }
}

fn meta_bool(file: &GgufFile, key: &str) -> Option<bool> {
    file.get(key).and_then(GgufValue::as_bool)
}

fn meta_token_id(file: &GgufFile, key: &str, n: usize) -> Result<Option<u32>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(id) if id < n as u64 => Ok(Some(id as u32)),
            _ => Err(tok_err(
                file.file_name(),
                format!("`{key}` = {v:?} is not a token id below the vocabulary size {n}"),
            )),
        },
    }
}

/// Builds a Hugging Face tokenizer from the GGUF's `tokenizer.ggml.*`
/// metadata (see the module docs for the construction). Warnings (an
/// unknown `tokenizer.ggml.pre`) are printed to stderr natively.
///
/// # Errors
/// [`StudioError::Tokenizer`] naming the file when the metadata is missing
/// or malformed (no `tokenizer.ggml.tokens`, merges or scores of the wrong
/// type or length, out-of-range special token ids) or the tokenizer model is
/// not `gpt2` or `llama`.
pub fn tokenizer_from_gguf(model: &impl AsRef<GgufFile>) -> Result<Tokenizer> {
    let file = model.as_ref();
    let (tok, warnings) = build_tokenizer(file)?;
    #[cfg(not(target_arch = "wasm32"))]
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    #[cfg(target_arch = "wasm32")]
    let _ = warnings;
    Ok(tok)
}

/// Like [`tokenizer_from_gguf`], returning the warnings instead of printing
/// them.
///
/// # Errors
/// As [`tokenizer_from_gguf`].
pub fn build_tokenizer(model: &impl AsRef<GgufFile>) -> Result<(Tokenizer, Vec<String>)> {
    let file = model.as_ref();
    let src = file.file_name();
    let mut warnings = Vec::new();
    let kind = file.get_str("tokenizer.ggml.model").ok_or_else(|| {
        tok_err(src, "GGUF metadata `tokenizer.ggml.model` is missing (the file carries no tokenizer)")
    })?;
    let tokens = string_array(file, "tokenizer.ggml.tokens", MAX_VOCAB)?
        .ok_or_else(|| tok_err(src, "GGUF metadata `tokenizer.ggml.tokens` is missing"))?;
    if tokens.is_empty() {
        return Err(tok_err(src, "`tokenizer.ggml.tokens` is empty"));
    }
    let n = tokens.len();
    let token_types = number_array(file, "tokenizer.ggml.token_type", n)?
        .map(|v| v.into_iter().map(|x| x as i64).collect::<Vec<_>>());
    let meta = Meta { src, tokens, token_types };
    let (mut tok, byte_level, default_bos) = match kind {
        "gpt2" => (gpt2_tokenizer(file, &meta, &mut warnings)?, true, false),
        "llama" => (llama_tokenizer(file, &meta)?, false, true),
        other => {
            return Err(tok_err(
                src,
                format!(
                    "unsupported GGUF tokenizer model `tokenizer.ggml.model` = \"{other}\" (supported: gpt2, llama)"
                ),
            ))
        }
    };
    add_special_tokens(&mut tok, &meta, byte_level);
    // BOS/EOS post-processing, as transformers' `update_post_processor`.
    let add_bos = meta_bool(file, "tokenizer.ggml.add_bos_token").unwrap_or(default_bos);
    let add_eos = meta_bool(file, "tokenizer.ggml.add_eos_token").unwrap_or(false);
    let bos = meta_token_id(file, "tokenizer.ggml.bos_token_id", n)?;
    let eos = meta_token_id(file, "tokenizer.ggml.eos_token_id", n)?;
    let bos = if add_bos { bos } else { None };
    let eos = if add_eos { eos } else { None };
    if add_bos && bos.is_none() {
        warnings
            .push(format!("{src}: add_bos_token is set but there is no tokenizer.ggml.bos_token_id; no BOS is added"));
    }
    if add_eos && eos.is_none() {
        warnings
            .push(format!("{src}: add_eos_token is set but there is no tokenizer.ggml.eos_token_id; no EOS is added"));
    }
    if bos.is_some() || eos.is_some() {
        let name = |id: u32| meta.tokens[id as usize].to_string();
        let mut single: Vec<String> = Vec::new();
        let mut pair: Vec<String> = Vec::new();
        let mut specials: Vec<(String, u32)> = Vec::new();
        if let Some(b) = bos {
            single.push(format!("{}:0", name(b)));
            specials.push((name(b), b));
        }
        single.push("$A:0".into());
        if let Some(e) = eos {
            single.push(format!("{}:0", name(e)));
            if Some(e) != bos {
                specials.push((name(e), e));
            }
        }
        pair.extend(single.iter().cloned());
        if let Some(b) = bos {
            pair.push(format!("{}:1", name(b)));
        }
        pair.push("$B:1".into());
        if let Some(e) = eos {
            pair.push(format!("{}:1", name(e)));
        }
        let post = TemplateProcessing::builder()
            .try_single(single)
            .and_then(|b| b.try_pair(pair))
            .map_err(|e| tok_err(src, format!("BOS/EOS template: {e}")))?
            .special_tokens(specials)
            .build()
            .map_err(|e| tok_err(src, format!("BOS/EOS template: {e}")))?;
        tok.with_post_processor(Some(post));
    }
    Ok((tok, warnings))
}

/// Byte-level BPE (`tokenizer.ggml.model = "gpt2"`).
fn gpt2_tokenizer(file: &GgufFile, meta: &Meta, warnings: &mut Vec<String>) -> Result<Tokenizer> {
    let src = meta.src;
    let spelling = bytes_to_unicode();
    let alphabet: std::collections::HashSet<char> = spelling.iter().copied().collect();
    let vocab: Vocab = meta
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let tok = if t.chars().all(|c| alphabet.contains(&c)) {
                t.to_string()
            } else {
                t.bytes().map(|b| spelling[b as usize]).collect()
            };
            (tok, i as u32)
        })
        .collect();
    let merges = string_array(file, "tokenizer.ggml.merges", MAX_MERGES)?.ok_or_else(|| {
        tok_err(src, "GGUF metadata `tokenizer.ggml.merges` is missing (needed for a gpt2 tokenizer)")
    })?;
    let merges = parse_merges(src, &merges)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| tok_err(src, format!("building the BPE model: {e}")))?;
    let mut tok = Tokenizer::new(bpe);
    let pre = file.get_str("tokenizer.ggml.pre").unwrap_or("default");
    let pre_tok: PreTokenizerWrapper = match pre {
        "smollm" => PreSequence::new(vec![Digits::new(true).into(), ByteLevel::new(false, true, true).into()]).into(),
        "default" | "gpt2" => ByteLevel::new(false, true, true).into(),
        other => match pre_split_regex(other) {
            Some(re) => {
                let split = Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false)
                    .map_err(|e| tok_err(src, format!("split regex for `{other}`: {e}")))?;
                PreSequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]).into()
            }
            None => {
                warnings.push(format!(
                    "{src}: unknown `tokenizer.ggml.pre` = \"{other}\"; using the GPT-2 default pre-tokenizer (tokenization may differ from the original model)"
                ));
                ByteLevel::new(false, true, true).into()
            }
        },
    };
    tok.with_pre_tokenizer(Some(pre_tok));
    tok.with_decoder(Some(ByteLevelDecoder::new(true, true, true)));
    Ok(tok)
}

fn parse_merges(src: &str, merges: &[&str]) -> Result<Vec<(String, String)>> {
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_string(), b.to_string())),
            _ => Err(tok_err(src, format!("`tokenizer.ggml.merges`[{i}] = {m:?} is not \"left right\""))),
        })
        .collect()
}

/// transformers' `generate_merges(vocab, vocab_scores)`: every split of
/// every token into two tokens of the vocabulary, ordered by the token's
/// score (descending), then the lengths of the two parts (descending),
/// stably; within one token, splits are ordered by the parts' ids.
pub fn merges_from_scores(tokens: &[&str], scores: &[f64]) -> Vec<(String, String)> {
    // vocab: token -> id, the last occurrence winning (a Python dict built
    // from enumerate); vocab_scores: first position, last score.
    let mut vocab: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    let mut score_of: HashMap<&str, f64> = HashMap::with_capacity(tokens.len());
    for (i, (&t, &s)) in tokens.iter().zip(scores).enumerate() {
        vocab.insert(t, i);
        if score_of.insert(t, s).is_none() {
            order.push(t);
        }
    }
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    let mut local: Vec<(&str, &str, f64)> = Vec::new();
    for &t in &order {
        let score = score_of[t];
        local.clear();
        for (idx, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(idx);
            if vocab.contains_key(l) && vocab.contains_key(r) {
                local.push((l, r, score));
            }
        }
        local.sort_by_key(|&(l, r, _)| (vocab[l], vocab[r]));
        merges.extend_from_slice(&local);
    }
    merges.sort_by(|a, b| {
        let ka = (a.0.chars().count(), a.1.chars().count());
        let kb = (b.0.chars().count(), b.1.chars().count());
        b.2.partial_cmp(&a.2).unwrap_or(std::cmp::Ordering::Equal).then(kb.cmp(&ka))
    });
    merges.into_iter().map(|(l, r, _)| (l.to_string(), r.to_string())).collect()
}

/// How a SentencePiece (`llama`) vocabulary of a GGUF is spelled and split,
/// by `general.architecture` (transformers' `GGUF_SENTENCEPIECE_BUILDERS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpmFlavor {
    /// `LlamaTokenizer`: `Metaspace` pre-tokenizer, merges by score.
    Llama,
    /// `GemmaTokenizer` (`gemma`, `gemma2`, `gemma3`): whitespace tokens
    /// respelled with `▁`, merges by token order, spaces replaced by a
    /// normalizer, no prefix `▁`.
    Gemma,
    /// Phi-3 (`phi3`): `LlamaTokenizer` with the prefix `▁` and the space
    /// replacement in the normalizer and no pre-tokenizer.
    Phi3,
}

impl SpmFlavor {
    /// The flavour of GGUF architecture `arch`.
    pub fn of(arch: &str) -> SpmFlavor {
        match arch {
            "gemma" | "gemma2" | "gemma3" => SpmFlavor::Gemma,
            "phi3" => SpmFlavor::Phi3,
            _ => SpmFlavor::Llama,
        }
    }
}

/// Gemma's whitespace tokens (a space among only whitespace, as Python's
/// `" " in t and not t.strip()`) respelled as one `▁` per character.
fn gemma_spelling(t: &str) -> String {
    let py_space = |c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c);
    if t.contains(' ') && t.chars().all(py_space) {
        "▁".repeat(t.chars().count())
    } else {
        t.to_string()
    }
}

/// SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`).
fn llama_tokenizer(file: &GgufFile, meta: &Meta) -> Result<Tokenizer> {
    let src = meta.src;
    let n = meta.tokens.len();
    let flavor = SpmFlavor::of(file.get_str("general.architecture").unwrap_or(""));
    let spelled: Vec<String> = match flavor {
        SpmFlavor::Gemma => meta.tokens.iter().map(|t| gemma_spelling(t)).collect(),
        _ => meta.tokens.iter().map(|t| t.to_string()).collect(),
    };
    let refs: Vec<&str> = spelled.iter().map(String::as_str).collect();
    let vocab: Vocab = spelled.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges = match string_array(file, "tokenizer.ggml.merges", MAX_MERGES)? {
        Some(m) => parse_merges(src, &m)?,
        // Gemma's merge order is its token order (first = best).
        None if flavor == SpmFlavor::Gemma => {
            merges_from_scores(&refs, &(0..n).map(|i| -(i as f64)).collect::<Vec<_>>())
        }
        None => {
            let scores = number_array(file, "tokenizer.ggml.scores", n)?.ok_or_else(|| {
                tok_err(src, "a llama tokenizer needs `tokenizer.ggml.merges` or `tokenizer.ggml.scores`")
            })?;
            merges_from_scores(&refs, &scores)
        }
    };
    let unk = meta_token_id(file, "tokenizer.ggml.unknown_token_id", n)?.map(|u| meta.tokens[u as usize]);
    match flavor {
        SpmFlavor::Llama => {
            let add_prefix_space = meta_bool(file, "tokenizer.ggml.add_space_prefix").unwrap_or(true);
            spm_tokenizer(vocab, merges, unk, add_prefix_space, src)
        }
        SpmFlavor::Phi3 => {
            let mut tok = spm_tokenizer(vocab, merges, unk, true, src)?;
            let space = Replace::new(" ", "▁").map_err(|e| tok_err(src, e.to_string()))?;
            tok.with_normalizer(Some(NormalizerSequence::new(vec![Prepend::new("▁".into()).into(), space.into()])));
            tok.with_pre_tokenizer(None::<PreTokenizerWrapper>);
            Ok(tok)
        }
        SpmFlavor::Gemma => gemma_tokenizer(vocab, merges, unk, src),
    }
}

/// transformers' `GemmaTokenizer` over a GGUF vocabulary: byte-fallback BPE
/// (`fuse_unk`), normalizer `Replace(" ", "▁")`, pre-tokenizer
/// `Split(" ", merged_with_previous)` (a no-op after the normalizer, kept
/// for fidelity), decoder `Replace("▁", " "), ByteFallback, Fuse`.
fn gemma_tokenizer(vocab: Vocab, merges: Vec<(String, String)>, unk: Option<&str>, src: &str) -> Result<Tokenizer> {
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true)
        .unk_token(unk.unwrap_or("<unk>").to_string())
        .build()
        .map_err(|e| tok_err(src, format!("building the BPE model: {e}")))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_normalizer(Some(Replace::new(" ", "▁").map_err(|e| tok_err(src, e.to_string()))?));
    let split = Split::new(SplitPattern::String(" ".into()), SplitDelimiterBehavior::MergedWithPrevious, false)
        .map_err(|e| tok_err(src, e.to_string()))?;
    tok.with_pre_tokenizer(Some(split));
    let seq: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ").map_err(|e| tok_err(src, e.to_string()))?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    tok.with_decoder(Some(DecoderSequence::new(seq)));
    Ok(tok)
}

/// A SentencePiece-style byte-fallback BPE tokenizer (pieces use `▁` for
/// spaces, bytes are `<0xXX>` tokens), built the way transformers'
/// `GGUFLlamaConverter` does: Metaspace pre-tokenizer (prepending `▁` to the
/// first word when `add_prefix_space`), decoder Replace(`▁`, ` `) +
/// ByteFallback + Fuse (+ Strip of the prefix space).
///
/// # Errors
/// [`StudioError::Tokenizer`] naming `src` when the BPE model is invalid.
pub fn spm_tokenizer(
    vocab: Vocab,
    merges: Vec<(String, String)>,
    unk: Option<&str>,
    add_prefix_space: bool,
    src: &str,
) -> Result<Tokenizer> {
    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).fuse_unk(true).byte_fallback(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk.to_string());
    }
    let bpe = builder.build().map_err(|e| tok_err(src, format!("building the BPE model: {e}")))?;
    let mut tok = Tokenizer::new(bpe);
    let scheme = if add_prefix_space { PrependScheme::First } else { PrependScheme::Never };
    tok.with_pre_tokenizer(Some(Metaspace::new('▁', scheme, false)));
    let mut seq: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ").map_err(|e| tok_err(src, e.to_string()))?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_prefix_space {
        seq.push(Strip::new(' ', 1, 0).into());
    }
    tok.with_decoder(Some(DecoderSequence::new(seq)));
    Ok(tok)
}

/// Adds control tokens (type 3) as special and user-defined ones (type 4)
/// as plain added tokens, as transformers' `add_gguf_special_tokens`.
fn add_special_tokens(tok: &mut Tokenizer, meta: &Meta, byte_level: bool) {
    let Some(types) = &meta.token_types else {
        return;
    };
    let alphabet: Option<std::collections::HashSet<char>> =
        byte_level.then(|| bytes_to_unicode().iter().copied().collect());
    let control: Vec<AddedToken> = meta
        .tokens
        .iter()
        .zip(types)
        .filter(|(t, &ty)| {
            ty == TOKEN_TYPE_CONTROL && alphabet.as_ref().is_none_or(|a| t.chars().all(|c| a.contains(&c)))
        })
        .map(|(t, _)| AddedToken::from(t.to_string(), true).normalized(false))
        .collect();
    if !control.is_empty() {
        tok.add_special_tokens(&control);
    }
    // Only those the model's vocabulary spells as the file does (Gemma's
    // respelled whitespace tokens are not re-added; transformers'
    // `token in vocab`).
    let user: Vec<AddedToken> = meta
        .tokens
        .iter()
        .zip(types)
        .filter(|(t, &ty)| ty == TOKEN_TYPE_USER_DEFINED && tok.token_to_id(t).is_some())
        .map(|(t, _)| AddedToken::from(t.to_string(), false).normalized(false))
        .collect();
    if !user.is_empty() {
        tok.add_tokens(&user);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet() {
        let m = bytes_to_unicode();
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[b'A' as usize], 'A');
        let set: std::collections::HashSet<char> = m.iter().copied().collect();
        assert_eq!(set.len(), 256);
    }

    #[test]
    fn merges_from_scores_order() {
        // Tokens: a b c ab bc abc with scores; "abc" splits as (a, bc) and (ab, c).
        let tokens = ["a", "b", "c", "ab", "bc", "abc"];
        let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0];
        let m = merges_from_scores(&tokens, &scores);
        let m: Vec<(&str, &str)> = m.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(m, vec![("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]);
    }
}
