//! Malformed GGUF input gives errors naming the file (and the key or
//! tensor), never a panic: truncation of a real header at many cut points,
//! flipped bytes, huge lengths and counts, tensors past the end of the file
//! or overlapping, unknown value types, non-UTF-8 strings, unsupported
//! tensor types; plus the Hugging Face view of a small synthetic llama and
//! qwen2 file (names, shapes, q/k un-permutation, config).

use crate::common;

use moe_shared::checkpoint::gguf::{self, GgufModel};
use moe_shared::config::Architecture;
use moe_shared::tensor_io::{Bytes, TensorSource};
use moe_shared::StudioError;

use common::{GgufWriter, V};

fn open(bytes: Vec<u8>, name: &str) -> moe_shared::Result<GgufModel> {
    gguf::open(Bytes::from_vec(bytes), name)
}

fn open_err(bytes: Vec<u8>, name: &str) -> StudioError {
    match std::panic::catch_unwind(|| open(bytes, name)) {
        Ok(Ok(_)) => panic!("{name}: expected an error"),
        Ok(Err(e)) => e,
        Err(_) => panic!("{name}: panicked"),
    }
}

/// A small but complete llama file: 2 heads of head_dim 4 (d = 8), 1 kv
/// head, f = 32 (Q8_0 for the FFN), vocab 4.
fn tiny_llama(arch: &str) -> GgufWriter {
    let d = 8u64;
    let f = 32u64;
    let seq = |n: usize, scale: f32| -> Vec<f32> { (0..n).map(|i| i as f32 * scale).collect() };
    let q8 = |rows: u64, cols: u64| -> Vec<u8> {
        // Q8_0 blocks with d = 1.0 and qs = 0..32.
        let mut out = Vec::new();
        for _ in 0..rows * cols / 32 {
            out.extend([0x00, 0x3C]);
            out.extend(0..32u8);
        }
        out
    };
    let mut w = GgufWriter::default()
        .kv("general.architecture", V::Str(arch.into()))
        .kv(&format!("{arch}.embedding_length"), V::U32(d as u32))
        .kv(&format!("{arch}.feed_forward_length"), V::U32(f as u32))
        .kv(&format!("{arch}.block_count"), V::U32(1))
        .kv(&format!("{arch}.attention.head_count"), V::U32(2))
        .kv(&format!("{arch}.attention.head_count_kv"), V::U32(1))
        .kv(&format!("{arch}.attention.layer_norm_rms_epsilon"), V::F32(1e-6))
        .kv(&format!("{arch}.rope.freq_base"), V::F32(500000.0))
        .kv(&format!("{arch}.context_length"), V::U32(128))
        .kv(&format!("{arch}.rope.dimension_count"), V::U32(4))
        .kv("tokenizer.ggml.tokens", V::StrArr(vec!["a".into(), "b".into(), "c".into(), "d".into()]))
        .kv("tokenizer.ggml.bos_token_id", V::U32(0))
        .kv("tokenizer.ggml.eos_token_id", V::U32(3))
        .f32_tensor("token_embd.weight", &[d, 4], &seq(32, 1.0))
        .f32_tensor("blk.0.attn_norm.weight", &[d], &seq(8, 1.0))
        .f32_tensor("blk.0.attn_q.weight", &[d, d], &seq(64, 1.0))
        .f32_tensor("blk.0.attn_k.weight", &[d, 4], &seq(32, 1.0))
        .f32_tensor("blk.0.attn_v.weight", &[d, 4], &seq(32, 1.0))
        .f32_tensor("blk.0.attn_output.weight", &[d, d], &seq(64, 1.0))
        .f32_tensor("blk.0.ffn_norm.weight", &[d], &seq(8, 1.0))
        .tensor("blk.0.ffn_gate.weight", &[32, d], 8, q8(d, 32))
        .tensor("blk.0.ffn_up.weight", &[32, d], 8, q8(d, 32))
        .tensor("blk.0.ffn_down.weight", &[32, d], 8, q8(d, 32))
        .f32_tensor("output_norm.weight", &[d], &seq(8, 1.0));
    if arch == "qwen2" {
        w = w
            .f32_tensor("blk.0.attn_q.bias", &[d], &seq(8, 1.0))
            .f32_tensor("blk.0.attn_k.bias", &[4], &seq(4, 1.0))
            .f32_tensor("blk.0.attn_v.bias", &[4], &seq(4, 1.0));
    }
    w
}

