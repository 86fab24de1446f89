//! `moe-studio train --nodes 2 --node-rank R --coordinator HOST:PORT` on
//! loopback (Burn's global collective: `moe-studio coordinator` plus two
//! rank processes with `--batch 2`).
//!
//! With Burn 0.21 the multi-process path is refused
//! (`moe_shared::train::parallel::GLOBAL_COLLECTIVE_USABLE` is `false`:
//! Burn's cross-process all-reduce hangs at its second call, see
//! `GLOBAL_COLLECTIVE_REFUSAL`): these tests then check that the
//! coordinator and every rank stop at once with that reason and write
//! nothing. Once the constant is `true` they check what the path promises:
//! 2 processes x batch 2 equal one process with `--batch 4` (losses per step
//! and final weights to float summation order), only rank 0 writes
//! metrics.jsonl and checkpoints, and the refusals (a coordinator that does
//! not answer, ranks that disagree on the options, a rank alone).
//!
//! Every spawned process runs under [`LIMIT`]: past it, it is killed and the
//! test fails naming it, so a hang in the collective cannot block CI.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use common::{arg, failure, ok, run, tmp};
use moe_shared::train::parallel::GLOBAL_COLLECTIVE_USABLE;

/// The longest any spawned process may run (a 5-step train of stories260K
/// takes seconds).
const LIMIT: Duration = Duration::from_secs(120);

