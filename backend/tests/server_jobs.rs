//! The job kinds that `server.rs` does not run — moerge, route (DUME's
//! ridge router), graft, merge, neurons and convert — through the real server's job
//! queue on stories260K, each compared with the same command run directly
//! by the CLI on the same inputs.
//!
//! A job is the CLI command in a child process, so its outputs must be
//! byte-identical to the CLI's: `model.safetensors` and `tokenizer.json`
//! have the CLI's sha256 (downloaded through the API, and as registered in
//! the output checkpoint), `config.json` is the CLI's but for the input
//! paths recorded as provenance, route's `ridge_stats.safetensors` is the
//! CLI's and its `ridge_report.json` has the CLI's numbers, and neurons'
//! `neurons.json` and CSVs are the CLI's. On top of that the values are
//! checked: the MoErge of two copies of stories260K has two equal experts
//! that are the dense FFN; the ridge router routes en vs hu above chance
//! and, its experts being equal, the routed MoE has the dense model's
//! perplexity; merge `linear` to f16 is stories260K rounded to f16; graft
//! adds `scale * (instruct - base)` and with instruct == base leaves the
//! MoE bit-identical; dare-ties keeps about `density` of the delta; convert
//! writes the MoErged model as a packed bf16 Mixtral. Bad
//! specs of these kinds are 422s naming the `spec.` field, and create no job.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::*;
use moe_shared::checkpoint::open_model;
use serde_json::{json, Value};

