//! The reverse of [`super::gguf`]: a Hugging Face `tokenizer.json` written
//! as GGUF `tokenizer.ggml.*` metadata (`convert --to gguf`), the way
//! llama.cpp's `convert_hf_to_gguf.py` (`_set_vocab_gpt2`) does.
//!
//! Supported: byte-level BPE (`model.type = "BPE"` with a `ByteLevel`
//! pre-tokenizer): `tokenizer.ggml.model = "gpt2"`, `tokens` (by id; the
//! byte-level spelling is kept, as llama.cpp stores it), `token_type` (1
//! normal, 3 control for special added tokens, 4 user-defined for other
//! added tokens, 5 unused for `[PAD{i}]` fill up to the model's vocabulary
//! size), `merges` (`"left right"`), `bos_token_id` / `eos_token_id` (from
//! the model's configuration), `add_bos_token` (whether the post-processor
//! prepends a special token) and `pre`, the llama.cpp name of the
//! pre-tokenizer — llama.cpp refuses a vocabulary whose `pre` it does not
//! know, so the name is recognised from the pre-tokenizer's structure
//! ([`pre_name`]) and an unknown one is refused.

use super::gguf::{LLAMA3_SPLIT, QWEN2_SPLIT};
use crate::config::ModelConfig;
use crate::error::{Result, StudioError};
use crate::tensor_io::gguf::{GgufArray, GgufValue};

/// GGUF token types (llama.cpp's `llama_token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

fn err(src: &str, what: impl Into<String>) -> StudioError {
    StudioError::Tokenizer { source_name: src.to_string(), what: what.into() }
}

