//! Packed expert tensors (transformers 5's `experts.gate_up_proj [E, 2f, d]`
//! / `experts.down_proj [E, d, f]`; `layout::packed`), read and written.
//!
//! Fixtures (tests/reference/make_packed_golden.py): `tiny-qwen3-moe-packed`
//! is `tiny-qwen3-moe` saved by transformers with
//! `save_original_format=False` (same seed); `tiny-mergekit-moe` is
//! mergekit-moe 0.1.5's packed Mixtral output (random gate) with the logits
//! transformers computes from it.

use burn::tensor::Tensor;
use moe_shared::checkpoint::export::export_moe;
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::layout::{ExpertsFormat, LayoutRequest};
use moe_shared::model::load_model;
use moe_shared::tensor_io::safetensors_io::SafetensorsModel;
use moe_shared::tensor_io::{TensorSource, WriteOptions};

use super::hf_tiny::{fixture, max_diff, tokens, B, TOL};

fn packed_golden(name: &str) -> (Vec<u32>, Vec<Vec<f32>>) {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/golden/packed_experts.json");
    let g: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    let e = &g[name];
    let ids = e["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let rows = e["logits"].as_array().unwrap();
    let logits =
        rows.iter().map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect()).collect();
    (ids, logits)
}

fn open(dir: &std::path::Path) -> LoadedModel {
    open_model(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Every canonical tensor of `a` and `b`: the same names, dtypes, shapes
/// and bits.
fn assert_same_tensors(a: &dyn TensorSource, b: &dyn TensorSource) {
    let mut ta = a.tensors();
    let mut tb = b.tensors();
    ta.sort_by(|x, y| x.name.cmp(&y.name));
    tb.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(ta, tb, "{} vs {}", a.source_name(), b.source_name());
    for t in &ta {
        let (va, vb) = (a.read_f32(&t.name).unwrap(), b.read_f32(&t.name).unwrap());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&va), bits(&vb), "{}", t.name);
    }
}

fn logits(m: &LoadedModel, ids: &[u32]) -> Tensor<B, 3> {
    load_model::<B>(m, &Default::default()).unwrap().forward(tokens(ids), None)
}

#[test]
fn a_packed_qwen3_moe_equals_its_per_expert_twin_bit_for_bit() {
    let packed = open(&fixture("tiny-qwen3-moe-packed"));
    let twin = open(&fixture("tiny-qwen3-moe"));
    // the file really is packed, and the reader says so
    let raw = SafetensorsModel::open_dir(&fixture("tiny-qwen3-moe-packed")).unwrap();
    let t = raw.info("model.layers.0.mlp.experts.gate_up_proj").expect("a packed fixture");
    assert_eq!(t.shape, vec![4, 48, 32]);
    assert!(raw.info("model.layers.0.mlp.experts.0.gate_proj.weight").is_none());
    assert_eq!(packed.experts_format, Some(ExpertsFormat::Packed));
    assert_eq!(twin.experts_format, Some(ExpertsFormat::PerExpert));
    assert_eq!((packed.layout.unwrap().name(), &packed.moe, &packed.config), ("qwen3_moe", &twin.moe, &twin.config));
    assert_same_tensors(packed.source.as_ref(), twin.source.as_ref());
    // ranges of one expert read alone: the same values as the full read
    let name = "model.layers.0.block_sparse_moe.experts.2.w3.weight";
    let full = packed.source.read_f32(name).unwrap();
    assert_eq!(packed.source.read_f32_range(name, 5..29).unwrap(), full[5..29]);
    let (ids, golden) = packed_golden("tiny-qwen3-moe-packed");
    let (a, b) = (logits(&packed, &ids), logits(&twin, &ids));
    let bits = |t: Tensor<B, 3>| t.into_data().to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let d = max_diff(a.clone(), &golden, 0);
    assert_eq!(bits(a), bits(b), "logits of the packed and per-expert reads");
    eprintln!("tiny-qwen3-moe-packed: logits = twin's bit for bit; max |ours - transformers| = {d:e}");
    assert!(d < TOL, "{d}");
}

