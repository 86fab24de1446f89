//! Reliability and security of `moe-studio serve` (issue 18), one test per
//! property, on a tiny generated llama2.c model (no shared data needed),
//! each bounded to seconds:
//!
//! 1. reads need the token (or the read cookie, which never writes);
//! 2. registering a hostile GGUF does not grow the server;
//! 3. specs that cannot fit are refused; a job over its memory limit is
//!    killed and says so; a job's memory is reported;
//! 4. half-open connections do not lock the user out; a stalled chunk
//!    releases its upload;
//! 5. cancel of a queued job wins; `complete` survives a crash in its
//!    rename; a killed registration strands nothing; interrupted jobs'
//!    temporary directories are removed; `--auto-resume` resumes a train
//!    job a clean stop recorded `interrupted`;
//! 6. announced uploads count against the free space;
//! 7. names are checked the same everywhere;
//! 8. checkpoints are checked against their configuration (and Git LFS
//!    pointers named as such).
//!
//! The full-scale attack run (100 MB GGUF, 3,000 connections, 200 races,
//! repeated kill -9) is `backend/tests/attack.rs` (`scripts/attack.sh`).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn submit(s: &Server, spec: Value) -> (u16, Value) {
    s.call("POST", "/api/jobs", Some(json!({ "spec": spec })))
}

fn upcycle(model: &str) -> Value {
    json!({"kind": "upcycle", "model": model, "experts": 2, "top_k": 1})
}