/// Runs `moe-studio --backend=cpu ARGS` (what a job runs, with this
/// test's paths); asserts success and returns stdout.
fn cli(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_moe-studio"))
        .arg("--backend=cpu")
        .args(args)
        .output()
        .expect("runs the binary");
    assert!(
        out.status.success(),
        "moe-studio {}: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// `POST /api/jobs {spec}`: asserts 201 and returns the job id.
fn submit(s: &Server, spec: Value) -> String {
    let (code, j) = s.call("POST", "/api/jobs", Some(json!({ "spec": spec })));
    assert_eq!(code, 201, "{spec} -> {j}");
    assert_eq!(j["state"], "queued", "{j}");
    j["id"].as_str().unwrap().to_string()
}

/// Waits for job `id`; asserts it succeeded on the CPU backend (its log
/// on failure) and returns it.
fn succeeded(s: &Server, id: &str) -> Value {
    let j = wait_job(s, id, 300);
    assert_eq!(j["state"], "succeeded", "{j}\n{}", job_log(s, id));
    assert_eq!(j["backend"], "cpu", "{j}");
    assert!(j["error"].is_null(), "{j}");
    j
}

/// GET `path` as bytes (200).
fn bytes(s: &Server, path: &str) -> Vec<u8> {
    let r = s.req("GET", &s.url(path)).call().unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(r.status(), 200, "GET {path}");
    let mut v = Vec::new();
    std::io::Read::read_to_end(&mut r.into_reader(), &mut v).unwrap();
    v
}

/// Every artefact of job `id`: listed, downloaded, and the listed size is
/// the downloaded one. Name -> bytes.
fn artefacts(s: &Server, id: &str) -> BTreeMap<String, Vec<u8>> {
    let list = s.get(&format!("/api/jobs/{id}/artifacts"));
    let mut out = BTreeMap::new();
    for f in list.as_array().unwrap() {
        let name = f["name"].as_str().unwrap().to_string();
        let b = bytes(s, &format!("/api/jobs/{id}/artifacts/{name}"));
        assert_eq!(b.len() as u64, f["size"].as_u64().unwrap(), "{name} of job {id}");
        out.insert(name, b);
    }
    assert!(!out.is_empty(), "job {id} has no artefacts");
    out
}

/// The job's output checkpoint: registered with `source_job`, its files
/// are the job's artefacts (same names and sha256, listed and downloaded).
fn output_checkpoint(s: &Server, job: &Value, arts: &BTreeMap<String, Vec<u8>>) -> Value {
    let id = job["output_checkpoint"].as_str().unwrap_or_else(|| panic!("no output checkpoint: {job}"));
    let c = s.get(&format!("/api/checkpoints/{id}"));
    assert_eq!(c["source_job"], job["id"], "{c}");
    assert_eq!(c["format"], "safetensors", "{c}");
    let files = c["files"].as_array().unwrap();
    let names: Vec<&str> = files.iter().map(|f| f["name"].as_str().unwrap()).collect();
    let art_names: Vec<&str> = arts.keys().map(String::as_str).collect();
    assert_eq!(names, art_names, "checkpoint files vs artefacts");
    for f in files {
        let n = f["name"].as_str().unwrap();
        assert_eq!(f["sha256"].as_str().unwrap(), sha(&arts[n]), "{n}");
        assert_eq!(sha(&bytes(s, &format!("/api/checkpoints/{id}/files/{n}"))), sha(&arts[n]), "{n}");
    }
    c
}

/// `config.json` without the input paths that `moe_studio.provenance`
/// records (a job reads its inputs from the server's checkpoints).
fn config_sans_paths(b: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(b).expect("config.json is JSON");
    if let Some(prov) = v.pointer_mut("/moe_studio/provenance").and_then(Value::as_object_mut) {
        prov.remove("sources");
        prov.remove("source");
    }
    v
}

/// The job's model artefacts are the CLI's: `model.safetensors` and
/// `tokenizer.json` byte for byte, `config.json` but for input paths.
/// Returns the sha256 of `model.safetensors`.
fn same_model(what: &str, arts: &BTreeMap<String, Vec<u8>>, cli_out: &Path) -> String {
    let want = ["config.json", "model.safetensors", "tokenizer.json"];
    for n in want {
        assert!(arts.contains_key(n), "{what}: no {n} among {:?}", arts.keys());
    }
    for n in ["model.safetensors", "tokenizer.json"] {
        let c = std::fs::read(cli_out.join(n)).unwrap();
        assert_eq!(sha(&arts[n]), sha(&c), "{what}: the job's {n} is not the CLI's");
    }
    let c = std::fs::read(cli_out.join("config.json")).unwrap();
    assert_eq!(config_sans_paths(&arts["config.json"]), config_sans_paths(&c), "{what}: config.json");
    sha(&arts["model.safetensors"])
}

/// Every tensor of the model at `path`, as f32, by name.
fn tensors(path: &Path) -> BTreeMap<String, Vec<f32>> {
    let m = open_model(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let read = |n: &str| m.source.read_f32(n).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    m.source.tensors().into_iter().map(|t| (t.name.clone(), read(&t.name))).collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Tensor names and shapes of a checkpoint's stored summary.
fn summary_tensors(c: &Value) -> BTreeMap<String, Vec<u64>> {
    c["summary"]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let shape = t["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            (t["name"].as_str().unwrap().to_string(), shape)
        })
        .collect()
}

/// Experts per layer of a summarised MoE checkpoint (from its routers' shapes).
fn experts_per_layer(c: &Value) -> Vec<u64> {
    let t = summary_tensors(c);
    let layers = c["summary"]["config"]["num_layers"].as_u64().unwrap();
    (0..layers)
        .map(|l| {
            let g = &t[&format!("model.layers.{l}.block_sparse_moe.gate.weight")];
            for e in 0..g[0] {
                assert!(t.contains_key(&format!("model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight")));
            }
            assert!(!t.contains_key(&format!("model.layers.{l}.block_sparse_moe.experts.{}.w1.weight", g[0])));
            g[0]
        })
        .collect()
}

/// `perplexity --json` of a model on a text.
fn ppl(model: &Path, text: &Path) -> f64 {
    let out = cli(&[
        "perplexity",
        &p(model),
        "--text",
        &p(text),
        "--window=64",
        "--stride=64",
        "--max-tokens=1024",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&out).expect("perplexity --json");
    v["ppl"].as_f64().unwrap()
}

#[test]
fn moerge_route_graft_merge_neurons_jobs_match_the_cli() {
    let Some(data) = data_dir() else { return };
    let root = tmp("jobs");
    let dd = root.join("data");
    let out = root.join("cli");
    std::fs::create_dir_all(&out).unwrap();
    let t0 = std::time::Instant::now();
    let lap = |what: &str| eprintln!("{:6.1} s  {what}", t0.elapsed().as_secs_f64());
    let s = Server::start(&dd, &["--workers", "2"]);
    let model = data.join("models/stories260K/stories260K.bin");
    let text = |lang: &str, split: &str| data.join(format!("corpora/lang/{lang}/{split}.txt"));
    let a = stories_checkpoint(&s, &data);
    let up = |lang: &str, split: &str| {
        upload(&s, &format!("{lang}-{split}.txt"), &std::fs::read(text(lang, split)).unwrap(), 256 << 10)
    };
    let (en_train, en_valid, hu_train, hu_valid, el_valid) =
        (up("en", "train"), up("en", "valid"), up("hu", "train"), up("hu", "valid"), up("el", "valid"));

    lap("uploaded");
    // ----- bad specs: 422 naming the field, no job ---------------------------
    let ghost = "123e4567-e89b-42d3-a456-426614174000";
    let dom = |name: &str, u: &str| json!({"name": name, "upload": u});
    let bad = [
        (json!({"kind": "moerge", "models": [a]}), "spec.models"),
        (json!({"kind": "moerge", "models": [a, "../../studio.db"]}), "spec.models[1]"),
        (json!({"kind": "moerge", "models": [a, ghost]}), "spec.models[1]"),
        (json!({"kind": "moerge", "models": [a, a], "dtype": "f64"}), "spec.dtype"),
        (json!({"kind": "route", "model": a, "domains": [dom("en", &en_train)]}), "spec.domains"),
        (
            json!({"kind": "route", "model": a, "domains": [dom("en", &en_train), dom("en", &hu_train)]}),
            "spec.domains[1].name",
        ),
        (
            json!({"kind": "route", "model": a, "domains": [dom("en", &en_train), dom("hu", &hu_train)], "lambda": 0.0}),
            "spec.lambda",
        ),
        (json!({"kind": "graft", "target": a, "base": a, "instruct": ghost}), "spec.instruct"),
        (json!({"kind": "graft", "target": a, "base": "x", "instruct": a}), "spec.base"),
        (json!({"kind": "graft", "target": a, "base": a, "instruct": a, "scale": 5000.0}), "spec.scale"),
        (json!({"kind": "merge", "method": "linear", "models": [a, a], "weights": [1.0]}), "spec.weights"),
        (json!({"kind": "merge", "method": "ties", "models": [a], "base": a, "density": 0.0}), "spec.density"),
        (json!({"kind": "merge", "method": "dare", "models": [a], "base": ghost}), "spec.base"),
        (json!({"kind": "merge", "method": "slerp", "models": [a, a]}), "body"),
        (json!({"kind": "convert", "model": a, "layout": "mixtrl"}), "spec.layout"),
        (json!({"kind": "convert", "model": a, "experts_format": "stacked"}), "spec.experts_format"),
        // `a` is dense: an MoE layout or packed experts asked of it is refused at submission
        (json!({"kind": "convert", "model": a, "layout": "mixtral"}), "spec.layout"),
        (json!({"kind": "convert", "model": a, "experts_format": "packed"}), "spec.experts_format"),
        (json!({"kind": "neurons", "model": a, "langs": [dom("en", &en_valid)]}), "spec.langs"),
        (
            json!({"kind": "neurons", "model": a, "langs": [dom("en", &en_valid), dom("hu", &hu_valid)],
                   "new": ["hu", "fr"]}),
            "spec.new[1]",
        ),
        (
            json!({"kind": "neurons", "model": a, "langs": [dom("en", &en_valid), dom("hu", &hu_valid)],
                   "max_tokens": 0}),
            "spec.max_tokens",
        ),
        (
            json!({"kind": "neurons", "model": a, "langs": [dom("en", &en_valid), dom("hu", &a)]}),
            "spec.langs[1].upload",
        ),
    ];
    for (spec, field) in &bad {
        let (code, e) = s.call("POST", "/api/jobs", Some(json!({ "spec": spec })));
        assert_eq!((code, e["field"].as_str()), (422, Some(*field)), "{spec} -> {e}");
    }
    assert_eq!(s.get("/api/jobs").as_array().unwrap().len(), 0, "a bad spec created a job");

    // ----- first wave: moerge, merge linear -> f16, neurons ------------------
    let moerge = submit(&s, json!({"kind": "moerge", "models": [a, a], "top_k": 2}));
    let linear = submit(&s, json!({"kind": "merge", "method": "linear", "models": [a, a], "dtype": "f16"}));
    let neurons = submit(
        &s,
        json!({"kind": "neurons", "model": a, "langs": [dom("en", &en_valid), dom("hu", &hu_valid), dom("el", &el_valid)],
               "new": ["hu", "el"], "top_n": 30, "max_texts": 60, "max_tokens": 48}),
    );
    // the same commands, directly (while the jobs run)
    let m = p(&model);
    let cli_moe = out.join("moerge");
    cli(&["moerge", &m, &m, "--top-k=2", &format!("--out={}", p(&cli_moe)), "--json"]);
    let cli_f16 = out.join("linear");
    cli(&["merge", "linear", &m, &m, "--dtype=f16", &format!("--out={}", p(&cli_f16)), "--json"]);
    let cli_neurons = out.join("neurons");
    let lang = |l: &str| format!("--lang={l}={}", p(&text(l, "valid")));
    cli(&[
        "neurons",
        &m,
        &lang("en"),
        &lang("hu"),
        &lang("el"),
        "--new=hu,el",
        "--top-n=30",
        "--max-texts=60",
        "--max-tokens=48",
        &format!("--out={}", p(&cli_neurons)),
    ]);

    lap("first wave: CLI");
    // moerge: a registered MoE of 5 layers x 2 experts, the CLI's bytes;
    // both experts are the dense FFN, routers start at zero
    let jm = succeeded(&s, &moerge);
    let arts = artefacts(&s, &moerge);
    let moe_sha = same_model("moerge", &arts, &cli_moe);
    let moe_ckpt = output_checkpoint(&s, &jm, &arts);
    assert_eq!(moe_ckpt["architecture"], "llama moe", "{moe_ckpt}");
    assert_eq!(moe_ckpt["summary"]["config"]["num_layers"], 5);
    assert_eq!(experts_per_layer(&moe_ckpt), [2, 2, 2, 2, 2]);
    let cfg: Value = serde_json::from_slice(&arts["config.json"]).unwrap();
    assert_eq!((cfg["num_local_experts"].as_u64(), cfg["num_experts_per_tok"].as_u64()), (Some(2), Some(2)));
    let moe_id = moe_ckpt["id"].as_str().unwrap().to_string();
    let dense = tensors(&model);
    let moe_t = tensors(&cli_moe);
    for l in 0..5 {
        for (w, d) in [("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")] {
            let x = &dense[&format!("model.layers.{l}.mlp.{d}.weight")];
            for e in 0..2 {
                let y = &moe_t[&format!("model.layers.{l}.block_sparse_moe.experts.{e}.{w}.weight")];
                assert!(x == y, "layer {l} expert {e} {w} is not the dense {d}");
            }
        }
        let g = &moe_t[&format!("model.layers.{l}.block_sparse_moe.gate.weight")];
        assert!(g.iter().all(|&v| v == 0.0), "layer {l}: a zero router after moerge");
    }

    // merge linear of two copies, to f16: stories260K rounded to f16
    let jl = succeeded(&s, &linear);
    let arts = artefacts(&s, &linear);
    same_model("merge linear", &arts, &cli_f16);
    let f16_ckpt = output_checkpoint(&s, &jl, &arts);
    assert_eq!(f16_ckpt["architecture"], "llama", "{f16_ckpt}");
    assert_eq!(f16_ckpt["summary"]["dtypes"], json!({"F16": 47}), "{f16_ckpt}");
    let f16_id = f16_ckpt["id"].as_str().unwrap().to_string();
    let f16_t = tensors(&cli_f16);
    assert_eq!(f16_t.len(), 47);
    let (mut rounded, mut n) = (0usize, 0usize);
    for (t, y) in &f16_t {
        let x = &dense[t];
        for (a, b) in x.iter().zip(y) {
            assert!((a - b).abs() <= a.abs() / 2048.0 + 6e-8, "{t}: {a} -> {b} is not its f16 rounding");
            rounded += usize::from(a != b);
        }
        n += x.len();
    }
    assert!(rounded > n / 2, "only {rounded} of {n} values changed by the f16 rounding");

    // neurons: no model, the CLI's report and tables
    let jn = succeeded(&s, &neurons);
    assert!(jn["output_checkpoint"].is_null(), "{jn}");
    let arts = artefacts(&s, &neurons);
    for f in ["layer_counts.csv", "counts.csv", "top_neurons.csv", "similarity.csv", "specific_per_layer.svg"] {
        let c = std::fs::read(cli_neurons.join(f)).unwrap();
        assert_eq!(sha(&arts[f]), sha(&c), "neurons {f} is not the CLI's");
    }
    for f in ["specific_per_layer.png", "specific_per_component.png"] {
        assert_eq!(&arts[f][..8], b"\x89PNG\r\n\x1a\n", "{f}");
    }
    let rep: Value = serde_json::from_slice(&arts["neurons.json"]).unwrap();
    let want: Value = serde_json::from_slice(&std::fs::read(cli_neurons.join("neurons.json")).unwrap()).unwrap();
    assert_eq!(rep, want, "neurons.json is not the CLI's");
    assert_eq!((rep["top_n"].as_u64(), rep["max_tokens"].as_u64()), (Some(30), Some(48)));
    assert_eq!(rep["new_languages"], json!(["hu", "el"]));
    let langs = rep["languages"].as_array().unwrap();
    assert_eq!(langs.iter().map(|l| l["code"].as_str().unwrap()).collect::<Vec<_>>(), ["en", "hu", "el"]);
    for l in langs {
        // The first 60 documents (blank-line separated, `moe_shared::corpus`) of each valid text.
        let code = l["code"].as_str().unwrap();
        let file = p(&text(code, "valid"));
        let docs = moe_shared::corpus::read_documents(&file, moe_shared::corpus::DocSplit::Blank).unwrap();
        assert_eq!(l["texts"].as_u64(), Some(docs.len().min(60) as u64), "{code}");
        // Top-30: the neurons above the cut plus the places the tie at the
        // cut shares (stories260K's activations tie often).
        let cut = l["top_cut"]["slots"].as_u64().unwrap_or(0) as usize;
        assert_eq!(l["top"].as_array().unwrap().len() + cut, 30, "{}", l["top_cut"]);
        let ap = l["mean_ap"].as_f64().unwrap();
        assert!(ap > 0.0 && ap < 1.0, "mean AP {ap}");
    }
    // Fractional counts when neurons tie at the cut (methods.md §3.3).
    let union: Vec<f64> =
        rep["union_counts"].as_array().unwrap().iter().map(|c| c["total"].as_f64().unwrap()).collect();
    assert_eq!(union.len(), 5);
    let total: f64 = union.iter().sum();
    assert!(total > 30.0 && total <= 60.0 + 1e-9, "union of hu and el specific neurons per layer {union:?}");
    eprintln!(
        "neurons: mean AP {:?}, union (hu, el) per layer {union:?}",
        langs.iter().map(|l| l["mean_ap"].as_f64().unwrap()).collect::<Vec<_>>()
    );

    lap("first wave checked");
    // ----- second wave: route, graft (twice), dare-ties ------------------------
    let route = submit(
        &s,
        json!({"kind": "route", "model": moe_id, "lambda": 0.05, "max_tokens": 2000, "context": 64,
               "domains": [{"name": "en", "upload": en_train, "heldout": en_valid},
                           {"name": "hu", "upload": hu_train, "heldout": hu_valid}]}),
    );
    let graft = submit(&s, json!({"kind": "graft", "target": moe_id, "base": a, "instruct": f16_id, "scale": 0.5}));
    let graft0 = submit(&s, json!({"kind": "graft", "target": moe_id, "base": a, "instruct": a}));
    let dare = submit(
        &s,
        json!({"kind": "merge", "method": "dare-ties", "models": [f16_id], "base": a, "weights": [0.7],
               "density": 0.5, "seed": 3, "dtype": "f32"}),
    );
    // convert, the operation added after the registry: the MoErged model in
    // Mixtral's layout with its experts packed (transformers 5's), in bf16
    let convert = submit(
        &s,
        json!({"kind": "convert", "model": moe_id, "layout": "mixtral", "experts_format": "packed", "dtype": "bf16"}),
    );
    let cli_packed = out.join("packed");
    let packed_out = format!("--out={}", p(&cli_packed));
    cli(&[
        "convert",
        &p(&cli_moe),
        "--layout=mixtral",
        "--experts-format=packed",
        "--dtype=bf16",
        &packed_out,
        "--json",
    ]);
    let cli_routed = out.join("routed");
    let domain = |l: &str| format!("--domain={l}={}:{}", p(&text(l, "train")), p(&text(l, "valid")));
    let route_stdout = cli(&[
        "route",
        &p(&cli_moe),
        &domain("en"),
        &domain("hu"),
        "--lambda=0.05",
        "--max-tokens=2000",
        "--context=64",
        &format!("--out={}", p(&cli_routed)),
        "--json",
    ]);
    assert!(route_stdout.contains("accuracy_per_domain_per_layer"), "{route_stdout}");
    let cli_graft = out.join("graft");
    cli(&[
        "graft",
        &p(&cli_moe),
        &format!("--base={m}"),
        &format!("--instruct={}", p(&cli_f16)),
        "--scale=0.5",
        &format!("--out={}", p(&cli_graft)),
        "--json",
    ]);
    let dare_cli = |seed: u64, dir: &Path| {
        cli(&[
            "merge",
            "dare-ties",
            &p(&cli_f16),
            &format!("--base={m}"),
            "--weights=0.7",
            "--density=0.5",
            &format!("--seed={seed}"),
            "--dtype=f32",
            &format!("--out={}", p(dir)),
            "--json",
        ])
    };
    let cli_dare = out.join("dare");
    dare_cli(3, &cli_dare);
    // (another seed drops other entries: the seed reaches the result)
    dare_cli(4, &out.join("dare-seed4"));
    assert_ne!(
        sha(&std::fs::read(cli_dare.join("model.safetensors")).unwrap()),
        sha(&std::fs::read(out.join("dare-seed4/model.safetensors")).unwrap())
    );

    lap("second wave: CLI");
    // convert: the CLI's bytes, registered as a packed Mixtral MoE of 2 experts per layer
    let jc = succeeded(&s, &convert);
    let arts = artefacts(&s, &convert);
    same_model("convert", &arts, &cli_packed);
    let packed = output_checkpoint(&s, &jc, &arts);
    assert_eq!(packed["summary"]["moe"]["experts_format"], "packed", "{packed}");
    assert_eq!(experts_per_layer(&packed), [2, 2, 2, 2, 2]);
    let config: Value = serde_json::from_slice(&arts["config.json"]).unwrap();
    assert_eq!((config["model_type"].as_str(), config["torch_dtype"].as_str()), (Some("mixtral"), Some("bfloat16")));
    // route: the routed MoE (studio layout: routers with a bias), the
    // CLI's bytes, statistics and report; en vs hu routed above chance
    let jr = succeeded(&s, &route);
    let arts = artefacts(&s, &route);
    same_model("route", &arts, &cli_routed);
    let stats = std::fs::read(cli_routed.join("ridge_stats.safetensors")).unwrap();
    assert_eq!(sha(&arts["ridge_stats.safetensors"]), sha(&stats), "route ridge_stats.safetensors is not the CLI's");
    let routed_ckpt = output_checkpoint(&s, &jr, &arts);
    assert_eq!(routed_ckpt["architecture"], "llama moe", "{routed_ckpt}");
    assert_eq!(experts_per_layer(&routed_ckpt), [2, 2, 2, 2, 2]);
    let t = summary_tensors(&routed_ckpt);
    assert!((0..5).all(|l| t.get(&format!("model.layers.{l}.block_sparse_moe.gate.bias")) == Some(&vec![2])));
    let mut report: Value = serde_json::from_slice(&arts["ridge_report.json"]).unwrap();
    let mut want: Value =
        serde_json::from_slice(&std::fs::read(cli_routed.join("ridge_report.json")).unwrap()).unwrap();
    for r in [&mut report, &mut want] {
        r.as_object_mut().unwrap().remove("model");
    }
    assert_eq!(report, want, "ridge_report.json is not the CLI's");
    assert_eq!(report["domains"], json!(["en", "hu"]));
    assert_eq!(report["tokens_per_domain"], json!([2000, 2000]));
    assert_eq!(
        (
            report["options"]["lambda"].as_f64(),
            report["options"]["context"].as_u64(),
            report["options"]["bias"].as_bool()
        ),
        (Some(0.05), Some(64), Some(true))
    );
    let chance = report["random_routing_accuracy"].as_f64().unwrap();
    assert_eq!(chance, 0.5);
    let acc: Vec<f64> =
        report["mean_accuracy_per_domain"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert!(acc.iter().all(|&x| x > chance + 0.15 && x <= 1.0), "held-out routing accuracy {acc:?}");
    let cond: Vec<f64> =
        report["condition_number_per_layer"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert!(cond.len() == 5 && cond.iter().all(|c| c.is_finite() && *c >= 1.0), "{cond:?}");
    // routing between equal experts changes nothing: the routers are
    // trained, the experts are still the dense FFN, the perplexity is the
    // dense model's
    let routed_t = tensors(&cli_routed);
    for l in 0..5 {
        let g = &routed_t[&format!("model.layers.{l}.block_sparse_moe.gate.weight")];
        assert!(g.iter().any(|&v| v != 0.0), "layer {l}: the ridge router is zero");
        let e0 = &routed_t[&format!("model.layers.{l}.block_sparse_moe.experts.0.w1.weight")];
        let e1 = &routed_t[&format!("model.layers.{l}.block_sparse_moe.experts.1.w1.weight")];
        assert!(e0 == e1 && *e0 == dense[&format!("model.layers.{l}.mlp.gate_proj.weight")], "layer {l}");
    }
    // (the first lines only: llama2.c's tokenizer is slow on a whole corpus)
    let hu_head = root.join("hu-head.txt");
    let hu = std::fs::read_to_string(text("hu", "valid")).unwrap();
    std::fs::write(&hu_head, hu.lines().take(50).collect::<Vec<_>>().join("\n")).unwrap();
    let (pd, pr) = (ppl(&model, &hu_head), ppl(&cli_routed, &hu_head));
    assert!((pd - pr).abs() <= 1e-4 * pd, "perplexity on hu: dense {pd}, routed MoE of two copies {pr}");
    eprintln!("route: held-out accuracy en/hu {acc:?} (chance {chance}), condition numbers {cond:?}; ppl hu {pd:.4} = {pr:.4}");

    // graft: MoE + 0.5 * (f16 - f32 stories260K), the CLI's bytes
    let jg = succeeded(&s, &graft);
    let arts = artefacts(&s, &graft);
    let graft_sha = same_model("graft", &arts, &cli_graft);
    let g_ckpt = output_checkpoint(&s, &jg, &arts);
    assert_eq!(experts_per_layer(&g_ckpt), [2, 2, 2, 2, 2]);
    assert_ne!(graft_sha, moe_sha, "the graft changed nothing");
    let graft_t = tensors(&cli_graft);
    let mut biggest = 0.0f32;
    for (moe_name, d) in [
        ("model.layers.0.block_sparse_moe.experts.1.w1.weight", "model.layers.0.mlp.gate_proj.weight"),
        ("model.layers.4.block_sparse_moe.experts.0.w2.weight", "model.layers.4.mlp.down_proj.weight"),
        ("model.layers.2.self_attn.q_proj.weight", "model.layers.2.self_attn.q_proj.weight"),
        ("model.embed_tokens.weight", "model.embed_tokens.weight"),
    ] {
        let (t, b, i) = (&moe_t[moe_name], &dense[d], &f16_t[d]);
        let want: Vec<f32> = t.iter().zip(b).zip(i).map(|((t, b), i)| t + 0.5 * (i - b)).collect();
        let got = &graft_t[moe_name];
        assert!(max_abs_diff(got, &want) <= 1e-6, "{moe_name}: {}", max_abs_diff(got, &want));
        biggest = biggest.max(max_abs_diff(got, t));
    }
    assert!(biggest > 1e-5, "the grafted delta is too small to see: {biggest}");
    // instruct == base: the MoE, bit for bit
    let jg0 = succeeded(&s, &graft0);
    let arts = artefacts(&s, &graft0);
    let g0 = output_checkpoint(&s, &jg0, &arts);
    assert_eq!(sha(&arts["model.safetensors"]), moe_sha, "graft with instruct == base changed the model");
    let moe_cfg = moe_ckpt["files"].as_array().unwrap().iter().find(|f| f["name"] == "config.json").unwrap().clone();
    let g0_cfg = g0["files"].as_array().unwrap().iter().find(|f| f["name"] == "config.json").unwrap().clone();
    assert_eq!(g0_cfg["sha256"], moe_cfg["sha256"]);

    // dare-ties: base + 0.7 * (a random half of the f16 rounding delta, rescaled)
    let jd = succeeded(&s, &dare);
    let arts = artefacts(&s, &dare);
    same_model("merge dare-ties", &arts, &cli_dare);
    let d_ckpt = output_checkpoint(&s, &jd, &arts);
    assert_eq!(d_ckpt["summary"]["dtypes"], json!({"F32": 47}), "{d_ckpt}");
    let dare_t = tensors(&cli_dare);
    assert_eq!(dare_t.len(), 47);
    let (mut moved, mut delta) = (0usize, 0usize);
    for (name, o) in &dare_t {
        let (b, i) = (&dense[name], &f16_t[name]);
        for ((b, i), o) in b.iter().zip(i).zip(o) {
            delta += usize::from(b != i);
            moved += usize::from(b != o);
        }
    }
    let kept = moved as f64 / delta as f64;
    assert!((0.4..=0.6).contains(&kept), "dare-ties at density 0.5 kept {moved} of {delta} changes ({kept:.3})");
    eprintln!("dare-ties: kept {moved} of {delta} changed values ({kept:.3})");

    lap("second wave checked");
    // ----- bad specs that need the models ------------------------------------
    let two = [dom("en", &en_train), dom("hu", &hu_train)];
    let bad = [
        (json!({"kind": "moerge", "models": [a, moe_id]}), "spec.models[1]"),
        (json!({"kind": "route", "model": a, "domains": two}), "spec.model"),
        (
            json!({"kind": "route", "model": moe_id, "domains": [dom("en", &en_train), dom("hu", &hu_train),
                   dom("el", &el_valid)]}),
            "spec.domains",
        ),
        (json!({"kind": "route", "model": moe_id, "domains": two, "top_k": 3}), "spec.top_k"),
        (json!({"kind": "route", "model": moe_id, "domains": two, "context": 4096}), "spec.context"),
        (
            json!({"kind": "route", "model": moe_id, "domains": [dom("en", &en_train),
                   {"name": "hu", "upload": hu_train, "heldout": ghost}]}),
            "spec.domains[1].heldout",
        ),
        (json!({"kind": "graft", "target": moe_id, "base": moe_id, "instruct": a}), "spec.base"),
        (json!({"kind": "graft", "target": moe_id, "base": a, "instruct": moe_id}), "spec.instruct"),
        (json!({"kind": "merge", "method": "linear", "models": [a, moe_id]}), "spec.models[1]"),
        (json!({"kind": "merge", "method": "task-arithmetic", "models": [a], "base": moe_id}), "spec.base"),
    ];
    let jobs_before = s.get("/api/jobs").as_array().unwrap().len();
    for (spec, field) in &bad {
        let (code, e) = s.call("POST", "/api/jobs", Some(json!({ "spec": spec })));
        assert_eq!((code, e["field"].as_str()), (422, Some(*field)), "{spec} -> {e}");
    }
    assert_eq!(s.get("/api/jobs").as_array().unwrap().len(), jobs_before, "a bad spec created a job");

    // nothing a job wrote names the data directory
    let dd_str = p(&dd);
    for j in [&moerge, &route, &graft, &dare, &neurons] {
        let log = job_log(&s, j);
        assert!(!log.contains(&dd_str), "job {j}'s log shows the data directory:\n{log}");
        for (n, b) in artefacts(&s, j) {
            assert!(!String::from_utf8_lossy(&b).contains(&dd_str), "job {j}'s {n} shows the data directory");
        }
    }
    lap("done");
    drop(s);
    let _ = std::fs::remove_dir_all(&root);
}
