//! An experiment, not a regular test (`#[ignore]`): burn-collective 0.21's
//! own cross-process all-reduce between two processes on loopback, the
//! evidence for why `train --nodes` does not use it
//! (shared/src/train/parallel.rs, ARCHITECTURE.md "Training"):
//! - `plain_hangs_at_the_second_call`: register once, all-reduce three
//!   times: both ranks pass the first call and wait forever in the second
//!   (the children are killed after 20 s);
//! - `epochs_survive`: register, one all-reduce, `finish_collective`, for
//!   `EPOCH_COUNT` (500) all-reduces of `EPOCH_VLEN` (2) floats, two
//!   orchestrators and two data ports used alternately; it reports the
//!   milliseconds per all-reduce (register / all-reduce / finish) or, when
//!   a rank hangs (killed after 600 s), how far each rank got and in which
//!   call. `EPOCH_SLEEP_MS` waits between the all-reduce and `finish`.
//!
//! `cargo test -p moe-studio --test collective_epochs -- --ignored --nocapture`
//! (the test binary re-runs itself as the two ranks, `child`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use burn::tensor::{Tensor, TensorData};
use burn_collective::{self as bc, AllReduceStrategy, CollectiveConfig, PeerId, ReduceOperation};

type B = moe_shared::CpuBackend;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn cfg(orch: u16, data: u16) -> CollectiveConfig {
    CollectiveConfig::default()
        .with_num_devices(1)
        .with_num_nodes(2)
        .with_global_address(format!("ws://127.0.0.1:{orch}").parse().unwrap())
        .with_node_address(format!("ws://127.0.0.1:{data}").parse().unwrap())
        .with_data_service_port(data)
        .with_global_all_reduce_strategy(AllReduceStrategy::Tree(2))
}

fn reduce(r: u32, v: &[f32]) -> Vec<f32> {
    let t = Tensor::<B, 1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default());
    let out = bc::all_reduce::<B>(PeerId::from(r), t.into_primitive().tensor(), ReduceOperation::Sum).unwrap();
    Tensor::<B, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(out)).into_data().to_vec::<f32>().unwrap()
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k}"))
}

#[test]
#[ignore]
fn child() {
    let Ok(role) = std::env::var("EPOCH_ROLE") else { return };
    let r: u32 = role.parse().unwrap();
    let mode = env("EPOCH_MODE");
    let n: u64 = env("EPOCH_N").parse().unwrap();
    let len: usize = env("EPOCH_LEN").parse().unwrap();
    let orch: Vec<u16> = env("EPOCH_ORCH").split(',').map(|s| s.parse().unwrap()).collect();
    let data: Vec<u16> = env(&format!("EPOCH_DATA{r}")).split(',').map(|s| s.parse().unwrap()).collect();
    let progress = PathBuf::from(env(&format!("EPOCH_PROGRESS{r}")));
    let sleep: u64 = std::env::var("EPOCH_SLEEP_MS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut v = vec![0f32; len];
    let t0 = Instant::now();
    let mut reg = Duration::ZERO;
    let mut red = Duration::ZERO;
    let mut fin = Duration::ZERO;
    if mode == "plain" {
        bc::register::<B>(PeerId::from(r), Default::default(), cfg(orch[0], data[0])).unwrap();
    }
    for e in 0..n {
        let p = (e % 2) as usize;
        let ta = Instant::now();
        std::fs::write(&progress, format!("{e} register")).unwrap();
        if mode == "epochs" {
            bc::register::<B>(PeerId::from(r), Default::default(), cfg(orch[p], data[p])).unwrap();
        }
        std::fs::write(&progress, format!("{e} all-reduce")).unwrap();
        let tb = Instant::now();
        v[0] = r as f32 + 1.0;
        v[1] = e as f32;
        let s = reduce(r, &v);
        assert_eq!((s[0], s[1]), (3.0, 2.0 * e as f32), "epoch {e}");
        if sleep > 0 {
            std::thread::sleep(Duration::from_millis(sleep));
        }
        let tc = Instant::now();
        std::fs::write(&progress, format!("{e} finish")).unwrap();
        if mode == "epochs" {
            bc::finish_collective::<B>(PeerId::from(r)).unwrap();
        }
        let td = Instant::now();
        reg += tb - ta;
        red += tc - tb;
        fin += td - tc;
        std::fs::write(&progress, format!("{} done", e + 1)).unwrap();
    }
    let el = t0.elapsed().as_secs_f64();
    eprintln!(
        "rank {r}: {n} all-reduces of {len} f32 in {el:.2} s: {:.2} ms each (register {:.2}, all-reduce {:.2}, \
         finish {:.2})",
        1e3 * el / n as f64,
        1e3 * reg.as_secs_f64() / n as f64,
        1e3 * red.as_secs_f64() / n as f64,
        1e3 * fin.as_secs_f64() / n as f64
    );
}

fn experiment(mode: &str, n: u64, len: usize, limit: Duration) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let orch = [free_port(), free_port()];
    for p in orch {
        rt.spawn(burn_collective::start_global_orchestrator(p));
    }
    std::thread::sleep(Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let mut kids = Vec::new();
    for r in 0..2 {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "child", "--ignored", "--nocapture", "--test-threads", "1"])
            .env("EPOCH_ROLE", r.to_string())
            .env("EPOCH_MODE", mode)
            .env("EPOCH_N", n.to_string())
            .env("EPOCH_LEN", len.to_string())
            .env("EPOCH_ORCH", format!("{},{}", orch[0], orch[1]));
        for q in 0..2 {
            c.env(format!("EPOCH_DATA{q}"), format!("{},{}", free_port(), free_port()));
            c.env(format!("EPOCH_PROGRESS{q}"), dir.path().join(format!("p{q}")));
        }
        c.stdout(Stdio::null()).stderr(std::fs::File::create(dir.path().join(format!("err{r}"))).unwrap());
        kids.push(c.spawn().unwrap());
    }
    let t0 = Instant::now();
    let mut done = [false, false];
    while t0.elapsed() < limit && !done.iter().all(|&d| d) {
        for (k, d) in kids.iter_mut().zip(done.iter_mut()) {
            if !*d && k.try_wait().unwrap().is_some() {
                *d = true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let prog: Vec<String> =
        (0..2).map(|q| std::fs::read_to_string(dir.path().join(format!("p{q}"))).unwrap_or_default()).collect();
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    let errs: Vec<String> =
        (0..2).map(|q| std::fs::read_to_string(dir.path().join(format!("err{q}"))).unwrap_or_default()).collect();
    eprintln!(
        "mode {mode}, {n} x {len} f32: {} after {:.1} s; completed per rank {prog:?}",
        if done.iter().all(|&d| d) { "finished" } else { "HUNG (killed)" },
        t0.elapsed().as_secs_f64()
    );
    for e in errs {
        for l in e.lines().filter(|l| l.starts_with("rank") || l.contains("panicked") || l.contains("assert")) {
            eprintln!("  {l}");
        }
    }
}

#[test]
#[ignore]
fn plain_hangs_at_the_second_call() {
    if std::env::var("EPOCH_ROLE").is_ok() {
        return;
    }
    experiment("plain", 3, 2, Duration::from_secs(20));
}

#[test]
#[ignore]
fn epochs_survive() {
    if std::env::var("EPOCH_ROLE").is_ok() {
        return;
    }
    let n = std::env::var("EPOCH_COUNT").ok().and_then(|s| s.parse().ok()).unwrap_or(500);
    let len = std::env::var("EPOCH_VLEN").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    experiment("epochs", n, len, Duration::from_secs(600));
}
