//! GGUF reading against the reference Python implementations: the `gguf`
//! package's dequantization (`golden/gguf_dequant.json`), its reading of the
//! real SmolLM2 Q4_1 file (`golden/smollm2_gguf_tensors.json`), and
//! transformers' un-permuted q/k weights (`golden/smollm2_hf_q_weight.json`).

use crate::common;

use base64::Engine as _;
use moe_shared::checkpoint::gguf;
use moe_shared::config::Architecture;
use moe_shared::tensor_io::gguf::GgufValue;
use moe_shared::tensor_io::quant::{dequantize, ggml_dtype};
use moe_shared::tensor_io::{Bytes, DType, TensorSource};
use serde_json::Value;

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

/// Max |a - b| over two equally long slices, asserting the lengths match.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn dequant_matches_gguf_py() {
    let Some(g) = common::golden_json("gguf_dequant.json") else {
        return;
    };
    let types = g["types"].as_array().unwrap();
    assert!(types.len() >= 9);
    for t in types {
        let name = t["type"].as_str().unwrap();
        let dtype = ggml_dtype(t["ggml_type"].as_u64().unwrap() as u32);
        assert_eq!(dtype.to_string(), name);
        let raw = base64::engine::general_purpose::STANDARD.decode(t["raw_base64"].as_str().unwrap()).unwrap();
        let n = t["n_elements"].as_u64().unwrap() as usize;
        let expected = f32s(&t["expected"]);
        let got = dequantize(dtype, &raw, n).unwrap();
        let d = max_abs_diff(&got, &expected);
        let bit_exact = got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0));
        eprintln!("{name}: {n} elements, max abs diff {d:e}, bit-exact {bit_exact}");
        assert_eq!(d, 0.0, "{name}: max abs diff {d}");
    }
}

fn open_smollm2() -> Option<gguf::GgufModel> {
    let path = common::smollm2_gguf()?;
    let bytes = Bytes::map_file(&path).unwrap();
    Some(gguf::open(bytes, &path.display().to_string()).unwrap())
}

