//! The tokenizer built from GGUF metadata: for SmolLM2 it must equal the
//! model's `tokenizer.json` (structure and ids on multilingual text, from
//! `golden/smollm2_tokenizer.json`), and decoding must round-trip. A tiny
//! synthetic SentencePiece ("llama") vocabulary checks byte fallback,
//! the ▁ space marker, merges recovered from scores and BOS handling.

use crate::common;

use moe_shared::checkpoint::gguf;
use moe_shared::tensor_io::Bytes;
use moe_shared::tokenizer::gguf::{build_tokenizer, tokenizer_from_gguf};
use tokenizers::Tokenizer;

use common::{GgufWriter, V};

fn smollm2() -> Option<(Tokenizer, Tokenizer)> {
    let path = common::smollm2_gguf()?;
    let data = common::data_dir()?;
    let json_path = common::require(
        data.join("models/smollm2-135m-instruct/tokenizer.json"),
        "SmolLM2 tokenizer.json",
        "shared data",
    )?;
    let m = gguf::open(Bytes::map_file(&path).unwrap(), &path.display().to_string()).unwrap();
    let (ours, warnings) = build_tokenizer(&m).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let reference = Tokenizer::from_file(&json_path).unwrap();
    Some((ours, reference))
}

#[test]
fn smollm2_tokenizer_json_is_reproduced() {
    let Some((ours, reference)) = smollm2() else {
        return;
    };
    let a: serde_json::Value = serde_json::from_str(&ours.to_string(false).unwrap()).unwrap();
    let b: serde_json::Value = serde_json::from_str(&reference.to_string(false).unwrap()).unwrap();
    for key in ["normalizer", "pre_tokenizer", "post_processor", "decoder", "added_tokens", "truncation", "padding"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert_eq!(a["model"], b["model"], "model (vocab + merges)");
    assert_eq!(a, b);
}

#[test]
fn smollm2_ids_match_golden() {
    let Some(g) = common::golden_json("smollm2_tokenizer.json") else {
        return;
    };
    let Some((ours, reference)) = smollm2() else {
        return;
    };
    let entries = g["entries"].as_array().unwrap();
    let mut agree = 0;
    let mut total_ids = 0;
    for e in entries {
        let text = e["text"].as_str().unwrap();
        let expected: Vec<u32> =
            e["ids_tokenizer_json"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let ids = ours.encode(text, false).unwrap().get_ids().to_vec();
        let ref_ids = reference.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ref_ids, expected, "tokenizer.json vs Python on {}[{}]", e["lang"], e["line_index"]);
        assert_eq!(ids, expected, "GGUF tokenizer on {}[{}]", e["lang"], e["line_index"]);
        let decoded = ours.decode(&ids, false).unwrap();
        assert_eq!(decoded, text, "round trip {}[{}]", e["lang"], e["line_index"]);
        agree += 1;
        total_ids += ids.len();
    }
    eprintln!("{agree}/{} lines agree ({total_ids} ids)", entries.len());
    assert_eq!(agree, 18);

    // The prompt of the forward-pass golden, and special tokens.
    if let Some(p) = common::golden_json("smollm2_prompt.json") {
        let expected: Vec<u32> =
            p["expected_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let prompt = p["prompt"].as_str().unwrap();
        assert_eq!(ours.encode(prompt, true).unwrap().get_ids(), &expected[..]);
    }
    let chat = "<|im_start|>user\nHi 2024!<|im_end|>\n";
    assert_eq!(ours.encode(chat, false).unwrap().get_ids(), reference.encode(chat, false).unwrap().get_ids());
    assert_eq!(ours.encode(chat, false).unwrap().get_ids()[0], 1);
}

/// A SentencePiece-style vocabulary: `<unk> <s> </s>`, 256 byte tokens, then
/// pieces with scores (no merges stored, so they come from the scores).
fn spm_file(add_bos: Option<bool>) -> Vec<u8> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let pieces = [
        "▁",
        "h",
        "e",
        "l",
        "o",
        "w",
        "r",
        "d",
        "▁h",
        "ll",
        "llo",
        "ello",
        "▁hello",
        "▁w",
        "or",
        "▁wor",
        "▁world",
        "ld",
        "▁▁",
        "▁▁▁",
        "he",
        "lo",
        "wo",
        "rld",
    ];
    let mut scores = vec![0f32; tokens.len()];
    for (i, p) in pieces.iter().enumerate() {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(-(i as f32));
    }
    let n = tokens.len();
    let mut w = GgufWriter::default()
        .kv("general.architecture", V::Str("llama".into()))
        .kv("tokenizer.ggml.model", V::Str("llama".into()))
        .kv("tokenizer.ggml.tokens", V::StrArr(tokens))
        .kv("tokenizer.ggml.scores", V::F32Arr(scores))
        .kv("tokenizer.ggml.token_type", V::I32Arr(types))
        .kv("tokenizer.ggml.bos_token_id", V::U32(1))
        .kv("tokenizer.ggml.eos_token_id", V::U32(2))
        .kv("tokenizer.ggml.unknown_token_id", V::U32(0));
    if let Some(b) = add_bos {
        w = w.kv("tokenizer.ggml.add_bos_token", V::Bool(b));
    }
    assert!(n > 259);
    w.build()
}

#[test]
fn spm_llama_tokenizer() {
    let m = gguf::open(Bytes::from_vec(spm_file(None)), "spm.gguf").unwrap();
    let tok = tokenizer_from_gguf(&m).unwrap();
    let enc = tok.encode("hello world", true).unwrap();
    assert_eq!(enc.get_tokens(), &["<s>", "▁hello", "▁world"]);
    assert_eq!(tok.decode(enc.get_ids(), true).unwrap(), "hello world");
    // Byte fallback for characters outside the vocabulary.
    let enc = tok.encode("hé", false).unwrap();
    assert_eq!(enc.get_tokens(), &["▁h", "<0xC3>", "<0xA9>"]);
    assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), "hé");
    // Control tokens are special and kept whole.
    let enc = tok.encode("</s>hello", false).unwrap();
    assert_eq!(enc.get_tokens()[0], "</s>");
    // add_bos_token = false turns BOS off.
    let m = gguf::open(Bytes::from_vec(spm_file(Some(false))), "spm.gguf").unwrap();
    let tok = tokenizer_from_gguf(&m).unwrap();
    assert_eq!(tok.encode("hello", true).unwrap().get_tokens(), &["▁hello"]);
}

