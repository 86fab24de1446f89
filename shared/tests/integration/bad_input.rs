//! Bad input gives errors that name the file, the tensor and the problem,
//! never a panic.

use moe_shared::checkpoint::open_model;
use moe_shared::tensor_io::safetensors_io::SafetensorsFile;
use moe_shared::tensor_io::writer::{serialize_to_vec, PlannedTensor};
use moe_shared::tensor_io::{Bytes, DType};

fn header_file(header: &str, data_len: usize) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(vec![0u8; data_len]);
    out
}

fn good_file() -> Vec<u8> {
    let p = [
        PlannedTensor { name: "w".into(), dtype: DType::F32, shape: vec![2, 2] },
        PlannedTensor { name: "v".into(), dtype: DType::F32, shape: vec![3] },
    ];
    let a = vec![0u8; 16];
    let b = vec![0u8; 12];
    serialize_to_vec(&[(p[0].clone(), &a), (p[1].clone(), &b)], &Default::default()).unwrap()
}

#[test]
fn truncated_safetensors_is_named() {
    let f = good_file();
    for cut in [0, 4, 9, 20, f.len() - 1] {
        let e =
            SafetensorsFile::parse(Bytes::from_vec(f[..cut].to_vec()), "model.safetensors").unwrap_err().to_string();
        assert!(e.contains("model.safetensors"), "cut {cut}: {e}");
        assert!(e.contains("truncated") || e.contains("shorter") || e.contains("past the end"), "cut {cut}: {e}");
    }
}

#[test]
fn overlapping_offsets_name_the_tensor() {
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let e = SafetensorsFile::parse(Bytes::from_vec(header_file(h, 12)), "x.safetensors").unwrap_err().to_string();
    assert!(e.contains("x.safetensors") && e.contains("`b`") && e.contains("overlap"), "{e}");
}

#[test]
fn offsets_past_the_end_name_the_tensor() {
    let h = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let e = SafetensorsFile::parse(Bytes::from_vec(header_file(h, 8)), "y.safetensors").unwrap_err().to_string();
    assert!(e.contains("y.safetensors") && e.contains("`a`") && e.contains("past the end"), "{e}");
}

#[test]
fn size_disagreeing_with_dtype_and_shape_is_named() {
    let h = r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}}"#;
    let e = SafetensorsFile::parse(Bytes::from_vec(header_file(h, 16)), "z.safetensors").unwrap_err().to_string();
    assert!(e.contains("`a`") && e.contains("need 8"), "{e}");
}

fn tiny_config(model_type: &str) -> String {
    format!(
        r#"{{"model_type":"{model_type}","vocab_size":8,"hidden_size":4,"intermediate_size":6,"num_hidden_layers":1,
        "num_attention_heads":2,"num_key_value_heads":1,"tie_word_embeddings":true}}"#
    )
}

#[test]
fn unknown_architecture_and_shape_mismatch_are_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), tiny_config("gpt_neox")).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), good_file()).unwrap();
    let e = open_model(dir.path()).unwrap_err().to_string();
    assert!(e.contains("config.json") && e.contains("gpt_neox"), "{e}");

    // A valid llama config, but the embedding has the wrong shape.
    std::fs::write(dir.path().join("config.json"), tiny_config("llama")).unwrap();
    let p = PlannedTensor { name: "model.embed_tokens.weight".into(), dtype: DType::F32, shape: vec![8, 5] };
    let data = vec![0u8; 8 * 5 * 4];
    std::fs::write(dir.path().join("model.safetensors"), serialize_to_vec(&[(p, &data)], &Default::default()).unwrap())
        .unwrap();
    // Refused when it is opened (not only when it is loaded), with every
    // problem: the wrong shape, expected vs found, and the missing tensors.
    let e = open_model(dir.path()).unwrap_err().to_string();
    assert!(e.contains("`model.embed_tokens.weight` is [8, 5], expected [8, 4]"), "{e}");
    assert!(e.contains("10 tensor(s) missing: `model.layers.0.input_layernorm.weight` [4]"), "{e}");
}

#[test]
fn missing_path_and_unknown_file_kind() {
    let e = open_model(std::path::Path::new("/nonexistent/model.gguf")).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/model.gguf"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("weights.pt");
    std::fs::write(&p, b"not a model").unwrap();
    let e = open_model(&p).unwrap_err().to_string();
    assert!(e.contains("weights.pt") && e.contains(".gguf"), "{e}");
}

/// A NaN or infinite weight is refused when the model is loaded, naming the
/// tensor (every output would be NaN: `generate` printed nothing and
/// `perplexity` reported NaN and succeeded).
#[test]
fn a_non_finite_weight_is_refused_by_name_when_loading() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), tiny_config("llama")).unwrap();
    let cfg = moe_shared::config::HfConfig::from_json(tiny_config("llama").as_bytes(), "c")
        .unwrap()
        .to_model_config("c")
        .unwrap();
    let plan = moe_shared::checkpoint::plan::dense_tensor_plan(&cfg);
    let data: Vec<Vec<u8>> = plan
        .iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|i| if name == "model.layers.0.self_attn.q_proj.weight" && i == 3 { f32::NAN } else { 0.01 })
                .collect();
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        })
        .collect();
    let tensors: Vec<(PlannedTensor, &[u8])> = plan
        .iter()
        .zip(&data)
        .map(|((n, s), d)| (PlannedTensor { name: n.clone(), dtype: DType::F32, shape: s.clone() }, &d[..]))
        .collect();
    std::fs::write(dir.path().join("model.safetensors"), serialize_to_vec(&tensors, &Default::default()).unwrap())
        .unwrap();
    let m = open_model(dir.path()).unwrap();
    let e = moe_shared::model::load_model::<moe_shared::CpuBackend>(&m, &Default::default()).unwrap_err().to_string();
    assert!(e.contains("model.layers.0.self_attn.q_proj.weight") && e.contains("1 non-finite value"), "{e}");
}