/// The llama.cpp `tokenizer.ggml.pre` name of a `tokenizer.json`
/// pre-tokenizer, recognised by structure: `Sequence[Digits(individual),
/// ByteLevel]` → `smollm`; `Sequence[Split(Qwen2 regex), ByteLevel]` →
/// `qwen2`; `Sequence[Split(Llama 3 regex), ByteLevel]` → `llama-bpe`;
/// `ByteLevel` alone → `gpt-2`; anything else → `None`.
pub fn pre_name(pre: &serde_json::Value) -> Option<&'static str> {
    let ty = |v: &serde_json::Value| v.get("type").and_then(|t| t.as_str()).map(str::to_string);
    match ty(pre)?.as_str() {
        "ByteLevel" => Some("gpt-2"),
        "Sequence" => {
            let items = pre.get("pretokenizers")?.as_array()?;
            let kinds: Vec<String> = items.iter().filter_map(ty).collect();
            match kinds.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
                ["Digits", "ByteLevel"] => {
                    (items[0].get("individual_digits").and_then(|b| b.as_bool()) == Some(true)).then_some("smollm")
                }
                ["Split", "ByteLevel"] => {
                    let re = items[0].get("pattern").and_then(|p| p.get("Regex")).and_then(|r| r.as_str())?;
                    if re == QWEN2_SPLIT {
                        Some("qwen2")
                    } else if re == LLAMA3_SPLIT {
                        Some("llama-bpe")
                    } else {
                        None
                    }
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// The `tokenizer.ggml.*` metadata of `tokenizer_json` for a model of
/// configuration `config` (see the module docs).
///
/// # Errors
/// [`StudioError::Tokenizer`] naming `source_name` for a tokenizer that is
/// not byte-level BPE, a pre-tokenizer llama.cpp does not know by name, a
/// vocabulary with gaps in its ids or larger than the model's, or malformed
/// JSON.
pub fn gguf_tokenizer(
    tokenizer_json: &str,
    config: &ModelConfig,
    source_name: &str,
) -> Result<Vec<(String, GgufValue)>> {
    let v: serde_json::Value = serde_json::from_str(tokenizer_json).map_err(|e| err(source_name, e.to_string()))?;
    let model = v.get("model").ok_or_else(|| err(source_name, "tokenizer.json has no `model`"))?;
    if model.get("type").and_then(|t| t.as_str()) != Some("BPE") {
        return Err(err(source_name, "GGUF export supports byte-level BPE tokenizers only (`model.type` is not BPE)"));
    }
    let pre_json = v.get("pre_tokenizer").cloned().unwrap_or(serde_json::Value::Null);
    let pre = pre_name(&pre_json).ok_or_else(|| {
        err(
            source_name,
            format!(
                "the pre-tokenizer is not one llama.cpp knows by name (`tokenizer.ggml.pre`: smollm, qwen2, llama-bpe, \
                 gpt-2), so llama.cpp would refuse the file: {}",
                serde_json::to_string(&pre_json).unwrap_or_default().chars().take(200).collect::<String>()
            ),
        )
    })?;
    let vocab = model.get("vocab").and_then(|x| x.as_object()).ok_or_else(|| err(source_name, "no `model.vocab`"))?;
    let mut tokens: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: usize, tok: &str, ty: i32| {
        if tokens.len() <= id {
            tokens.resize(id + 1, None);
        }
        tokens[id] = Some((tok.to_string(), ty));
    };
    for (tok, id) in vocab {
        let id = id.as_u64().ok_or_else(|| err(source_name, format!("vocab entry `{tok}` has no integer id")))?;
        put(id as usize, tok, NORMAL);
    }
    for a in v.get("added_tokens").and_then(|x| x.as_array()).into_iter().flatten() {
        let (Some(id), Some(content)) =
            (a.get("id").and_then(|x| x.as_u64()), a.get("content").and_then(|x| x.as_str()))
        else {
            continue;
        };
        let special = a.get("special").and_then(|x| x.as_bool()).unwrap_or(false);
        put(id as usize, content, if special { CONTROL } else { USER_DEFINED });
    }
    if tokens.len() > config.vocab_size {
        return Err(err(
            source_name,
            format!("the tokenizer has {} tokens but the model's vocabulary has {}", tokens.len(), config.vocab_size),
        ));
    }
    tokens.resize(config.vocab_size, None);
    let mut names = Vec::with_capacity(tokens.len());
    let mut types = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.into_iter().enumerate() {
        let (name, ty) = t.unwrap_or_else(|| (format!("[PAD{i}]"), UNUSED));
        names.push(GgufValue::String(name));
        types.push(GgufValue::I32(ty));
    }
    let merges: Vec<GgufValue> = model
        .get("merges")
        .and_then(|m| m.as_array())
        .ok_or_else(|| err(source_name, "no `model.merges`"))?
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => Ok(GgufValue::String(s.clone())),
            serde_json::Value::Array(p) if p.len() == 2 => {
                Ok(GgufValue::String(format!("{} {}", p[0].as_str().unwrap_or(""), p[1].as_str().unwrap_or(""))))
            }
            other => Err(err(source_name, format!("merge {other} is neither \"a b\" nor [a, b]"))),
        })
        .collect::<Result<_>>()?;
    let add_bos = v
        .get("post_processor")
        .and_then(|p| p.get("single"))
        .and_then(|s| s.as_array())
        .and_then(|s| s.first())
        .is_some_and(|first| first.get("SpecialToken").is_some());
    let mut out = vec![
        ("tokenizer.ggml.model".to_string(), GgufValue::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), GgufValue::String(pre.into())),
        ("tokenizer.ggml.tokens".to_string(), GgufValue::Array(GgufArray::from_values(&names))),
        ("tokenizer.ggml.token_type".to_string(), GgufValue::Array(GgufArray::from_values(&types))),
        ("tokenizer.ggml.merges".to_string(), GgufValue::Array(GgufArray::from_values(&merges))),
    ];
    if let Some(b) = config.bos_token_id {
        out.push(("tokenizer.ggml.bos_token_id".into(), GgufValue::U32(b)));
    }
    if let Some(e) = config.eos_token_id {
        out.push(("tokenizer.ggml.eos_token_id".into(), GgufValue::U32(e)));
    }
    out.push(("tokenizer.ggml.add_bos_token".into(), GgufValue::Bool(add_bos)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_tokenizers_are_named_by_structure() {
        let smollm = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]});
        assert_eq!(pre_name(&smollm), Some("smollm"));
        let qwen = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]});
        assert_eq!(pre_name(&qwen), Some("qwen2"));
        assert_eq!(pre_name(&serde_json::json!({"type": "ByteLevel"})), Some("gpt-2"));
        assert_eq!(pre_name(&serde_json::json!({"type": "Whitespace"})), None);
    }
}
