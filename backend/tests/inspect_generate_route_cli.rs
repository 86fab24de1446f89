//! `moe-studio inspect`, `generate` and `route` end to end on stories260K:
//! the MoE structure in `inspect` (text and `--json`), a model directory
//! without config.json, the sampling flags checked before the model is
//! read, and `route`'s studio-layout warning pointing to `--no-bias`.

mod common;

use std::path::Path;

use common::{failure, json, ok, run, stories, tmp};

#[test]
fn inspect_shows_the_moe_structure_in_text_and_json() {
    let Some(model) = stories() else { return };
    let dir = tmp("inspect");
    let out = dir.join("moe");
    let o = out.to_str().unwrap();
    ok(&run(&["upcycle", model.to_str().unwrap(), "--experts", "4", "--top-k", "2", "--out", o]));
    let dense = json(&run(&["inspect", model.to_str().unwrap(), "--json"]));
    assert!(dense.get("moe").is_none(), "a dense model has no moe: {dense}");
    let s = json(&run(&["inspect", o, "--json"]));
    let m = &s["moe"];
    assert_eq!(m["layout"], "mixtral", "{m}");
    assert_eq!(m["experts_per_layer"], serde_json::json!([4, 4, 4, 4, 4]));
    assert_eq!(m["top_k_per_layer"], serde_json::json!([2, 2, 2, 2, 2]));
    assert_eq!(m["frozen_experts"], serde_json::json!([[0], [0], [0], [0], [0]]));
    assert_eq!(m["router_bias"], serde_json::json!([false, false, false, false, false]));
    let total = m["total_parameters"].as_u64().unwrap();
    let active = m["active_parameters_per_token"].as_u64().unwrap();
    assert_eq!(total, s["parameters"].as_u64().unwrap(), "total = the tensors present");
    // 2 of the 4 experts are idle per token: 5 layers x 2 x 3 x d x f
    assert_eq!(total - active, 5 * 2 * 3 * 64 * 172);
    let text = ok(&run(&["inspect", o]));
    assert!(text.contains("moe layout   mixtral"), "{text}");
    assert!(text.contains("experts      [4 x5] per layer"), "{text}");
    assert!(text.contains("top-k        [2 x5]"), "{text}");
    assert!(text.contains("frozen       [[0] x5]"), "{text}");
    assert!(text.contains("router bias  no"), "{text}");
    assert!(text.contains(&format!("{total} total")) && text.contains(&format!("{active} active per token")), "{text}");
    let text = ok(&run(&["inspect", model.to_str().unwrap()]));
    assert!(!text.contains("experts"), "dense: {text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn inspect_opens_a_llama2c_directory_without_config_json() {
    let Some(model) = stories() else { return };
    let dir = model.parent().unwrap();
    let s = json(&run(&["inspect", dir.to_str().unwrap(), "--json"]));
    assert_eq!(s["format"], "llama2c");
    assert_eq!(s["tokenizer_vocab"], 512);
    let two = tmp("two-bins");
    std::fs::copy(&model, two.join("a.bin")).unwrap();
    std::fs::copy(&model, two.join("b.bin")).unwrap();
    let e = failure(&run(&["inspect", two.to_str().unwrap()]));
    assert!(e.contains("a.bin, b.bin"), "{e}");
    std::fs::remove_dir_all(&two).unwrap();
}

#[test]
fn generate_checks_sampling_flags_before_loading() {
    // The model path does not exist: each error must come from the flag check.
    let m = "/nonexistent/model.bin";
    let e = failure(&run(&["generate", m, "--prompt", "x", "--top-p", "2"]));
    assert!(e.contains("--top-p") && e.contains("(0, 1]"), "{e}");
    let e = failure(&run(&["generate", m, "--prompt", "x", "--top-p", "0"]));
    assert!(e.contains("--top-p"), "{e}");
    let e = failure(&run(&["generate", m, "--prompt", "x", "--temperature", "-1"]));
    assert!(e.contains("--temperature"), "{e}");
    let e = failure(&run(&["generate", m, "--prompt", "x", "--temperature", "NaN"]));
    assert!(e.contains("--temperature"), "{e}");
    let e = failure(&run(&["generate", m, "--prompt", "x", "--max-new-tokens", "0"]));
    assert!(e.contains("--max-new-tokens"), "{e}");
    let e = failure(&run(&["generate", m, "--prompt", "x"]));
    assert!(e.contains("nonexistent"), "valid flags reach the model: {e}");
}

#[test]
fn route_with_bias_warns_and_points_to_no_bias() {
    let Some(model) = stories() else { return };
    let model = model.to_str().unwrap();
    let dir = tmp("route");
    let moe = dir.join("moe");
    ok(&run(&["moerge", model, model, "--out", moe.to_str().unwrap()]));
    let a = dir.join("a.txt");
    let b = dir.join("b.txt");
    std::fs::write(&a, "Once upon a time there was a little cat. The cat liked to play in the sun. ".repeat(8))
        .unwrap();
    std::fs::write(&b, "Tom had a big red ball. He threw the ball to his dog every day. ".repeat(8)).unwrap();
    let (da, db) = (format!("a={}", a.display()), format!("b={}", b.display()));
    let route = |out: &Path, extra: &[&str]| {
        let args = ["route", moe.to_str().unwrap(), "--domain", &da, "--domain", &db, "--context", "64"];
        run(&[&args[..], extra, &["--out", out.to_str().unwrap(), "--json"]].concat())
    };
    let o = route(&dir.join("biased"), &[]);
    let s = json(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("warning:") && stderr.contains("studio layout") && stderr.contains("--no-bias"),
        "{stderr}"
    );
    assert_eq!(s["layout"], "moe_studio");
    assert!(s["warnings"][0].as_str().unwrap().contains("--no-bias"), "{s}");
    let o = route(&dir.join("plain"), &["--no-bias"]);
    let s = json(&o);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("warning"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(s["layout"], "mixtral");
    assert_eq!(s["warnings"], serde_json::json!([]));
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("plain/config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "mixtral");
    std::fs::remove_dir_all(&dir).unwrap();
}
