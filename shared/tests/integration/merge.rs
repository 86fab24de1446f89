//! Merge baselines (methods.md §1 "Baselines"): agreement with mergekit on
//! the committed tiny fixtures (tests/fixtures/merge, golden checksums from
//! tests/reference/make_merge_golden.py), and the methods' invariants on
//! real weights (stories260K): exact linear / task-arithmetic formulas, TIES
//! against a naive sort-based implementation, DARE by its statistics (its
//! RNG is not torch's, so never bitwise against mergekit).

use crate::common;

use std::path::{Path, PathBuf};

use moe_shared::checkpoint::open_model;
use moe_shared::methods::merge::{merge, plan_merge, write_merge, MergeMethod, MergeOptions, MergeReport, Rescale};
use moe_shared::tensor_io::safetensors_io::{SafetensorsFile, SafetensorsModel};
use moe_shared::tensor_io::sink::MemorySink;
use moe_shared::tensor_io::{Bytes, DType, TensorInfo, TensorSource};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// An in-memory checkpoint.
struct Mem {
    name: String,
    t: Vec<(TensorInfo, Vec<f32>)>,
}

impl TensorSource for Mem {
    fn source_name(&self) -> &str {
        &self.name
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        self.t.iter().map(|(i, _)| i.clone()).collect()
    }
    fn read_f32(&self, name: &str) -> moe_shared::Result<Vec<f32>> {
        self.t
            .iter()
            .find(|(i, _)| i.name == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| moe_shared::StudioError::tensor(&self.name, name, "missing"))
    }
}

impl Mem {
    fn get(&self, name: &str) -> &[f32] {
        &self.t.iter().find(|(i, _)| i.name == name).unwrap().1
    }
    fn map(&self, name: &str, f: impl Fn(&str, usize, f32) -> f32) -> Mem {
        let t = self
            .t
            .iter()
            .map(|(i, v)| (i.clone(), v.iter().enumerate().map(|(k, &x)| f(&i.name, k, x)).collect()))
            .collect();
        Mem { name: name.into(), t }
    }
}

