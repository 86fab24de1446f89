//! `moe-studio recipe FILE.yml` end to end: the committed recipes of
//! tests/reference/recipes (mergekit's documented config shapes on the tiny
//! fixtures) against what mergekit 0.1.5 / mergekit-moe wrote from the same
//! files (tests/reference/golden/mergekit_recipes.json, made by
//! tests/reference/make_recipe_golden.py): linear / task arithmetic / TIES
//! within the tolerance of the merge golden test, DARE by its statistics,
//! mergekit-moe's base tensors, experts and `cheap_embed` routers, its
//! `shared_experts` (Qwen2-MoE output: the shared expert's FFN and its
//! `shared_expert_gate`); a studio pipeline (MoErge -> ridge router ->
//! graft) in one file; refusals that name the key and write nothing.

mod common;

use std::path::{Path, PathBuf};

use common::{arg, failure, ok, run};
use moe_shared::tensor_io::safetensors_io::SafetensorsModel;
use moe_shared::tensor_io::TensorSource;
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

fn golden() -> Value {
    let p = root().join("tests/reference/golden/mergekit_recipes.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

/// A fresh directory under Cargo's per-test temporary directory.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("recipe_cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a committed recipe from the repository root; returns the output.
fn run_recipe(dir: &TempDir, name: &str) -> SafetensorsModel {
    let out = dir.path().join(name);
    let recipe = root().join(format!("tests/reference/recipes/{name}.yml"));
    let r = run(&[
        "--backend=cpu",
        "recipe",
        &arg(&recipe),
        "--out",
        &arg(&out),
        "--base-dir",
        &arg(&root()),
        "--seed",
        "0",
    ]);
    ok(&r);
    SafetensorsModel::open_dir(&out).unwrap()
}

/// `(sum, sum |x|, sum x^2)` in f64.
fn sums(v: &[f32]) -> (f64, f64, f64) {
    v.iter().fold((0.0, 0.0, 0.0), |(s, a, q), &x| {
        let x = f64::from(x);
        (s + x, a + x.abs(), q + x * x)
    })
}

fn check_sums(what: &str, got: (f64, f64, f64), g: &Value, rel: f64) {
    let (gs, ga, gq) = (g["sum"].as_f64().unwrap(), g["abs_sum"].as_f64().unwrap(), g["sum_sq"].as_f64().unwrap());
    assert!((got.0 - gs).abs() <= rel * ga, "{what}: sum {} vs mergekit {gs}", got.0);
    assert!((got.1 - ga).abs() <= rel * ga, "{what}: sum |x| {} vs mergekit {ga}", got.1);
    assert!((got.2 - gq).abs() <= 2.0 * rel * gq, "{what}: sum x^2 {} vs mergekit {gq}", got.2);
}

fn check_first8(what: &str, v: &[f32], g: &Value, rel: f64) {
    for (k, want) in g["first8"].as_array().unwrap().iter().enumerate() {
        let want = want.as_f64().unwrap();
        let err = (f64::from(v[k]) - want).abs();
        assert!(err <= rel * want.abs(), "{what}[{k}]: {} vs mergekit {want}", v[k]);
    }
}

#[test]
fn mergekit_merge_recipes_give_mergekit_s_tensors() {
    let g = golden();
    let dir = TempDir::new("merge");
    for name in ["linear", "task_arithmetic", "ties"] {
        let ours = run_recipe(&dir, name);
        let tensors = g["recipes"][name]["tensors"].as_object().unwrap();
        assert_eq!(ours.tensors().len(), tensors.len(), "{name}: tensor count");
        let (mut worst, mut n) = (0f64, 0);
        for (t, gt) in tensors {
            let info = ours.info(t).unwrap_or_else(|| panic!("{name}: `{t}` missing"));
            assert_eq!(info.dtype.to_string(), gt["dtype"].as_str().unwrap(), "{name} {t}");
            let bf16 = gt["dtype"] == "BF16";
            // As the merge golden test: f32 1e-6 relative; bf16 one bf16 step.
            let rel = if bf16 { 2f64.powi(-8) } else { 1e-6 };
            let v = ours.read_f32(t).unwrap();
            let s = sums(&v);
            worst = worst.max((s.1 - gt["abs_sum"].as_f64().unwrap()).abs() / gt["abs_sum"].as_f64().unwrap());
            check_sums(&format!("{name} {t}"), s, gt, rel);
            check_first8(&format!("{name} {t}"), &v, gt, rel);
            n += 1;
        }
        eprintln!("{name}: {n} tensors agree with mergekit, worst relative sum |x| error {worst:.2e}");
    }
}

#[test]
fn dare_recipes_match_mergekit_s_statistics() {
    let g = golden();
    let dir = TempDir::new("dare");
    let base = SafetensorsModel::open_dir(&root().join("tests/fixtures/merge/f32/base")).unwrap();
    for name in ["dare_linear", "dare_ties"] {
        let ours = run_recipe(&dir, name);
        let delta = g["recipes"][name]["delta"].as_object().unwrap();
        let (mut changed, mut total, mut l1, mut theirs_changed, mut theirs_l1) = (0usize, 0usize, 0f64, 0f64, 0f64);
        for (t, d) in delta {
            let (o, b) = (ours.read_f32(t).unwrap(), base.read_f32(t).unwrap());
            changed += o.iter().zip(&b).filter(|(x, y)| x != y).count();
            l1 += o.iter().zip(&b).map(|(x, y)| f64::from((x - y).abs())).sum::<f64>();
            total += o.len();
            theirs_changed += d["changed_fraction"].as_f64().unwrap() * o.len() as f64;
            theirs_l1 += d["delta_l1"].as_f64().unwrap();
        }
        let (p_ours, p_theirs) = (changed as f64 / total as f64, theirs_changed / total as f64);
        // Two independent binomial fractions: 5 sigma of their difference.
        let sigma = (2.0 * p_theirs * (1.0 - p_theirs) / total as f64).sqrt();
        eprintln!(
            "{name}: changed {p_ours:.4} (mergekit {p_theirs:.4}, 5 sigma {:.4}); L1 of the merged delta {l1:.4} \
             (mergekit {theirs_l1:.4})",
            5.0 * sigma
        );
        assert!((p_ours - p_theirs).abs() < 5.0 * sigma, "{name}: changed fraction {p_ours} vs mergekit {p_theirs}");
        // dare_linear with mergekit's L1 rescale keeps the delta's L1 norm
        // whatever the mask; dare_ties' sign election varies with it.
        let tol = if name == "dare_linear" { 1e-3 } else { 0.1 };
        assert!((l1 - theirs_l1).abs() <= tol * theirs_l1, "{name}: L1 {l1} vs mergekit {theirs_l1}");
    }
}

#[test]
fn mergekit_moe_recipes_copy_base_and_experts_and_match_cheap_embed_routers() {
    let g = golden();
    let dir = TempDir::new("moe");
    let fix = |n: &str| SafetensorsModel::open_dir(&root().join("tests/fixtures/merge/f32").join(n)).unwrap();
    let (base, m1, m2) = (fix("base"), fix("m1"), fix("m2"));
    for name in ["moe_cheap_embed", "moe_random"] {
        let ours = run_recipe(&dir, name);
        let gr = &g["recipes"][name];
        let cfg: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(name).join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["model_type"], "mixtral", "{name}");
        assert_eq!((cfg["num_local_experts"].as_u64(), cfg["num_experts_per_tok"].as_u64()), (Some(2), Some(2)));
        let bf16 = name == "moe_random";
        let rel = if bf16 { 2f64.powi(-8) } else { 1e-6 };
        for (t, gt) in gr["tensors"].as_object().unwrap() {
            if t.contains(".mlp.") {
                continue;
            }
            // Not an expert or router: the base's tensor (mergekit-moe copies it).
            let v = ours.read_f32(t).unwrap();
            assert_eq!(ours.info(t).unwrap().dtype.to_string(), gt["dtype"].as_str().unwrap(), "{name} {t}");
            check_sums(&format!("{name} {t}"), sums(&v), gt, rel);
            let b = base.read_f32(t).unwrap();
            assert!(v.iter().zip(&b).all(|(x, y)| (x - y).abs() <= rel as f32 * y.abs()), "{name} {t}: not the base's");
        }
        for l in 0..2 {
            // Experts: mergekit's fused [E, 2f, d] gate_up and [E, d, f] down
            // hold the same values as our w1, w3 and w2 of every expert.
            let e = |e: usize, w: &str| {
                ours.read_f32(&format!("model.layers.{l}.block_sparse_moe.experts.{e}.{w}.weight")).unwrap()
            };
            let (gate_up, down): (Vec<f32>, Vec<f32>) =
                ([e(0, "w1"), e(0, "w3"), e(1, "w1"), e(1, "w3")].concat(), [e(0, "w2"), e(1, "w2")].concat());
            let gu = &gr["tensors"][format!("model.layers.{l}.mlp.experts.gate_up_proj")];
            check_sums(&format!("{name} layer {l} gate_up"), sums(&gate_up), gu, rel);
            check_first8(&format!("{name} layer {l} gate_up"), &gate_up, gu, rel);
            let dn = &gr["tensors"][format!("model.layers.{l}.mlp.experts.down_proj")];
            check_sums(&format!("{name} layer {l} down"), sums(&down), dn, rel);
            if !bf16 {
                let p = format!("model.layers.{l}.mlp.gate_proj.weight");
                assert_eq!(e(0, "w1"), m1.read_f32(&p).unwrap());
                assert_eq!(e(1, "w1"), m2.read_f32(&p).unwrap());
            }
            let router = ours.read_f32(&format!("model.layers.{l}.block_sparse_moe.gate.weight")).unwrap();
            let theirs: Vec<f64> = gr["routers"][format!("model.layers.{l}.mlp.gate.weight")]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(router.len(), theirs.len());
            if name == "moe_cheap_embed" {
                let worst = router.iter().zip(&theirs).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0.0, f64::max);
                eprintln!("{name} layer {l}: router max |ours - mergekit| = {worst:.2e}");
                assert!(worst < 1e-6, "{name} layer {l}: cheap_embed router differs from mergekit's by {worst}");
            } else {
                // Both N(0, 1) (different generators): mean square near 1.
                for (who, ms) in [
                    ("ours", router.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / router.len() as f64),
                    ("mergekit", theirs.iter().map(|x| x * x).sum::<f64>() / theirs.len() as f64),
                ] {
                    assert!((0.5..1.6).contains(&ms), "{name} layer {l}: {who}'s router mean square {ms}");
                }
            }
        }
    }
}

