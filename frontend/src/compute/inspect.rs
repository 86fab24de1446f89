//! The teaching view: which experts each token goes to at one layer (the
//! model's own top-k choices, with their routing weights), and the load per
//! expert counted from the same choices, so the colours and the load chart
//! agree (a tie among router logits is resolved once, by the model).

use std::ops::Range;

use burn::tensor::activation::softmax;
use moe_shared::model::{ForwardOptions, RoutingTrace, Trace};
use moe_shared::tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};

use super::progress::Progress;
use super::{cpu_model, encode, tokens};
use crate::store::Picked;
use crate::Cpu;

/// One token's routing at the layer: its `top_k` chosen experts, best
/// first, with the weights the layer mixes them with (softmax over the
/// chosen logits; they sum to 1).
pub type TokenRoute = Vec<(usize, f32)>;

/// Routing of a text at one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inspection {
    /// The text as the tokenizer decodes it, one span per token (with its
    /// leading space), or per group of byte tokens that together make one
    /// character: `(text, the routing of each token in the span)`.
    pub tokens: Vec<(String, Vec<TokenRoute>)>,
    /// Experts of the layer.
    pub experts: usize,
    /// Experts per token (`k`) at the layer.
    pub top_k: usize,
    /// Fraction of routed slots (top-k) per expert: the same choices as
    /// the colours.
    pub load: Vec<f64>,
    /// The MoE layers of the model.
    pub moe_layers: Vec<usize>,
}

/// Tokens per forward call (through the KV cache), for the progress.
const CHUNK: usize = 32;

/// The chosen experts and their weights, per token, of one layer's trace.
fn token_routes(r: &RoutingTrace<Cpu>) -> Vec<TokenRoute> {
    let k = r.top_k;
    let n = r.chosen.len() / k.max(1);
    let [_, e] = r.logits.dims();
    let logits: Vec<f32> = r.logits.clone().into_data().convert::<f32>().to_vec().expect("f32 logits");
    (0..n)
        .map(|t| {
            let chosen: Vec<usize> = r.chosen[t * k..(t + 1) * k].iter().map(|&c| c as usize).collect();
            let picked: Vec<f32> = chosen.iter().map(|&c| logits[t * e + c]).collect();
            let w = softmax(burn::tensor::Tensor::<Cpu, 1>::from_floats(picked.as_slice(), &Default::default()), 0);
            let w: Vec<f32> = w.into_data().convert::<f32>().to_vec().expect("f32 weights");
            chosen.into_iter().zip(w).collect()
        })
        .collect()
}

/// Routes `text` through `src` and reads layer `layer`'s choices; progress
/// in tokens.
///
/// # Errors
/// A dense model, no tokenizer, an empty text, a dense layer.
pub fn inspect(progress: &Progress, src: &Picked, text: &str, layer: usize) -> Result<Inspection, String> {
    let m = src.model();
    let moe = m
        .moe
        .as_ref()
        .ok_or_else(|| format!("{} is dense: pick an MoE (upcycle, route or MoErge first)", src.name()))?;
    let moe_layers: Vec<usize> = moe.layers.iter().enumerate().filter(|(_, s)| s.is_some()).map(|(l, _)| l).collect();
    if !moe_layers.contains(&layer) {
        return Err(format!("layer {layer} is not an MoE layer (MoE layers: {moe_layers:?})"));
    }
    let mut ids = encode(m, text, false)?;
    ids.truncate(m.config.max_position_embeddings.min(512));
    if ids.is_empty() {
        return Err("type some text to route".into());
    }
    let model = cpu_model(m)?;
    let mut cache = model.new_cache();
    let mut routes: Vec<TokenRoute> = Vec::with_capacity(ids.len());
    let (mut experts, mut top_k) = (0, 1);
    let mut counts: Vec<usize> = Vec::new();
    progress.step("routing the text", 0, ids.len() as u64, "tokens");
    for chunk in ids.chunks(CHUNK) {
        let mut trace: Trace<Cpu> = Trace::default();
        let _ = model.forward_hidden_with(tokens(chunk), Some(&mut cache), ForwardOptions::default(), Some(&mut trace));
        let r = trace.routing.get(layer).and_then(|r| r.as_ref()).ok_or("no routing recorded for this layer")?;
        (experts, top_k) = (r.counts.len(), r.top_k);
        counts.resize(experts, 0);
        counts.iter_mut().zip(&r.counts).for_each(|(c, n)| *c += n);
        routes.extend(token_routes(r));
        progress.step("routing the text", routes.len() as u64, ids.len() as u64, "tokens");
    }
    let tok = m.tokenizer.as_ref().ok_or("no tokenizer")?;
    let toks = token_spans(tok, &ids).into_iter().map(|(text, span)| (text, routes[span].to_vec())).collect();
    let total = counts.iter().sum::<usize>().max(1) as f64;
    Ok(Inspection {
        tokens: toks,
        experts,
        top_k,
        load: counts.iter().map(|&c| c as f64 / total).collect(),
        moe_layers,
    })
}