/// Ids from transformers 5.24 (`AutoTokenizer.from_pretrained(dir,
/// gguf_file=...)`, tokenizers 0.23.3) on the same vocabulary written by
/// gguf-py's `GGUFWriter` with `add_space_prefix = true`: (text, ids with
/// special tokens, decode of the ids without).
const SPM_TRANSFORMERS: &[(&str, &[u32], &str)] = &[
    ("hello world", &[1, 271, 275], "hello world"),
    ("  hello  world", &[1, 259, 271, 259, 275], " hello  world"),
    (" hello", &[1, 271], "hello"),
    ("hé\nworld!", &[1, 267, 198, 172, 13, 264, 273, 276, 36], "hé\nworld!"),
    ("</s>hello<s> world", &[1, 2, 260, 270, 1, 275], "</s>hello<s> world"),
    ("hello</s>", &[1, 271, 2], "hello</s>"),
    ("worldhello   ", &[1, 275, 260, 270, 278], "worldhello   "),
];

#[test]
fn spm_llama_tokenizer_matches_transformers() {
    let m = gguf::open(Bytes::from_vec(spm_file(None)), "spm.gguf").unwrap();
    let tok = tokenizer_from_gguf(&m).unwrap();
    for (text, ids, decoded) in SPM_TRANSFORMERS {
        let enc = tok.encode(*text, true).unwrap();
        assert_eq!(enc.get_ids(), *ids, "{text:?}");
        let plain = tok.encode(*text, false).unwrap();
        assert_eq!(plain.get_ids(), &ids[1..], "{text:?}");
        assert_eq!(tok.decode(plain.get_ids(), false).unwrap(), *decoded, "{text:?}");
    }
}

