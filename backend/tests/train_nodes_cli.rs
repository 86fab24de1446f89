//! `moe-studio train --nodes 2 --node-rank R --coordinator HOST:PORT` on
//! loopback: `moe-studio coordinator` plus two rank processes with
//! `--batch 2` (shared/src/train/parallel.rs).
//!
//! They check what the path promises: 2 processes x batch 2 equal one
//! process with `--batch 4` (losses per step and final weights to float
//! summation order, with load balancing and the language prior on), only
//! rank 0 writes metrics.jsonl and checkpoints, a run stopped by Ctrl-C on
//! one rank stops every rank after the same step and `--resume` continues
//! it bit for bit, one coordinator serves one run after another, and the
//! refusals (a coordinator that does not answer, ranks that disagree on
//! the options, a rank alone).
//!
//! Every spawned process runs under [`LIMIT`]: past it, it is killed and the
//! test fails naming it, so a hang cannot block CI.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use common::{arg, failure, ok, run, tmp};

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
            let mut logs = String::new();
            for p in procs.iter_mut() {
                if let Some(mut c) = p.child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                let err = std::fs::read_to_string(&p.err).unwrap_or_default();
                logs.push_str(&format!("\n--- {} stderr:\n{}", p.name, err.trim_end()));
            }
            panic!("{names} still running after {} s: killed (a hang in Burn's collective?){logs}", LIMIT.as_secs());
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

