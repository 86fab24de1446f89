//! stories260K (llama2.c) end to end: header parsing, tokenizer and greedy
//! generation against the reference text of llama2.c's `run.c`.

use crate::common;

use moe_shared::checkpoint::{open_model, ModelFormat};
use moe_shared::generate::{generate, Sampling};
use moe_shared::model::load_model;
use moe_shared::CpuBackend;

type B = CpuBackend;

#[test]
fn greedy_generation_reproduces_llama2c() {
    let Some(path) = common::data_file("models/stories260K/stories260K.bin") else {
        return;
    };
    let m = open_model(&path).unwrap();
    assert_eq!(m.format, ModelFormat::Llama2c);
    let c = &m.config;
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.vocab_size),
        (64, 172, 5, 8, 4, 512)
    );
    assert!(c.tie_word_embeddings);
    let tok = m.tokenizer.as_ref().expect("tok512.bin found beside the model");
    let prompt = tok.encode("Once upon a time", true).unwrap();
    assert_eq!(prompt[0], 1, "BOS first");
    let device = Default::default();
    let model = load_model::<B>(&m, &device).unwrap();
    let new = generate(&model, &prompt, 40, Sampling::default(), None, &device).unwrap();
    let mut all = prompt.clone();
    all.extend(&new);
    let text = tok.decode(&all).unwrap();
    assert!(text.starts_with("Once upon a time, there was a little girl named Lily."), "got: {text:?}");
}

#[test]
fn kv_cache_matches_full_forward() {
    let Some(path) = common::data_file("models/stories260K/stories260K.bin") else {
        return;
    };
    let m = open_model(&path).unwrap();
    let device = Default::default();
    let model = load_model::<B>(&m, &device).unwrap();
    use burn::tensor::{Int, Tensor, TensorData};
    let ids: Vec<i64> = vec![1, 403, 407, 261, 378, 275, 300, 30, 280];
    let n = ids.len();
    let full = model.forward(Tensor::<B, 2, Int>::from_data(TensorData::new(ids.clone(), [1, n]), &device), None);
    let full_last: Vec<f32> = full.narrow(1, n - 1, 1).into_data().to_vec().unwrap();
    let mut cache = model.new_cache();
    let _ = model
        .forward(Tensor::<B, 2, Int>::from_data(TensorData::new(ids[..5].to_vec(), [1, 5]), &device), Some(&mut cache));
    let inc = model.forward_last(
        Tensor::<B, 2, Int>::from_data(TensorData::new(ids[5..].to_vec(), [1, n - 5]), &device),
        Some(&mut cache),
    );
    let inc: Vec<f32> = inc.into_data().to_vec().unwrap();
    let max = full_last.iter().zip(&inc).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(max < 1e-4, "cached vs full max diff {max}");
}