#[test]
fn a_mergekit_moe_shared_expert_recipe_gives_mergekit_s_qwen2_moe() {
    let g = golden();
    let dir = TempDir::new("shared");
    let name = "moe_shared_expert";
    let ours = run_recipe(&dir, name);
    let gr = &g["recipes"][name];
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(name).join("config.json")).unwrap()).unwrap();
    // mergekit picks Qwen MoE (the only output that holds a shared expert
    // with prompts); the studio's `auto` layout picks qwen2_moe.
    let theirs = &gr["config"];
    assert_eq!(cfg["model_type"], "qwen2_moe");
    assert_eq!(theirs["model_type"], "qwen2_moe");
    for key in [
        "num_experts",
        "num_experts_per_tok",
        "norm_topk_prob",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
    ] {
        assert_eq!(cfg[key], theirs[key], "config `{key}`");
    }
    let fix = |n: &str| SafetensorsModel::open_dir(&root().join("tests/fixtures/merge/f32").join(n)).unwrap();
    let m1 = fix("m1");
    let mut compared = 0;
    for (t, gt) in gr["tensors"].as_object().unwrap() {
        if t.ends_with("_proj.bias") {
            // mergekit gives a Llama base zero q/k/v biases (Qwen2-MoE's
            // default has them); the studio writes `qkv_bias: false`.
            assert_eq!(gt["abs_sum"].as_f64(), Some(0.0), "{t}");
            assert!(ours.info(t).is_none(), "{t}");
            assert_eq!(cfg["qkv_bias"], false);
            continue;
        }
        let info = ours.info(t).unwrap_or_else(|| panic!("`{t}` missing"));
        assert_eq!(info.dtype.to_string(), gt["dtype"].as_str().unwrap(), "{t}");
        let shape: Vec<usize> = gt["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        assert_eq!(info.shape, shape, "{t}");
        let v = ours.read_f32(t).unwrap();
        check_sums(t, sums(&v), gt, 1e-6);
        check_first8(t, &v, gt, 1e-6);
        compared += 1;
    }
    assert_eq!(compared, ours.tensors().len(), "every tensor of ours is in mergekit's output");
    for l in 0..2 {
        for p in ["gate_proj", "up_proj", "down_proj"] {
            // The shared expert is its source model's FFN, bit for bit.
            let shared = ours.read_f32(&format!("model.layers.{l}.mlp.shared_expert.{p}.weight")).unwrap();
            assert_eq!(shared, m1.read_f32(&format!("model.layers.{l}.mlp.{p}.weight")).unwrap(), "layer {l} {p}");
        }
        for gate in ["gate", "shared_expert_gate"] {
            let t = format!("model.layers.{l}.mlp.{gate}.weight");
            let v = ours.read_f32(&t).unwrap();
            let theirs: Vec<f64> = gr["routers"][&t].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            assert_eq!(v.len(), theirs.len(), "{t}");
            let worst = v.iter().zip(&theirs).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0.0, f64::max);
            eprintln!("{t}: max |ours - mergekit| = {worst:.2e}");
            assert!(worst < 1e-6, "{t} differs from mergekit's by {worst}");
        }
    }
    eprintln!("{name}: {compared} tensors agree with mergekit 0.1.5");
}