#[test]
fn smollm2_header_and_tensors_match_gguf_py() {
    let Some(g) = common::golden_json("smollm2_gguf_tensors.json") else {
        return;
    };
    let Some(m) = open_smollm2() else { return };
    let f = &m.file;
    assert_eq!(f.version as u64, g["gguf_version"].as_u64().unwrap());
    assert_eq!(f.tensors.len() as u64, g["tensor_count"].as_u64().unwrap());
    assert_eq!(f.alignment as u64, g["alignment"].as_u64().unwrap());
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for t in &f.tensors {
        *counts.entry(t.dtype.to_string()).or_default() += 1;
    }
    for (k, v) in g["tensor_type_counts"].as_object().unwrap() {
        assert_eq!(counts.get(k).copied(), v.as_u64(), "type count {k}");
    }
    // Metadata: every scalar key the golden lists has the same value.
    let meta = g["metadata"].as_object().unwrap();
    for (k, v) in meta {
        let Some(ours) = f.get(k) else {
            assert!(k.contains('(') || k == "all_keys", "missing key {k}");
            continue;
        };
        match (ours, v) {
            (GgufValue::String(s), Value::String(e)) => assert_eq!(s, e, "{k}"),
            (GgufValue::Bool(b), Value::Bool(e)) => assert_eq!(b, e, "{k}"),
            (GgufValue::F32(x), Value::Number(e)) => {
                assert_eq!(*x as f64, e.as_f64().unwrap(), "{k}")
            }
            (o, Value::Number(e)) => assert_eq!(o.as_u64(), e.as_u64(), "{k}"),
            (GgufValue::Array(a), Value::Array(e)) => assert_eq!(a.len(), e.len(), "{k}"),
            (o, e) => panic!("{k}: ours {o:?} vs golden {e}"),
        }
    }
    let keys: Vec<&str> = f.metadata().iter().map(|(k, _)| k.as_str()).collect();
    let golden_keys: Vec<&str> = meta["all_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .filter(|k| !k.starts_with("GGUF."))
        .collect();
    assert_eq!(keys, golden_keys);
    let toks = f.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!(toks.len() as u64, meta["tokenizer.ggml.tokens (count)"].as_u64().unwrap());
    let merges = f.get("tokenizer.ggml.merges").unwrap().as_array().unwrap();
    assert_eq!(merges.len() as u64, meta["tokenizer.ggml.merges (count)"].as_u64().unwrap());
    for (i, e) in meta["tokenizer.ggml.merges (first 3)"].as_array().unwrap().iter().enumerate() {
        assert_eq!(merges.strs().unwrap().nth(i), e.as_str());
    }

    for t in g["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let info = f.tensor(name).unwrap_or_else(|| panic!("tensor {name}"));
        assert_eq!(info.dtype.to_string(), t["ggml_type"].as_str().unwrap());
        let ne: Vec<u64> = t["shape_ne"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(info.ne, ne, "{name} ne");
        let np_shape: Vec<usize> =
            t["numpy_shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(info.torch_shape(), np_shape, "{name} shape");
        assert_eq!(info.n_bytes as u64, t["n_bytes"].as_u64().unwrap());
        assert_eq!(info.data_start as u64, t["data_offset_in_file"].as_u64().unwrap());
        let v = f.dequantize(info).unwrap();
        assert_eq!(v.len() as u64, t["n_elements"].as_u64().unwrap());
        let d16 = max_abs_diff(&v[..16], &f32s(&t["first16"]));
        assert_eq!(d16, 0.0, "{name} first16");
        if let Some(rows) = t["rows0to3_first16"].as_array() {
            let cols = info.ne[0] as usize;
            for (r, row) in rows.iter().enumerate() {
                assert_eq!(max_abs_diff(&v[r * cols..r * cols + 16], &f32s(row)), 0.0, "{name} row {r}");
            }
        }
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        let sum_sq: f64 = v.iter().map(|&x| (x as f64) * (x as f64)).sum();
        let (es, esq) = (t["sum"].as_f64().unwrap(), t["sum_sq"].as_f64().unwrap());
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1.0);
        eprintln!(
            "{name}: sum {sum} vs {es} (rel {:e}), sum_sq {sum_sq} vs {esq} (rel {:e})",
            rel(sum, es),
            rel(sum_sq, esq)
        );
        assert!(rel(sum, es) < 1e-9 && rel(sum_sq, esq) < 1e-9, "{name} sums");
    }
}

#[test]
fn smollm2_hf_view_and_qk_unpermute() {
    let Some(g) = common::golden_json("smollm2_hf_q_weight.json") else {
        return;
    };
    let Some(m) = open_smollm2() else { return };
    for (name, t) in g["tensors"].as_object().unwrap() {
        let info = m.info(name).unwrap_or_else(|| panic!("{name}"));
        let shape: Vec<usize> = t["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(info.shape, shape);
        assert_eq!(info.dtype, DType::Q4_1);
        let w = m.read_f32(name).unwrap();
        let cols = shape[1];
        let d0 = max_abs_diff(&w[..16], &f32s(&t["row0_first16"]));
        let d1 = max_abs_diff(&w[cols..cols + 16], &f32s(&t["row1_first16"]));
        let sum: f64 = w.iter().map(|&x| x as f64).sum();
        let sum_sq: f64 = w.iter().map(|&x| (x as f64) * (x as f64)).sum();
        eprintln!("{name}: row0 diff {d0}, row1 diff {d1}, sum {sum} vs {}", t["sum"]);
        assert_eq!((d0, d1), (0.0, 0.0), "{name}");
        assert!((sum - t["sum"].as_f64().unwrap()).abs() < 1e-6 * sum.abs().max(1.0));
        assert!((sum_sq - t["sum_sq"].as_f64().unwrap()).abs() < 1e-9 * sum_sq);
    }
    // The permutation maps HF row h*64 + j*32 + i to GGUF row h*64 + 2i + j:
    // check every row of q_proj and k_proj against the raw storage.
    for (hf, gg, heads) in [
        ("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", 9usize),
        ("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", 3),
    ] {
        let w = m.read_f32(hf).unwrap();
        let raw = m.file.dequantize(m.file.tensor(gg).unwrap()).unwrap();
        let cols = 576;
        for h in 0..heads {
            for j in 0..2 {
                for i in 0..32 {
                    let (dst, src) = (h * 64 + j * 32 + i, h * 64 + 2 * i + j);
                    assert_eq!(&w[dst * cols..(dst + 1) * cols], &raw[src * cols..(src + 1) * cols]);
                }
            }
        }
    }
    // v_proj is not permuted.
    let v = m.read_f32("model.layers.0.self_attn.v_proj.weight").unwrap();
    let raw = m.file.dequantize(m.file.tensor("blk.0.attn_v.weight").unwrap()).unwrap();
    assert_eq!(v, raw);
}

#[test]
fn smollm2_config_and_all_tensors() {
    let Some(m) = open_smollm2() else { return };
    let c = m.model_config().unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim),
        (49152, 576, 1536, 30, 9, 3, 64)
    );
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.rms_norm_eps, 1e-5f32 as f64);
    assert_eq!(c.max_position_embeddings, 8192);
    assert!(c.tie_word_embeddings && !c.attention_bias);
    assert_eq!((c.bos_token_id, c.eos_token_id), (Some(1), Some(2)));
    assert_eq!(c.num_parameters(), 134_515_008);

    // Every tensor of the dense model is present with its HF name and shape.
    let mut expected =
        vec![("model.embed_tokens.weight".to_string(), vec![49152, 576]), ("model.norm.weight".to_string(), vec![576])];
    for l in 0..30 {
        let p = format!("model.layers.{l}");
        for (n, s) in [
            ("input_layernorm.weight", vec![576]),
            ("post_attention_layernorm.weight", vec![576]),
            ("self_attn.q_proj.weight", vec![576, 576]),
            ("self_attn.k_proj.weight", vec![192, 576]),
            ("self_attn.v_proj.weight", vec![192, 576]),
            ("self_attn.o_proj.weight", vec![576, 576]),
            ("mlp.gate_proj.weight", vec![1536, 576]),
            ("mlp.up_proj.weight", vec![1536, 576]),
            ("mlp.down_proj.weight", vec![576, 1536]),
        ] {
            expected.push((format!("{p}.{n}"), s));
        }
    }
    let infos = m.tensors();
    assert_eq!(infos.len(), expected.len());
    assert!(m.info("lm_head.weight").is_none());
    let t0 = std::time::Instant::now();
    let mut total = 0usize;
    for (name, shape) in &expected {
        let i = m.info(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(&i.shape, shape, "{name}");
        let v = m.read_f32(name).unwrap();
        assert_eq!(v.len(), i.numel());
        assert!(v.iter().all(|x| x.is_finite()), "{name}");
        total += v.len();
    }
    eprintln!("dequantized {total} values in {:?}", t0.elapsed());
    assert_eq!(total, 134_515_008);
}
