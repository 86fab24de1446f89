//! `moe-studio train ... --engine torch --emit DIR` on stories260K, without
//! torch: the job's files, its data equal to the sequences the Burn trainer
//! draws (same order, inputs and shifted targets, original-language tags),
//! its model equal to the input bit for bit, the studio modeling for what
//! no transformers class holds, refusals that leave nothing behind, the
//! structure of every method's job equal to what the opt-in
//! `scripts/torch_handoff_check.sh` ran under torch
//! (tests/reference/golden/torch_handoff.json), and `train --nodes 2`
//! answering with the torchrun commands.

mod common;

use common::{arg, failure, json, ok, run, tmp};
use moe_shared::tokenizer::{Llama2cTokenizer, Tokenizer};
use moe_shared::train::data::load_mixture;
use moe_shared::train::DataSpec;

fn upcycled(dir: &std::path::Path) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let data = common::data_dir()?;
    let moe = dir.join("moe");
    ok(&run(&[
        "upcycle",
        &arg(&data.join("models/stories260K/stories260K.bin")),
        "--experts",
        "4",
        "--top-k",
        "2",
        "--router-init",
        "random",
        "--dtype",
        "f32",
        "--layout",
        "mixtral",
        "--out",
        &arg(&moe),
    ]));
    Some((moe, data))
}

#[test]
fn the_emitted_job_holds_the_trainers_model_data_and_config() {
    let dir = tmp("emit");
    let Some((moe, data)) = upcycled(&dir) else { return };
    let tok = data.join("models/stories260K/tok512.bin");
    let en = data.join("corpora/lang/en/valid.txt");
    let hu = data.join("corpora/lang/hu/valid.txt");
    let job = dir.join("job");
    let en_spec = format!("en={}:orig", arg(&en));
    let hu_spec = format!("hu={}:2", arg(&hu));
    let base = [
        "train",
        moe.to_str().unwrap(),
        "--tokenizer",
        tok.to_str().unwrap(),
        "--stage",
        "experts",
        "--data",
        &en_spec,
        "--data",
        &hu_spec,
        "--steps",
        "3",
        "--seq-len",
        "16",
        "--batch",
        "2",
        "--grad-accum",
        "2",
        "--seed",
        "5",
        "--engine",
        "torch",
    ];
    // Frozen weights in 16 bits are the Burn trainer's: refused by name, nothing written.
    let mut argv = base.to_vec();
    argv.extend(["--emit", job.to_str().unwrap(), "--frozen-dtype", "bf16"]);
    let e = failure(&run(&argv));
    assert!(e.contains("--frozen-dtype bf16") && e.contains("PyTorch"), "{e}");
    assert!(!job.exists(), "nothing left at --emit");
    let mut argv = base.to_vec();
    argv.extend(["--emit", job.to_str().unwrap(), "--json"]);
    let out = json(&run(&argv));
    assert_eq!((out["engine"].as_str(), out["layout"].as_str()), (Some("torch"), Some("mixtral")));
    for f in ["train.py", "README.md", "requirements.txt", "job.json", "model/config.json", "model/tokenizer.bin"] {
        assert!(job.join(f).is_file(), "{f}");
    }
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(job.join("job.json")).unwrap()).unwrap();
    assert_eq!(j["format"], "moe-studio-torch-job");
    assert_eq!(
        (j["global_batch"].as_u64(), j["data"]["rows"].as_u64(), j["data"]["row_len"].as_u64()),
        (Some(2), Some(12), Some(17))
    );
    let t = &j["train"];
    assert_eq!(
        (t["stage"].as_str(), t["steps"].as_u64(), t["grad_accum"].as_u64()),
        (Some("experts"), Some(3), Some(2))
    );
    assert_eq!(
        (t["lr"].as_f64(), t["alpha"].as_f64(), t["prior"].as_f64(), t["seed"].as_u64()),
        (Some(5e-5), Some(0.01), Some(0.1), Some(5))
    );
    // Stage experts: expert 0 of 5 layers and everything outside the MoE FFNs frozen.
    let p = &j["parameters"];
    assert!(p["trainable"].as_u64().unwrap() > 0 && p["frozen"].as_u64().unwrap() > 0);

    // The data: the trainer's mixture, drawn in its order.
    let bytes = std::fs::read(&tok).unwrap();
    let tk = Tokenizer::Llama2c(Llama2cTokenizer::parse(&bytes, 512, "tok512").unwrap());
    let specs = [DataSpec::parse(&en_spec).unwrap(), DataSpec::parse(&hu_spec).unwrap()];
    let mut mix = load_mixture(&specs, moe_shared::corpus::DocSplit::Blank, &tk, 16, 5).unwrap();
    let tokens = std::fs::read(job.join("data/tokens.u32")).unwrap();
    let original = std::fs::read(job.join("data/original.u8")).unwrap();
    let source = std::fs::read(job.join("data/source.u16")).unwrap();
    assert_eq!((tokens.len(), original.len(), source.len()), (12 * 17 * 4, 12, 24));
    let ids: Vec<i64> = tokens.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64).collect();
    let mut seen = [0usize; 2];
    for micro in 0..6 {
        let b = mix.next_batch(2);
        for r in 0..2 {
            let row = &ids[(micro * 2 + r) * 17..(micro * 2 + r + 1) * 17];
            assert_eq!(&row[..16], &b.inputs[r * 16..(r + 1) * 16], "inputs of micro-step {micro} row {r}");
            assert_eq!(&row[1..], &b.targets[r * 16..(r + 1) * 16], "targets of micro-step {micro} row {r}");
            let i = micro * 2 + r;
            assert_eq!(original[i] == 1, b.original[r]);
            let s = u16::from_le_bytes([source[2 * i], source[2 * i + 1]]) as usize;
            assert_eq!(s, b.sources[r]);
            seen[s] += 1;
        }
    }
    assert!(seen[0] > 0 && seen[1] > 0, "both sources drawn: {seen:?}");

    // The model: the input, unchanged (f32 Mixtral in, f32 Mixtral out).
    let (a, b) = (dir.join("a.f32"), dir.join("b.f32"));
    ok(&run(&["logits", moe.to_str().unwrap(), "--ids", "1,403,407,261", "--out", a.to_str().unwrap()]));
    ok(&run(&["logits", &arg(&job.join("model")), "--ids", "1,403,407,261", "--out", b.to_str().unwrap()]));
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());

    // A model only the studio layout holds (the aux-free selection bias) is emitted with the studio modeling.
    let job2 = dir.join("job2");
    let mut free = base.to_vec();
    free.extend(["--emit", job2.to_str().unwrap(), "--balance", "aux-free", "--json"]);
    let out = json(&run(&free));
    assert_eq!((out["layout"].as_str(), out["modeling"].as_str()), (Some("moe_studio"), Some("studio")));
    let j2: serde_json::Value = serde_json::from_slice(&std::fs::read(job2.join("job.json")).unwrap()).unwrap();
    assert_eq!((j2["modeling"].as_str(), j2["activation"].as_str()), (Some("studio"), Some("silu")));
    assert_eq!(j2["base_config"]["model_type"], "llama");
    assert!(job2.join("studio_moe.py").is_file());
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(job2.join("model/config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "moe_studio");
    assert!(cfg["moe_layers"].as_array().unwrap().iter().all(|l| l["selection_bias"] == true));

    // Refusals leave nothing: a non-empty --emit directory, no --emit.
    let mut again = base.to_vec();
    again.extend(["--emit", job.to_str().unwrap()]);
    assert!(failure(&run(&again)).contains("not empty"));
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-emit-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let err = failure(&run(&base));
    assert!(err.contains("--out") || err.contains("--emit"), "{err}");
}

/// The repository root (tests/reference lives there).
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `$NAME` placeholders of tests/reference/torch_handoff_cases.json.
fn substitute(x: &str, vars: &[(&str, String)]) -> String {
    let mut v: Vec<&(&str, String)> = vars.iter().collect();
    v.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    v.iter().fold(x.to_string(), |acc, (k, val)| acc.replace(&format!("${k}"), val))
}

/// `{name: shape}` from the safetensors headers of model directory `d`.
fn header_shapes(d: &std::path::Path) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    for e in std::fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let b = std::fs::read(&p).unwrap();
            let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
            let h: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
            for (k, v) in h.as_object().unwrap() {
                if k != "__metadata__" {
                    out.insert(k.clone(), v["shape"].clone());
                }
            }
        }
    }
    out
}