#[test]
fn tokenizer_round_trips_and_uses_byte_fallback() {
    let Some(path) = common::data_file("models/stories260K/stories260K.bin") else {
        return;
    };
    let m = open_model(&path).unwrap();
    let tok = m.tokenizer.unwrap();
    for text in ["Once upon a time", "Lily's dog ran fast!", "naïve café ☕"] {
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
    // A character outside the 512-token vocabulary falls back to bytes (3 + byte).
    let ids = tok.encode("☕", false).unwrap();
    assert!(ids.contains(&(0xE2 + 3)), "{ids:?}");
}

#[test]
fn llama2c_vocabulary_converts_to_an_equivalent_hf_tokenizer() {
    let Some(path) = common::data_file("models/stories260K/stories260K.bin") else { return };
    let m = open_model(&path).unwrap();
    let tok = m.tokenizer.unwrap();
    let json = tok.to_hf_json().expect("tokenizer.json");
    let hf = moe_shared::tokenizer::Tokenizer::from_hf_json(json.as_bytes(), "converted").unwrap();
    let mut lines = 0;
    for rel in ["corpora/lang/en/valid.txt", "corpora/lang/hu/valid.txt", "corpora/lang/el/valid.txt"] {
        let Some(p) = common::data_file(rel) else { return };
        for line in std::fs::read_to_string(p).unwrap().lines().take(20) {
            let line: String = line.chars().take(300).collect();
            assert_eq!(hf.encode(&line, false).unwrap(), tok.encode(&line, false).unwrap(), "{rel}: {line:?}");
            assert_eq!(hf.encode(&line, true).unwrap(), tok.encode(&line, true).unwrap(), "{rel}: {line:?} (BOS)");
            assert_eq!(hf.decode(&hf.encode(&line, false).unwrap()).unwrap(), line);
            lines += 1;
        }
    }
    assert_eq!(lines, 60);
}

#[test]
fn llama2c_vocabulary_is_compatible_with_its_converted_tokenizer() {
    // A `.bin` and a converted copy (even one written before tokenizer.json
    // had the BOS post-processor) share one vocabulary: MoErge must accept
    // them (the pieces used to compare raw bytes with `▁`/`<0x00>` pieces).
    use moe_shared::methods::compat::check_tokenizer;
    use moe_shared::tokenizer::Tokenizer;
    let Some(path) = common::data_file("models/stories260K/stories260K.bin") else { return };
    let tok = open_model(&path).unwrap().tokenizer.unwrap();
    let Tokenizer::Llama2c(l) = &tok else { panic!("llama2.c tokenizer expected") };
    let mut old = l.to_hf("test").unwrap();
    old.with_post_processor(None::<tokenizers::processors::PostProcessorWrapper>);
    let old = Tokenizer::Hf(Box::new(old));
    let same = Tokenizer::from_hf_json(tok.to_hf_json().unwrap().as_bytes(), "converted").unwrap();
    assert_eq!(check_tokenizer("bin", Some(&tok), "converted", Some(&same)).unwrap(), None);
    let w = check_tokenizer("bin", Some(&tok), "old", Some(&old)).unwrap();
    assert!(w.is_some_and(|w| w.contains("share their vocabulary")));
    // A token file made with one reads with the other: their fingerprints agree (the vocabulary
    // hash spells pieces as Hugging Face does).
    use moe_shared::corpus::token_file::TokenizerFingerprint;
    let (a, b) = (TokenizerFingerprint::of(&tok).unwrap(), TokenizerFingerprint::of(&same).unwrap());
    assert_eq!(a.vocab_sha256, b.vocab_sha256);
    assert!(a.accepts(&b) && b.accepts(&a), "{a:?} {b:?}");
}

/// A directory without config.json opens its one llama2.c `.bin` (the
/// `tok*.bin` beside it is a tokenizer, not a candidate); with two
/// candidates the error lists them; with none it asks for config.json.
#[test]
fn directory_without_config_opens_its_single_model_file() {
    let Some(path) = common::data_file("models/stories260K/stories260K.bin") else {
        return;
    };
    let dir = path.parent().unwrap();
    let m = open_model(dir).unwrap();
    assert_eq!(m.format, ModelFormat::Llama2c);
    assert!(m.path.ends_with("stories260K.bin"), "{}", m.path);
    assert_eq!(m.config.vocab_size, 512);
    assert!(m.tokenizer.is_some(), "tok512.bin found beside the model");

    let two = tempfile::tempdir().unwrap();
    std::fs::copy(&path, two.path().join("a.bin")).unwrap();
    std::fs::copy(&path, two.path().join("b.bin")).unwrap();
    std::fs::copy(dir.join("tok512.bin"), two.path().join("tok512.bin")).unwrap();
    std::fs::write(two.path().join("c.gguf"), b"GGUF").unwrap();
    let e = open_model(two.path()).expect_err("several candidates").to_string();
    assert!(e.contains("a.bin, b.bin, c.gguf") && !e.contains("tok512"), "{e}");

    std::fs::remove_file(two.path().join("b.bin")).unwrap();
    std::fs::remove_file(two.path().join("c.gguf")).unwrap();
    let m = open_model(two.path()).unwrap();
    assert!(m.path.ends_with("a.bin") && m.tokenizer.is_some(), "{}", m.path);

    let none = tempfile::tempdir().unwrap();
    std::fs::write(none.path().join("tokenizer.bin"), b"x").unwrap();
    let e = open_model(none.path()).expect_err("no candidate").to_string();
    assert!(e.contains("config.json") && e.contains("exactly one"), "{e}");
}
