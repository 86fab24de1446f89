//! Helpers shared by the backend's integration tests: the shared data and
//! temporary directories, the `moe-studio` CLI (`*_cli.rs`), and for
//! `server.rs` / `server_jobs.rs` the `moe-studio serve` process on a
//! temporary data directory, JSON calls, chunked uploads, job polling, SSE.
//!
//! Each test crate compiles this module on its own and uses a part of it,
//! hence `dead_code` is allowed here.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

// ----- fixtures ---------------------------------------------------------------

/// The shared data directory (`$MOE_STUDIO_DATA`, default `../shared/data`)
/// when stories260K is there; `None` (a notice) when it is not, a panic
/// under `CI=true`.
pub fn data_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("MOE_STUDIO_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"));
    let p = dir.join("models/stories260K/stories260K.bin");
    if p.exists() {
        return Some(dir);
    }
    if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
        panic!("{} not found (set MOE_STUDIO_DATA)", p.display());
    }
    eprintln!("NOTICE: skipping: {} not found (set MOE_STUDIO_DATA)", p.display());
    None
}

/// A fresh, empty directory `{test crate}-{name}-{pid}` under Cargo's
/// test temporary directory.
pub fn tmp(name: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let d = base.join(format!("{}-{name}-{}", env!("CARGO_CRATE_NAME"), std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// stories260K's llama2.c checkpoint in the shared data (see [`data_dir`]).
pub fn stories() -> Option<PathBuf> {
    data_dir().map(|d| d.join("models/stories260K/stories260K.bin"))
}

/// `p` as a command-line argument.
pub fn arg(p: &Path) -> String {
    p.display().to_string()
}

// ----- the CLI -----------------------------------------------------------------

/// Runs `moe-studio ARGS` (the binary of this package) to completion.
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moe-studio")).args(args).output().expect("runs the binary")
}

/// stdout of a command that must succeed (its stderr in the panic).
pub fn ok(out: &Output) -> String {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `--json` stdout of a command that must succeed.
pub fn json(out: &Output) -> Value {
    serde_json::from_str(&ok(out)).expect("--json prints JSON")
}

/// stderr of a command that must fail (its stdout in the panic).
pub fn failure(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure, stdout: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Lowercase hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Lowercase hex sha256 of `b`.
pub fn sha(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

// ----- the server process ----------------------------------------------------------

/// A running `moe-studio serve` on an ephemeral loopback port (killed on drop).
pub struct Server {
    /// The server process.
    pub child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The API token (read from `DATA_DIR/token`).
    pub token: String,
    /// The data directory.
    pub data: PathBuf,
    /// The extra arguments it was started with (kept for `restart`).
    pub extra: Vec<String>,
}

impl Server {
    /// Starts the server on `data` with `extra` arguments and waits for its address.
    pub fn start(data: &Path, extra: &[&str]) -> Server {
        Self::start_limited(data, extra, None)
    }

    /// [`Server::start`] with the open-file limit (soft and hard) set to `nofile`.
    pub fn start_limited(data: &Path, extra: &[&str], nofile: Option<u64>) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_moe-studio"));
        cmd.args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; it only changes the child's limit.
            unsafe {
                cmd.pre_exec(move || {
                    let r = libc::rlimit { rlim_cur: n, rlim_max: n };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("starts moe-studio serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut addr = None;
        for _ in 0..20 {
            let mut line = String::new();
            if out.read_line(&mut line).unwrap() == 0 {
                break;
            }
            if let Some(a) = line.trim().strip_prefix("listening on http://") {
                addr = Some(a.to_string());
                break;
            }
        }
        let addr = addr.expect("the server prints its address");
        // Keep reading stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut s = String::new();
            while out.read_line(&mut s).map(|n| n > 0).unwrap_or(false) {
                s.clear();
            }
        });
        let token = std::fs::read_to_string(data.join("token")).unwrap().trim().to_string();
        Server { child, addr, token, data: data.to_path_buf(), extra: extra.iter().map(|s| s.to_string()).collect() }
    }

    /// The full URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
    }

    /// Resident memory of the server process, bytes (`VmRSS`).
    pub fn rss(&self) -> u64 {
        let t = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        t.lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l[6..].trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    }

    /// A new server on the same data directory with the same arguments.
    pub fn restart(&mut self) -> Server {
        let extra: Vec<&str> = self.extra.iter().map(|s| s.as_str()).collect();
        Server::start(&self.data, &extra)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A JSON request with the token: (status, body).
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        call(method, &self.url(path), Some(&self.token), body)
    }

    /// A `method` request to the full `url` with the token, to send.
    pub fn req(&self, method: &str, url: &str) -> ureq::Request {
        agent().request(method, url).set("Authorization", &format!("Bearer {}", self.token))
    }

    /// GET `path` with the token; asserts 200 and returns the JSON body.
    pub fn get(&self, path: &str) -> Value {
        let (s, v) = self.call("GET", path, None);
        assert_eq!(s, 200, "GET {path}: {v}");
        v
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client with a 120 s timeout.
pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build()
}

/// A JSON request to `url` with an optional bearer token: (status, body);
/// see [`finish`].
pub fn call(method: &str, url: &str, token: Option<&str>, body: Option<Value>) -> (u16, Value) {
    let mut r = agent().request(method, url);
    if let Some(t) = token {
        r = r.set("Authorization", &format!("Bearer {t}"));
    }
    let res = match body {
        Some(b) => r.send_json(b),
        None => r.call(),
    };
    finish(res)
}

/// (status, JSON body) of an answer; a 4xx/5xx must be a JSON error body
/// `{"error": "..."}` (asserted). Transport errors panic.
pub fn finish(res: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    match res {
        Ok(r) => {
            let s = r.status();
            let text = r.into_string().unwrap_or_default();
            (s, serde_json::from_str(&text).unwrap_or(Value::Null))
        }
        Err(ureq::Error::Status(s, r)) => {
            let ct = r.header("content-type").unwrap_or("").to_string();
            let text = r.into_string().unwrap_or_default();
            assert!(ct.starts_with("application/json"), "{s} answer is not JSON ({ct}): {text}");
            let v: Value = serde_json::from_str(&text).expect("error body is JSON");
            assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "error body {v}");
            (s, v)
        }
        Err(e) => panic!("transport error: {e}"),
    }
}

/// PUT chunk `index` of upload `id` with its `X-Chunk-Sha256`.
pub fn put_chunk(s: &Server, id: &str, index: u64, bytes: &[u8], chunk_sha: &str) -> (u16, Value) {
    finish(
        agent()
            .put(&s.url(&format!("/api/uploads/{id}/chunks/{index}")))
            .set("Authorization", &format!("Bearer {}", s.token))
            .set("X-Chunk-Sha256", chunk_sha)
            .send_bytes(bytes),
    )
}

/// Uploads `bytes` as `file_name` in chunks of `chunk` bytes; returns the upload id.
pub fn upload(s: &Server, file_name: &str, bytes: &[u8], chunk: u64) -> String {
    let (st, u) = s.call(
        "POST",
        "/api/uploads",
        Some(json!({"file_name": file_name, "size": bytes.len(), "sha256": sha(bytes), "chunk_size": chunk})),
    );
    assert_eq!(st, 201, "{u}");
    let id = u["id"].as_str().unwrap().to_string();
    for (i, c) in bytes.chunks(chunk as usize).enumerate() {
        let (st, v) = put_chunk(s, &id, i as u64, c, &sha(c));
        assert_eq!(st, 200, "chunk {i}: {v}");
    }
    if bytes.is_empty() {
        assert_eq!(put_chunk(s, &id, 0, &[], &sha(&[])).0, 200);
    }
    let (st, v) = s.call("POST", &format!("/api/uploads/{id}/complete"), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "complete");
    id
}

/// Sends raw bytes on a new connection and returns the status and body
/// (the request path is not normalised the way an HTTP client would).
/// `Host: x` in `request` becomes the server's own address (other hosts
/// are refused: DNS-rebinding guard).
pub fn raw(s: &Server, request: &str) -> (u16, String) {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request = request.replacen("Host: x\r\n", &format!("Host: {}\r\n", s.addr), 1);
    c.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    let status = out.split_whitespace().nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// A raw `GET path` with the token on a new connection (see [`raw`]).
pub fn raw_get(s: &Server, path: &str) -> (u16, String) {
    raw(s, &format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n", s.token))
}

/// Polls job `id` until it leaves queued/running (at most `secs`); returns it.
pub fn wait_job(s: &Server, id: &str, secs: u64) -> Value {
    let t = Instant::now();
    loop {
        let j = s.get(&format!("/api/jobs/{id}"));
        let state = j["state"].as_str().unwrap().to_string();
        if !matches!(state.as_str(), "queued" | "running") {
            return j;
        }
        assert!(t.elapsed().as_secs() < secs, "job {id} still {state} after {secs} s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The job's log (`GET /api/jobs/{id}/log`).
pub fn job_log(s: &Server, id: &str) -> String {
    agent()
        .get(&s.url(&format!("/api/jobs/{id}/log")))
        .set("Authorization", &format!("Bearer {}", s.token))
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

/// Every path under `dir` (files and directories), sorted.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        v.push(e.path());
        if e.file_type().unwrap().is_dir() {
            v.extend(files_under(&e.path()));
        }
    }
    v.sort();
    v
}

/// Uploads stories260K (+ its vocabulary) and registers it; returns the checkpoint id.
pub fn stories_checkpoint(s: &Server, data: &Path) -> String {
    let dir = data.join("models/stories260K");
    let bin = std::fs::read(dir.join("stories260K.bin")).unwrap();
    let tok = std::fs::read(dir.join("tok512.bin")).unwrap();
    let a = upload(s, "stories260K.bin", &bin, 256 << 10);
    let b = upload(s, "tok512.bin", &tok, 256 << 10);
    let (st, c) = s.call("POST", "/api/checkpoints", Some(json!({"name": "stories260K", "uploads": [a, b]})));
    assert_eq!(st, 201, "{c}");
    c["id"].as_str().unwrap().to_string()
}

/// Reads SSE events from `url` (with the token) on a thread until a terminal state or `stop`;
/// returns (event name, data) pairs as they arrive.
pub fn sse(url: String, token: &str, tx: std::sync::mpsc::Sender<(String, Value)>) -> std::thread::JoinHandle<()> {
    let auth = format!("Bearer {token}");
    std::thread::spawn(move || {
        let Ok(r) = agent().get(&url).set("Authorization", &auth).call() else { return };
        let mut rd = BufReader::new(r.into_reader());
        let mut event = String::new();
        let mut line = String::new();
        loop {
            line.clear();
            match rd.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let l = line.trim_end();
            if let Some(e) = l.strip_prefix("event: ") {
                event = e.to_string();
            } else if let Some(d) = l.strip_prefix("data: ") {
                let v: Value = serde_json::from_str(d).unwrap_or(Value::Null);
                if tx.send((event.clone(), v)).is_err() {
                    return;
                }
            }
        }
    })
}

// ----- a tiny model ------------------------------------------------------------------

/// Writes a tiny llama2.c model `tiny.bin` (d 8, ffn 16, 1 layer, 2 heads,
/// context 32, vocabulary 260 = 3 specials + 256 byte-fallback tokens + " a")
/// and its vocabulary `tok260.bin` into `dir`; returns both paths. Small
/// enough to register, upcycle and train in milliseconds, with no shared data.
pub fn tiny_llama2c(dir: &Path) -> (PathBuf, PathBuf) {
    let (d, f, l, nh, nkv, v, seq) = (8i32, 16i32, 1i32, 2i32, 2i32, 260i32, 32i32);
    let (du, fu, vu, hd) = (d as usize, f as usize, v as usize, (d / nh) as usize);
    let kv = nkv as usize * hd;
    let floats = vu * du + l as usize * (du + 2 * du * du + 2 * kv * du + du + 3 * fu * du) + du + seq as usize * hd;
    let mut b: Vec<u8> = [d, f, l, nh, nkv, v, seq].iter().flat_map(|x| x.to_le_bytes()).collect();
    for i in 0..floats {
        let x = ((i as f32) * 0.7548).sin() * 0.2;
        b.extend(x.to_le_bytes());
    }
    let bin = dir.join("tiny.bin");
    std::fs::write(&bin, &b).unwrap();
    let mut t: Vec<u8> = 16i32.to_le_bytes().to_vec();
    let piece = |t: &mut Vec<u8>, score: f32, p: &[u8]| {
        t.extend(score.to_le_bytes());
        t.extend((p.len() as i32).to_le_bytes());
        t.extend(p);
    };
    piece(&mut t, 0.0, b"<unk>");
    piece(&mut t, 0.0, b"\n<s>\n");
    piece(&mut t, 0.0, b"\n</s>\n");
    for byte in 0..=255u8 {
        piece(&mut t, 0.0, format!("<0x{byte:02X}>").as_bytes());
    }
    piece(&mut t, -1.0, b" a");
    let tok = dir.join("tok260.bin");
    std::fs::write(&tok, &t).unwrap();
    (bin, tok)
}

/// Uploads [`tiny_llama2c`] and registers it as checkpoint `name`; returns its id.
pub fn tiny_checkpoint(s: &Server, name: &str) -> String {
    let dir = s.data.with_extension("tiny-model");
    std::fs::create_dir_all(&dir).unwrap();
    let (bin, tok) = tiny_llama2c(&dir);
    let a = upload(s, "tiny.bin", &std::fs::read(bin).unwrap(), 4096);
    let b = upload(s, "tok260.bin", &std::fs::read(tok).unwrap(), 4096);
    let (st, c) = s.call("POST", "/api/checkpoints", Some(json!({"name": name, "uploads": [a, b]})));
    assert_eq!(st, 201, "{c}");
    c["id"].as_str().unwrap().to_string()
}