#[test]
fn mergekit_moe_packed_mixtral_matches_transformers() {
    let dir = fixture("tiny-mergekit-moe");
    let m = open(&dir);
    assert_eq!(m.layout.unwrap().name(), "mixtral");
    assert_eq!(m.experts_format, Some(ExpertsFormat::Packed));
    let moe = m.moe.as_ref().unwrap();
    assert!(moe.layers.iter().all(|s| s.as_ref().is_some_and(|s| (s.num_experts, s.top_k) == (4, 2))));
    // mergekit's `mlp.gate.weight` is the router; its `mlp.experts.*` the experts
    for name in ["model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.experts.3.w2.weight"] {
        assert!(m.source.info(name).is_some(), "{name}");
    }
    let (ids, golden) = packed_golden("tiny-mergekit-moe");
    let model = load_model::<B>(&m, &Default::default()).unwrap();
    let full = max_diff(model.forward(tokens(&ids), None), &golden, 0);
    let mut cache = model.new_cache();
    let a = max_diff(model.forward(tokens(&ids[..7]), Some(&mut cache)), &golden, 0);
    let b = max_diff(model.forward(tokens(&ids[7..]), Some(&mut cache)), &golden, 7);
    eprintln!("tiny-mergekit-moe: max |ours - transformers| = {full:e} (KV cache 7+5: {:e})", a.max(b));
    assert!(full < TOL && a.max(b) < TOL, "{full} {a} {b}");
}

/// Writes `m` packed and per expert in `layout`; both read back to `m`'s
/// tensors bit for bit, and the packed file holds `packed_names` (and no
/// per-expert tensor).
fn round_trip(m: &LoadedModel, layout: &str, packed_names: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let moe = m.moe.as_ref().unwrap();
    let request = LayoutRequest::parse(layout).unwrap();
    for (format, sub) in [(ExpertsFormat::Packed, "packed"), (ExpertsFormat::PerExpert, "per-expert")] {
        let out = dir.path().join(sub);
        let opts = WriteOptions { max_shard_bytes: 60_000, ..Default::default() };
        export_moe(m.source.as_ref(), &m.config, moe, request, format, &out, None, None, opts).unwrap();
        let back = open(&out);
        assert_eq!(back.experts_format, Some(format), "{layout} {sub}");
        assert_eq!(back.layout.unwrap().name(), layout);
        assert_same_tensors(m.source.as_ref(), back.source.as_ref());
        let raw = SafetensorsModel::open_dir(&out).unwrap();
        let names: Vec<String> = raw.tensors().into_iter().map(|t| t.name).collect();
        let per_expert = names.iter().filter(|n| n.contains(".experts.0.")).count();
        if format == ExpertsFormat::Packed {
            for n in packed_names {
                assert!(names.iter().any(|x| x == n), "{layout}: no {n} in {names:?}");
            }
            assert_eq!(per_expert, 0, "{layout}: per-expert tensors in a packed file: {names:?}");
        } else {
            assert!(per_expert > 0, "{layout}");
        }
    }
}

#[test]
fn every_layout_writes_packed_experts_that_read_back_bit_for_bit() {
    let mixtral = open(&fixture("tiny-mixtral"));
    round_trip(
        &mixtral,
        "mixtral",
        &[
            "model.layers.0.mlp.gate.weight",
            "model.layers.0.mlp.experts.gate_up_proj",
            "model.layers.1.mlp.experts.down_proj",
        ],
    );
    // Qwen2-MoE: a dense layer (mlp_only_layers) and its own shared expert
    // (never packed)
    let qwen2 = open(&fixture("tiny-qwen2-moe"));
    round_trip(
        &qwen2,
        "qwen2_moe",
        &["model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.shared_expert.up_proj.weight"],
    );
    let qwen3 = open(&fixture("tiny-qwen3-moe"));
    round_trip(
        &qwen3,
        "qwen3_moe",
        &["model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.down_proj.weight"],
    );
    // the studio layout packs under the canonical prefix, each layer with
    // its own expert count
    round_trip(&qwen3, "moe_studio", &["model.layers.0.block_sparse_moe.experts.gate_up_proj"]);
    // the mergekit output written per expert is the same model
    round_trip(&open(&fixture("tiny-mergekit-moe")), "mixtral", &["model.layers.1.mlp.experts.gate_up_proj"]);
}

