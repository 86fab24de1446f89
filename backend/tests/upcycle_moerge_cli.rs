//! `moe-studio upcycle` and `moe-studio moerge` end to end on stories260K:
//! `--json` summaries, both allocation-file forms, and clear errors with no
//! output directory on bad input.

mod common;

use common::{failure, json, ok, run, tmp};

/// stories260K's checkpoint path as an argument.
fn stories() -> Option<String> {
    common::stories().map(|p| common::arg(&p))
}

#[test]
fn upcycle_writes_mixtral_or_studio_layout_and_reports_json() {
    let Some(model) = stories() else { return };
    let dir = tmp("upcycle");
    let out = dir.join("mixtral");
    let s = json(&run(&[
        "upcycle",
        &model,
        "--experts",
        "4",
        "--router-init",
        "random",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(s["layout"], "mixtral");
    assert_eq!(s["experts_per_layer"], serde_json::json!([4, 4, 4, 4, 4]));
    assert_eq!(s["router_init"], "random");
    assert!(s["bytes_on_disk"].as_u64().unwrap() > s["tensor_bytes"].as_u64().unwrap());
    assert!(s["seconds"].as_f64().is_some() && s["peak_rss_mib"].as_f64().is_some());
    let insp = json(&run(&["inspect", out.to_str().unwrap(), "--json"]));
    assert!(insp.to_string().contains("block_sparse_moe"), "inspect reads the MoE checkpoint");

    let alloc = dir.join("alloc.json");
    std::fs::write(&alloc, br#"{"new_experts_per_layer": [1, 3, null, 1, 2], "method": "neuronmoe"}"#).unwrap();
    let out = dir.join("studio");
    let s = json(&run(&[
        "upcycle",
        &model,
        "--allocation",
        alloc.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(s["layout"], "moe_studio");
    assert_eq!(s["experts_per_layer"], serde_json::json!([2, 4, 0, 2, 3]));
    assert!(s["layout_reason"].as_str().unwrap().contains("layer 0"), "{s}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn upcycle_errors_are_clear_and_leave_nothing() {
    let Some(model) = stories() else { return };
    let dir = tmp("errors");
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    let alloc = dir.join("short.json");
    std::fs::write(&alloc, br#"{"experts_per_layer": [2, 2]}"#).unwrap();
    let a = alloc.to_str().unwrap();
    let e = failure(&run(&["upcycle", &model, "--allocation", a, "--out", o]));
    assert!(e.contains("short.json") && e.contains("2 layers") && e.contains("has 5"), "{e}");
    let e = failure(&run(&["upcycle", &model, "--experts", "2", "--top-k", "3", "--out", o]));
    assert!(e.contains("top-k 3"), "{e}");
    let e = failure(&run(&["upcycle", &model, "--experts", "0", "--out", o]));
    assert!(e.contains("at least 1 expert"), "{e}");
    let e = failure(&run(&["upcycle", &model, "--experts", "2", "--allocation", a, "--out", o]));
    assert!(e.contains("cannot be used with"), "{e}");
    let e = failure(&run(&["upcycle", &model, "--experts", "2", "--router-init", "hidden", "--out", o]));
    assert!(e.contains("--expert-prompts"), "{e}");
    assert!(!out.exists());
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 1, "only the allocation file remains: {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn moerge_merges_copies_and_refuses_a_single_model() {
    let Some(model) = stories() else { return };
    let dir = tmp("moerge");
    let out = dir.join("moe");
    let s = json(&run(&["moerge", &model, &model, &model, "--out", out.to_str().unwrap(), "--json"]));
    assert_eq!(s["method"], "moerge");
    assert_eq!(s["experts_per_layer"], serde_json::json!([3, 3, 3, 3, 3]));
    assert_eq!(s["moe"]["layers"][0]["top_k"], 1);
    let e = failure(&run(&["moerge", &model, "--out", dir.join("one").to_str().unwrap()]));
    assert!(e.contains("2 values") || e.contains("at least"), "{e}");
    assert!(!dir.join("one").exists());
    // routing the 3-expert MoE with top-k above its experts is refused before any work
    let (moe, routed) = (out.to_str().unwrap(), dir.join("routed"));
    let text = dir.join("t.txt");
    std::fs::write(&text, "Once upon a time there was a cat.\n").unwrap();
    let d = |n: &str| format!("{n}={}", text.display());
    let args = ["route", moe, "--domain", &d("a"), "--domain", &d("b"), "--domain", &d("c")];
    let e = failure(&run(&[&args[..], &["--top-k", "4", "--out", routed.to_str().unwrap()]].concat()));
    assert!(e.contains("--top-k 4: expected 1 to 3"), "{e}");
    assert!(!routed.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The upcycling variants and routing options end to end: a granular,
/// shared-expert, Drop-Upcycling upcycle (studio layout, E·G experts), then stage 1 with
/// aux-loss-free balancing, z-loss and un-normalised top-k, whose
/// metrics.jsonl logs the load, the bias and the z-loss; bad values are
/// refused before anything is written.
#[test]
fn upcycle_variants_then_train_with_routing_options() {
    let Some(model) = stories() else { return };
    let dir = tmp("variants");
    let out = dir.join("moe");
    let o = out.to_str().unwrap();
    let s = json(&run(&[
        "upcycle",
        &model,
        "--experts",
        "3",
        "--granularity",
        "2",
        "--shared-experts",
        "1",
        "--shared-gate",
        "--drop-ratio",
        "0.5",
        "--router-init",
        "random",
        "--dtype",
        "f32",
        "--out",
        o,
        "--json",
    ]));
    assert_eq!(s["layout"], "moe_studio");
    assert_eq!(s["experts_per_layer"], serde_json::json!([6, 6, 6, 6, 6]));
    let l0 = &s["moe"]["layers"][0];
    assert_eq!((l0["top_k"].as_u64(), l0["expert_intermediate_size"].as_u64()), (Some(4), Some(86)));
    assert_eq!((l0["shared_experts"].as_u64(), l0["shared_expert_gate"].as_bool()), (Some(1), Some(true)));
    assert!(s["layout_reason"].as_str().unwrap().contains("qwen2_moe"), "{s}");

    let text = dir.join("t.txt");
    std::fs::write(&text, "Once upon a time there was a little cat. It liked to play in the sun.\n".repeat(40))
        .unwrap();
    let tok = common::data_dir().unwrap().join("models/stories260K/tok512.bin");
    let train = dir.join("train");
    let data = format!("t={}", text.display());
    let base = [
        "train",
        o,
        "--tokenizer",
        tok.to_str().unwrap(),
        "--stage",
        "experts",
        "--data",
        &data,
        "--steps",
        "2",
        "--seq-len",
        "32",
        "--batch",
        "2",
        "--out",
    ];
    let e = failure(&run(&[&base[..], &[train.to_str().unwrap(), "--balance", "auxfree"]].concat()));
    assert!(e.contains("--balance `auxfree`") && e.contains("aux-free"), "{e}");
    let opts = ["--balance", "aux-free", "--bias-update-rate", "0.01", "--z-loss", "1e-3", "--norm-topk", "false"];
    ok(&run(&[&base[..], &[train.to_str().unwrap()], &opts[..]].concat()));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(train.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for m in &lines {
        assert!(m["z_loss"].as_f64().unwrap() > 0.0, "{m}");
        assert_eq!(m["selection_bias"][0].as_array().unwrap().len(), 6, "{m}");
        assert_eq!(m["expert_load"][0].as_array().unwrap().len(), 6, "{m}");
    }
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(train.join("final/config.json")).unwrap()).unwrap();
    let l0 = &cfg["moe_layers"][0];
    assert_eq!((l0["selection_bias"].as_bool(), l0["norm_topk_prob"].as_bool()), (Some(true), Some(false)), "{cfg}");

    for (args, want) in [
        (&["--drop-ratio", "1.5"][..], "--drop-ratio"),
        (&["--granularity", "3"][..], "divisors of 172: 2, 4, 43"),
        (&["--shared-gate"][..], "--shared-experts"),
    ] {
        let bad = dir.join("bad");
        let cmd = [&["upcycle", &model, "--experts", "4", "--out", bad.to_str().unwrap()][..], args].concat();
        let e = failure(&run(&cmd));
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(!bad.exists());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
