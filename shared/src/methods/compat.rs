//! Can two dense models be merged? Architecture and tokenizer checks for
//! MoErging (DUME, methods.md §2: "all N models share one architecture").
//!
//! Architecture: every field that changes the computation must agree
//! (family, sizes, heads, RoPE, norm epsilon, biases, tied head). The
//! vocabulary size may differ — a fine-tune can grow the vocabulary — and
//! is aligned later with a warning; `max_position_embeddings` and BOS/EOS
//! ids may differ with a warning (the first model's are kept).
//!
//! Tokenizer: identical serialisations pass. Otherwise the two vocabularies
//! are compared id by id: if one is a prefix of the other (a grown
//! vocabulary) the merge goes on with a warning; if a token id means
//! different pieces in the two, the merge is refused, naming both models and
//! the first differing id.

use crate::config::{Architecture, ModelConfig};
use crate::error::{Result, StudioError};
use crate::tokenizer::Tokenizer;

/// Checks that `b` has the architecture of `a`; returns warnings for the
/// tolerated differences.
///
/// # Errors
/// [`StudioError::Config`] naming both models and the first differing field.
pub fn check_architecture(a_name: &str, a: &ModelConfig, b_name: &str, b: &ModelConfig) -> Result<Vec<String>> {
    // Llama, Mistral (its sliding window ignored) and Qwen2 (q/k/v biases: `attention_bias`,
    // compared below) compute the same blocks: a Mixtral made by mergekit-moe from Llama
    // experts records `mistral` as its dense type, and its experts are Llamas.
    let block = |c: &ModelConfig| match c.architecture {
        Architecture::Llama | Architecture::Mistral | Architecture::Qwen2 => "llama, mistral or qwen2".to_string(),
        other => other.model_type().to_string(),
    };
    if block(a) != block(b) {
        return Err(StudioError::config(
            b_name,
            format!(
                "cannot merge models of different architectures: `model_type` is {} here but {} in {a_name} \
                 (MoErging needs models fine-tuned from one base)",
                b.architecture.model_type(),
                a.architecture.model_type()
            ),
        ));
    }
    let fields: [(&str, String, String); 11] = [
        ("hidden_size", a.hidden_size.to_string(), b.hidden_size.to_string()),
        ("intermediate_size", a.intermediate_size.to_string(), b.intermediate_size.to_string()),
        ("num_hidden_layers", a.num_layers.to_string(), b.num_layers.to_string()),
        ("num_attention_heads", a.num_heads.to_string(), b.num_heads.to_string()),
        ("num_key_value_heads", a.num_kv_heads.to_string(), b.num_kv_heads.to_string()),
        ("head_dim", a.head_dim.to_string(), b.head_dim.to_string()),
        ("rms_norm_eps", a.rms_norm_eps.to_string(), b.rms_norm_eps.to_string()),
        ("rope_theta", a.rope_theta.to_string(), b.rope_theta.to_string()),
        ("rope_scaling", format!("{:?}", a.rope_scaling), format!("{:?}", b.rope_scaling)),
        ("tie_word_embeddings", a.tie_word_embeddings.to_string(), b.tie_word_embeddings.to_string()),
        ("attention_bias", a.attention_bias.to_string(), b.attention_bias.to_string()),
    ];
    for (field, x, y) in fields {
        if x != y {
            return Err(StudioError::config(
                b_name,
                format!(
                    "cannot merge models of different architectures: `{field}` is {y} here but {x} in {a_name} \
                     (MoErging needs models fine-tuned from one base)"
                ),
            ));
        }
    }
    let mut warnings = Vec::new();
    if a.vocab_size != b.vocab_size {
        warnings.push(format!(
            "{b_name} has a vocabulary of {} tokens, {a_name} of {}: vocabulary-sized tensors are aligned to the \
             first model ({a_name})",
            b.vocab_size, a.vocab_size
        ));
    }
    if a.max_position_embeddings != b.max_position_embeddings {
        warnings.push(format!(
            "max_position_embeddings differs ({a_name}: {}, {b_name}: {}); keeping {}",
            a.max_position_embeddings, b.max_position_embeddings, a.max_position_embeddings
        ));
    }
    if (a.bos_token_id, a.eos_token_id) != (b.bos_token_id, b.eos_token_id) {
        warnings.push(format!(
            "BOS/EOS ids differ ({a_name}: {:?}/{:?}, {b_name}: {:?}/{:?}); keeping the first model's",
            a.bos_token_id, a.eos_token_id, b.bos_token_id, b.eos_token_id
        ));
    }
    Ok(warnings)
}

