//! `moe-studio inspect`, `generate`, `route` and `eval --task` end to end on
//! stories260K: the MoE structure in `inspect` (text and `--json`), a model
//! directory without config.json, the sampling flags checked before the
//! model is read, `route`'s studio-layout warning pointing to `--no-bias`,
//! every command reading the same token stream, and task accuracy (lm-eval's
//! predictions; bad task lines refused with file and line, nothing printed).

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
    // A non-empty --out is refused before the statistics pass, not after it, and kept.
    let e = failure(&route(&dir.join("plain"), &["--no-bias"]));
    assert!(e.contains("already exists and is not empty") && !e.contains("statistics"), "{e}");
    assert!(dir.join("plain/config.json").exists());
    // A name given twice is refused by route and eval; the oracle needs an expert per dataset.
    let dup =
        failure(&run(&["route", moe.to_str().unwrap(), "--domain", &da, "--domain", &da, "--out", "/nonexistent/x"]));
    assert!(dup.contains("`a` is used twice"), "{dup}");
    let m = moe.to_str().unwrap();
    let dup = failure(&run(&["eval", m, "--data", &da, "--data", &da, "--window", "64", "--stride", "64"]));
    assert!(dup.contains("`a` is used twice"), "{dup}");
    let dc = format!("c={}", a.display());
    let e = failure(&run(&[
        "eval",
        m,
        "--data",
        &da,
        "--data",
        &db,
        "--data",
        &dc,
        "--routing",
        "oracle",
        "--window",
        "64",
        "--stride",
        "64",
    ]));
    assert!(e.contains("3 datasets") && e.contains("2 experts"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The golden token streams of `tests/reference/make_corpus_golden.py`
/// (Hugging Face's tokenizer on the fixture, per `--docs` split).
fn corpus_golden() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/reference/golden/corpus_streams.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Issue 35 item 1: every command that reads a text file sees the same
/// token stream — documents as the file separates them (blank lines by
/// default), each followed by `<|endoftext|>` — equal to Hugging Face's
/// tokenizer on the same documents. A two-document Python file, on a tiny
/// random model with SmolLM2's vocabulary: `eval`, `perplexity`, `route`,
/// `train` and `neurons` report the golden stream's SHA-256 and its length,
/// and `--docs line` / `--docs file` give those splits' streams.
#[test]
fn every_command_reads_the_same_token_stream() {
    let Some(data) = common::data_dir() else { return };
    let dir = tmp("corpus");
    let golden = corpus_golden();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/corpus/two_docs.txt");
    let text = fixture.to_str().unwrap();
    let g = &golden["files"]["tests/fixtures/corpus/two_docs.txt"];
    let (sha, n) = (g["blank"]["sha256"].as_str().unwrap(), g["blank"]["ids"].as_array().unwrap().len());
    assert_eq!(g["blank"]["documents"], 2);
    // A tiny llama with SmolLM2's tokenizer (vocabulary 49152).
    let cfg = dir.join("config.json");
    std::fs::write(
        &cfg,
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": 49152, "max_position_embeddings": 128,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true}"#,
    )
    .unwrap();
    let tok = data.join("models/smollm2-135m-instruct/tokenizer.json");
    let dense = dir.join("dense");
    let d = dense.to_str().unwrap();
    let c = cfg.to_str().unwrap();
    ok(&run(&["init-random", "--config", c, "--tokenizer", tok.to_str().unwrap(), "--out", d]));
    // eval and perplexity: the stream, all but its first token scored.
    // Windows of the model's context (128; the stream is shorter), the same for both.
    let w = ["--window", "128", "--stride", "128"];
    let e = json(&run(&[&["eval", d, "--data", &format!("code={text}"), "--json"][..], &w].concat()));
    assert_eq!(e["datasets"][0]["stream_sha256"], sha, "{e}");
    assert_eq!(e["datasets"][0]["tokens"], n - 1, "{e}");
    let p = json(&run(&[&["perplexity", d, "--text", text, "--json"][..], &w].concat()));
    assert_eq!((p["stream_sha256"].as_str(), p["tokens"].as_u64()), (Some(sha), Some(n as u64 - 1)), "{p}");
    assert_eq!(p["nll"], e["datasets"][0]["nll"], "eval and perplexity score the same windows");
    for split in ["line", "file"] {
        let e =
            json(&run(&[&["eval", d, "--data", &format!("code={text}"), "--docs", split, "--json"][..], &w].concat()));
        assert_eq!(e["datasets"][0]["stream_sha256"], g[split]["sha256"], "--docs {split}: {e}");
    }
    // route on a MoErge of two copies: every statistics token (no cap).
    let moe = dir.join("moe");
    let m = moe.to_str().unwrap();
    ok(&run(&["moerge", d, d, "--out", m]));
    let routed = dir.join("routed");
    let r = json(&run(&[
        "route",
        m,
        "--domain",
        &format!("a={text}:{text}"),
        "--domain",
        &format!("b={text}:{text}"),
        "--out",
        routed.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(r["stream_sha256_per_domain"], serde_json::json!([sha, sha]), "{r}");
    assert_eq!(r["heldout_sha256_per_domain"], serde_json::json!([sha, sha]), "{r}");
    assert_eq!(r["tokens_per_domain"], serde_json::json!([n, n]), "{r}");
    assert!(r["all_layers_accuracy_per_domain"].as_array().is_some_and(|v| v.len() == 2), "{r}");
    // Re-solving the saved statistics (`--stats`) at top-2 with a relative lambda sweep: the same
    // statistics, no collection; statistics of other domains are refused before any output.
    let stats = routed.join("ridge_stats.safetensors");
    let top2 = dir.join("routed-top2");
    let r2 = json(&run(&[
        "route",
        m,
        "--domain",
        &format!("a={text}:{text}"),
        "--domain",
        &format!("b={text}:{text}"),
        "--top-k",
        "2",
        "--stats",
        stats.to_str().unwrap(),
        "--lambda-sweep-relative",
        "1e-6,1",
        "--out",
        top2.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(r2["tokens_per_domain"], r["tokens_per_domain"], "{r2}");
    assert_eq!(r2["reused_stats"], stats.to_str().unwrap(), "{r2}");
    assert_eq!(r2["lambda_sweep"].as_array().unwrap().len(), 2, "{r2}");
    assert!(r2["mean_diagonal_per_layer"].as_array().unwrap().iter().all(|x| x.as_f64().is_some_and(|v| v > 0.0)));
    let bad = dir.join("routed-bad");
    let e = failure(&run(&[
        "route",
        m,
        "--domain",
        &format!("x={text}"),
        "--domain",
        &format!("b={text}"),
        "--stats",
        stats.to_str().unwrap(),
        "--out",
        bad.to_str().unwrap(),
    ]));
    assert!(e.contains("[a, b]") && e.contains("[x, b]"), "{e}");
    assert!(!bad.exists(), "nothing written");
    // train: the data line names the stream.
    let train = |file: &str, out: &Path| {
        let data = format!("code={file}");
        let args = ["train", d, "--stage", "ffn", "--data", &data, "--steps", "1", "--seq-len", "8", "--batch", "1"];
        let t = run(&[&args[..], &["--out", out.to_str().unwrap()]].concat());
        ok(&t);
        t
    };
    let trained = dir.join("trained");
    let t = train(text, &trained);
    let err = String::from_utf8_lossy(&t.stderr);
    assert!(err.contains(&format!("{n} tokens")) && err.contains(&format!("stream sha256 {sha}")), "{err}");
    // neurons: each document is one text; the language's texts concatenated are the stream.
    let nd = dir.join("neurons");
    ok(&run(&[
        "neurons",
        d,
        "--lang",
        &format!("en={text}"),
        "--lang",
        &format!("code={text}"),
        "--top-n",
        "4",
        "--out",
        nd.to_str().unwrap(),
    ]));
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(nd.join("neurons.json")).unwrap()).unwrap();
    for l in rep["languages"].as_array().unwrap() {
        assert_eq!((l["texts"].as_u64(), l["stream_sha256"].as_str()), (Some(2), Some(sha)), "{l}");
    }
    // Issue 38 item 5: the same stream through a token file (`tokenize`): `eval`, `perplexity`,
    // `route` and `train` read it as written and give the text's SHA-256, scores and losses.
    let tokens = dir.join("code.tokens");
    let tf = tokens.to_str().unwrap();
    let h = json(&run(&["tokenize", d, "--text", text, "--out", tf, "--json"]));
    assert_eq!(
        (h["sha256"].as_str(), h["tokens"].as_u64(), h["documents"].as_u64(), h["docs"].as_str()),
        (Some(sha), Some(n as u64), Some(2), Some("blank")),
        "{h}"
    );
    let ex = json(&run(&[&["eval", d, "--data", &format!("code={text}"), "--json"][..], &w].concat()));
    // A token file cut by lines: reports give its own split (the footer's), whatever --docs says.
    let line_tokens = dir.join("line.tokens");
    let lt = line_tokens.to_str().unwrap();
    ok(&run(&["tokenize", d, "--text", text, "--docs", "line", "--out", lt]));
    let pl = json(&run(&[&["perplexity", d, "--text", lt, "--docs", "file", "--json"][..], &w].concat()));
    assert_eq!((&pl["docs"], &pl["stream_sha256"]), (&serde_json::json!("line"), &g["line"]["sha256"]), "{pl}");
    let et = json(&run(&[&["eval", d, "--data", &format!("code={tf}"), "--json"][..], &w].concat()));
    assert_eq!(et["datasets"][0]["stream_sha256"], sha, "{et}");
    assert_eq!(et["datasets"][0]["nll"], ex["datasets"][0]["nll"], "{et}");
    let pt = json(&run(&[&["perplexity", d, "--text", tf, "--json"][..], &w].concat()));
    assert_eq!((&pt["nll"], &pt["tokens"]), (&p["nll"], &p["tokens"]), "{pt}");
    let rt = json(&run(&[
        "route",
        m,
        "--domain",
        &format!("a={tf}:{tf}"),
        "--domain",
        &format!("b={tf}:{tf}"),
        "--out",
        dir.join("routed-tokens").to_str().unwrap(),
        "--json",
    ]));
    for k in
        ["stream_sha256_per_domain", "heldout_sha256_per_domain", "tokens_per_domain", "all_layers_accuracy_per_domain"]
    {
        assert_eq!(rt[k], r[k], "{k}: {rt}");
    }
    let trained_t = dir.join("trained-tokens");
    let t = train(tf, &trained_t);
    assert!(String::from_utf8_lossy(&t.stderr).contains(&format!("stream sha256 {sha}")));
    let loss = |d: &Path| -> Vec<serde_json::Value> {
        let m = std::fs::read_to_string(d.join("metrics.jsonl")).unwrap();
        m.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].clone()).collect()
    };
    assert_eq!(loss(&trained_t), loss(&trained), "the same losses from the token file as from the text");
    assert!(loss(&trained)[0].as_f64().is_some_and(|l| l > 0.0));
    // A token file of another tokenizer (stories260K's 512 tokens) is refused by name.
    let small = dir.join("small.tokens");
    let stories_tok = data.join("models/stories260K/tok512.bin");
    let stories_bin = data.join("models/stories260K/stories260K.bin");
    ok(&run(&[
        "tokenize",
        stories_bin.to_str().unwrap(),
        "--tokenizer",
        stories_tok.to_str().unwrap(),
        "--text",
        text,
        "--out",
        small.to_str().unwrap(),
    ]));
    let e = failure(&run(&[&["eval", d, "--data", &format!("code={}", small.display()), "--json"][..], &w].concat()));
    assert!(e.contains("small.tokens") && e.contains("vocabulary of 512"), "{e}");
    // A tokenizer larger than the model's embedding (SmolLM2's 49152 for stories260K's 512 rows)
    // is refused by name on the text path too, before any id indexes past the embedding.
    let tok_s = tok.to_str().unwrap();
    let e = failure(&run(&[
        "eval",
        stories_bin.to_str().unwrap(),
        "--tokenizer",
        tok_s,
        "--data",
        &format!("code={text}"),
    ]));
    assert!(e.contains("tokenizer.json") && e.contains("49152 tokens") && e.contains("512 rows"), "{e}");
    let nt = dir.join("neurons-tokens");
    let (en, code) = (format!("en={tf}"), format!("code={text}"));
    let e = failure(&run(&["neurons", d, "--lang", &en, "--lang", &code, "--out", nt.to_str().unwrap()]));
    assert!(e.contains("code.tokens") && e.contains("not a token file"), "{e}");
    let e = failure(&run(&["tokenize", d, "--text", text, "--out", dir.join("x.bin").to_str().unwrap()]));
    assert!(e.contains("x.bin") && e.contains(".tokens"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn eval_task_gives_lm_eval_s_predictions_and_refuses_bad_lines() {
    let Some(model) = stories() else { return };
    let m = model.to_str().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let task = root.join("tests/reference/tasks/tiny_stories_mc.jsonl");
    let spec = format!("tiny={}", task.display());
    let r = json(&run(&["--backend", "cpu", "eval", m, "--task", &spec, "--target-delimiter", "", "--json"]));
    let t = &r["tasks"][0];
    assert_eq!(
        (t["name"].as_str(), t["items"].as_u64(), t["target_delimiter"].as_str()),
        (Some("tiny"), Some(12), Some(""))
    );
    // lm-eval 0.4.13 on the converted stories260K (tests/reference/make_task_golden.sh)
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("tests/reference/golden/task_eval.json")).unwrap()).unwrap();
    let want = &golden["runs"]["dense_none"]["tasks"]["tiny"];
    for k in ["acc", "acc_norm", "acc_bytes", "acc_stderr", "acc_norm_stderr"] {
        assert!((t[k].as_f64().unwrap() - want[k].as_f64().unwrap()).abs() < 1e-12, "{k}: {t}");
    }
    for (a, b) in t["samples"].as_array().unwrap().iter().zip(want["samples"].as_array().unwrap()) {
        assert_eq!((&a["pred"], &a["pred_norm"], &a["pred_bytes"]), (&b["pred"], &b["pred_norm"], &b["pred_bytes"]));
    }
    let text = ok(&run(&["--backend", "cpu", "eval", m, "--task", &spec, "--limit", "3"]));
    assert!(
        text.contains("acc_norm") && text.lines().nth(1).unwrap().starts_with("tiny") && text.contains(" 3 "),
        "{text}"
    );

    let dir = tmp("bad-tasks");
    let good = r#"{"context": "Tom had a ball.", "choices": ["He ran.", "It sang."], "gold": 0}"#;
    for (bad, want) in [
        (r#"{"context": "Tom had a ball.", "gold": 0}"#, "line 2: no `choices`"),
        (r#"{"context": "Tom had a ball.", "choices": ["a", "b"], "gold": 2}"#, "line 2: `gold` 2 is out of range"),
        (
            r#"{"context": "Tom had a ball.", "choices": ["a", "b"], "gold": "1"}"#,
            "line 2: `gold` must be a non-negative integer",
        ),
        (
            r#"{"context": "Tom had a ball.", "choices": ["a", "b"], "gold": 0.5}"#,
            "line 2: `gold` must be a non-negative integer",
        ),
    ] {
        let f = dir.join("bad.jsonl");
        std::fs::write(&f, format!("{good}\n{bad}\n")).unwrap();
        let out = run(&["--backend", "cpu", "eval", m, "--task", &format!("bad={}", f.display()), "--json"]);
        let e = failure(&out);
        assert!(e.contains(&f.display().to_string()) && e.contains(want), "{want}: {e}");
        assert!(out.stdout.is_empty(), "nothing printed: {}", String::from_utf8_lossy(&out.stdout));
    }
    let e = failure(&run(&["eval", m, "--task", &spec, "--data", &spec]));
    assert!(e.contains("cannot be used with"), "{e}");
    // The perplexity-only flags are refused with --task, not silently ignored.
    for flag in [["--window", "64"], ["--stride", "32"], ["--max-tokens", "100"], ["--docs", "line"]] {
        let e = failure(&run(&["eval", m, "--task", &spec, flag[0], flag[1]]));
        assert!(e.contains("cannot be used with") && e.contains(flag[0]), "{flag:?}: {e}");
    }
    let e = failure(&run(&["--backend", "cpu", "eval", m, "--task", &spec, "--routing", "oracle"]));
    assert!(e.contains("--routing oracle"), "{e}");
    // A token file where a task belongs: named as what it is.
    let tf = dir.join("corpus.tokens");
    std::fs::write(&tf, b"MOETOK01").unwrap();
    let e = failure(&run(&["--backend", "cpu", "eval", m, "--task", &format!("x={}", tf.display())]));
    assert!(e.contains("corpus.tokens") && e.contains("token file") && e.contains("JSON lines"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--backend cpu train MODEL --stage ffn` on the shared data's lang/en/valid.txt, 1 × 16 tokens
/// per step, `steps` steps, then `extra`, and `--out OUT` last (tests replace it).
fn train_args(model: &Path, data: &Path, out: &Path, steps: &str, extra: &[&str]) -> Vec<String> {
    let en = format!("en={}", data.join("corpora/lang/en/valid.txt").display());
    let (m, o) = (model.to_str().unwrap(), out.to_str().unwrap());
    [
        "--backend",
        "cpu",
        "train",
        m,
        "--stage",
        "ffn",
        "--data",
        &en,
        "--steps",
        steps,
        "--seq-len",
        "16",
        "--batch",
        "1",
    ]
    .iter()
    .chain(extra)
    .chain(&["--out", o])
    .map(|s| s.to_string())
    .collect()
}

/// `train --frozen-dtype bf16` (issue 38 item 3): said on the stage line, recorded in the saved
/// model's provenance, and part of the run's options: a resume with another value is refused
/// before the run's metrics are touched.
#[test]
fn train_frozen_dtype_is_recorded_and_a_mismatched_resume_leaves_the_run_alone() {
    let Some(model) = common::stories() else { return };
    let Some(data) = common::data_dir() else { return };
    let dir = tmp("frozen-dtype");
    let out = dir.join("run");
    let args = |steps: &str, dtype: &str| {
        train_args(&model, &data, &out, steps, &["--save-every", "1", "--keep", "5", "--frozen-dtype", dtype])
    };
    let argv = args("2", "bf16");
    let t = run(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    ok(&t);
    let err = String::from_utf8_lossy(&t.stderr);
    assert!(err.contains("frozen (matrices in bf16)"), "{err}");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("final/config.json")).unwrap()).unwrap();
    assert_eq!(cfg["moe_studio"]["provenance"]["frozen_dtype"], "bf16", "{cfg}");
    let metrics = || std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let before = metrics();
    assert_eq!(before.lines().count(), 2);
    let mut argv = args("3", "f32");
    argv.push("--resume".into());
    let e = failure(&run(&argv.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(e.contains("frozen_dtype") && e.contains("bf16"), "{e}");
    assert_eq!(metrics(), before, "a refused resume leaves metrics.jsonl as it was");

    // A resume asked to stop before the checkpoint's step would report steps it never took.
    let mut argv = args("1", "bf16");
    argv.push("--resume".into());
    let e = failure(&run(&argv.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(e.contains("--steps 1 is below the 2 steps"), "{e}");
    assert_eq!(metrics(), before);
    // MODEL of another shape than the run's: refused, not silently ignored.
    let up = dir.join("up2");
    ok(&run(&["upcycle", model.to_str().unwrap(), "--experts", "2", "--out", up.to_str().unwrap()]));
    let mut argv = args("3", "bf16");
    argv[3] = up.to_str().unwrap().to_string();
    argv.push("--resume".into());
    let e = failure(&run(&argv.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(e.contains("is not the model this run trains") && e.contains("up2"), "{e}");
    assert_eq!(metrics(), before);

    // A fresh run never overwrites what a user keeps in --out (a file, or a metrics.jsonl
    // that is not a run's); every other writer refuses a non-empty --out the same way.
    for (file, body) in [("notes.txt", "mine"), ("metrics.jsonl", "my precious metrics\n")] {
        let user = dir.join(format!("user-{file}"));
        std::fs::create_dir_all(&user).unwrap();
        std::fs::write(user.join(file), body).unwrap();
        let mut argv = args("1", "bf16");
        let last = argv.len() - 1;
        argv[last] = user.to_str().unwrap().to_string();
        let e = failure(&run(&argv.iter().map(String::as_str).collect::<Vec<_>>()));
        assert!(e.contains("already exists and is not empty"), "{e}");
        assert_eq!(std::fs::read_to_string(user.join(file)).unwrap(), body);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `train` stopped by SIGTERM (what `kill`, `timeout`, Slurm and Kubernetes send) finishes its
/// step, saves a checkpoint that `--resume` continues, and exits with 128 + 15; before, SIGTERM
/// killed it with nothing saved since the last `--save-every`. A second signal right behind the
/// first (a service manager's SIGTERM to the group, then the server's SIGINT to its job) is the
/// same stop and still saves.
#[test]
fn sigterm_saves_a_checkpoint_that_resume_continues() {
    let Some(model) = common::stories() else { return };
    let Some(data) = common::data_dir() else { return };
    let dir = tmp("sigterm");
    let out = dir.join("run");
    let args = |steps: &str| train_args(&model, &data, &out, steps, &["--save-every", "1000000"]);
    /// Kills the run when the test fails before it ends (it would train for hours).
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_moe-studio"))
            .args(args("1000000"))
            .stderr(std::fs::File::create(dir.join("stderr.txt")).unwrap())
            .spawn()
            .unwrap(),
    );
    // Wait for a few steps' metrics, then stop it as a scheduler would.
    let metrics = out.join("metrics.jsonl");
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(&metrics).map(|s| s.lines().count()).unwrap_or(0) < 3 {
        assert!(t0.elapsed().as_secs() < 300, "no training steps within 300 s");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let pid = child.0.id() as i32;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    // Once it has taken the SIGTERM, the SIGINT that follows at once is the same stop.
    let t1 = std::time::Instant::now();
    while !std::fs::read_to_string(dir.join("stderr.txt")).unwrap().contains("SIGTERM: finishing this step") {
        assert!(t1.elapsed().as_secs() < 120, "no SIGTERM message within 120 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(t1.elapsed().as_secs() < 120, "train did not stop within 120 s of SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(dir.join("stderr.txt")).unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}: {err}");
    assert!(err.contains("SIGTERM: finishing this step") && err.contains("stopped after step"), "{err}");
    let steps = std::fs::read_to_string(&metrics).unwrap().lines().count();
    let (saved, ckpt) = moe_shared::train::checkpoint::latest_checkpoint(&out).expect("a checkpoint was saved");
    assert_eq!(saved, steps, "the checkpoint holds every step metrics.jsonl reports");
    assert!(ckpt.file_name().unwrap().to_string_lossy().starts_with("checkpoint-"), "{}", ckpt.display());
    // The same command plus --resume continues from it to the end.
    let mut argv = args(&(steps + 2).to_string());
    argv.push("--resume".into());
    let r = run(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    ok(&r);
    assert_eq!(std::fs::read_to_string(&metrics).unwrap().lines().count(), steps + 2);
    assert!(out.join("final/config.json").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