fn bump(name: &str, i: usize, amp: f32, salt: u32) -> f32 {
    let h = name.bytes().fold(salt, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    amp * (((i as f32) * 0.618_034 + (h % 997) as f32).sin())
}

/// stories260K (f32) in memory, plus two perturbed "fine-tunes".
fn stories_family() -> Option<(Mem, Mem, Mem)> {
    let p = common::data_file("models/stories260K/stories260K.bin")?;
    let m = open_model(&p).unwrap();
    let t = m
        .source
        .tensors()
        .into_iter()
        .map(|i| {
            let v = m.source.read_f32(&i.name).unwrap();
            (TensorInfo { dtype: DType::F32, ..i }, v)
        })
        .collect();
    let base = Mem { name: "stories-base".into(), t };
    let m1 = base.map("stories-m1", |n, i, x| x + bump(n, i, 0.01, 1));
    let m2 = base.map("stories-m2", |n, i, x| x + bump(n, i, 0.02, 2) - bump(n, i, 0.005, 3));
    Some((base, m1, m2))
}

/// Runs a merge into memory and returns the output and the report.
fn merge_mem(
    models: &[&dyn TensorSource],
    base: Option<&dyn TensorSource>,
    opts: &MergeOptions,
) -> (SafetensorsFile, MergeReport) {
    let plan = plan_merge(models, base, opts).unwrap();
    let mut sink = MemorySink::new(plan.planned.clone());
    let stats = write_merge(models, base, &plan, &mut sink).unwrap();
    let f = SafetensorsFile::parse(Bytes::from_vec(sink.into_safetensors().unwrap()), "merged").unwrap();
    (f, moe_shared::methods::merge::merge_report(models, base, &plan, stats))
}

fn opts(method: MergeMethod, weights: &[f64]) -> MergeOptions {
    MergeOptions { weights: Some(weights.to_vec()), ..MergeOptions::new(method) }
}

#[test]
fn merges_agree_with_mergekit_on_the_fixtures() {
    let Some(golden) = common::golden_json("mergekit_merges.json") else { return };
    let root = repo_root();
    let dir = tempfile::tempdir().unwrap();
    let merges = golden["merges"].as_object().unwrap();
    assert!(merges.len() >= 4, "linear and task_arithmetic in f32 and bf16 at least");
    for (key, g) in merges {
        let method = MergeMethod::parse(g["method"].as_str().unwrap()).unwrap();
        let models: Vec<SafetensorsModel> = g["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| SafetensorsModel::open_dir(&root.join(m["path"].as_str().unwrap())).unwrap())
            .collect();
        let base = g["base"].as_str().map(|b| SafetensorsModel::open_dir(&root.join(b)).unwrap());
        let weights: Vec<f64> = g["models"].as_array().unwrap().iter().map(|m| m["weight"].as_f64().unwrap()).collect();
        let mut o = opts(method, &weights);
        if let Some(d) = g["models"][0]["density"].as_f64() {
            o.density = d;
        }
        let srcs: Vec<&dyn TensorSource> = models.iter().map(|m| m as &dyn TensorSource).collect();
        let out = dir.path().join(key);
        let report =
            merge(&srcs, base.as_ref().map(|b| b as &dyn TensorSource), &o, &out, &[], Default::default()).unwrap();
        let ours = SafetensorsModel::open_dir(&out).unwrap();
        let tensors = g["tensors"].as_object().unwrap();
        assert_eq!(report.tensors, tensors.len(), "{key}: tensor count");
        let bf16 = g["out_dtype"] == "bfloat16";
        let (mut worst_sum, mut worst_val, mut equal_vals, mut vals) = (0f64, 0f64, 0, 0);
        for (name, t) in tensors {
            let info = ours.info(name).unwrap_or_else(|| panic!("{key}: `{name}` missing"));
            assert_eq!(info.dtype.to_string(), t["dtype"].as_str().unwrap(), "{key} {name}");
            let shape: Vec<usize> =
                t["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            assert_eq!(info.shape, shape, "{key} {name}");
            let v: Vec<f64> = ours.read_f32(name).unwrap().into_iter().map(f64::from).collect();
            let sum: f64 = v.iter().sum();
            let abs_sum: f64 = v.iter().map(|x| x.abs()).sum();
            let sum_sq: f64 = v.iter().map(|x| x * x).sum();
            // f32: 1e-6 relative; bf16: a value may land one bf16 step
            // (2^-8 relative) away where torch's f32 sum rounds differently.
            let rel = if bf16 { 2f64.powi(-8) } else { 1e-6 };
            let (gs, ga, gq) =
                (t["sum"].as_f64().unwrap(), t["abs_sum"].as_f64().unwrap(), t["sum_sq"].as_f64().unwrap());
            let sum_err = (sum - gs).abs() / ga;
            worst_sum = worst_sum.max(sum_err).max((abs_sum - ga).abs() / ga).max((sum_sq - gq).abs() / gq);
            assert!(sum_err <= rel, "{key} {name}: sum {sum} vs mergekit {gs}");
            assert!((abs_sum - ga).abs() <= rel * ga, "{key} {name}: sum |x| {abs_sum} vs {ga}");
            assert!((sum_sq - gq).abs() <= 2.0 * rel * gq, "{key} {name}: sum x^2 {sum_sq} vs {gq}");
            for (k, want) in t["first8"].as_array().unwrap().iter().enumerate() {
                let want = want.as_f64().unwrap();
                let err = (v[k] - want).abs();
                vals += 1;
                equal_vals += usize::from(err == 0.0);
                worst_val = worst_val.max(err / want.abs().max(1e-30));
                assert!(err <= rel * want.abs(), "{key} {name}[{k}]: {} vs mergekit {want}", v[k]);
            }
        }
        eprintln!(
            "{key}: {} tensors, worst relative checksum error {worst_sum:.2e}, worst value error {worst_val:.2e}, {equal_vals}/{vals} leading values identical",
            tensors.len()
        );
    }
}

#[test]
fn linear_and_task_arithmetic_follow_their_formulas_exactly() {
    let Some((base, m1, m2)) = stories_family() else { return };
    let (lin, rep) = merge_mem(&[&m1, &m2], None, &opts(MergeMethod::Linear, &[0.3, 0.7]));
    assert!(rep.params.normalize, "mergekit's linear default: normalize");
    let (ta, rep) = merge_mem(&[&m1, &m2], Some(&base), &opts(MergeMethod::TaskArithmetic, &[0.5, 1.0]));
    assert!(!rep.params.normalize, "mergekit's task_arithmetic default: no normalize");
    let (w0, w1) = (0.3f32, 0.7f32);
    for (info, b) in &base.t {
        let (x0, x1) = (m1.get(&info.name), m2.get(&info.name));
        let l = lin.read_f32(&info.name).unwrap();
        let t = ta.read_f32(&info.name).unwrap();
        for k in 0..b.len() {
            let want = (x0[k] * w0 + x1[k] * w1) / (w0 + w1);
            assert_eq!(l[k].to_bits(), want.to_bits(), "linear {}[{k}]", info.name);
            let want = ((x0[k] - b[k]) * 0.5 + (x1[k] - b[k])) + b[k];
            assert_eq!(t[k].to_bits(), want.to_bits(), "task arithmetic {}[{k}]", info.name);
        }
    }
    // Normalised task arithmetic divides the summed delta by sum(w); lambda
    // scales it.
    let mut o = opts(MergeMethod::TaskArithmetic, &[0.5, 1.0]);
    o.normalize = Some(true);
    o.lambda = 2.0;
    let (tn, _) = merge_mem(&[&m1, &m2], Some(&base), &o);
    let name = "model.layers.1.mlp.up_proj.weight";
    let (b, x0, x1, got) = (base.get(name), m1.get(name), m2.get(name), tn.read_f32(name).unwrap());
    for k in 0..b.len() {
        let want = ((x0[k] - b[k]) * 0.5 + (x1[k] - b[k])) / 1.5 * 2.0 + b[k];
        assert_eq!(got[k].to_bits(), want.to_bits(), "{name}[{k}]");
    }
}

/// TIES by a naive, independent implementation: stable sort by magnitude
/// for the top-k, then the election and disjoint mean.
fn naive_ties(b: &[f32], xs: &[&[f32]], w: &[f32], density: f64) -> Vec<f32> {
    let n = b.len();
    let k = ((density * n as f64) as usize).max(1);
    let wd: Vec<Vec<f32>> = xs
        .iter()
        .zip(w)
        .map(|(x, &w)| {
            let d: Vec<f32> = x.iter().zip(b).map(|(x, b)| x - b).collect();
            let mut idx: Vec<usize> = (0..n).collect();
            idx.sort_by(|&i, &j| d[j].abs().total_cmp(&d[i].abs()).then(i.cmp(&j)));
            let mut t = vec![0f32; n];
            for &i in &idx[..k.min(n)] {
                t[i] = d[i];
            }
            t.iter().map(|x| x * w).collect()
        })
        .collect();
    (0..n)
        .map(|j| {
            let s: f32 = wd.iter().fold(0.0, |a, d| a + d[j]);
            let (mut m, mut div) = (0f32, 0f32);
            for (d, &wi) in wd.iter().zip(w) {
                if (s >= 0.0 && d[j] > 0.0) || (s < 0.0 && d[j] < 0.0) {
                    m += d[j];
                    div += wi;
                }
            }
            (m / if div == 0.0 { 1.0 } else { div }) + b[j]
        })
        .collect()
}

#[test]
fn ties_matches_a_naive_implementation_and_trims_by_magnitude() {
    let Some((base, m1, m2)) = stories_family() else { return };
    for density in [0.2, 0.5, 1.0] {
        let mut o = opts(MergeMethod::Ties, &[0.5, 1.0]);
        o.density = density;
        let (out, rep) = merge_mem(&[&m1, &m2], Some(&base), &o);
        assert!(rep.params.normalize, "mergekit's ties default: normalize");
        for (info, b) in &base.t {
            let want = naive_ties(b, &[m1.get(&info.name), m2.get(&info.name)], &[0.5, 1.0], density);
            let got = out.read_f32(&info.name).unwrap();
            for k in 0..b.len() {
                assert_eq!(got[k].to_bits(), want[k].to_bits(), "ties d={density} {}[{k}]", info.name);
            }
        }
        // Kept fraction: exactly max(1, floor(density * n)) per tensor and model.
        for s in &rep.per_tensor {
            let n = base.get(&s.name).len();
            let k = ((density * n as f64) as usize).max(1).min(n);
            assert!((s.kept_fraction.unwrap() - k as f64 / n as f64).abs() < 1e-12, "{s:?}");
        }
    }
    // One model: the survivors are the largest deltas.
    let mut o = opts(MergeMethod::Ties, &[1.0]);
    o.density = 0.3;
    let (out, _) = merge_mem(&[&m2], Some(&base), &o);
    let name = "model.layers.0.self_attn.o_proj.weight";
    let (b, x, got) = (base.get(name), m2.get(name), out.read_f32(name).unwrap());
    let (mut min_kept, mut max_dropped, mut kept) = (f32::INFINITY, 0f32, 0);
    for k in 0..b.len() {
        let d = (x[k] - b[k]).abs();
        if got[k] == b[k] && d > 0.0 {
            max_dropped = max_dropped.max(d);
        } else if d > 0.0 {
            min_kept = min_kept.min(d);
            kept += 1;
        }
    }
    assert_eq!(kept, (0.3 * b.len() as f64) as usize);
    assert!(min_kept >= max_dropped, "kept {min_kept} < dropped {max_dropped}");
}

#[test]
fn dare_keeps_density_of_the_delta_rescaled_and_is_unbiased() {
    let Some((base, m1, m2)) = stories_family() else { return };
    let p = 0.3f64;
    let mut o = opts(MergeMethod::Dare, &[1.0]);
    o.density = p;
    o.seed = 11;
    let (out, rep) = merge_mem(&[&m1], Some(&base), &o);
    assert_eq!(rep.params.rescale, Some(Rescale::InverseDensity));
    let (mut kept, mut total, mut sum_out, mut sum_d, mut var) = (0usize, 0usize, 0f64, 0f64, 0f64);
    for (info, b) in &base.t {
        let x = m1.get(&info.name);
        let got = out.read_f32(&info.name).unwrap();
        for k in 0..b.len() {
            let d = x[k] - b[k];
            if d == 0.0 {
                continue;
            }
            let rescaled = d / p as f32 + b[k];
            total += 1;
            if got[k].to_bits() == rescaled.to_bits() && got[k] != b[k] {
                kept += 1;
            } else {
                assert_eq!(got[k], b[k], "{}[{k}]: neither dropped nor rescaled", info.name);
            }
            sum_out += f64::from(got[k] - b[k]);
            sum_d += f64::from(d);
            var += f64::from(d).powi(2) * (1.0 - p) / p;
        }
    }
    let frac = kept as f64 / total as f64;
    let sigma = (p * (1.0 - p) / total as f64).sqrt();
    eprintln!("dare: kept {kept}/{total} = {frac:.4} (density {p}, 5 sigma = {:.4}); sum of merged deltas {sum_out:.4} vs {sum_d:.4} (5 sigma = {:.4})", 5.0 * sigma, 5.0 * var.sqrt());
    assert!((frac - p).abs() < 5.0 * sigma, "kept fraction {frac} vs density {p}");
    assert!((rep.kept_fraction.unwrap() - p).abs() < 5.0 * sigma);
    assert!((sum_out - sum_d).abs() < 5.0 * var.sqrt(), "E[dare] = task arithmetic: {sum_out} vs {sum_d}");

    // Seeded: same seed, same bytes; another seed, other masks.
    let (again, _) = merge_mem(&[&m1], Some(&base), &o);
    let name = "model.layers.3.mlp.down_proj.weight";
    assert_eq!(out.raw(name).unwrap().1, again.raw(name).unwrap().1);
    o.seed = 12;
    let (other, _) = merge_mem(&[&m1], Some(&base), &o);
    assert_ne!(out.raw(name).unwrap().1, other.raw(name).unwrap().1);

    // Density 1 is plain task arithmetic (mergekit returns the delta as is).
    let mut o1 = opts(MergeMethod::Dare, &[0.5, 1.0]);
    o1.density = 1.0;
    let (d1, _) = merge_mem(&[&m1, &m2], Some(&base), &o1);
    let (ta, _) = merge_mem(&[&m1, &m2], Some(&base), &opts(MergeMethod::TaskArithmetic, &[0.5, 1.0]));
    for (info, _) in &base.t {
        assert_eq!(d1.raw(&info.name).unwrap().1, ta.raw(&info.name).unwrap().1, "{}", info.name);
    }

    // mergekit 0.1.5's L1 rescale keeps each delta's L1 norm.
    let mut ol1 = opts(MergeMethod::Dare, &[1.0]);
    ol1.density = 0.4;
    ol1.rescale = Some(Rescale::L1);
    let (l1, _) = merge_mem(&[&m2], Some(&base), &ol1);
    for (info, b) in &base.t {
        let x = m2.get(&info.name);
        let got = l1.read_f32(&info.name).unwrap();
        let before: f64 = x.iter().zip(b.iter()).map(|(x, b)| f64::from((x - b).abs())).sum();
        let after: f64 = got.iter().zip(b.iter()).map(|(g, b)| f64::from((g - b).abs())).sum();
        assert!((after - before).abs() <= 1e-3 * before, "{}: L1 {after} vs {before}", info.name);
    }

    // dare-ties: sign election over dropped deltas; never moves an element
    // against the elected sign of the (dropped, weighted) deltas.
    let mut odt = opts(MergeMethod::DareTies, &[1.0, 1.0]);
    odt.density = 0.5;
    let (dt, rep) = merge_mem(&[&m1, &m2], Some(&base), &odt);
    assert!(!rep.params.normalize && rep.params.seed == Some(0));
    let got = dt.read_f32(name).unwrap();
    assert!(got.iter().zip(base.get(name)).any(|(g, b)| g != b));
}

#[test]
fn bad_merges_fail_clearly_and_write_nothing() {
    let Some((base, m1, _)) = stories_family() else { return };
    let err = |models: &[&dyn TensorSource], base: Option<&dyn TensorSource>, o: &MergeOptions| -> String {
        plan_merge(models, base, o).unwrap_err().to_string()
    };
    let e = err(&[&m1], None, &opts(MergeMethod::TaskArithmetic, &[1.0]));
    assert!(e.contains("needs --base"), "{e}");
    let e = err(&[&m1], Some(&base), &opts(MergeMethod::Linear, &[1.0]));
    assert!(e.contains("linear takes no --base"), "{e}");
    let e = err(&[&m1, &base], None, &opts(MergeMethod::Linear, &[1.0]));
    assert!(e.contains("1 weights for 2 models"), "{e}");
    let e = err(&[&m1, &base], None, &opts(MergeMethod::Linear, &[1.0, -1.0]));
    assert!(e.contains("sum to 0"), "{e}");
    let e = err(&[&m1], None, &opts(MergeMethod::Linear, &[f64::INFINITY]));
    assert!(e.contains("finite"), "{e}");
    for d in [0.0, 1.5, f64::NAN] {
        let mut o = opts(MergeMethod::Ties, &[1.0]);
        o.density = d;
        let e = err(&[&m1], Some(&base), &o);
        assert!(e.contains("density must be in (0, 1]"), "{e}");
    }
    let e = err(&[], None, &MergeOptions::new(MergeMethod::Linear));
    assert!(e.contains("at least one model"), "{e}");
    // Different vocabularies between two models.
    let mut small = base.map("small-vocab", |_, _, x| x);
    for (i, v) in small.t.iter_mut() {
        if i.name == "model.embed_tokens.weight" {
            i.shape = vec![500, 64];
            v.truncate(500 * 64);
        }
    }
    let e = err(&[&m1, &small], None, &MergeOptions::new(MergeMethod::Linear));
    assert!(e.contains("different vocabularies") && e.contains("stories-m1") && e.contains("small-vocab"), "{e}");
    let e = err(&[&m1], Some(&small), &MergeOptions::new(MergeMethod::TaskArithmetic));
    assert!(e.contains("model.embed_tokens.weight") && e.contains("small-vocab"), "{e}");
    // A missing tensor.
    let mut fewer = base.map("fewer", |_, _, x| x);
    fewer.t.retain(|(i, _)| i.name != "model.norm.weight");
    let e = err(&[&m1, &fewer], None, &MergeOptions::new(MergeMethod::Linear));
    assert!(e.contains("model.norm.weight") && e.contains("missing from the model 2 (fewer)"), "{e}");
    // Nothing is written on a validation error.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    merge(&[&m1, &small], None, &MergeOptions::new(MergeMethod::Linear), &out, &[], Default::default()).unwrap_err();
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