#[test]
fn tiny_llama_view_config_and_permutation() {
    let m = open(tiny_llama("llama").build(), "tiny.gguf").unwrap();
    let c = m.model_config().unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim),
        (8, 32, 1, 2, 1, 4)
    );
    assert_eq!((c.vocab_size, c.rope_theta, c.max_position_embeddings), (4, 500000.0, 128));
    assert!(c.tie_word_embeddings && !c.attention_bias);
    assert_eq!((c.bos_token_id, c.eos_token_id), (Some(0), Some(3)));
    assert_eq!(m.info("model.layers.0.mlp.down_proj.weight").unwrap().shape, vec![8, 32]);
    assert_eq!(m.info("model.layers.0.mlp.gate_proj.weight").unwrap().shape, vec![8, 32]);
    assert_eq!(m.info("model.embed_tokens.weight").unwrap().shape, vec![4, 8]);
    // q: 2 heads of 4 rows; GGUF rows 0 1 2 3 | 4 5 6 7 -> HF rows 0 2 1 3 | 4 6 5 7.
    let q = m.read_f32("model.layers.0.self_attn.q_proj.weight").unwrap();
    let rows: Vec<f32> = q.chunks(8).map(|r| r[0] / 8.0).collect();
    assert_eq!(rows, vec![0., 2., 1., 3., 4., 6., 5., 7.]);
    let k = m.read_f32("model.layers.0.self_attn.k_proj.weight").unwrap();
    let rows: Vec<f32> = k.chunks(8).map(|r| r[0] / 8.0).collect();
    assert_eq!(rows, vec![0., 2., 1., 3.]);
    let v = m.read_f32("model.layers.0.self_attn.v_proj.weight").unwrap();
    assert_eq!(v, (0..32).map(|i| i as f32).collect::<Vec<_>>());
    let g = m.read_f32("model.layers.0.mlp.gate_proj.weight").unwrap();
    assert_eq!(&g[..3], &[0., 1., 2.]);
    let e = m.read_f32("lm_head.weight").unwrap_err().to_string();
    assert!(e.contains("tiny.gguf") && e.contains("lm_head.weight"), "{e}");
}

#[test]
fn tiny_qwen2_is_not_permuted_and_has_bias() {
    let m = open(tiny_llama("qwen2").build(), "q.gguf").unwrap();
    let c = m.model_config().unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.attention_bias);
    let q = m.read_f32("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q, (0..64).map(|i| i as f32).collect::<Vec<_>>());
    assert_eq!(m.read_f32("model.layers.0.self_attn.q_proj.bias").unwrap().len(), 8);
}

#[test]
fn unknown_architecture_is_a_config_error() {
    let mut w = tiny_llama("llama");
    w.kv[0].1 = V::Str("gpt2".into());
    let m = open(w.build(), "arch.gguf").unwrap();
    let e = m.model_config().unwrap_err();
    assert!(matches!(e, StudioError::Config { .. }), "{e:?}");
    let s = e.to_string();
    assert!(s.contains("arch.gguf") && s.contains("gpt2") && s.contains("llama") && s.contains("qwen2"), "{s}");
}

#[test]
fn unsupported_tensor_types() {
    // A known but non-dequantizable type (IQ2_XXS, id 16): opens, fails on read.
    let w = tiny_llama("llama").tensor("blk.0.extra.weight", &[256], 16, vec![0u8; 66]);
    let w = {
        let mut w = w;
        // Make the unsupported tensor one the model needs: replace ffn_up.
        let i = w.tensors.iter().position(|t| t.0 == "blk.0.ffn_up.weight").unwrap();
        w.tensors[i] = ("blk.0.ffn_up.weight".into(), vec![256, 1], 16, vec![0u8; 66]);
        w
    };
    let m = open(w.build(), "iq.gguf").unwrap();
    let e = m.read_f32("model.layers.0.mlp.up_proj.weight").unwrap_err();
    assert!(matches!(e, StudioError::UnsupportedDType { .. }), "{e:?}");
    let s = e.to_string();
    assert!(s.contains("iq.gguf") && s.contains("model.layers.0.mlp.up_proj.weight") && s.contains("IQ2_XXS"), "{s}");
    let e = m.model_config().unwrap_err();
    assert!(matches!(e, StudioError::UnsupportedDType { .. }), "{e:?}");
    // An unknown type id fails at open, naming the tensor.
    let w = GgufWriter::default().tensor("weird", &[32], 200, vec![0u8; 32]);
    let e = open_err(w.build(), "u.gguf");
    let s = e.to_string();
    assert!(
        matches!(e, StudioError::UnsupportedDType { .. })
            && s.contains("u.gguf")
            && s.contains("weird")
            && s.contains("200"),
        "{s}"
    );
}