/// The ids `perplexity --text` and `logits --text` score
/// (`eval::text_ids`) are transformers' `tokenizer(text)`: the vocabulary's
/// own BOS first when its `tokenizer.ggml.add_bos_token` is true (Gemma 3
/// 270M's GGUF says true, `<bos>` = 2: golden `synthetic.gemma3`, made
/// with `add_special_tokens=True`), nothing when it is false. Before the
/// fix the studio tokenized `--text` without special tokens and differed
/// from transformers at index 0 on Gemma.
#[test]
fn text_ids_start_with_the_bos_the_vocabulary_adds() {
    use moe_shared::eval::text_ids;
    use moe_shared::tokenizer::Tokenizer as StudioTokenizer;
    let studio = |bytes: Vec<u8>| {
        StudioTokenizer::Hf(Box::new(
            tokenizer_from_gguf(&gguf::open(Bytes::from_vec(bytes), "t.gguf").unwrap()).unwrap(),
        ))
    };
    let (bos, no_bos) = (studio(spm_file(Some(true))), studio(spm_file(Some(false))));
    for (text, ids, _) in SPM_TRANSFORMERS {
        assert_eq!(text_ids(&bos, text).unwrap(), ids.to_vec(), "{text:?}");
        assert_eq!(text_ids(&no_bos, text).unwrap(), ids[1..].to_vec(), "{text:?}");
    }
    let Some(g) = common::golden_json("gguf_tokenizers.json") else {
        return;
    };
    let s = &g["synthetic"];
    let gemma = studio(synthetic_file("gemma3"));
    for (line, want) in s["lines"].as_array().unwrap().iter().zip(golden_ids(&s["gemma3"])) {
        let got = text_ids(&gemma, line.as_str().unwrap()).unwrap();
        assert_eq!(got[0], 2, "{line}: Gemma's <bos> first");
        assert_eq!(got, want, "{line}");
    }
}

#[test]
fn unsupported_tokenizer_model_is_named() {
    let bytes = GgufWriter::default()
        .kv("tokenizer.ggml.model", V::Str("t5".into()))
        .kv("tokenizer.ggml.tokens", V::StrArr(vec!["a".into()]))
        .build();
    let m = gguf::open(Bytes::from_vec(bytes), "t5.gguf").unwrap();
    let e = tokenizer_from_gguf(&m).unwrap_err().to_string();
    assert!(e.contains("t5.gguf") && e.contains("t5") && e.contains("gpt2"), "{e}");
}

#[test]
fn unknown_pre_tokenizer_warns() {
    let bytes = GgufWriter::default()
        .kv("tokenizer.ggml.model", V::Str("gpt2".into()))
        .kv("tokenizer.ggml.pre", V::Str("mystery".into()))
        .kv("tokenizer.ggml.tokens", V::StrArr(vec!["a".into(), "b".into(), "ab".into()]))
        .kv("tokenizer.ggml.merges", V::StrArr(vec!["a b".into()]))
        .build();
    let m = gguf::open(Bytes::from_vec(bytes), "x.gguf").unwrap();
    let (tok, warnings) = build_tokenizer(&m).unwrap();
    assert!(warnings.len() == 1 && warnings[0].contains("mystery"), "{warnings:?}");
    assert_eq!(tok.encode("ab", false).unwrap().get_ids(), &[2]);
}

/// The ids transformers gives (`tests/reference/make_tokenizer_golden.py`).
fn golden_ids(v: &serde_json::Value) -> Vec<Vec<u32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|ids| ids.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect())
        .collect()
}

/// `make_tokenizer_golden.py`'s `synthetic_vocab` as GGUF architecture `arch`.
fn synthetic_file(arch: &str) -> Vec<u8> {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"].map(String::from).to_vec();
    let mut types = vec![3, 3, 3, 2];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let mut scores = vec![0f32; tokens.len()];
    for (i, p) in ["▁", "a", "b", "c", "bc", "ab", "▁a", "  ", "▁▁", "ca", "▁ab", "\n"].iter().enumerate() {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(i as f32);
    }
    GgufWriter::default()
        .kv("general.architecture", V::Str(arch.into()))
        .kv("tokenizer.ggml.model", V::Str("llama".into()))
        .kv("tokenizer.ggml.tokens", V::StrArr(tokens))
        .kv("tokenizer.ggml.scores", V::F32Arr(scores))
        .kv("tokenizer.ggml.token_type", V::I32Arr(types))
        .kv("tokenizer.ggml.bos_token_id", V::U32(2))
        .kv("tokenizer.ggml.eos_token_id", V::U32(1))
        .kv("tokenizer.ggml.unknown_token_id", V::U32(3))
        .kv("tokenizer.ggml.padding_token_id", V::U32(0))
        .build()
}

