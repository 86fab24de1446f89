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

/// `moerge --base --shared-expert` (mergekit-moe's `shared_experts`) on
/// the committed tiny merge fixtures: refused without a base (DUME) and in
/// layouts that cannot hold it, with nothing written; an ungated shared
/// expert goes to the studio layout, one gated shared expert to qwen2_moe;
/// the shared expert is its source model's FFN bit for bit, the gate
/// follows `--router-init`; the output runs (`logits`).
#[test]
fn moerge_shared_experts_copy_their_model_s_ffn_and_need_a_base() {
    use moe_shared::tensor_io::safetensors_io::SafetensorsModel;
    use moe_shared::tensor_io::TensorSource;
    let fix = |n: &str| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/merge/f32")
            .join(n)
            .canonicalize()
            .unwrap()
    };
    let (base, m1, m2) = (fix("base"), fix("m1"), fix("m2"));
    let (b, e1, e2) = (common::arg(&base), common::arg(&m1), common::arg(&m2));
    let dir = tmp("moerge-shared");
    let out = |n: &str| common::arg(&dir.join(n));
    let moerge = |extra: &[&str], o: &str| {
        let mut a = vec!["moerge", &e1, &e2];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--out", o, "--json"]);
        run(&a)
    };
    let e = failure(&moerge(&["--shared-expert", &b], &out("dume")));
    assert!(e.contains("shared experts need a base model") && e.contains("ridge router"), "{e}");
    let e = failure(&moerge(&["--base", &b, "--shared-expert", &b, "--layout", "qwen2_moe"], &out("q")));
    assert!(e.contains("`qwen2_moe` layout cannot hold") && e.contains("shared_expert_gate"), "{e}");
    let gated = ["--base", &b, "--shared-expert", &e2, "--shared-gate", "--router-init", "random"];
    let e = failure(&moerge(&[&gated[..], &["--layout", "mixtral"]].concat(), &out("m")));
    assert!(e.contains("`mixtral` layout cannot hold") && e.contains("shared"), "{e}");
    let e = failure(&moerge(&[&gated[..], &["--shared-prompts", &b]].concat(), &out("p")));
    assert!(e.contains("--shared-prompts is read by a gated shared expert"), "{e}");
    for n in ["dume", "q", "m", "p"] {
        assert!(!dir.join(n).exists(), "{n}: output written on refusal");
    }
    // Ungated (DeepSeek-style): only the studio layout holds it.
    let s = json(&moerge(&["--base", &b, "--shared-expert", &b], &out("ungated")));
    assert_eq!(s["layout"], "moe_studio");
    assert!(s["layout_reason"].as_str().unwrap().contains("ungated"), "{s}");
    assert_eq!(s["moe"]["layers"][0]["shared_experts"], 1);
    // `shared_expert_gate` is written only when true (serde skips `false`).
    assert!(!s["moe"]["layers"][0]["shared_expert_gate"].as_bool().unwrap_or(false), "{s}");
    let o = SafetensorsModel::open_dir(&dir.join("ungated")).unwrap();
    let src = SafetensorsModel::open_dir(&base).unwrap();
    for l in 0..2 {
        for (w, p) in [("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")] {
            let got = o.read_f32(&format!("model.layers.{l}.block_sparse_moe.shared_experts.0.{w}.weight")).unwrap();
            assert_eq!(got, src.read_f32(&format!("model.layers.{l}.mlp.{p}.weight")).unwrap(), "layer {l} {w}");
        }
    }
    // One gated shared expert: qwen2_moe, m2's FFN, a seeded N(0, 1) gate.
    let s = json(&moerge(&[&gated[..], &["--router-std", "1", "--seed", "5"]].concat(), &out("gated")));
    assert_eq!(s["layout"], "qwen2_moe");
    let o = SafetensorsModel::open_dir(&dir.join("gated")).unwrap();
    let src = SafetensorsModel::open_dir(&m2).unwrap();
    let down = "model.layers.1.mlp.down_proj.weight";
    assert_eq!(o.read_f32("model.layers.1.mlp.shared_expert.down_proj.weight").unwrap(), src.read_f32(down).unwrap());
    let g = o.read_f32("model.layers.0.mlp.shared_expert_gate.weight").unwrap();
    assert_eq!(g.len(), 16);
    let ms = g.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / 16.0;
    assert!((0.2..3.0).contains(&ms), "N(0, 1) gate, mean square {ms}");
    assert_ne!(g, o.read_f32("model.layers.1.mlp.shared_expert_gate.weight").unwrap(), "a stream per tensor");
    // The gate is a router row of the shared expert's own prompts: with the
    // prompts of expert 0 it equals router row 0 in every layer (hidden:
    // per layer from the base's forward pass; cheap-embed: one row).
    let prompts = |name: &str, sets: &[&str]| {
        let p = dir.join(name);
        let experts: Vec<serde_json::Value> =
            sets.iter().map(|s| serde_json::json!({"positive": [s], "negative": ["dog cat"]})).collect();
        std::fs::write(&p, serde_json::json!({ "experts": experts }).to_string()).unwrap();
        common::arg(&p)
    };
    let (ep, sp) =
        (prompts("e.json", &["code function loop", "math proof number"]), prompts("s.json", &["code function loop"]));
    for init in ["hidden", "cheap-embed"] {
        let o = out(init);
        let args = ["--base", &b, "--shared-expert", &e1, "--shared-gate", "--router-init", init];
        ok(&moerge(&[&args[..], &["--expert-prompts", &ep, "--shared-prompts", &sp]].concat(), &o));
        let m = SafetensorsModel::open_dir(&dir.join(init)).unwrap();
        for l in 0..2 {
            let router = m.read_f32(&format!("model.layers.{l}.mlp.gate.weight")).unwrap();
            let gate = m.read_f32(&format!("model.layers.{l}.mlp.shared_expert_gate.weight")).unwrap();
            assert_eq!(gate, router[..16], "{init} layer {l}");
            let norm = gate.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            assert!((norm - 1.0).abs() < 1e-6, "{init} layer {l}: a unit row ({norm})");
        }
    }
    let e = failure(&moerge(
        &["--base", &b, "--shared-expert", &e1, "--shared-gate", "--router-init", "hidden", "--expert-prompts", &ep],
        &out("np"),
    ));
    assert!(e.contains("needs --shared-prompts FILE"), "{e}");
    assert!(!dir.join("np").exists());
    let logits = dir.join("l.f32");
    ok(&run(&["logits", &out("gated"), "--ids", "1,4,5,6", "--out", &common::arg(&logits)]));
    let v: Vec<f32> =
        std::fs::read(&logits).unwrap().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(v.len(), 4 * 64);
    assert!(v.iter().all(|x| x.is_finite()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The upcycling variants and routing options end to end: a granular,
/// shared-expert, Drop-Upcycling upcycle (E·G experts and one gated shared
/// expert: the Qwen2-MoE layout), then stage 1 with aux-loss-free
/// balancing, z-loss and un-normalised top-k, whose metrics.jsonl logs the
/// load, the bias and the z-loss (the trained model, with its selection
/// bias, is written in the studio layout); bad values are refused before
/// anything is written.
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
    // Granular experts and one gated shared expert: Qwen2-MoE holds both
    // (`moe_intermediate_size`, its own `shared_expert`); Mixtral neither.
    assert_eq!(s["layout"], "qwen2_moe", "{s}");
    assert!(s["layout_reason"].is_null(), "{s}");
    assert_eq!(s["experts_per_layer"], serde_json::json!([6, 6, 6, 6, 6]));
    let l0 = &s["moe"]["layers"][0];
    assert_eq!((l0["top_k"].as_u64(), l0["expert_intermediate_size"].as_u64()), (Some(4), Some(86)));
    assert_eq!((l0["shared_experts"].as_u64(), l0["shared_expert_gate"].as_bool()), (Some(1), Some(true)));
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (cfg["moe_intermediate_size"].as_u64(), cfg["shared_expert_intermediate_size"].as_u64()),
        (Some(86), Some(172))
    );

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
    // clap reads the value (the operation's parser): the value, the option and the accepted names.
    assert!(e.contains("'auxfree' for '--balance") && e.contains("aux-free"), "{e}");
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

    // A run stopped before its first checkpoint leaves metrics.jsonl alone: the next run into that
    // --out starts at step 1 and its rows replace the stale ones (they used to be appended after).
    let again = dir.join("again");
    std::fs::create_dir_all(&again).unwrap();
    let stale: String = (1..=3).map(|s| format!("{{\"step\":{s},\"ce_loss\":99.0}}\n")).collect();
    std::fs::write(again.join("metrics.jsonl"), stale).unwrap();
    ok(&run(&[&base[..], &[again.to_str().unwrap()]].concat()));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(again.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<u64> = rows.iter().map(|m| m["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 2], "{rows:?}");
    assert!(rows.iter().all(|m| m["ce_loss"].as_f64().unwrap() < 99.0), "{rows:?}");

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