/// Raw request `head` (and `body`) on a new connection; the status line's code.
/// Submits a train job of a million steps on a tiny model and waits until
/// it has done two: its id.
fn start_long_train(s: &Server) -> String {
    let cid = tiny_checkpoint(s, "tiny");
    let text = upload(s, "a.txt", " a a a a a a a a a a a a\n".repeat(200).as_bytes(), 4096);
    let spec = json!({"kind": "train", "model": cid, "stage": "dense", "steps": 1000000, "save_every": 1000000,
                      "data": [{"name": "a", "upload": text}], "seq_len": 32, "batch": 4});
    let (code, j) = submit(s, spec);
    assert_eq!(code, 201, "{j}");
    let id = j["id"].as_str().unwrap().to_string();
    let t = Instant::now();
    while s.get(&format!("/api/jobs/{id}"))["progress"]["step"].as_u64().unwrap_or(0) < 2 {
        assert!(t.elapsed() < Duration::from_secs(60), "the job did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    id
}

fn raw_status(s: &Server, head: &str) -> u16 {
    raw(s, head).0
}

#[test]
fn reads_need_the_token() {
    let d = tmp("reads");
    let s = Server::start(&d.join("data"), &[]);
    let cid = tiny_checkpoint(&s, "tiny");
    let file = s.url(&format!("/api/checkpoints/{cid}/files/tiny.bin"));
    // Without the token, no user data: the checkpoint file (byte for byte
    // before), the lists, a job's spec and log, the uploads.
    let (_, job) = submit(&s, upcycle(&cid));
    let jid = job["id"].as_str().unwrap().to_string();
    wait_job(&s, &jid, 60);
    for p in [
        format!("/api/checkpoints/{cid}/files/tiny.bin"),
        "/api/checkpoints".to_string(),
        format!("/api/checkpoints/{cid}"),
        "/api/uploads".to_string(),
        "/api/jobs".to_string(),
        format!("/api/jobs/{jid}"),
        format!("/api/jobs/{jid}/log"),
        format!("/api/jobs/{jid}/events"),
        format!("/api/jobs/{jid}/artifacts"),
        format!("/api/jobs/{jid}/artifacts/config.json"),
        format!("/api/jobs/{jid}/metrics"),
    ] {
        let (code, e) = call("GET", &s.url(&p), None, None);
        assert_eq!((code, e["field"].as_str()), (401, Some("Authorization")), "GET {p}: {e}");
        let (code, _) = call("GET", &s.url(&p), Some("wrong-token-of-another-length"), None);
        assert_eq!(code, 401, "GET {p} with a wrong token");
    }
    // HEAD too; /api/info and the static page stay public.
    assert_eq!(
        raw_status(
            &s,
            &format!("HEAD /api/checkpoints/{cid}/files/tiny.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        ),
        401
    );
    assert_eq!(call("GET", &s.url("/api/info"), None, None).0, 200);
    assert_ne!(raw_status(&s, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 401);
    // With the token: the file, byte for byte.
    let mut got = Vec::new();
    s.req("GET", &file).call().unwrap().into_reader().read_to_end(&mut got).unwrap();
    assert_eq!(got, std::fs::read(d.join("data.tiny-model/tiny.bin")).unwrap());
    // The read cookie: set by POST /api/session (bearer), HttpOnly and
    // SameSite=Strict, a value that is not the token; it reads (an
    // EventSource, a download link) and never writes.
    let r = s.req("POST", &s.url("/api/session")).call().unwrap();
    assert_eq!(r.status(), 204);
    let cookie = r.header("set-cookie").unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains("Path=/api"),
        "{cookie}"
    );
    assert!(!cookie.contains(&s.token), "the cookie carries the token itself");
    let pair = cookie.split(';').next().unwrap().to_string();
    let r = agent().get(&file).set("Cookie", &pair).call().unwrap();
    assert_eq!(r.status(), 200);
    let r = agent().get(&s.url(&format!("/api/jobs/{jid}/events"))).set("Cookie", &pair).call().unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.into_string().unwrap().contains("event: state"));
    let (code, e) = finish(agent().delete(&s.url(&format!("/api/checkpoints/{cid}"))).set("Cookie", &pair).call());
    assert_eq!(code, 401, "the cookie must not write: {e}");
    let (code, _) = finish(agent().get(&file).set("Cookie", "moe_studio_read=0000").call());
    assert_eq!(code, 401);
    assert_eq!(s.call("DELETE", "/api/session", None).0, 204);
}

/// A GGUF of `mb` megabytes whose metadata is one `u8` array (no model).
fn hostile_gguf(mb: usize) -> Vec<u8> {
    let n = mb << 20;
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(9u64.to_le_bytes());
    b.extend(b"evil.blob");
    b.extend(9u32.to_le_bytes());
    b.extend(0u32.to_le_bytes());
    b.extend((n as u64).to_le_bytes());
    b.extend((0..n).map(|i| i as u8));
    b
}

#[test]
fn a_hostile_gguf_does_not_grow_the_server() {
    let d = tmp("hostile");
    let s = Server::start(&d.join("data"), &[]);
    // 40 MB here (100 MB in the attack run): 1.3 GB of metadata values before.
    let g = hostile_gguf(40);
    let up = upload(&s, "evil.gguf", &g, 8 << 20);
    let idle = s.rss();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(idle));
    let (p2, pid, stop) = (peak.clone(), s.pid(), std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let stop2 = stop.clone();
    let watcher = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let t = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let kb: u64 = t
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l[6..].trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0);
            p2.fetch_max(kb * 1024, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let (code, e) = s.call("POST", "/api/checkpoints", Some(json!({"name": "evil", "uploads": [up]})));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watcher.join().unwrap();
    assert_eq!(code, 422, "{e}");
    assert!(e["error"].as_str().unwrap().contains("general.architecture"), "{e}");
    let grew = peak.load(std::sync::atomic::Ordering::Relaxed).saturating_sub(idle);
    eprintln!("registering a 40 MB hostile GGUF: server RSS {} MB idle, +{} MB at most", idle >> 20, grew >> 20);
    assert!(grew < 100 << 20, "the server grew by {} MB", grew >> 20);
    // The upload is usable again (the registration released it).
    assert_eq!(s.get(&format!("/api/uploads/{up}"))["state"], "complete");
}

#[test]
fn specs_that_cannot_fit_are_refused_and_memory_is_limited_and_reported() {
    let d = tmp("bounded");
    let data = d.join("data");
    // A 200 MB job limit: the tiny model's batch 4096 x 32 x 260 logits alone need 400 MB.
    let s = Server::start(&data, &["--job-memory-limit", "200000000"]);
    let cid = tiny_checkpoint(&s, "tiny");
    let text = upload(&s, "a.txt", " a a a a a a a a a a a a\n".repeat(50).as_bytes(), 4096);
    let train = |extra: Value| {
        let mut spec = json!({"kind": "train", "model": cid, "stage": "dense", "steps": 2,
                              "data": [{"name": "a", "upload": text}], "seq_len": 16, "batch": 1});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    };
    // 64 "devices" on the CPU: one more copy of the model each.
    let (code, e) = submit(&s, train(json!({"devices": 64})));
    assert_eq!((code, e["field"].as_str()), (422, Some("spec.devices")), "{e}");
    let (code, e) = submit(&s, train(json!({"devices": 2})));
    assert_eq!((code, e["field"].as_str()), (422, Some("spec.devices")), "{e}");
    // batch x sequence x vocabulary over the host.
    let (code, e) = submit(&s, train(json!({"batch": 4096, "seq_len": 32})));
    assert_eq!((code, e["field"].as_str()), (422, Some("spec.batch")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("job memory limit"), "{e}");
    // A job that fits runs, and its memory is reported.
    let (code, j) = submit(&s, upcycle(&cid));
    assert_eq!(code, 201, "{j}");
    let j = wait_job(&s, j["id"].as_str().unwrap(), 60);
    assert_eq!(j["state"], "succeeded", "{j}");
    let m = &j["memory"];
    assert!(m["peak_bytes"].as_u64().unwrap() > 0, "{j}");
    assert!(m["limit_bytes"].as_u64().unwrap() > m["peak_bytes"].as_u64().unwrap(), "{j}");
    drop(s);
    // Under a 1 MB limit a job that runs long enough to be measured (a
    // train job of 100,000 steps; 2.2 MB resident) is killed, and says so.
    let s = Server::start(&data, &["--job-memory-limit", "1000000"]);
    let (code, j) = submit(&s, train(json!({"steps": 100000, "save_every": 100000})));
    assert_eq!(code, 201, "{j}");
    let j = wait_job(&s, j["id"].as_str().unwrap(), 60);
    assert_eq!(j["state"], "failed", "{j}");
    let err = j["error"].as_str().unwrap();
    assert!(err.contains("over the job memory limit of 1.0 MB"), "{err}");
    assert!(err.contains("it has no checkpoint yet: a resume starts over"), "{err}");
    assert!(j["memory"]["peak_bytes"].as_u64().unwrap() >= 1_000_000, "{j}");
    assert_eq!(j["output_checkpoint"], Value::Null);
}

#[test]
fn a_cancel_that_outlasts_its_grace_kills_and_says_so() {
    let d = tmp("grace");
    let s = Server::start(&d.join("data"), &["--cancel-grace-secs", "0"]);
    let cid = tiny_checkpoint(&s, "tiny");
    let text = upload(&s, "a.txt", " a a a a a a a a a a a a\n".repeat(200).as_bytes(), 4096);
    let spec = json!({"kind": "train", "model": cid, "stage": "dense", "steps": 1000000, "save_every": 1000000,
                      "data": [{"name": "a", "upload": text}], "seq_len": 32, "batch": 64});
    let (code, j) = submit(&s, spec);
    assert_eq!(code, 201, "{j}");
    let id = j["id"].as_str().unwrap().to_string();
    let t = Instant::now();
    while s.get(&format!("/api/jobs/{id}"))["state"] != "running" {
        assert!(t.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    let (code, _) = s.call("POST", &format!("/api/jobs/{id}/cancel"), None);
    assert_eq!(code, 200);
    let j = wait_job(&s, &id, 30);
    assert!(t.elapsed() < Duration::from_secs(10), "the SIGKILL came after {:?}", t.elapsed());
    assert_eq!(j["state"], "cancelled", "{j}");
    // Killed before a checkpoint (a 1,000,000-step job saves one on its
    // SIGINT, which the zero grace does not wait for) — or it made it.
    match j["error"].as_str() {
        Some(e) => {
            assert!(e.contains("killed (SIGKILL) before it saved a checkpoint"), "{e}");
            assert!(e.contains("resume starts over") || e.contains("continues from its last checkpoint"), "{e}");
        }
        None => eprintln!("NOTICE: the job saved its checkpoint within the zero grace"),
    }
}

/// A clean stop (SIGTERM) records a running train job `interrupted`
/// itself; `--auto-resume` at the next start resumes it from the
/// checkpoint its SIGINT saved (before, only jobs a dead server left
/// `running` were resumed).
#[test]
fn auto_resume_resumes_a_train_job_a_clean_stop_interrupted() {
    let d = tmp("autoresume");
    let s = Server::start(&d.join("data"), &["--auto-resume"]);
    let id = start_long_train(&s);
    let mut s = s;
    std::process::Command::new("kill").args(["-TERM", &s.pid().to_string()]).status().unwrap();
    let t = Instant::now();
    while s.child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(60), "the server did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = s.restart();
    let t = Instant::now();
    loop {
        let j = s.get(&format!("/api/jobs/{id}"));
        if j["state"] == "running" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "not resumed at start: {j}");
        assert!(j["state"] == "queued" || j["state"] == "interrupted", "{j}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // It continues from the checkpoint of the stop, not from step 0 (waited for before the
    // cancel: a SIGINT before the resumed process has read its checkpoint ends it first).
    let log_path = d.join("data").join("jobs").join(&id).join("log.txt");
    let t = Instant::now();
    while !std::fs::read_to_string(&log_path).unwrap_or_default().contains("resuming from") {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        assert!(t.elapsed() < Duration::from_secs(60), "the resumed run did not say it resumed: {log}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, _) = s.call("POST", &format!("/api/jobs/{id}/cancel"), None);
    assert_eq!(code, 200);
    let j = wait_job(&s, &id, 60);
    assert_eq!(j["state"], "cancelled", "{j}");
}

/// A cancel is stored with the job: when the server dies (SIGKILL) after
/// a running job's cancel was accepted but before its end was recorded, the
/// next start records it `cancelled` (and kills the job's process left
/// behind), and `--auto-resume` does not run it again (before, it became
/// `interrupted` and was resumed).
#[test]
fn a_cancel_survives_a_server_that_dies_before_the_job_stopped() {
    let d = tmp("cancelkill");
    let s = Server::start(&d.join("data"), &["--auto-resume"]);
    let id = start_long_train(&s);
    // The job's process is stopped (SIGSTOP) first, so it cannot finish stopping and be
    // recorded before the server dies: the test does not depend on timing.
    let job_dir = std::fs::canonicalize(d.join("data").join("jobs").join(&id)).unwrap();
    let pids: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path().join("cwd")).is_ok_and(|c| c == job_dir))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!pids.is_empty(), "no process works in {}", job_dir.display());
    for p in &pids {
        std::process::Command::new("kill").args(["-STOP", p]).status().unwrap();
    }
    let (code, _) = s.call("POST", &format!("/api/jobs/{id}/cancel"), None);
    assert_eq!(code, 200);
    let mut s = s;
    std::process::Command::new("kill").args(["-KILL", &s.pid().to_string()]).status().unwrap();
    let _ = s.child.wait();
    let s = s.restart();
    let j = s.get(&format!("/api/jobs/{id}"));
    assert_eq!(j["state"], "cancelled", "{j}");
    std::thread::sleep(Duration::from_secs(2));
    let j = s.get(&format!("/api/jobs/{id}"));
    assert_eq!(j["state"], "cancelled", "not resumed by --auto-resume: {j}");
}

#[test]
fn half_open_connections_do_not_lock_out_the_user() {
    let d = tmp("conns");
    // 256 descriptors, as in the review: 1,500 half-open connections here
    // (3,000 in the attack run), then an authorised request.
    let s = Server::start_limited(&d.join("data"), &["--header-timeout-secs", "2"], Some(256));
    let mut held = Vec::new();
    for _ in 0..1500 {
        match TcpStream::connect(&s.addr) {
            Ok(c) => held.push(c),
            Err(e) => panic!("connect: {e}"),
        }
    }
    let t = Instant::now();
    let (code, v) = s.call("GET", "/api/jobs", None);
    let took = t.elapsed();
    eprintln!("1500 half-open connections held; an authorised GET answered in {took:?}");
    assert_eq!(code, 200, "{v}");
    // Answered at all is the property (locked out is no answer). Within
    // 3 s: the 1,500 connections overflow the listen backlog (1,024), and a
    // SYN the kernel drops while the server drains it is sent again after
    // its 1 s retransmission timeout (seen once in a cold CI run on 2 busy
    // cores: 1.02 s; idle, 2-7 ms).
    assert!(took < Duration::from_secs(3), "{took:?}");
    drop(held);
    // A connection that sends nothing is closed after the header timeout.
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let n = c.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
}

#[test]
fn a_stalled_chunk_releases_its_upload() {
    let d = tmp("stall");
    let s = Server::start(&d.join("data"), &["--chunk-timeout-secs", "1"]);
    let body = vec![7u8; 8192];
    let (code, u) = s.call(
        "POST",
        "/api/uploads",
        Some(json!({"file_name": "x.bin", "size": body.len(), "sha256": sha(&body), "chunk_size": 8192})),
    );
    assert_eq!(code, 201, "{u}");
    let id = u["id"].as_str().unwrap().to_string();
    // Half the chunk, then silence on an open connection.
    let mut c = TcpStream::connect(&s.addr).unwrap();
    let head = format!(
        "PUT /api/uploads/{id}/chunks/0 HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nX-Chunk-Sha256: {}\r\n\
         Content-Length: {}\r\n\r\n",
        s.addr,
        s.token,
        sha(&body),
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&body[..4096]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // While it stalls the chunk is locked...
    assert_eq!(put_chunk(&s, &id, 0, &body, &sha(&body)).0, 409);
    // ...and after the timeout the resent chunk is accepted.
    std::thread::sleep(Duration::from_millis(1500));
    let (code, v) = put_chunk(&s, &id, 0, &body, &sha(&body));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["chunks_received"], 1);
    drop(c);
}

#[test]
fn cancel_of_a_queued_job_wins() {
    let d = tmp("races");
    let s = Server::start(&d.join("data"), &[]);
    let cid = tiny_checkpoint(&s, "tiny");
    let mut ran_after_cancelled = Vec::new();
    let mut cancelled = 0;
    for i in 0..40 {
        let (code, j) = submit(&s, upcycle(&cid));
        assert_eq!(code, 201, "{j}");
        let id = j["id"].as_str().unwrap().to_string();
        if i % 2 == 1 {
            std::thread::sleep(Duration::from_micros(200 * (i % 7)));
        }
        let (code, c) = s.call("POST", &format!("/api/jobs/{id}/cancel"), None);
        assert!(code == 200 || code == 409, "{c}");
        // Cancelled while still queued: the answer says `cancelled` with no
        // attempt made. (A job the worker took first is cancelled as a running
        // one; when its child stops before the answer is read back, that
        // answer also says `cancelled`, with `attempts` 1, and is not a race
        // this test is about; it must still end cancelled with no output.)
        let answered_cancelled = code == 200 && c["state"] == "cancelled";
        let j = wait_job(&s, &id, 60);
        if answered_cancelled && c["attempts"] == 0 {
            cancelled += 1;
            let log = job_log(&s, &id);
            if j["state"] != "cancelled" || j["attempts"] != 0 || !j["output_checkpoint"].is_null() || !log.is_empty() {
                ran_after_cancelled.push(format!("{id}: {j}"));
            }
        } else if answered_cancelled && (j["state"] != "cancelled" || !j["output_checkpoint"].is_null()) {
            ran_after_cancelled.push(format!("{id} (cancelled while running): {j}"));
        }
    }
    eprintln!("40 create-then-cancel races: {cancelled} answered cancelled, {} of them ran", ran_after_cancelled.len());
    assert!(cancelled > 0);
    assert!(ran_after_cancelled.is_empty(), "{ran_after_cancelled:#?}");
}

#[test]
fn complete_survives_a_crash_in_its_rename_window() {
    let d = tmp("complete");
    let data = d.join("data");
    let mut s = Server::start(&data, &[]);
    let body = b"some dataset\n".repeat(100);
    let (_, u) = s.call(
        "POST",
        "/api/uploads",
        Some(json!({"file_name": "d.txt", "size": body.len(), "sha256": sha(&body), "chunk_size": 1024})),
    );
    let id = u["id"].as_str().unwrap().to_string();
    for (i, c) in body.chunks(1024).enumerate() {
        assert_eq!(put_chunk(&s, &id, i as u64, c, &sha(c)).0, 200);
    }
    // The server died right after `complete` renamed the file, before it
    // recorded the state.
    s.kill9();
    let dir = data.join("uploads").join(&id);
    std::fs::rename(dir.join("d.txt.part"), dir.join("d.txt")).unwrap();
    let s = s.restart();
    let (code, v) = s.call("POST", &format!("/api/uploads/{id}/complete"), None);
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["state"], "complete");
    assert_eq!(std::fs::read(dir.join("d.txt")).unwrap(), body);
    // Idempotent: again.
    assert_eq!(s.call("POST", &format!("/api/uploads/{id}/complete"), None).1["state"], "complete");
}

#[test]
fn a_registration_killed_midway_strands_nothing() {
    let d = tmp("regkill");
    let data = d.join("data");
    let mut s = Server::start(&data, &[]);
    let dir = d.join("m");
    std::fs::create_dir_all(&dir).unwrap();
    let (bin, tok) = tiny_llama2c(&dir);
    let (bin, tok) = (std::fs::read(bin).unwrap(), std::fs::read(tok).unwrap());
    // The state a kill -9 between the claim and the row leaves (both
    // windows: after the assembly was renamed into place, and before).
    for renamed in [true, false] {
        let a = upload(&s, "tiny.bin", &bin, 4096);
        let b = upload(&s, "tok260.bin", &tok, 4096);
        let ghost = "0b6c1b4e-9d7e-4f1e-8c59-3a8b2f7c9d10";
        s.kill9();
        sql(
            &data,
            &format!("UPDATE uploads SET state = 'consumed', checkpoint_id = '{ghost}' WHERE id IN ('{a}', '{b}');"),
        );
        let leftover =
            if renamed { data.join("checkpoints").join(ghost) } else { data.join(format!("checkpoints/.tmp-{ghost}")) };
        std::fs::create_dir_all(&leftover).unwrap();
        std::fs::hard_link(data.join(format!("uploads/{a}/tiny.bin")), leftover.join("tiny.bin")).unwrap();
        s = s.restart();
        assert!(!leftover.exists(), "{} stranded", leftover.display());
        for u in [&a, &b] {
            assert_eq!(s.get(&format!("/api/uploads/{u}"))["state"], "complete", "upload {u} stranded");
        }
        let (code, c) = s.call("POST", "/api/checkpoints", Some(json!({"name": "again", "uploads": [a, b]})));
        assert_eq!(code, 201, "{c}");
    }
}

/// Runs `sql` on the (stopped) server's database.
fn sql(data: &std::path::Path, sql: &str) {
    let c = rusqlite::Connection::open(data.join("studio.db")).unwrap();
    c.execute_batch(sql).unwrap();
}

#[test]
fn interrupted_jobs_temporaries_are_removed_at_start() {
    let d = tmp("temps");
    let data = d.join("data");
    let mut s = Server::start(&data, &[]);
    let cid = tiny_checkpoint(&s, "tiny");
    let (_, j) = submit(&s, upcycle(&cid));
    let id = j["id"].as_str().unwrap().to_string();
    wait_job(&s, &id, 60);
    s.kill9();
    // What a writer killed mid-way leaves: `.out.tmp-PID` beside out/, and
    // a train checkpoint's `out/.checkpoint-N.tmp-PID`.
    let job = data.join("jobs").join(&id);
    for p in [job.join(".out.tmp-4242"), job.join("out/.checkpoint-5.tmp-4242")] {
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("model-00001-of-00001.safetensors"), b"partial").unwrap();
    }
    let _s = s.restart();
    assert!(!job.join(".out.tmp-4242").exists());
    assert!(!job.join("out/.checkpoint-5.tmp-4242").exists());
    assert!(job.join("out/config.json").exists(), "the finished output stays");
}

#[test]
fn announced_uploads_count_against_the_free_space() {
    let d = tmp("disk");
    let data = d.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let free = fs4::available_space(&data).unwrap();
    let s = Server::start(&data, &["--max-upload-bytes", &u64::MAX.to_string()]);
    let each = free / 10 * 6;
    let announce = |name: &str| {
        s.call(
            "POST",
            "/api/uploads",
            Some(json!({"file_name": name, "size": each, "sha256": sha(b""), "chunk_size": 64 << 20})),
        )
    };
    let (code, first) = announce("a.bin");
    assert_eq!(code, 201, "{first}");
    let (code, e) = announce("b.bin");
    assert_eq!((code, e["field"].as_str()), (507, Some("size")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("promised"), "{e}");
    // Deleting the first frees its promise.
    assert_eq!(s.call("DELETE", &format!("/api/uploads/{}", first["id"].as_str().unwrap()), None).0, 204);
    assert_eq!(announce("c.bin").0, 201);
}

#[test]
fn names_are_checked_the_same_everywhere() {
    let d = tmp("names");
    let s = Server::start(&d.join("data"), &[]);
    let cid = tiny_checkpoint(&s, "tiny");
    let dir = d.join("m");
    std::fs::create_dir_all(&dir).unwrap();
    let (bin, tok) = tiny_llama2c(&dir);
    let a = upload(&s, "tiny.bin", &std::fs::read(bin).unwrap(), 4096);
    let b = upload(&s, "tok260.bin", &std::fs::read(tok).unwrap(), 4096);
    for bad in ["", "   ", "report\u{202E}fdp.exe", "a\u{2066}b", "line\nbreak"] {
        let (code, e) = s.call("POST", "/api/checkpoints", Some(json!({"name": bad, "uploads": [a, b]})));
        assert_eq!((code, e["field"].as_str()), (400, Some("name")), "checkpoint {bad:?}: {e}");
        let (code, e) = s.call("POST", "/api/jobs", Some(json!({"spec": upcycle(&cid), "name": bad})));
        assert_eq!((code, e["field"].as_str()), (400, Some("name")), "job {bad:?}: {e}");
    }
    let (code, c) = s.call("POST", "/api/checkpoints", Some(json!({"name": " Árvíztűrő 🦀 ", "uploads": [a, b]})));
    assert_eq!(code, 201, "{c}");
    assert_eq!(c["name"], "Árvíztűrő 🦀");
}

/// A Hugging Face directory: a 2-layer llama config.json and one
/// safetensors file with the tensors `tensors` (name, shape) in F32.
fn hf_dir(dir: &std::path::Path, tensors: &[(&str, Vec<usize>)], duplicate: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let cfg = json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
        "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "vocab_size": 16, "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "tie_word_embeddings": true,
        "rope_theta": 10000.0});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let mut header = String::from("{");
    let mut off = 0;
    let mut parts = Vec::new();
    for (name, shape) in tensors {
        let n: usize = shape.iter().product::<usize>() * 4;
        parts
            .push(format!("\"{name}\":{{\"dtype\":\"F32\",\"shape\":{shape:?},\"data_offsets\":[{off},{}]}}", off + n));
        off += n;
    }
    if duplicate {
        let (name, shape) = &tensors[0];
        let n: usize = shape.iter().product::<usize>() * 4;
        parts
            .push(format!("\"{name}\":{{\"dtype\":\"F32\",\"shape\":{shape:?},\"data_offsets\":[{off},{}]}}", off + n));
        off += n;
    }
    header.push_str(&parts.join(","));
    header.push('}');
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend(header.as_bytes());
    f.extend(vec![0u8; off]);
    std::fs::write(dir.join("model.safetensors"), f).unwrap();
}

#[test]
fn checkpoints_are_checked_against_their_config() {
    let d = tmp("checked");
    // One tensor, of the wrong shape; the other 19 missing.
    let bad = d.join("bad");
    hf_dir(&bad, &[("model.embed_tokens.weight", vec![10, 8])], false);
    let e = failure(&run(&["inspect", &arg(&bad)]));
    assert!(
        e.contains("1 tensor(s) of the wrong shape: `model.embed_tokens.weight` is [10, 8], expected [16, 8]"),
        "{e}"
    );
    assert!(e.contains("19 tensor(s) missing: `model.layers.0.input_layernorm.weight` [8]"), "{e}");
    // A tensor listed twice.
    let dup = d.join("dup");
    hf_dir(&dup, &[("model.norm.weight", vec![8])], true);
    let e = failure(&run(&["inspect", &arg(&dup)]));
    assert!(e.contains("tensor `model.norm.weight` is listed twice"), "{e}");
    // Git LFS pointers, as each format.
    let ptr = b"version https://git-lfs.github.com/spec/v1\noid sha256:abcd\nsize 538970456\n";
    let lfs = d.join("lfs");
    hf_dir(&lfs, &[("model.norm.weight", vec![8])], false);
    std::fs::write(lfs.join("model.safetensors"), ptr).unwrap();
    std::fs::write(d.join("m.gguf"), ptr).unwrap();
    std::fs::write(d.join("m.bin"), ptr).unwrap();
    for p in [lfs.clone(), d.join("m.gguf"), d.join("m.bin")] {
        let e = failure(&run(&["inspect", &arg(&p)]));
        assert!(e.contains("Git LFS pointer") && e.contains("run `git lfs pull`"), "{}: {e}", p.display());
    }
    // The server's registration says the same, naming the checkpoint.
    let s = Server::start(&d.join("data"), &[]);
    let ups: Vec<String> = ["config.json", "model.safetensors"]
        .iter()
        .map(|f| upload(&s, f, &std::fs::read(bad.join(f)).unwrap(), 4096))
        .collect();
    let (code, e) = s.call("POST", "/api/checkpoints", Some(json!({"name": "broken", "uploads": ups})));
    assert_eq!(code, 422, "{e}");
    let msg = e["error"].as_str().unwrap();
    assert!(msg.contains("is [10, 8], expected [16, 8]") && msg.contains("19 tensor(s) missing"), "{msg}");
    assert!(!msg.contains(&d.display().to_string()), "a server path leaked: {msg}");
}