#[test]
fn a_studio_recipe_runs_moerge_ridge_router_and_graft_in_one_file() {
    let dir = TempDir::new("studio");
    let f = |n: &str| arg(&root().join("tests/fixtures/merge/f32").join(n));
    let code = "code function loop compile test code loop function\n".repeat(40);
    let math = "math proof number sum prime number proof math\n".repeat(40);
    std::fs::write(dir.path().join("code.txt"), code).unwrap();
    std::fs::write(dir.path().join("math.txt"), math).unwrap();
    let recipe = format!(
        "# DUME + DeltaMoE graft\nexperts:\n  - source_model: {m1}\n    name: code\n    data: code.txt\n  \
         - source_model: {m2}\n    name: math\n    data: math.txt\ngate_mode: ridge\nexperts_per_token: 1\n\
         ridge:\n  lambda: 0.01\n  max_tokens: 200\n  context: 16\ngraft:\n  base: {b}\n  instruct: {m1}\n  scale: 0.5\n",
        m1 = f("m1"),
        m2 = f("m2"),
        b = f("base")
    );
    let rp = dir.path().join("pipeline.yml");
    std::fs::write(&rp, recipe).unwrap();
    let out = dir.path().join("out");
    let base_dir = arg(dir.path());
    let dry =
        ok(&run(&["--backend=cpu", "recipe", &arg(&rp), "--out", &arg(&out), "--base-dir", &base_dir, "--dry-run"]));
    assert!(dry.contains("studio recipe") && dry.contains("3 stage(s)"), "{dry}");
    assert!(dry.contains(" moerge ") && dry.contains(" route ") && dry.contains(" graft "), "{dry}");
    assert!(!out.exists(), "--dry-run writes nothing");
    ok(&run(&["--backend=cpu", "recipe", &arg(&rp), "--out", &arg(&out), "--base-dir", &base_dir]));
    assert_eq!(dir.entries(), ["code.txt", "math.txt", "out", "pipeline.yml"], "the work directory is removed");
    let m = SafetensorsModel::open_dir(&out).unwrap();
    let router_name = m.tensors().into_iter().map(|t| t.name).find(|n| n.contains("gate.weight")).expect("a router");
    assert!(m.read_f32(&router_name).unwrap().iter().any(|&x| x != 0.0), "the ridge router was fitted");
    // The graft added 0.5 (m1 - base) to the MoErged (mean) attention.
    let t = "model.layers.0.self_attn.q_proj.weight";
    let r = |n: &str| {
        SafetensorsModel::open_dir(&root().join("tests/fixtures/merge/f32").join(n)).unwrap().read_f32(t).unwrap()
    };
    let (b, m1, m2) = (r("base"), r("m1"), r("m2"));
    let got = m.read_f32(t).unwrap();
    for k in 0..got.len() {
        let want = (f64::from(m1[k]) + f64::from(m2[k])) / 2.0 + 0.5 * (f64::from(m1[k]) - f64::from(b[k]));
        assert!((f64::from(got[k]) - want).abs() < 1e-6, "{t}[{k}]: {} vs {want}", got[k]);
    }
}

