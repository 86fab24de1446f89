//! `moe-studio train --nodes 2 --node-rank R --coordinator HOST:PORT` on
//! loopback (Burn's global collective: `moe-studio coordinator` plus two
//! rank processes with `--batch 2`) equals the single-process run with
//! `--batch 4`: the losses per step and the final weights agree to float
//! summation order; only rank 0 writes metrics.jsonl and checkpoints. And
//! the refusals: a coordinator that does not answer, a rank out of range,
//! ranks that disagree on the options, `--nodes` without `--coordinator`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use common::{arg, failure, ok, run, tmp};

/// A loopback port nobody listens on (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn(args: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_moe-studio"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs the binary")
}

/// The coordinator, killed (by its own pid) on drop.
struct Coordinator(Child);

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn coordinator() -> (Coordinator, u16) {
    let port = free_port();
    let c = Coordinator(
        Command::new(env!("CARGO_BIN_EXE_moe-studio"))
            .args(["coordinator", "--port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts the coordinator"),
    );
    (c, port)
}

struct Fixture {
    dir: PathBuf,
    moe: PathBuf,
    tok: PathBuf,
    en: PathBuf,
    hu: PathBuf,
}

fn fixture(name: &str) -> Option<Fixture> {
    let data = common::data_dir()?;
    let dir = tmp(name);
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
        "--out",
        &arg(&moe),
    ]));
    Some(Fixture {
        moe,
        tok: data.join("models/stories260K/tok512.bin"),
        en: data.join("corpora/lang/en/valid.txt"),
        hu: data.join("corpora/lang/hu/valid.txt"),
        dir,
    })
}

impl Fixture {
    /// `train` on the fixture: 5 steps of stage experts, grad-accum 2, the
    /// language prior on `en`.
    fn train(&self, out: &Path, batch: usize, extra: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = [
            "train",
            &arg(&self.moe),
            "--tokenizer",
            &arg(&self.tok),
            "--stage",
            "experts",
            "--data",
            &format!("en={}:orig", arg(&self.en)),
            "--data",
            &format!("hu={}", arg(&self.hu)),
            "--steps",
            "5",
            "--seq-len",
            "16",
            "--grad-accum",
            "2",
            "--lr",
            "1e-3",
            "--warmup",
            "1",
            "--seed",
            "5",
            "--batch",
            &batch.to_string(),
            "--out",
            &arg(out),
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    }
}

fn losses(metrics: &Path) -> Vec<(f64, f64)> {
    std::fs::read_to_string(metrics)
        .unwrap_or_else(|e| panic!("{}: {e}", metrics.display()))
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["loss"].as_f64().unwrap(), v["lb_loss"].as_f64().unwrap())
        })
        .collect()
}

struct Flat(Vec<f32>);

impl<B: Backend> ModuleVisitor<B> for Flat {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
        self.0.extend(p.val().into_data().convert::<f32>().to_vec::<f32>().unwrap());
    }
}

fn weights(dir: &Path) -> Vec<f32> {
    let m = moe_shared::checkpoint::open_model(dir).unwrap();
    let model = moe_shared::model::load_model::<moe_shared::CpuBackend>(&m, &Default::default()).unwrap();
    let mut f = Flat(Vec::new());
    model.visit(&mut f);
    f.0
}

fn wait(c: Child) -> Output {
    c.wait_with_output().unwrap()
}