fn assert_format(e: &StudioError, file: &str, needles: &[&str]) {
    assert!(matches!(e, StudioError::Format { format: "GGUF", .. }), "{e:?}");
    let s = e.to_string();
    assert!(s.contains(file), "{s}");
    for n in needles {
        assert!(s.contains(n), "missing {n:?} in: {s}");
    }
}

#[test]
fn synthetic_corruptions() {
    // Bad magic and versions.
    assert_format(&open_err(b"GGUX\x03\0\0\0".to_vec(), "m.gguf"), "m.gguf", &["magic"]);
    let mut v1 = tiny_llama("llama").build();
    v1[4] = 1;
    assert_format(&open_err(v1, "v1.gguf"), "v1.gguf", &["version 1"]);
    let mut be = tiny_llama("llama").build();
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert_format(&open_err(be, "be.gguf"), "be.gguf", &["big-endian"]);
    // Version 2 is accepted.
    let mut v2 = tiny_llama("llama").build();
    v2[4] = 2;
    assert!(open(v2, "v2.gguf").is_ok());

    // Huge counts: no allocation, an error.
    let mut huge = tiny_llama("llama").build();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_format(&open_err(huge, "tc.gguf"), "tc.gguf", &["tensor_count"]);
    let mut huge = tiny_llama("llama").build();
    huge[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert_format(&open_err(huge, "kv.gguf"), "kv.gguf", &["metadata_kv_count"]);

    // A huge string length (the first key's).
    let mut s = tiny_llama("llama").build();
    s[24..32].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    assert_format(&open_err(s, "s.gguf"), "s.gguf", &["string length", "byte 24"]);

    // A huge array length.
    let w = GgufWriter::default()
        .kv("big", V::Raw(9, [4u32.to_le_bytes().to_vec(), u64::MAX.to_le_bytes().to_vec()].concat()));
    assert_format(&open_err(w.build(), "a.gguf"), "a.gguf", &["`big`", "count"]);

    // Deeply nested arrays: 64 levels of [array of 1 array], then [1 uint32].
    let mut nested = Vec::new();
    for _ in 0..64 {
        nested.extend(9u32.to_le_bytes());
        nested.extend(1u64.to_le_bytes());
    }
    nested.extend(4u32.to_le_bytes());
    nested.extend(1u64.to_le_bytes());
    nested.extend(7u32.to_le_bytes());
    let w = GgufWriter::default().kv("deep", V::Raw(9, nested));
    assert_format(&open_err(w.build(), "d.gguf"), "d.gguf", &["`deep`", "nested"]);

    // Unknown value type.
    let w = GgufWriter::default().kv("odd.key", V::Raw(42, vec![0; 8]));
    assert_format(&open_err(w.build(), "t.gguf"), "t.gguf", &["`odd.key`", "unknown value type 42"]);

    // Non-UTF-8 string.
    let w = GgufWriter::default().kv("name", V::Raw(8, [2u64.to_le_bytes().to_vec(), vec![0xFF, 0xFE]].concat()));
    assert_format(&open_err(w.build(), "u.gguf"), "u.gguf", &["`name`", "UTF-8"]);

    // Duplicate keys.
    let w = GgufWriter::default().kv("k", V::U32(1)).kv("k", V::U32(2));
    assert_format(&open_err(w.build(), "dup.gguf"), "dup.gguf", &["duplicate", "`k`"]);

    // Bad alignment.
    let w = tiny_llama("llama").kv("general.alignment", V::U32(3));
    assert_format(&open_err(w.build(), "al.gguf"), "al.gguf", &["general.alignment"]);

    // Too many dims; row not a whole number of blocks.
    let w = GgufWriter::default().tensor("t5d", &[1, 1, 1, 1, 1], 0, vec![0; 4]);
    assert_format(&open_err(w.build(), "nd.gguf"), "nd.gguf", &["`t5d`", "n_dims"]);
    let w = GgufWriter::default().tensor("rag", &[33], 8, vec![0; 68]);
    assert_format(&open_err(w.build(), "b.gguf"), "b.gguf", &["`rag`", "block size"]);

    // Tensor offset past EOF, misaligned offset, overlapping tensors.
    let w = tiny_llama("llama");
    let (mut bytes, pos) = w.build_with_positions();
    let p = pos[3]; // blk.0.attn_k.weight
    bytes[p..p + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert_format(&open_err(bytes, "eof.gguf"), "eof.gguf", &["`blk.0.attn_k.weight`", "past the end"]);
    let (mut bytes, pos) = w.build_with_positions();
    let p = pos[3];
    bytes[p..p + 8].copy_from_slice(&8u64.to_le_bytes());
    assert_format(&open_err(bytes, "mis.gguf"), "mis.gguf", &["`blk.0.attn_k.weight`", "alignment"]);
    let (mut bytes, pos) = w.build_with_positions();
    let q_offset = bytes[pos[2]..pos[2] + 8].to_vec();
    bytes[pos[3]..pos[3] + 8].copy_from_slice(&q_offset);
    assert_format(
        &open_err(bytes, "ov.gguf"),
        "ov.gguf",
        &["`blk.0.attn_q.weight`", "`blk.0.attn_k.weight`", "overlap"],
    );

    // Truncated data section: the last tensor runs past the end.
    let bytes = w.build();
    let cut = bytes.len() - 4;
    assert_format(&open_err(bytes[..cut].to_vec(), "cut.gguf"), "cut.gguf", &["`output_norm.weight`", "past the end"]);
}

/// Deterministic xorshift for byte flipping.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn synthetic_truncations_and_flips_never_panic() {
    let bytes = tiny_llama("qwen2").build();
    for cut in 0..bytes.len() {
        let r = std::panic::catch_unwind(|| open(bytes[..cut].to_vec(), "c.gguf"));
        let e = r.unwrap_or_else(|_| panic!("panic at cut {cut}")).err().unwrap_or_else(|| panic!("cut {cut} parsed"));
        assert!(e.to_string().contains("c.gguf"), "{e}");
    }
    let mut st = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + xorshift(&mut st) % 4 {
            let i = (xorshift(&mut st) % b.len() as u64) as usize;
            b[i] ^= 1 << (xorshift(&mut st) % 8);
        }
        let r = std::panic::catch_unwind(|| {
            if let Ok(m) = open(b, "f.gguf") {
                let _ = m.model_config();
                for t in m.tensors() {
                    let _ = m.read_f32(&t.name);
                }
                let _ = moe_shared::tokenizer::gguf::build_tokenizer(&m);
            }
        });
        assert!(r.is_ok(), "panic on flipped bytes");
    }
}