/// A copy of the mergekit fixture whose safetensors file is `edit`ed
/// (tensor name -> new shape and data, or removed).
fn edited_mergekit(
    dir: &std::path::Path,
    edit: impl Fn(&str, &[usize], &[u8]) -> Option<(String, Vec<usize>, Vec<u8>)>,
) -> std::path::PathBuf {
    use moe_shared::tensor_io::writer::serialize_to_vec;
    use moe_shared::tensor_io::PlannedTensor;
    let src = fixture("tiny-mergekit-moe");
    let out = dir.join("edited");
    std::fs::create_dir_all(&out).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), out.join(f)).unwrap();
    }
    let raw = SafetensorsModel::open_dir(&src).unwrap();
    let mut owned = Vec::new();
    for t in raw.tensors() {
        let (_, bytes) = raw.raw(&t.name).unwrap();
        if let Some((name, shape, data)) = edit(&t.name, &t.shape, bytes) {
            owned.push((PlannedTensor { name, dtype: t.dtype, shape }, data));
        }
    }
    let pairs: Vec<(PlannedTensor, &[u8])> = owned.iter().map(|(p, d)| (p.clone(), d.as_slice())).collect();
    std::fs::write(out.join("model.safetensors"), serialize_to_vec(&pairs, &Default::default()).unwrap()).unwrap();
    out
}

#[test]
fn packed_tensors_that_disagree_with_the_config_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let keep = |n: &str, s: &[usize], d: &[u8]| Some((n.to_string(), s.to_vec(), d.to_vec()));
    // three experts in layer 1's gate_up_proj, four in config.json
    let bad = edited_mergekit(dir.path(), |n, s, d| {
        if n == "model.layers.1.mlp.experts.gate_up_proj" {
            let per = d.len() / s[0];
            return Some((n.to_string(), vec![3, s[1], s[2]], d[..3 * per].to_vec()));
        }
        keep(n, s, d)
    });
    let e = open_model(&bad).err().unwrap().to_string();
    assert!(
        e.contains("`model.layers.1.mlp.experts.gate_up_proj`")
            && e.contains("expert dimension 3")
            && e.contains("4 experts"),
        "{e}"
    );
    // a down_proj of the wrong width
    std::fs::remove_dir_all(&bad).unwrap();
    let bad = edited_mergekit(dir.path(), |n, s, d| {
        if n == "model.layers.0.mlp.experts.down_proj" {
            return Some((n.to_string(), vec![s[0], s[2], s[1]], d.to_vec()));
        }
        keep(n, s, d)
    });
    let e = open_model(&bad).err().unwrap().to_string();
    assert!(e.contains("`model.layers.0.mlp.experts.down_proj`") && e.contains("[4, 32, 48]"), "{e}");
    // gate_up_proj without its down_proj
    std::fs::remove_dir_all(&bad).unwrap();
    let bad = edited_mergekit(dir.path(), |n, s, d| {
        (n != "model.layers.0.mlp.experts.down_proj").then(|| keep(n, s, d)).flatten()
    });
    let e = open_model(&bad).err().unwrap().to_string();
    assert!(e.contains("`model.layers.0.mlp.experts.down_proj`") && e.contains("missing"), "{e}");
    // neither layout in layer 0: both are named
    std::fs::remove_dir_all(&bad).unwrap();
    let bad = edited_mergekit(dir.path(), |n, s, d| {
        (!n.starts_with("model.layers.0.mlp.experts")).then(|| keep(n, s, d)).flatten()
    });
    let e = open_model(&bad).err().unwrap().to_string();
    assert!(
        e.contains("layer 0")
            && e.contains("neither expert layout")
            && e.contains("model.layers.0.block_sparse_moe.experts.{e}.w1.weight")
            && e.contains("`model.layers.0.mlp.experts.gate_up_proj` [4, 96, 32]"),
        "{e}"
    );
}
