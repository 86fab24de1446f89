//! DUME MoErging on real weights (methods.md §2): three copies of one model
//! give that model back exactly; two different checkpoints of one
//! architecture average exactly tensor by tensor with the FFNs kept as
//! experts; grown vocabularies are aligned with a warning; different
//! architectures or tokenizers are refused, leaving no output.

use crate::common;

use std::path::Path;

use burn::tensor::{Int, Tensor, TensorData};
use moe_shared::checkpoint::export::export_dense;
use moe_shared::checkpoint::plan::dense_tensor_plan;
use moe_shared::checkpoint::{open_model, LoadedModel};
use moe_shared::config::ModelConfig;
use moe_shared::layout::names::{expert_weight_name, router_weight_name, Proj};
use moe_shared::methods::{moerge, plan_moerge, weighted_means, MoergeInput, MoergeOptions};
use moe_shared::model::load_model;
use moe_shared::tensor_io::{DType, TensorInfo, TensorSource, WriteOptions};
use moe_shared::tokenizer::Tokenizer;
use moe_shared::CpuBackend;

type B = CpuBackend;

fn logits(m: &LoadedModel, ids: &[u32]) -> Vec<f32> {
    let device = Default::default();
    let model = load_model::<B>(m, &device).unwrap();
    let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    let n = ids.len();
    model
        .forward(Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, n]), &device), None)
        .into_data()
        .to_vec()
        .unwrap()
}

fn stories() -> Option<LoadedModel> {
    Some(open_model(&common::data_file("models/stories260K/stories260K.bin")?).unwrap())
}

/// A deterministic perturbation of another source, optionally with a grown
/// vocabulary (extra embedding rows).
struct Perturbed<'a> {
    inner: &'a dyn TensorSource,
    extra_rows: usize,
}

impl Perturbed<'_> {
    fn grown(&self, t: TensorInfo) -> TensorInfo {
        if t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight" {
            TensorInfo { shape: vec![t.shape[0] + self.extra_rows, t.shape[1]], ..t }
        } else {
            t
        }
    }
}

impl TensorSource for Perturbed<'_> {
    fn source_name(&self) -> &str {
        "perturbed"
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        self.inner.tensors().into_iter().map(|t| self.grown(t)).collect()
    }
    fn read_f32(&self, name: &str) -> moe_shared::Result<Vec<f32>> {
        let mut v = self.inner.read_f32(name)?;
        let salt = name.len() as f32;
        for (i, x) in v.iter_mut().enumerate() {
            *x = *x * (1.0 + 0.1 * (i as f32 * 0.37 + salt).sin()) + 0.01 * (i as f32 * 0.11).cos();
        }
        let want = self.grown(self.inner.info(name).unwrap()).shape.iter().product::<usize>();
        v.extend((v.len()..want).map(|i| (i as f32 * 0.3).sin()));
        Ok(v)
    }
}

/// Writes a perturbed copy of `m` (vocabulary grown by `extra_rows`) as a
/// Hugging Face directory with our writer.
fn perturbed_copy(m: &LoadedModel, extra_rows: usize, out: &Path) -> LoadedModel {
    let p = Perturbed { inner: m.source.as_ref(), extra_rows };
    let config = ModelConfig { vocab_size: m.config.vocab_size + extra_rows, ..m.config.clone() };
    export_dense(&p, &config, out, Some(DType::F32), None, WriteOptions::default()).unwrap();
    open_model(out).unwrap()
}

fn is_ffn(name: &str) -> bool {
    name.contains(".mlp.")
}

#[test]
fn three_copies_give_the_model_back() {
    let Some(m) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("moe");
    let inputs = [MoergeInput::from(&m); 3];
    let report = moerge(&inputs, &MoergeOptions::default(), &out, None, WriteOptions::default()).unwrap();
    assert_eq!(report.layout, "mixtral");
    assert_eq!(report.experts_per_layer, vec![3; 5]);
    let merged = open_model(&out).unwrap();
    for (name, _) in dense_tensor_plan(&m.config) {
        let want = m.source.read_f32(&name).unwrap();
        if !is_ffn(&name) {
            let got = merged.source.read_f32(&name).unwrap();
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} not bitwise equal");
            continue;
        }
        let (l, proj) = parse_ffn(&name);
        for e in 0..3 {
            assert_eq!(merged.source.read_f32(&expert_weight_name(l, e, Proj::from_hf(proj).unwrap())).unwrap(), want);
        }
    }
    let ids =
        m.tokenizer.as_ref().unwrap().encode("Once upon a time, there was a little dog named Max.", true).unwrap();
    let (a, b) = (logits(&m, &ids), logits(&merged, &ids));
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    eprintln!("MoErge of 3 copies: max |dlogit| = {diff:e}");
    assert_eq!(diff, 0.0, "logits must be identical");
}

