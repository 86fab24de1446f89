//! `--layout` refusals and the llama.cpp expert-count warning through the
//! CLI (issue 13): an explicit layout that cannot hold the model exactly is
//! refused before anything is written, the message naming the field and the
//! layouts that can — q/k/v bias into Mixtral, per-layer expert counts into
//! Qwen2-MoE, un-normalised top-k into Mixtral (tiny transformers-written
//! fixtures), a router bias into Mixtral (`route`), and the aux-loss-free
//! selection bias into every public layout (`convert` of a model trained
//! with `--balance aux-free`; stories260K); an expert count llama.cpp's
//! backends handle badly is a warning on stderr, and the export is written.

mod common;

use std::path::{Path, PathBuf};

use common::{failure, json, ok, run, tmp};

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name).display().to_string()
}

/// Runs `args` + `--out out`, which must fail without creating `out`; its stderr.
fn refused(args: &[&str], out: &Path) -> String {
    let e = failure(&run(&[args, &["--out", out.to_str().unwrap()]].concat()));
    assert!(!out.exists(), "{} was created: {e}", out.display());
    e
}

#[test]
fn explicit_layouts_that_cannot_hold_the_model_are_refused_naming_the_field_and_the_layouts_that_can() {
    let dir = tmp("refusals");
    let out = dir.join("out");
    let (qwen2, mistral) = (fixture("tiny-qwen2"), fixture("tiny-mistral"));
    let e = refused(&["upcycle", &qwen2, "--experts", "4", "--layout", "mixtral"], &out);
    assert!(
        e.contains("the `mixtral` layout cannot hold")
            && e.contains("`attention_bias`")
            && e.contains("layouts that can: qwen2_moe, moe_studio"),
        "{e}"
    );
    let alloc = dir.join("alloc.json");
    std::fs::write(&alloc, br#"{"experts_per_layer": [2, 3]}"#).unwrap();
    let e = refused(&["upcycle", &qwen2, "--allocation", alloc.to_str().unwrap(), "--layout", "qwen2_moe"], &out);
    assert!(e.contains("`num_experts`") && e.contains("layouts that can: moe_studio"), "{e}");
    let e = refused(&["upcycle", &mistral, "--experts", "4", "--norm-topk", "false", "--layout", "mixtral"], &out);
    assert!(e.contains("`norm_topk_prob`") && e.contains("layouts that can: qwen2_moe, moe_studio"), "{e}");
    // DeepSeek-MoE's form, refused as safetensors and pointed to the GGUF
    let e = refused(
        &[
            "upcycle",
            &mistral,
            "--experts",
            "4",
            "--norm-topk",
            "false",
            "--shared-experts",
            "1",
            "--layout",
            "deepseek_moe",
        ],
        &out,
    );
    assert!(
        e.contains("`layout`") && e.contains("convert --to gguf") && e.contains("layouts that can: moe_studio"),
        "{e}"
    );
    // ... and `auto` writes what the named layouts refused
    let s = json(&run(&[
        "upcycle",
        &mistral,
        "--experts",
        "4",
        "--norm-topk",
        "false",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(s["layout"], "qwen2_moe", "{s}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn expert_counts_llama_cpp_handles_badly_are_a_warning_and_the_export_is_written() {
    let dir = tmp("expert-count");
    let out = dir.join("e3");
    let o = run(&[
        "upcycle",
        &fixture("tiny-mistral"),
        "--experts",
        "3",
        "--layout",
        "mixtral",
        "--out",
        out.to_str().unwrap(),
    ]);
    ok(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("warning:") && stderr.contains("3 experts") && stderr.contains("power of two"), "{stderr}");
    assert!(out.join("config.json").exists());
    let o = run(&[
        "upcycle",
        &fixture("tiny-mistral"),
        "--experts",
        "4",
        "--layout",
        "mixtral",
        "--out",
        dir.join("e4").to_str().unwrap(),
    ]);
    ok(&o);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("power of two"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// stories260K (shared data) or `None`.
fn stories() -> Option<(String, PathBuf)> {
    let model = common::stories()?;
    let tok = model.parent().unwrap().join("tok512.bin");
    Some((common::arg(&model), tok))
}

#[test]
fn a_router_bias_and_the_selection_bias_are_refused_by_every_public_layout() {
    let Some((model, tok)) = stories() else { return };
    let dir = tmp("bias");
    let moe = dir.join("moe");
    ok(&run(&["upcycle", &model, "--experts", "4", "--router-init", "random", "--out", moe.to_str().unwrap()]));
    let m = moe.to_str().unwrap();
    let text = dir.join("t.txt");
    std::fs::write(&text, "Once upon a time there was a little cat. It liked to play in the sun.\n".repeat(40))
        .unwrap();
    // a ridge router with a bias (route's default) into Mixtral
    let (da, db) = (format!("a={}", text.display()), format!("b={}", text.display()));
    let e = refused(
        &["route", m, "--domain", &da, "--domain", &db, "--context", "64", "--layout", "mixtral"],
        &dir.join("routed"),
    );
    assert!(e.contains("`router_bias`") && e.contains("layouts that can: moe_studio"), "{e}");
    // the aux-loss-free selection bias (one training step) into each public layout
    let train = dir.join("train");
    let data = format!("t={}", text.display());
    ok(&run(&[
        "train",
        m,
        "--tokenizer",
        tok.to_str().unwrap(),
        "--stage",
        "experts",
        "--data",
        &data,
        "--steps",
        "1",
        "--seq-len",
        "32",
        "--batch",
        "2",
        "--balance",
        "aux-free",
        "--out",
        train.to_str().unwrap(),
    ]));
    let trained = train.join("final");
    for layout in ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_moe"] {
        let out = dir.join(layout);
        let e = refused(&["convert", trained.to_str().unwrap(), "--layout", layout], &out);
        assert!(
            e.contains(&format!("the `{layout}` layout cannot hold"))
                && e.contains("`selection_bias`")
                && e.contains("layouts that can: moe_studio"),
            "{layout}: {e}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
