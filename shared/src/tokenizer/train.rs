//! Training a small byte-level BPE tokenizer on local texts, for a model
//! trained from scratch (the fetched teaching preset of the browser studio,
//! issue 19 item 3, where no pretrained vocabulary small enough exists).
//!
//! The recipe is GPT-2's byte-level BPE (Radford et al. 2019, section 2.2;
//! the `tokenizers` crate's `BpeTrainer` with the `ByteLevel` alphabet, as
//! Hugging Face's `ByteLevelBPETokenizer.train`), with SmolLM2's digit
//! split in front (each digit its own pre-token, so numbers are read digit
//! by digit): every byte has a token, so any text encodes and decodes back
//! unchanged; `<|endoftext|>` is id 0 and marks document ends in training
//! ([`crate::corpus::document_separator`]); no BOS is added.

use crate::error::{Result, StudioError};
use crate::tokenizer::Tokenizer;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::AddedToken;

/// The end-of-document token (id 0) of a tokenizer from
/// [`train_byte_level_bpe`].
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// The smallest vocabulary [`train_byte_level_bpe`] accepts: the 256 byte
/// tokens and [`END_OF_TEXT`].
pub const MIN_BYTE_LEVEL_VOCAB: usize = 257;

/// A byte-level BPE tokenizer of `vocab_size` tokens (id 0
/// [`END_OF_TEXT`], the 256 byte tokens, then merges in order of pair
/// frequency) trained on `texts` (each item one document).
///
/// Fewer than `vocab_size` tokens come out only when the texts run out of
/// pairs to merge (tiny inputs); the result's
/// [`Tokenizer::vocab_size`] says how many.
///
/// # Errors
/// [`StudioError::Invalid`] when `vocab_size` is below
/// [`MIN_BYTE_LEVEL_VOCAB`]; [`StudioError::Tokenizer`] when training
/// fails.
pub fn train_byte_level_bpe<I, S>(texts: I, vocab_size: usize) -> Result<Tokenizer>
where
    I: Iterator<Item = S> + Send,
    S: AsRef<str> + Send,
{
    if vocab_size < MIN_BYTE_LEVEL_VOCAB {
        return Err(StudioError::Invalid(format!(
            "a byte-level BPE tokenizer needs at least {MIN_BYTE_LEVEL_VOCAB} tokens (256 bytes + {END_OF_TEXT}), \
             got a vocabulary of {vocab_size}"
        )));
    }
    let err = |e: tokenizers::Error| StudioError::Tokenizer {
        source_name: "byte-level BPE training".into(),
        what: e.to_string(),
    };
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(Sequence::new(vec![
        Digits::new(true).into(),
        ByteLevel::default().add_prefix_space(false).into(),
    ])));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    let trainer = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(END_OF_TEXT, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut trainer = TrainerWrapper::BpeTrainer(trainer);
    tok.train(&mut trainer, texts).map_err(err)?;
    Ok(Tokenizer::Hf(Box::new(tok)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Vec<String> {
        let mut docs = Vec::new();
        for i in 0..200 {
            docs.push(format!("the cat sat on the mat and the dog sat on the log number {i}"));
            docs.push(format!("a kutya a szőnyegen ült, és a macska is ott ült {i}"));
        }
        docs
    }

    #[test]
    fn trains_the_requested_vocabulary_and_round_trips_any_text() {
        let tok = train_byte_level_bpe(corpus().iter(), 300).unwrap();
        assert_eq!(tok.vocab_size(), 300);
        let Tokenizer::Hf(hf) = &tok else { panic!("not a Hugging Face tokenizer") };
        assert_eq!(hf.token_to_id(END_OF_TEXT), Some(0));
        // Frequent words became single tokens ("Ġ" is the byte-level space).
        assert!(hf.token_to_id("Ġthe").is_some(), "no merge for ' the'");
        assert!(hf.token_to_id("Ġsat").is_some(), "no merge for ' sat'");
        // Text the training never saw (other scripts, an emoji, tabs)
        // encodes into byte tokens and decodes back unchanged.
        for text in ["the cat sat on the mat", "Árvíztűrő tükörfúrógép\tλ = 1e-3 🙂", "x  =  [1, 22, 333]\n"]
        {
            let ids = tok.encode(text, false).unwrap();
            assert!(ids.iter().all(|&i| (i as usize) < 300 && i != 0), "{text:?}: {ids:?}");
            assert_eq!(tok.decode(&ids).unwrap(), text);
        }
        // Merges shorten the seen text well below one token per byte.
        let seen = "the cat sat on the mat and the dog sat on the log";
        assert!(tok.encode(seen, false).unwrap().len() * 3 < seen.len(), "{:?}", tok.encode(seen, false));
        // Digits are split one by one: "333" is three tokens.
        assert_eq!(tok.encode("333", false).unwrap().len(), 3);
        // No BOS/EOS added.
        assert_eq!(tok.encode("a", true).unwrap(), tok.encode("a", false).unwrap());
        // The tokenizer.json round-trips through the parser.
        let json = tok.to_hf_json().unwrap();
        let back = Tokenizer::from_hf_json(json.as_bytes(), "trained").unwrap();
        assert_eq!(back.encode(seen, false).unwrap(), tok.encode(seen, false).unwrap());
    }

    /// The merges of a trained tokenizer, in order, read back from its
    /// `tokenizer.json` (`model.merges`: `["a", "b"]` pairs, or `"a b"`
    /// strings in older files).
    fn merges(tok: &Tokenizer) -> Vec<(String, String)> {
        let json: serde_json::Value = serde_json::from_str(&tok.to_hf_json().unwrap()).unwrap();
        json["model"]["merges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| match m {
                serde_json::Value::Array(p) => (p[0].as_str().unwrap().into(), p[1].as_str().unwrap().into()),
                serde_json::Value::String(s) => {
                    let (a, b) = s.split_once(' ').unwrap();
                    (a.into(), b.into())
                }
                other => panic!("merge {other}"),
            })
            .collect()
    }

    #[test]
    fn merges_are_the_most_frequent_pairs_in_order() {
        // The word counts of Hugging Face's BPE walkthrough (NLP course,
        // chapter 6.5), one word per document (so no byte-level space
        // prefix): hug 10, pug 5, pun 12, bun 4, hugs 5. Pair counts:
        // u+g = 10 + 5 + 5 = 20, u+n = 12 + 4 = 16; after both, h+ug =
        // 10 + 5 = 15, then p+un = 12 (p+ug 5, ug+s 5, b+un 4).
        let mut docs = Vec::new();
        for (w, n) in [("hug", 10), ("pug", 5), ("pun", 12), ("bun", 4), ("hugs", 5)] {
            docs.extend(std::iter::repeat_n(w, n));
        }
        let tok = train_byte_level_bpe(docs.iter(), MIN_BYTE_LEVEL_VOCAB + 4).unwrap();
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(merges(&tok), [pair("u", "g"), pair("u", "n"), pair("h", "ug"), pair("p", "un")]);
        let Tokenizer::Hf(hf) = &tok else { panic!("not a Hugging Face tokenizer") };
        // Ids: <|endoftext|> 0, the 256 bytes 1..=256, the merges from 257 on.
        for (i, t) in ["ug", "un", "hug", "pun"].iter().enumerate() {
            assert_eq!(hf.token_to_id(t), Some(257 + i as u32), "{t}");
        }
        assert_eq!(tok.vocab_size(), 261);
        let id = |t: &str| hf.token_to_id(t).unwrap();
        assert_eq!(tok.encode("hugs", false).unwrap(), [id("hug"), id("s")]);
        assert_eq!(tok.encode("bun", false).unwrap(), [id("b"), id("un")]);
        assert_eq!(tok.decode(&[id("pun"), id("s")]).unwrap(), "puns");
        // Asked for more tokens than there are pairs seen twice: training
        // stops early (min_frequency 2) and says how many it made.
        let all = train_byte_level_bpe(docs.iter(), 1000).unwrap();
        assert!(all.vocab_size() < 1000 && all.vocab_size() >= 261, "{}", all.vocab_size());
        assert_eq!(merges(&all)[..4], merges(&tok)[..]);
    }

    #[test]
    fn training_is_deterministic() {
        let a = train_byte_level_bpe(corpus().iter(), 320).unwrap().to_hf_json().unwrap();
        let b = train_byte_level_bpe(corpus().iter(), 320).unwrap().to_hf_json().unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn a_vocabulary_below_the_bytes_is_refused() {
        let e = train_byte_level_bpe(corpus().iter(), 256).expect_err("refused").to_string();
        assert!(e.contains("at least 257") && e.contains("256"), "{e}");
    }
}