fn parse_ffn(name: &str) -> (usize, &str) {
    let rest = name.strip_prefix("model.layers.").unwrap();
    let (l, rest) = rest.split_once('.').unwrap();
    (l.parse().unwrap(), rest.strip_prefix("mlp.").unwrap().strip_suffix(".weight").unwrap())
}

#[test]
fn two_checkpoints_average_exactly_and_keep_their_ffns() {
    let Some(a) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let b = perturbed_copy(&a, 0, &dir.path().join("b"));
    let out = dir.path().join("moe");
    let inputs = [MoergeInput::from(&a), MoergeInput::from(&b)];
    let report = moerge(&inputs, &MoergeOptions::default(), &out, None, WriteOptions::default()).unwrap();
    assert!(report.warnings.iter().any(|w| w.contains("only one of")), "{:?}", report.warnings);
    let merged = open_model(&out).unwrap();
    let (mut averaged, mut experts) = (0, 0);
    for (name, _) in dense_tensor_plan(&a.config) {
        let (x, y) = (a.source.read_f32(&name).unwrap(), b.source.read_f32(&name).unwrap());
        assert_ne!(x, y, "{name}: the copy must differ");
        if is_ffn(&name) {
            let (l, proj) = parse_ffn(&name);
            assert_eq!(merged.source.read_f32(&expert_weight_name(l, 0, Proj::from_hf(proj).unwrap())).unwrap(), x);
            assert_eq!(merged.source.read_f32(&expert_weight_name(l, 1, Proj::from_hf(proj).unwrap())).unwrap(), y);
            experts += 2;
            continue;
        }
        let got = merged.source.read_f32(&name).unwrap();
        for (i, ((p, q), g)) in x.iter().zip(&y).zip(&got).enumerate() {
            let want = ((f64::from(*p) + f64::from(*q)) / 2.0) as f32;
            assert_eq!(g.to_bits(), want.to_bits(), "{name}[{i}]: {g} != ({p} + {q}) / 2");
        }
        averaged += 1;
    }
    for l in 0..5 {
        assert!(merged.source.read_f32(&router_weight_name(l)).unwrap().iter().all(|&w| w == 0.0));
    }
    eprintln!("MoErge of 2 checkpoints: {averaged} tensors averaged exactly, {experts} expert tensors kept");
    assert_eq!((averaged, experts), (5 * 6 + 2, 5 * 3 * 2));
}

#[test]
fn weighted_means_cover_the_shared_tensors_of_two_models_of_one_shape_only() {
    let Some(a) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let b = perturbed_copy(&a, 0, &dir.path().join("b"));
    let grown = perturbed_copy(&a, 8, &dir.path().join("grown"));
    let opts = MoergeOptions::default();
    let two = [MoergeInput::from(&a), MoergeInput::from(&b)];
    let plan = plan_moerge(&two, &opts).unwrap();
    let means = weighted_means(&two, &plan);
    assert_eq!(means.len(), plan.tensors.len());
    let out = dir.path().join("moe");
    moerge(&two, &opts, &out, None, WriteOptions::default()).unwrap();
    let merged = open_model(&out).unwrap();
    let mut covered = 0;
    for (t, w) in plan.tensors.iter().zip(&means) {
        let Some(w) = w else {
            assert!(is_ffn(&t.name) || t.name.contains("block_sparse_moe"), "{} has no weighted mean", t.name);
            continue;
        };
        // The kernel's f32 arithmetic on these weights gives the written bytes.
        let (x, y) = (a.source.read_f32(&t.name).unwrap(), b.source.read_f32(&t.name).unwrap());
        assert!(w.inputs_exact(&x) && w.inputs_exact(&y), "{}", t.name);
        let sum: Vec<f32> = x.iter().zip(&y).map(|(p, q)| (0.0 + p * w.weights[0]) + q * w.weights[1]).collect();
        assert!(w.output_exact(&[&x, &y], &sum), "{}", t.name);
        let got = merged.source.read_f32(&t.name).unwrap();
        assert!(got.iter().zip(&sum).all(|(g, s)| g.to_bits() == s.to_bits()), "{}", t.name);
        covered += 1;
    }
    assert_eq!(covered, 5 * 6 + 2);
    // Three models, or shapes that differ: the f64 accumulator only.
    let three = [MoergeInput::from(&a), MoergeInput::from(&b), MoergeInput::from(&a)];
    assert!(weighted_means(&three, &plan_moerge(&three, &opts).unwrap()).iter().all(Option::is_none));
    let mixed = [MoergeInput::from(&a), MoergeInput::from(&grown)];
    let plan = plan_moerge(&mixed, &opts).unwrap();
    for (t, w) in plan.tensors.iter().zip(weighted_means(&mixed, &plan)) {
        let aligned = t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight";
        let averaged = !is_ffn(&t.name) && !t.name.contains("block_sparse_moe");
        assert_eq!(w.is_some(), averaged && !aligned, "{}", t.name);
    }
}