/// Checks that `b`'s tokenizer is `a`'s (or a grown version of it, or `a`
/// grown); returns a warning when they are not identical but compatible, or
/// when one model has no tokenizer to compare.
///
/// # Errors
/// [`StudioError::Tokenizer`] naming both models and the first id whose
/// piece differs.
pub fn check_tokenizer(
    a_name: &str,
    a: Option<&Tokenizer>,
    b_name: &str,
    b: Option<&Tokenizer>,
) -> Result<Option<String>> {
    let (a, b) = match (a, b) {
        (Some(a), Some(b)) => (a, b),
        (None, None) => return Ok(None),
        _ => {
            return Ok(Some(format!(
                "only one of {a_name} and {b_name} has a tokenizer; their vocabularies could not be compared"
            )))
        }
    };
    if let (Some(x), Some(y)) = (a.to_hf_json(), b.to_hf_json()) {
        if x == y {
            return Ok(None);
        }
    }
    let (pa, pb) = (a.hf_pieces(), b.hf_pieces());
    if let Some(id) = pa.iter().zip(&pb).position(|(x, y)| x != y) {
        let show =
            |p: &Option<Vec<u8>>| p.as_ref().map(|p| String::from_utf8_lossy(p).into_owned()).unwrap_or_default();
        return Err(StudioError::Tokenizer {
            source_name: format!("{a_name} vs {b_name}"),
            what: format!(
                "the models use different tokenizers: token {id} is {:?} in {a_name} but {:?} in {b_name} \
                 (MoErging needs one tokenizer)",
                show(&pa[id]),
                show(&pb[id])
            ),
        });
    }
    Ok(Some(if pa.len() == pb.len() {
        format!("the tokenizers of {a_name} and {b_name} share their vocabulary but differ in other settings; using the first")
    } else {
        format!(
            "the tokenizers of {a_name} ({} tokens) and {b_name} ({} tokens) agree on their common ids \
             (a grown vocabulary); using the first",
            pa.len(),
            pb.len()
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HfConfig;

    fn cfg(extra: &str) -> ModelConfig {
        let json = format!(
            r#"{{"model_type":"llama","vocab_size":32,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":2,
            "num_attention_heads":2,"num_key_value_heads":1{extra}}}"#
        );
        HfConfig::from_json(json.as_bytes(), "c").unwrap().to_model_config("c").unwrap()
    }

    #[test]
    fn architecture_mismatch_names_both_models_and_the_field() {
        let e = check_architecture("a.bin", &cfg(""), "b.bin", &cfg(r#","rope_theta":500000"#)).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("a.bin") && e.contains("b.bin") && e.contains("rope_theta"), "{e}");
        let w = check_architecture("a", &cfg(""), "b", &cfg(r#","max_position_embeddings":64"#)).unwrap();
        assert_eq!(w.len(), 1);
        // A Mistral of the same shapes computes a Llama's blocks (mergekit-moe's Mixtral of
        // Llama experts records `mistral`); another block family is refused by model_type.
        let mut mistral = cfg("");
        mistral.architecture = Architecture::Mistral;
        assert!(check_architecture("moe", &mistral, "dense", &cfg("")).unwrap().is_empty());
        let mut qwen3 = cfg("");
        qwen3.architecture = Architecture::Qwen3;
        let e = check_architecture("moe", &qwen3, "dense", &cfg("")).unwrap_err().to_string();
        assert!(e.contains("`model_type` is llama here but qwen3 in moe"), "{e}");
    }

    #[test]
    fn vocab_growth_is_a_warning() {
        let mut big = cfg("");
        big.vocab_size = 40;
        let w = check_architecture("a", &cfg(""), "b", &big).unwrap();
        assert!(w[0].contains("aligned"), "{w:?}");
    }
}