/// Job files relative to `job` (outside `out/`), sorted.
fn job_files(job: &std::path::Path) -> Vec<String> {
    fn walk(root: &std::path::Path, d: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(job, job, &mut out);
    out.sort();
    out
}

/// Every stage of every method the opt-in torch check ran
/// (tests/reference/torch_handoff_cases.json) emits the job whose structure
/// that run recorded (tests/reference/golden/torch_handoff.json): layout,
/// modeling, `moe_layers`, files, data shape, training options, every
/// tensor's name and shape, and the trainable element count, which the check
/// asserted equal to what torch trains. A router stage that the check ran
/// from torch's stage-1 output is emitted from stage 1's input here (the
/// same structure).
#[test]
fn every_method_s_job_has_the_structure_the_torch_check_ran() {
    let Some(data) = common::data_dir() else { return };
    let dir = tmp("golden");
    let cases: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo().join("tests/reference/torch_handoff_cases.json")).unwrap())
            .unwrap();
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo().join("tests/reference/golden/torch_handoff.json")).unwrap())
            .unwrap();
    let m = data.join("models/stories260K");
    let vars = [
        ("STORIES", arg(&m.join("stories260K.bin"))),
        ("TOK", arg(&m.join("tok512.bin"))),
        ("D", arg(&data)),
        ("W", arg(&dir)),
        ("STEPS", golden["steps"].to_string()),
    ];
    let sub = |x: &serde_json::Value| substitute(x.as_str().unwrap(), &vars);
    let mut checked = 0;
    for case in cases["cases"].as_array().unwrap() {
        if let Some(files) = case["files"].as_object() {
            for (name, body) in files {
                std::fs::write(dir.join(name), serde_json::to_vec(body).unwrap()).unwrap();
            }
        }
        for cmd in case["prepare"].as_array().unwrap() {
            let argv: Vec<String> = cmd.as_array().unwrap().iter().map(sub).collect();
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            ok(&run(&argv));
        }
        let stages = case["stages"].as_array().unwrap();
        for st in stages {
            let name = st["name"].as_str().unwrap();
            let mut input = st["input"].as_str().unwrap().to_string();
            while let Some(from) = input.strip_prefix('@') {
                let s = stages.iter().find(|s| s["name"] == from).expect("the referenced stage");
                input = s["input"].as_str().unwrap().to_string();
            }
            let job = dir.join(format!("torch-{name}"));
            let mut argv = vec!["train".to_string(), substitute(&input, &vars), "--stage".into()];
            argv.push(st["stage"].as_str().unwrap().into());
            argv.extend(st["args"].as_array().unwrap().iter().map(sub));
            argv.extend(st.get("train").unwrap_or(&cases["train"]).as_array().unwrap().iter().map(sub));
            argv.extend(["--engine".into(), "torch".into(), "--emit".into(), arg(&job)]);
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            ok(&run(&argv));
            let want = &golden["stages"][name];
            assert!(want.is_object(), "{name}: not in the golden file (rerun the torch check with --update-golden)");
            let j: serde_json::Value = serde_json::from_slice(&std::fs::read(job.join("job.json")).unwrap()).unwrap();
            let cfg: serde_json::Value =
                serde_json::from_slice(&std::fs::read(job.join("model/config.json")).unwrap()).unwrap();
            let train = want["train"].as_object().unwrap();
            let got = serde_json::json!({
                "layout": j["layout"],
                "modeling": j["modeling"],
                "model_type": cfg["model_type"],
                "moe_layers": cfg.get("moe_layers").cloned().unwrap_or(serde_json::Value::Null),
                "files": job_files(&job),
                "global_batch": j["global_batch"],
                "data": {"rows": j["data"]["rows"], "row_len": j["data"]["row_len"]},
                "train": train.keys().map(|k| (k.clone(), j["train"][k].clone())).collect::<serde_json::Map<_, _>>(),
                "parameters": j["parameters"],
                "tensors": header_shapes(&job.join("model")),
            });
            for (k, v) in got.as_object().unwrap() {
                assert_eq!(v, &want[k], "{name}: `{k}` differs from the golden file");
            }
            assert_eq!(
                j["parameters"]["trainable"], want["torch_trainable_elements"],
                "{name}: the elements torch trained in the check"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, golden["stages"].as_object().unwrap().len(), "every golden stage emitted");
}

/// `train --nodes 2`: the studio trains on one machine; it prints the
/// command that emits the same run as a PyTorch job and each node's
/// `torchrun --nnodes 2` line, and fails without reading anything (the
/// model path does not exist).
#[test]
fn train_nodes_prints_the_torchrun_lines_and_starts_nothing() {
    let dir = tmp("nodes");
    let out = run(&[
        "--backend",
        "cpu",
        "train",
        "/nonexistent/moe",
        "--stage",
        "experts",
        "--data",
        "hu=/nonexistent/hu.txt",
        "--steps",
        "10",
        "--batch",
        "4",
        "--devices",
        "8",
        "--nodes",
        "2",
        "--frozen-dtype",
        "bf16",
        "--out",
        &arg(&dir.join("run")),
    ]);
    let err = failure(&out);
    assert!(err.contains("--nodes 2") && err.contains("torchrun") && err.contains("nothing was started"), "{err}");
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    let emit = lines.iter().find(|l| l.contains(" train ")).expect("the emit command");
    let job = format!("{}-torch-job", arg(&dir.join("run")));
    assert!(emit.contains(&format!("--devices 16 --engine torch --emit {job}")), "{emit}");
    assert!(!emit.contains("--nodes") && !emit.contains("--out"), "{emit}");
    // The PyTorch job refuses --frozen-dtype: the printed command leaves it out, and says so.
    assert!(!emit.contains("--frozen-dtype"), "{emit}");
    assert!(lines.iter().any(|l| l.starts_with('#') && l.contains("without --frozen-dtype bf16")), "{lines:?}");
    for r in 0..2 {
        let want = format!(
            "torchrun --nnodes 2 --nproc-per-node 8 --node-rank {r} --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
             --rdzv-id moe-job {job}/train.py"
        );
        assert!(lines.contains(&want), "{want} in {lines:?}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing written");
    let help = common::ok(&run(&["--help"]));
    assert!(!help.contains("coordinator"), "{help}");
    let err = failure(&run(&["coordinator", "--port", "29500"]));
    assert!(err.contains("unrecognized subcommand"), "{err}");
}