/// A loopback port nobody listens on (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A spawned `moe-studio` whose stdout/stderr go to files (no pipe to fill
/// up), killed (by its own pid) on drop, so a failing assertion leaves no
/// process behind.
struct Proc {
    name: String,
    child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(name: &str, dir: &Path, args: &[String]) -> Proc {
    let (out, err) = (dir.join(format!("{name}.stdout")), dir.join(format!("{name}.stderr")));
    let child = Command::new(env!("CARGO_BIN_EXE_moe-studio"))
        .args(args)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .stdin(Stdio::null())
        .spawn()
        .expect("runs the binary");
    Proc { name: name.to_string(), child: Some(child), out, err }
}

/// Waits for all `procs` until `started + LIMIT`; on the deadline kills
/// every one still running and fails naming them.
fn wait_all(procs: &mut [Proc], started: Instant) -> Vec<Output> {
    loop {
        let running: Vec<String> = procs
            .iter_mut()
            .filter_map(|p| {
                let done = p.child.as_mut().expect("not waited yet").try_wait().unwrap().is_some();
                (!done).then(|| p.name.clone())
            })
            .collect();
        if running.is_empty() {
            break;
        }
        if started.elapsed() >= LIMIT {
            let names = running.join(", ");
            for p in procs.iter_mut() {
                drop(p.child.take());
            }
            panic!("{names} still running after {} s: killed (a hang in Burn's collective?)", LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    procs
        .iter_mut()
        .map(|p| {
            let status = p.child.take().expect("not waited yet").wait().unwrap();
            Output { status, stdout: std::fs::read(&p.out).unwrap(), stderr: std::fs::read(&p.err).unwrap() }
        })
        .collect()
}

/// One `moe-studio` run under [`LIMIT`].
fn run_limited(name: &str, dir: &Path, args: &[String]) -> Output {
    wait_all(&mut [spawn(name, dir, args)], Instant::now()).pop().unwrap()
}

fn coordinator(dir: &Path) -> (Proc, u16) {
    let port = free_port();
    (spawn(&format!("coordinator-{port}"), dir, &["coordinator".into(), "--port".into(), port.to_string()]), port)
}

/// The refusal of Burn 0.21's global path, on `opt` (`--nodes` for a rank,
/// `coordinator` for the coordinator).
fn assert_refused(e: &str, opt: &str) {
    assert!(
        e.contains(opt)
            && e.contains("multi-process training is disabled")
            && e.contains("src/global/node/sync.rs:71-79")
            && e.contains("--devices N")
            && e.contains("--engine torch --emit DIR"),
        "{e}"
    );
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

/// `train` arguments of rank `r` of 2 (its data service on a free port).
fn rank_args(fx: &Fixture, out: &Path, r: usize, coord: &str, extra: &[&str]) -> Vec<String> {
    let node = format!("127.0.0.1:{}", free_port());
    let rank = r.to_string();
    let mut v = ["--nodes", "2", "--node-rank", &rank, "--coordinator", coord, "--node-address", &node].to_vec();
    v.extend(extra);
    fx.train(out, 2, &v)
}

#[test]
fn two_processes_on_loopback_are_one_process_with_twice_the_batch() {
    let Some(fx) = fixture("nodes") else { return };
    let t0 = Instant::now();
    let (c, port) = coordinator(&fx.dir);
    let coord = format!("127.0.0.1:{port}");
    let mut procs = vec![c];
    for r in 0..2 {
        let out = fx.dir.join(format!("rank{r}"));
        procs.push(spawn(&format!("rank{r}"), &fx.dir, &rank_args(&fx, &out, r, &coord, &["--save-every", "2"])));
    }
    if !GLOBAL_COLLECTIVE_USABLE {
        // Burn 0.21: the coordinator and both ranks refuse at once (before
        // reading the model), naming the cause; nothing is written.
        let outs = wait_all(&mut procs, t0);
        assert_refused(&failure(&outs[0]), "coordinator");
        for (r, o) in outs[1..].iter().enumerate() {
            assert_refused(&failure(o), "--nodes");
            assert!(!fx.dir.join(format!("rank{r}")).exists(), "rank {r} wrote into its --out");
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the refusal took {:?}", t0.elapsed());
        return;
    }
    let outs = wait_all(&mut procs[1..], t0);
    drop(procs);
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let single = fx.dir.join("single");
    ok(&run_limited("single", &fx.dir, &fx.train(&single, 4, &[])));
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
    let s = |name: &str, extra: &[&str]| failure(&run_limited(name, &fx.dir, &fx.train(&out, 2, extra)));

    let e = s("no-coordinator", &["--nodes", "2"]);
    assert!(e.contains("--nodes 2 needs --coordinator"), "{e}");
    let e = s("rank-range", &["--nodes", "2", "--node-rank", "2", "--coordinator", "127.0.0.1:1234"]);
    assert!(e.contains("--node-rank") && e.contains("out of range"), "{e}");
    let silent = format!("127.0.0.1:{}", free_port());
    let e = s("silent", &["--nodes", "2", "--node-rank", "1", "--coordinator", &silent, "--join-timeout", "2"]);
    if !GLOBAL_COLLECTIVE_USABLE {
        // Burn 0.21: a well-formed spec is refused before any network call,
        // with 2 nodes or 1 (the distributed path in one process).
        assert_refused(&e, "--nodes");
        let e = s("one-node", &["--nodes", "1", "--coordinator", &silent]);
        assert_refused(&e, "--nodes");
        assert!(!out.exists(), "a refused run wrote {}", out.display());
        return;
    }
    assert!(e.contains("did not answer within 2 s") && e.contains("moe-studio coordinator"), "{e}");

    // Two ranks that disagree on --z-loss: both refuse after joining, naming the options.
    let t0 = Instant::now();
    let (c, port) = coordinator(&fx.dir);
    let coord = format!("127.0.0.1:{port}");
    let mut procs = vec![c];
    for (r, z) in ["0", "1e-3"].iter().enumerate() {
        let o = fx.dir.join(format!("disagree{r}"));
        let v = rank_args(&fx, &o, r, &coord, &["--z-loss", z, "--join-timeout", "60"]);
        procs.push(spawn(&format!("disagree{r}"), &fx.dir, &v));
    }
    for (r, o) in wait_all(&mut procs[1..], t0).iter().enumerate() {
        let e = failure(o);
        assert!(e.contains("disagree on the options"), "rank {r}: {e}");
    }
    drop(procs);
    // A rank alone (the other never comes) gives up after --join-timeout.
    let (_c, port) = coordinator(&fx.dir);
    let coord = format!("127.0.0.1:{port}");
    let e = failure(&run_limited("alone", &fx.dir, &rank_args(&fx, &out, 0, &coord, &["--join-timeout", "3"])));
    assert!(e.contains("not all 2 ranks joined") && e.contains("within 3 s"), "{e}");
}