#[test]
fn grown_vocabulary_is_aligned_to_the_first_model_with_a_warning() {
    let Some(a) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let b = perturbed_copy(&a, 8, &dir.path().join("b"));
    let out = dir.path().join("moe");
    let report = moerge(
        &[MoergeInput::from(&a), MoergeInput::from(&b)],
        &MoergeOptions::default(),
        &out,
        None,
        Default::default(),
    )
    .unwrap();
    assert!(report.warnings.iter().any(|w| w.contains("vocabulary of 520")), "{:?}", report.warnings);
    assert!(report.warnings.iter().any(|w| w.contains("model.embed_tokens.weight") && w.contains("[520, 64]")));
    let merged = open_model(&out).unwrap();
    assert_eq!(merged.config.vocab_size, 512);
    let name = "model.embed_tokens.weight";
    let (x, y, got) =
        (a.source.read_f32(name).unwrap(), b.source.read_f32(name).unwrap(), merged.source.read_f32(name).unwrap());
    assert_eq!(got.len(), 512 * 64);
    for i in 0..got.len() {
        assert_eq!(got[i], ((f64::from(x[i]) + f64::from(y[i])) / 2.0) as f32);
    }
    // The other order keeps the grown rows: they are b's own (no zero padding).
    let out2 = dir.path().join("moe2");
    moerge(&[MoergeInput::from(&b), MoergeInput::from(&a)], &MoergeOptions::default(), &out2, None, Default::default())
        .unwrap();
    let got = open_model(&out2).unwrap().source.read_f32(name).unwrap();
    assert_eq!(got.len(), 520 * 64);
    assert_eq!(&got[512 * 64..], &y[512 * 64..]);
}

fn assert_refused(inputs: &[MoergeInput<'_>], expect: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("moe");
    let e = moerge(inputs, &MoergeOptions::default(), &out, None, WriteOptions::default()).unwrap_err().to_string();
    for x in expect {
        assert!(e.contains(x), "`{x}` not in: {e}");
    }
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left after: {e}");
}

/// A dense model of another shape (intermediate size 100), random weights.
fn other_shape(a: &LoadedModel, out: &Path) -> LoadedModel {
    struct Synthetic(ModelConfig);
    impl TensorSource for Synthetic {
        fn source_name(&self) -> &str {
            "synthetic"
        }
        fn tensors(&self) -> Vec<TensorInfo> {
            dense_tensor_plan(&self.0)
                .into_iter()
                .map(|(name, shape)| TensorInfo { name, dtype: DType::F32, shape })
                .collect()
        }
        fn read_f32(&self, name: &str) -> moe_shared::Result<Vec<f32>> {
            let n = self.info(name).unwrap().numel();
            Ok((0..n).map(|i| (i as f32 * 0.7).sin() * 0.1).collect())
        }
    }
    let config = ModelConfig { intermediate_size: 100, ..a.config.clone() };
    export_dense(&Synthetic(config.clone()), &config, out, None, None, WriteOptions::default()).unwrap();
    open_model(out).unwrap()
}

#[test]
fn different_architectures_and_tokenizers_are_refused() {
    let Some(a) = stories() else { return };
    let dir = tempfile::tempdir().unwrap();
    let c = other_shape(&a, &dir.path().join("c"));
    assert_refused(
        &[MoergeInput::from(&a), MoergeInput::from(&c)],
        &["stories260K.bin", "/c", "intermediate_size", "100", "172"],
    );
    let Some(tok_path) = common::data_file("models/smollm2-135m-instruct/tokenizer.json") else { return };
    let other = Tokenizer::from_hf_json(&std::fs::read(&tok_path).unwrap(), "smollm2").unwrap();
    let b = MoergeInput { name: "b-with-smollm2-tokenizer", tokenizer: Some(&other), ..MoergeInput::from(&a) };
    assert_refused(
        &[MoergeInput::from(&a), b],
        &["different tokenizers", "stories260K.bin", "b-with-smollm2-tokenizer"],
    );
    assert_refused(&[MoergeInput::from(&a)], &["at least two models"]);
    let opts = MoergeOptions { top_k: 3, ..Default::default() };
    let e = moerge(&[MoergeInput::from(&a); 2], &opts, &dir.path().join("x"), None, Default::default()).unwrap_err();
    assert!(e.to_string().contains("top-k 3"), "{e}");
    assert!(!dir.path().join("x").exists());
}
