//! `moe-studio train ... --engine torch --emit DIR` on stories260K, without
//! torch: the job's files, its data equal to the sequences the Burn trainer
//! draws (same order, inputs and shifted targets, original-language tags),
//! its model equal to the input bit for bit, and refusals that leave nothing
//! behind. The run of the job itself against the Burn trainer is the opt-in
//! `scripts/torch_handoff_check.sh` (it needs torch).

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

    // Refusals leave nothing: a non-empty --emit directory, a model no torch layout holds, no --emit.
    let mut again = base.to_vec();
    again.extend(["--emit", job.to_str().unwrap()]);
    assert!(failure(&run(&again)).contains("not empty"));
    let job2 = dir.join("job2");
    let mut free = base.to_vec();
    free.extend(["--emit", job2.to_str().unwrap(), "--balance", "aux-free"]);
    let err = failure(&run(&free));
    assert!(err.contains("selection_bias") && err.contains("--engine burn"), "{err}");
    assert!(!job2.exists());
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-emit-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let err = failure(&run(&base));
    assert!(err.contains("--out") || err.contains("--emit"), "{err}");
}
