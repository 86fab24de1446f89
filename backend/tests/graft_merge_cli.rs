//! `moe-studio graft` and `moe-studio merge` end to end on the committed
//! tiny fixtures (tests/fixtures/merge): `--json` summaries, the output
//! directory, and clear errors with nothing written on bad input.

mod common;

use std::path::{Path, PathBuf};

use common::{arg as path, failure, json, run};

fn fixture(dtype: &str, name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/merge").join(dtype).join(name);
    p.display().to_string()
}

/// A fresh directory under Cargo's per-test temporary directory.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("graft_merge_cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn graft_and_merge_write_models_and_json_summaries() {
    let dir = TempDir::new("ok");
    let (b, m1, m2) = (fixture("bf16", "base"), fixture("bf16", "m1"), fixture("bf16", "m2"));
    let out = path(&dir.path().join("grafted"));
    let r = json(&run(&["graft", &m1, "--base", &b, "--instruct", &m2, "--scale", "0.5", "--out", &out, "--json"]));
    assert_eq!(r["method"], "graft");
    assert_eq!(r["tensors"], 21);
    assert_eq!(r["grafted"], 21);
    assert_eq!(r["deltas"].as_array().unwrap().len(), 21);
    assert!(r["deltas"][0]["delta_l2"].as_f64().unwrap() > 0.0);
    assert!(Path::new(&out).join("model.safetensors").exists() && Path::new(&out).join("config.json").exists());

    let out = path(&dir.path().join("ta"));
    let r = json(&run(&[
        "merge",
        "task-arithmetic",
        &m1,
        &m2,
        "--base",
        &b,
        "--weights",
        "0.5,1.0",
        "--out",
        &out,
        "--json",
    ]));
    assert_eq!(r["params"]["method"], "task-arithmetic");
    assert_eq!(r["params"]["weights"], serde_json::json!([0.5, 1.0]));
    assert_eq!(r["dtype"], "BF16");

    let out = path(&dir.path().join("dare"));
    let r = json(&run(&[
        "merge",
        "dare",
        &m1,
        &m2,
        "--base",
        &b,
        "--density",
        "0.3",
        "--seed",
        "4",
        "--dtype",
        "f32",
        "--out",
        &out,
        "--json",
    ]));
    assert_eq!(r["dtype"], "F32");
    assert_eq!(r["params"]["seed"], 4);
    let kept = r["kept_fraction"].as_f64().unwrap();
    assert!((kept - 0.3).abs() < 0.05, "{kept}");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(Path::new(&out).join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["dtype"], "float32", "--dtype is recorded in config.json");
}

#[test]
fn bad_input_fails_clearly_without_output() {
    let dir = TempDir::new("bad");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let empty = path(&empty);
    let out_p = dir.path().join("out");
    let out = path(&out_p);
    let (b, m1) = (fixture("f32", "base"), fixture("f32", "m1"));
    let e = failure(&run(&["graft", &empty, "--base", &b, "--instruct", &m1, "--out", &out]));
    assert!(e.contains("opening the target") && e.contains("config.json"), "{e}");
    let e = failure(&run(&["merge", "linear", &empty, &m1, "--out", &out]));
    assert!(e.contains(&empty) && e.contains("config.json"), "{e}");
    let e = failure(&run(&["merge", "ties", &m1, "--out", &out]));
    assert!(e.contains("ties needs --base"), "{e}");
    let e = failure(&run(&["merge", "soup", &m1, "--out", &out]));
    assert!(e.contains("expected linear, task-arithmetic, ties, dare or dare-ties"), "{e}");
    // f32 base vs bf16 instruct is fine (a warning); a different model is not.
    let bf = fixture("bf16", "m1");
    let o = run(&["graft", &m1, "--base", &b, "--instruct", &bf, "--out", &out]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("different dtypes"));
    std::fs::remove_dir_all(&out_p).unwrap();
    assert!(!out_p.exists());
    let e = failure(&run(&["graft", &m1, "--base", &b, "--instruct", &m1, "--scale", "inf", "--out", &out]));
    assert!(e.contains("finite"), "{e}");
    assert!(!out_p.exists(), "nothing written on error");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "only the empty input directory remains");
}