#[test]
fn real_header_truncated_and_flipped() {
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let full = std::fs::read(&path).unwrap();
    let m = open(full[..].to_vec(), "full.gguf").unwrap();
    let data_offset = m.file.data_offset;
    drop(m);
    let header = &full[..data_offset + 4096];
    let name = "SmolLM2-135M-Instruct.Q4_1.gguf";
    // Cut points: every byte of the first 512, then ~150 spread over the
    // header, and some inside the data section.
    let mut cuts: Vec<usize> = (0..512).collect();
    cuts.extend((1..150).map(|k| k * data_offset / 150));
    cuts.extend([data_offset - 1, data_offset, data_offset + 1, data_offset + 4096]);
    let mut by_kind = std::collections::BTreeMap::<&str, usize>::new();
    for &cut in &cuts {
        let bytes = if cut <= header.len() { header[..cut].to_vec() } else { full[..cut].to_vec() };
        let r = std::panic::catch_unwind(|| open(bytes, name));
        let e = r.unwrap_or_else(|_| panic!("panic at cut {cut}")).err().unwrap_or_else(|| panic!("cut {cut} parsed"));
        let s = e.to_string();
        assert!(s.contains(name), "{s}");
        let kind = if s.contains("past the end") || s.contains("more than the whole file") {
            assert!(s.contains("tensor `"), "{s}");
            "tensor past end"
        } else if s.contains("truncated") || s.contains("exceeds") || s.contains("remain") {
            "truncated header"
        } else {
            "other"
        };
        *by_kind.entry(kind).or_default() += 1;
    }
    eprintln!("{} cut points: {by_kind:?}", cuts.len());
    assert_eq!(by_kind.get("other"), None);
    // Flipped bytes in the real header: errors or success, never a panic.
    let mut st = 12345u64;
    let mut errs = 0;
    for _ in 0..30 {
        let mut b = full[..].to_vec();
        let i = (xorshift(&mut st) % data_offset as u64) as usize;
        b[i] ^= 1 << (xorshift(&mut st) % 8);
        let r = std::panic::catch_unwind(|| open(b, name).map(|m| m.model_config().map(|_| ())));
        match r {
            Err(_) => panic!("panic flipping byte {i}"),
            Ok(Err(_)) | Ok(Ok(Err(_))) => errs += 1,
            Ok(Ok(Ok(()))) => {}
        }
    }
    eprintln!("30 single-bit flips in the header: {errs} errors, the rest parsed");
}