#[test]
fn unsupported_recipe_keys_are_refused_by_name_and_nothing_is_written() {
    let dir = TempDir::new("refuse");
    let m = arg(&root().join("tests/fixtures/merge/f32/m1"));
    let b = arg(&root().join("tests/fixtures/merge/f32/base"));
    let cases: Vec<(String, &str)> = vec![
        (format!("models:\n  - model: {m}\n    parameters: {{weight: 1}}\nmerge_method: linear\nfoo_bar: 1\n"), "unknown key `foo_bar`"),
        (
            format!("models:\n  - model: {m}\n    parameters: {{weight: 1}}\nmerge_method: slerp\nbase_model: {b}\n"),
            "`merge_method: slerp` is a mergekit method the studio does not implement (supported: linear, task_arithmetic, ties, dare_linear, dare_ties)",
        ),
        (
            format!("models:\n  - model: {m}\n    parameters: {{weight: 1}}\nmerge_method: dare-ties\nbase_model: {b}\n"),
            "did you mean `dare_ties`?",
        ),
        (
            format!("models:\n  - model: {m}\n    parameters: {{weight: 1, desnity: 0.5}}\nmerge_method: ties\nbase_model: {b}\n"),
            "unknown key `models[0].parameters.desnity`: did you mean `models[0].parameters.density`?",
        ),
        (
            format!("merge_method: ties\nbase_model: {b}\nmodels:\n  - model: {m}\n    parameters: {{weight: 1}}\nparamters: {{normalize: true}}\n"),
            "unknown key `paramters`: did you mean `parameters`?",
        ),
        (format!("slices: []\nmerge_method: passthrough\nmodels:\n  - model: {m}\n"), "`slices` is not supported"),
        (
            format!("models:\n  - model: {m}\n    parameters: {{weight: [0, 0.5, 1]}}\nmerge_method: task_arithmetic\nbase_model: {b}\n"),
            "`models[0].parameters.weight`: per-layer gradients",
        ),
        (
            format!("base_model: {b}\narchitecture: mixtral\ngate_mode: random\nexperts:\n  - source_model: {m}\n  - source_model: {m}\nshared_experts:\n  - source_model: {m}\n"),
            "`shared_experts`: the `mixtral` output has no shared experts (mergekit-moe refuses this too)",
        ),
        (
            format!("base_model: {b}\narchitecture: qwen\ngate_mode: cheap_embed\nexperts:\n  - {{source_model: {m}, positive_prompts: [a]}}\n  - {{source_model: {m}, positive_prompts: [b]}}\nshared_experts:\n  - source_model: {m}\n"),
            "Qwen2-MoE holds exactly one gated shared expert (got 1 ungated: no prompts)",
        ),
        (
            format!("base_model: {b}\ngate_mode: random\nexperts:\n  - source_model: {m}\n  - source_model: {m}\nshared_experts:\n  - source_model: {m}\n    residual_scale: 0.5\n"),
            "`shared_experts[0].residual_scale` is not supported",
        ),
        (
            format!("base_model: {b}\ngate_mode: random\ntokenizer_source: union\nexperts:\n  - source_model: {m}\n  - source_model: {m}\n"),
            "`tokenizer_source: union` is not supported: only `base`",
        ),
        (
            format!("base_model: {b}\ngate_mode: random\nexperts:\n  - source_model: {m}\n  - source_model: {m}\ntrain:\n  steps: 10\n"),
            "`train` is not supported: continued pre-training is not a recipe stage",
        ),
        (
            format!("base_model: {b}\ngate_mode: random\nexperts:\n  - source_model: {m}\n    noise_scale: 0.1\n  - source_model: {m}\n"),
            "`experts[0].noise_scale` is not supported",
        ),
        (
            format!("base_model: {b}\ngate_mode: hiden\nexperts:\n  - source_model: {m}\n  - source_model: {m}\n"),
            "did you mean `hidden`?",
        ),
        (
            format!("base_model: {b}\ngate_mode: random\nexperts_per_tokn: 1\nexperts:\n  - source_model: {m}\n  - source_model: {m}\n"),
            "did you mean `experts_per_token`?",
        ),
        (
            "models:\n  - model: org/not-here\n    parameters: {weight: 1}\nmerge_method: linear\n".to_string(),
            "`models[0].model`",
        ),
    ];
    let before = dir.entries();
    for (i, (yaml, want)) in cases.iter().enumerate() {
        let rp = dir.path().join(format!("r{i}.yml"));
        std::fs::write(&rp, yaml).unwrap();
        let out = dir.path().join(format!("out{i}"));
        let e =
            failure(&run(&["--backend=cpu", "recipe", &arg(&rp), "--out", &arg(&out), "--base-dir", &arg(dir.path())]));
        assert!(e.contains(want), "case {i}: {e}\nwanted: {want}");
        assert!(e.contains(&format!("r{i}.yml")), "case {i} names the recipe: {e}");
        assert!(!out.exists(), "case {i}: output written");
        std::fs::remove_file(&rp).unwrap();
        assert_eq!(dir.entries(), before, "case {i}: something was left behind");
    }
}