/// The per-family SentencePiece rules on a vocabulary whose token order and
/// scores disagree: Gemma merges by token order and respells the all-space
/// token `"  "` as `▁▁`; Phi-3 keeps every leading space (prefix `▁` in the
/// normalizer); Llama merges by score with `Metaspace`. Ids equal
/// transformers' (golden `synthetic`); each family gives other ids than
/// the Llama rules would on some line, so a wrong rule fails here.
#[test]
fn family_spm_rules_match_transformers() {
    let Some(g) = common::golden_json("gguf_tokenizers.json") else {
        return;
    };
    let s = &g["synthetic"];
    let lines: Vec<&str> = s["lines"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    let llama = golden_ids(&s["llama"]);
    for arch in ["gemma3", "phi3", "llama"] {
        let m = gguf::open(Bytes::from_vec(synthetic_file(arch)), &format!("{arch}.gguf")).unwrap();
        let tok = tokenizer_from_gguf(&m).unwrap();
        let want = golden_ids(&s[arch]);
        for (line, ids) in lines.iter().zip(&want) {
            assert_eq!(tok.encode(*line, true).unwrap().get_ids(), ids.as_slice(), "{arch}: {line:?}");
        }
        if arch != "llama" {
            assert_ne!(want, llama, "{arch}: the golden must tell the family's rules from Llama's");
        }
    }
}

/// Real vocabularies per family (Gemma 3 270M's GGUF; llama.cpp's Phi-3 and
/// Qwen2/Qwen3 vocabulary files; `tests/reference/fetch_family_ggufs.sh`):
/// ids equal transformers' on English, Hungarian, Greek, Chinese, code and
/// whitespace lines. Skipped (with a note) when the files are not fetched,
/// unless `MOE_STUDIO_REQUIRE_FAMILY_GGUFS=1`.
#[test]
fn family_tokenizers_match_transformers() {
    let Some(g) = common::golden_json("gguf_tokenizers.json") else {
        return;
    };
    let dir = match std::env::var_os("MOE_STUDIO_FAMILY_GGUFS") {
        Some(d) => std::path::PathBuf::from(d),
        None => common::cache_dir().join("family-ggufs"),
    };
    let required = std::env::var("MOE_STUDIO_REQUIRE_FAMILY_GGUFS").is_ok_and(|v| v == "1");
    let lines: Vec<&str> = g["lines"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    for (family, f) in g["files"].as_object().unwrap() {
        let path = dir.join(f["file"].as_str().unwrap());
        if !path.exists() {
            assert!(!required, "{}: missing (run tests/reference/fetch_family_ggufs.sh)", path.display());
            eprintln!("skipping {family}: {} not fetched (tests/reference/fetch_family_ggufs.sh)", path.display());
            continue;
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), f["bytes"].as_u64().unwrap(), "{}", path.display());
        let m = gguf::open(Bytes::map_file(&path).unwrap(), &path.display().to_string()).unwrap();
        let (tok, warnings) = build_tokenizer(&m).unwrap();
        assert!(warnings.is_empty(), "{family}: {warnings:?}");
        let want = golden_ids(&f["ids"]);
        let mut same = 0;
        for (line, ids) in lines.iter().zip(&want) {
            let got = tok.encode(*line, true).unwrap().get_ids().to_vec();
            if got == *ids {
                same += 1;
            } else {
                eprintln!("{family}: {line:?}\n  ours         {got:?}\n  transformers {ids:?}");
            }
        }
        eprintln!("{family}: {same}/{} lines with transformers' ids", lines.len());
        assert_eq!(same, lines.len(), "{family}");
    }
}