#[test]
fn two_processes_on_loopback_are_one_process_with_twice_the_batch() {
    let Some(fx) = fixture("nodes") else { return };
    let single = fx.dir.join("single");
    ok(&run(&fx.train(&single, 4, &[]).iter().map(String::as_str).collect::<Vec<_>>()));

    let (_coord, port) = coordinator();
    let coord = format!("127.0.0.1:{port}");
    let ranks: Vec<Child> = (0..2)
        .map(|r| {
            let out = fx.dir.join(format!("rank{r}"));
            let node = format!("127.0.0.1:{}", free_port());
            let rank = r.to_string();
            let extra = [
                "--nodes",
                "2",
                "--node-rank",
                &rank,
                "--coordinator",
                &coord,
                "--node-address",
                &node,
                "--save-every",
                "2",
            ];
            spawn(&fx.train(&out, 2, &extra))
        })
        .collect();
    let outs: Vec<Output> = ranks.into_iter().map(wait).collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", String::from_utf8_lossy(&o.stderr));
    }
    // --json stdout stays JSON (Burn's "Connecting to ..." goes to stderr).
    for l in String::from_utf8_lossy(&outs[0].stdout).lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("rank 0 stdout `{l}`: {e}"));
    }
    let one = losses(&single.join("metrics.jsonl"));
    let two = losses(&fx.dir.join("rank0/metrics.jsonl"));
    assert_eq!(one.len(), 5);
    assert_eq!(two.len(), 5);
    for (s, ((a, la), (b, lb))) in one.iter().zip(&two).enumerate() {
        assert!((a - b).abs() <= 2e-6 * a.abs(), "step {}: loss {a} vs {b}", s + 1);
        assert!((la - lb).abs() <= 2e-6 * la.abs(), "step {}: load balancing {la} vs {lb}", s + 1);
    }
    // Only rank 0 writes: its periodic checkpoint and final model; rank 1 nothing.
    assert!(fx.dir.join("rank0/checkpoint-000004/trainer_state.json").is_file());
    assert!(!fx.dir.join("rank1").exists(), "rank 1 wrote into its --out");
    let (w1, w2) = (weights(&single.join("final")), weights(&fx.dir.join("rank0/final")));
    assert_eq!(w1.len(), w2.len());
    let dw = w1.iter().zip(&w2).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("2 processes x batch 2 vs 1 x batch 4: max |dw| {dw:.2e}; losses {one:?} / {two:?}");
    // AdamW turns roundoff in near-zero gradients into up to lr-sized steps.
    assert!(dw <= 1e-5, "final weights differ by {dw}");
}

#[test]
fn refusals_name_the_problem() {
    let Some(fx) = fixture("nodes-refuse") else { return };
    let out = fx.dir.join("o");
    let argv = |extra: &[&str]| fx.train(&out, 2, extra);
    let s = |v: Vec<String>| failure(&run(&v.iter().map(String::as_str).collect::<Vec<_>>()));

    let e = s(argv(&["--nodes", "2"]));
    assert!(e.contains("--nodes 2 needs --coordinator"), "{e}");
    let e = s(argv(&["--nodes", "2", "--node-rank", "2", "--coordinator", "127.0.0.1:1234"]));
    assert!(e.contains("--node-rank") && e.contains("out of range"), "{e}");
    let silent = format!("127.0.0.1:{}", free_port());
    let e = s(argv(&["--nodes", "2", "--node-rank", "1", "--coordinator", &silent, "--join-timeout", "2"]));
    assert!(e.contains("did not answer within 2 s") && e.contains("moe-studio coordinator"), "{e}");

    // Two ranks that disagree on --z-loss: both refuse after joining, naming the options.
    let (_coord, port) = coordinator();
    let coord = format!("127.0.0.1:{port}");
    let ranks: Vec<Child> = ["0", "1e-3"]
        .iter()
        .enumerate()
        .map(|(r, z)| {
            let o = fx.dir.join(format!("disagree{r}"));
            let node = format!("127.0.0.1:{}", free_port());
            let rank = r.to_string();
            let mut v = fx.train(&o, 2, &["--nodes", "2", "--node-rank", &rank, "--coordinator", &coord]);
            v.extend(["--node-address", &node, "--z-loss", z, "--join-timeout", "60"].map(String::from));
            spawn(&v)
        })
        .collect();
    for (r, c) in ranks.into_iter().enumerate() {
        let e = failure(&wait(c));
        assert!(e.contains("disagree on the options"), "rank {r}: {e}");
    }
    // A rank alone (the other never comes) gives up after --join-timeout.
    let (_coord, port) = coordinator();
    let coord = format!("127.0.0.1:{port}");
    let node = format!("127.0.0.1:{}", free_port());
    let e = s(argv(&[
        "--nodes",
        "2",
        "--node-rank",
        "0",
        "--coordinator",
        &coord,
        "--node-address",
        &node,
        "--join-timeout",
        "3",
    ]));
    assert!(e.contains("not all 2 ranks joined") && e.contains("within 3 s"), "{e}");
}