/// A `moe-studio coordinator` listening on a free loopback port, returned
/// once it accepts connections. A port found free can be taken before the
/// coordinator binds it (by another test's outgoing connection, whose
/// ephemeral port it is): then the coordinator exits with "cannot listen"
/// and another port is tried, up to 5 times.
fn coordinator(dir: &Path) -> (Proc, u16) {
    let mut tried = Vec::new();
    for _ in 0..5 {
        let port = free_port();
        let mut c =
            spawn(&format!("coordinator-{port}"), dir, &["coordinator".into(), "--port".into(), port.to_string()]);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if c.child.as_mut().expect("running").try_wait().unwrap().is_some() {
                break;
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                // Connected to ours, not to whoever might hold the port: ours is still up.
                std::thread::sleep(Duration::from_millis(200));
                if c.child.as_mut().expect("running").try_wait().unwrap().is_none() {
                    return (c, port);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        tried.push(format!("{port}: {}", std::fs::read_to_string(&c.err).unwrap_or_default().trim()));
    }
    panic!("no coordinator came up on a free port: {}", tried.join("; "));
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

/// `train` arguments of rank `r` of 2.
fn rank_args(fx: &Fixture, out: &Path, r: usize, coord: &str, extra: &[&str]) -> Vec<String> {
    let rank = r.to_string();
    let mut v = ["--nodes", "2", "--node-rank", &rank, "--coordinator", coord].to_vec();
    v.extend(extra);
    fx.train(out, 2, &v)
}

/// `(step, loss, lb_loss, seconds)` per line of a metrics.jsonl.
fn steps(metrics: &Path) -> Vec<(u64, f64, f64, f64)> {
    std::fs::read_to_string(metrics)
        .unwrap_or_else(|e| panic!("{}: {e}", metrics.display()))
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {l}"));
            (v["step"].as_u64().unwrap(), f("loss"), f("lb_loss"), f("seconds"))
        })
        .collect()
}

fn signal(p: &Proc, sig: i32) {
    let pid = p.child.as_ref().expect("running").id() as i32;
    // SAFETY: kill(2) on a child this test spawned and has not waited for.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill {sig} {}", p.name);
}

#[test]
fn two_processes_on_loopback_are_one_process_with_twice_the_batch() {
    let Some(fx) = fixture("nodes") else { return };
    let (c, port) = coordinator(&fx.dir);
    let coord = format!("127.0.0.1:{port}");
    let _coordinator = c;

    // 2 ranks x batch 2, separate --out directories: rank 0 writes.
    let t0 = Instant::now();
    let mut procs: Vec<Proc> = (0..2)
        .map(|r| {
            let out = fx.dir.join(format!("rank{r}"));
            spawn(&format!("rank{r}"), &fx.dir, &rank_args(&fx, &out, r, &coord, &["--save-every", "2"]))
        })
        .collect();
    let outs = wait_all(&mut procs, t0);
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", String::from_utf8_lossy(&o.stderr));
    }
    // --json stdout stays JSON on rank 0; rank 1 prints its steps too.
    for l in String::from_utf8_lossy(&outs[0].stdout).lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("rank 0 stdout `{l}`: {e}"));
    }
    assert!(fx.dir.join("rank0/checkpoint-000004/trainer_state.json").is_file());
    assert!(!fx.dir.join("rank1").exists(), "rank 1 wrote into its --out");
    let two = steps(&fx.dir.join("rank0/metrics.jsonl"));

    let single = fx.dir.join("single");
    let o = run_limited("single", &fx.dir, &fx.train(&single, 4, &[]));
    assert!(o.status.success(), "single: {}", String::from_utf8_lossy(&o.stderr));
    let one = steps(&single.join("metrics.jsonl"));
    assert_eq!(one.len(), 5);
    assert_eq!(two.len(), 5);
    let mut dl = 0f64;
    for ((s, a, la, _), (_, b, lb, _)) in one.iter().zip(&two) {
        dl = dl.max((a - b).abs()).max((la - lb).abs());
        assert!((a - b).abs() <= 2e-6 * a.abs(), "step {s}: loss {a} vs {b}");
        assert!((la - lb).abs() <= 2e-6 * la.abs(), "step {s}: load balancing {la} vs {lb}");
    }
    let (w1, w2) = (weights(&single.join("final")), weights(&fx.dir.join("rank0/final")));
    assert_eq!(w1.len(), w2.len());
    let dw = w1.iter().zip(&w2).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    // Seconds per step after the first (which includes Burn's autotune and
    // the first allocations).
    let per_step = |v: &[(u64, f64, f64, f64)]| v[1..].iter().map(|x| x.3).sum::<f64>() / (v.len() - 1) as f64;
    eprintln!(
        "2 processes x batch 2 vs 1 x batch 4: max |dloss| {dl:.2e}, max |dw| {dw:.2e}; seconds per step {:.4} (1 \
         process) vs {:.4} (2 processes)",
        per_step(&one),
        per_step(&two)
    );
    // AdamW turns roundoff in near-zero gradients into up to lr-sized steps.
    assert!(dw <= 1e-5, "final weights differ by {dw}");

    // The same run with one --out for both ranks (a shared file system),
    // Ctrl-C on rank 1 mid-run: rank 0 is paused once its first step is
    // written, so both stop after the same step before the last; rank 0
    // saves a checkpoint there and nobody writes `final`.
    let shared = fx.dir.join("shared");
    let t0 = Instant::now();
    let mut procs: Vec<Proc> = (0..2)
        .map(|r| spawn(&format!("stop{r}"), &fx.dir, &rank_args(&fx, &shared, r, &coord, &["--save-every", "1"])))
        .collect();
    let metrics = shared.join("metrics.jsonl");
    while std::fs::read_to_string(&metrics).map_or(true, |m| m.lines().count() < 1) {
        assert!(t0.elapsed() < LIMIT, "rank 0 wrote no step within {} s", LIMIT.as_secs());
        std::thread::sleep(Duration::from_millis(2));
    }
    signal(&procs[0], libc::SIGSTOP);
    signal(&procs[1], libc::SIGINT);
    std::thread::sleep(Duration::from_millis(200));
    signal(&procs[0], libc::SIGCONT);
    let outs = wait_all(&mut procs, t0);
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(o.status.code(), Some(130), "rank {r} exits as stopped: {}", String::from_utf8_lossy(&o.stderr));
    }
    let stopped = steps(&metrics).len();
    assert!((1..5).contains(&stopped), "stopped after step {stopped}");
    let e = String::from_utf8_lossy(&outs[0].stderr);
    assert!(e.contains(&format!("stopped after step {stopped}")), "{e}");
    assert!(shared.join(format!("checkpoint-{stopped:06}/trainer_state.json")).is_file());
    assert!(!shared.join("final").exists());

    // --resume on both ranks: the same losses and weights, bit for bit.
    let t0 = Instant::now();
    let mut procs: Vec<Proc> = (0..2)
        .map(|r| {
            let a = rank_args(&fx, &shared, r, &coord, &["--save-every", "1", "--resume"]);
            spawn(&format!("resume{r}"), &fx.dir, &a)
        })
        .collect();
    for (r, o) in wait_all(&mut procs, t0).iter().enumerate() {
        assert!(o.status.success(), "resumed rank {r}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let resumed = steps(&metrics);
    let strip = |v: &[(u64, f64, f64, f64)]| v.iter().map(|x| (x.0, x.1, x.2)).collect::<Vec<_>>();
    assert_eq!(strip(&resumed), strip(&two), "stopped after step {stopped}, resumed");
    assert_eq!(weights(&shared.join("final")), w2, "final weights after --resume");
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
    // A rank alone (the other never comes) gives up after --join-timeout;
    // the same coordinator serves it after the failed run.
    let e = failure(&run_limited("alone", &fx.dir, &rank_args(&fx, &out, 0, &coord, &["--join-timeout", "3"])));
    assert!(e.contains("not all 2 ranks joined") && e.contains("within 3 s"), "{e}");
    drop(procs);
    assert!(!out.exists(), "a refused run wrote {}", out.display());
}