/// The text of each token as it reads in the decoded text: the tokenizer's
/// own decode of the ids up to and including the token, minus that of the
/// ids before it (so a token keeps its leading space, which decoding one
/// token alone strips). Byte-fallback tokens (`<0xE2>` ...) that only
/// together form one UTF-8 character are one span (up to 4 tokens); a byte
/// that forms no character stays `\u{FFFD}`.
pub fn token_spans(tok: &Tokenizer, ids: &[u32]) -> Vec<(String, Range<usize>)> {
    const PARTIAL: char = char::REPLACEMENT_CHARACTER;
    let dec = |r: &[u32]| tok.decode(r).unwrap_or_default();
    let mut out = Vec::new();
    let mut prefix = String::new();
    let mut i = 0;
    while i < ids.len() {
        let mut end = i + 1;
        let mut full = dec(&ids[..end]);
        if full.ends_with(PARTIAL) {
            // The following tokens complete the character only when they
            // are byte pieces themselves (each decodes to U+FFFD alone).
            for j in i + 2..=(i + 4).min(ids.len()) {
                if !dec(&ids[j - 1..j]).contains(PARTIAL) {
                    break;
                }
                let f = dec(&ids[..j]);
                if !f.ends_with(PARTIAL) {
                    (end, full) = (j, f);
                    break;
                }
            }
        }
        let text = match full.strip_prefix(prefix.as_str()) {
            Some(t) => t.to_string(),
            None => dec(&ids[i..end]),
        };
        let text = if text.is_empty() { format!("<{}>", ids[i]) } else { text };
        out.push((text, i..end));
        prefix = full;
        i = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use moe_shared::tokenizer::Llama2cTokenizer;

    /// A llama2.c vocabulary: <unk> <s> </s>, the 256 byte pieces, then
    /// `words` (scores rising, so longer merges win as their order says).
    fn vocab(words: &[&str]) -> Tokenizer {
        let mut pieces: Vec<Vec<u8>> = vec![b"<unk>".to_vec(), b"<s>".to_vec(), b"</s>".to_vec()];
        pieces.extend((0..=255u8).map(|b| format!("<0x{b:02X}>").into_bytes()));
        pieces.extend(words.iter().map(|w| w.as_bytes().to_vec()));
        let mut bytes = 16i32.to_le_bytes().to_vec();
        for (i, p) in pieces.iter().enumerate() {
            bytes.extend((i as f32).to_le_bytes());
            bytes.extend((p.len() as i32).to_le_bytes());
            bytes.extend(p);
        }
        Tokenizer::Llama2c(Llama2cTokenizer::parse(&bytes, pieces.len(), "tok.bin").unwrap())
    }

    fn texts(tok: &Tokenizer, text: &str) -> Vec<String> {
        let ids = tok.encode(text, false).unwrap();
        let spans = token_spans(tok, &ids);
        // The spans cover every token once, in order.
        assert_eq!(spans.iter().map(|(_, r)| r.len()).sum::<usize>(), ids.len());
        spans.into_iter().map(|(t, _)| t).collect()
    }

    #[test]
    fn tokens_keep_their_leading_space() {
        let tok = vocab(&[
            " ", "O", "n", "c", "e", "a", "d", "o", "g", ".", "On", "Onc", "Once", " Once", " a", "do", "dog", " dog",
        ]);
        let t = texts(&tok, "Once a dog.");
        assert_eq!(t, ["Once", " a", " dog", "."]);
        assert_eq!(t.concat(), tok.decode(&tok.encode("Once a dog.", false).unwrap()).unwrap());
    }

    #[test]
    fn split_characters_are_one_span() {
        // No piece for "á" (C3 A1) or "ő" (C5 91): byte fallback.
        let tok = vocab(&[" ", "r", "v", "z", " z"]);
        let ids = tok.encode("zárvő z", false).unwrap();
        let spans = token_spans(&tok, &ids);
        let t: Vec<&str> = spans.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(t.concat(), "zárvő z");
        assert!(t.contains(&"ő"), "{t:?}");
        let o = spans.iter().find(|(t, _)| t == "ő").unwrap();
        assert_eq!(o.1.len(), 2, "two byte tokens");
        assert!(!t.iter().any(|t| t.contains(char::REPLACEMENT_CHARACTER)), "{t:?}");
        // A lone byte that forms no character stays one replacement glyph per token.
        let lone = token_spans(&tok, &[3 + 0xC5, 3 + b'r' as u32]);
        assert_eq!(lone.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(), ["\u{FFFD}", "r"]);
    }

    /// The tester's text on the real stories260K vocabulary from
    /// `$MOE_STUDIO_DATA` (default `../shared/data` beside the repo);
    /// skipped when it is missing, except under `CI=true`, where that fails.
    #[test]
    fn stories260k_reads_with_spaces_and_whole_characters() {
        let dir = std::env::var("MOE_STUDIO_DATA").unwrap_or_else(|_| "../../shared/data".into());
        let Ok(bytes) = std::fs::read(format!("{dir}/models/stories260K/tok512.bin")) else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: no stories260K tokenizer at {dir}/models/stories260K/tok512.bin (set MOE_STUDIO_DATA)"
            );
            eprintln!("skipped: no stories260K in {dir}");
            return;
        };
        let tok = Tokenizer::Llama2c(Llama2cTokenizer::parse(&bytes, 512, "tok512.bin").unwrap());
        let text = "Once upon a time there was a dog. Egyszer volt egy árvíztűrő kutya.";
        let t = texts(&tok, text);
        assert_eq!(t.concat(), text, "{t:?}");
        assert!(t.iter().any(|x| x.starts_with(' ')), "{t:?}");
        for ch in ["á", "í", "ű", "ő"] {
            assert!(t.iter().any(|x| x.contains(ch)), "{ch} in {t:?}");
        }
        assert!(!t.concat().contains(char::REPLACEMENT_CHARACTER));
    }
}
