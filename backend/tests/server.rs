//! `moe-studio serve` end to end: the real binary on an ephemeral loopback
//! port with a temporary data directory, driven over HTTP.
//!
//! - `upload_interrupt_resume_and_hostile_input`: stories260K in chunks with
//!   a connection cut mid-chunk and a `kill -9` of the server mid-upload,
//!   resumed from the status; sha256 verified, listed, inspected; then bad
//!   and hostile input (tokens, traversal ids, chunk order and checksum,
//!   limits, non-checkpoints, invalid job specs) all answer 4xx JSON, nothing
//!   is written outside the data dir, and the server keeps serving.
//! - `train_job_survives_kill9`: upcycle + `experts`-stage training on
//!   corpora/lang/hu with SSE progress; `kill -9` of the server mid-job,
//!   restart, the job is `interrupted`, resumes from its checkpoint and ends
//!   with the same final loss as an uninterrupted run of the same spec; the
//!   uploaded checkpoint's sha256 is unchanged.
//! - `load_test` (ignored; `scripts/server_load_test.sh`): 20 concurrent
//!   chunked uploads of a 50 MB file and 100 concurrent status/SSE clients;
//!   prints the figures and the server's peak RSS.
//!
//! The helpers (the server process, calls, uploads, job polling, SSE) are
//! in `common/mod.rs`; `server_jobs.rs` runs the other job kinds (moerge,
//! route, graft, merge, neurons) against the CLI.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// The request line and headers of a raw `PUT` of chunk `index` holding
/// `c` (its sha256 and length), for tests that write the body themselves.
fn chunk_head(s: &Server, id: &str, index: u64, c: &[u8]) -> String {
    format!(
        "PUT /api/uploads/{id}/chunks/{index} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         X-Chunk-Sha256: {}\r\nContent-Length: {}\r\n\r\n",
        s.addr,
        s.token,
        sha(c),
        c.len()
    )
}

// ----- tests ---------------------------------------------------------------------

#[test]
fn upload_interrupt_resume_and_hostile_input() {
    let Some(data) = data_dir() else { return };
    let root = tmp("upload");
    let dd = root.join("data");
    let mut s = Server::start(&dd, &["--max-upload-bytes", "4000000", "--max-chunk-bytes", "1048576"]);
    let bin_path = data.join("models/stories260K/stories260K.bin");
    let bin = std::fs::read(&bin_path).unwrap();
    let tok = std::fs::read(data.join("models/stories260K/tok512.bin")).unwrap();
    let want_sha = sha(&bin);

    // --- chunked upload, interrupted twice ---
    let chunk = 64 * 1024u64;
    let (st, u) = s.call(
        "POST",
        "/api/uploads",
        Some(json!({"file_name": "stories260K.bin", "size": bin.len(), "sha256": want_sha, "chunk_size": chunk})),
    );
    assert_eq!(st, 201, "{u}");
    let id = u["id"].as_str().unwrap().to_string();
    let chunks: Vec<&[u8]> = bin.chunks(chunk as usize).collect();
    assert_eq!(u["chunks_total"].as_u64().unwrap() as usize, chunks.len());
    for (i, c) in chunks.iter().enumerate().take(5) {
        assert_eq!(put_chunk(&s, &id, i as u64, c, &sha(c)).0, 200);
    }
    // 1. the connection drops half-way through chunk 5.
    {
        let c = chunks[5];
        let mut t = TcpStream::connect(&s.addr).unwrap();
        t.write_all(chunk_head(&s, &id, 5, c).as_bytes()).unwrap();
        t.write_all(&c[..c.len() / 2]).unwrap();
        drop(t);
    }
    std::thread::sleep(Duration::from_millis(300));
    let st_now = s.get(&format!("/api/uploads/{id}"));
    assert_eq!(st_now["chunks_received"], 5, "{st_now}");
    assert_eq!(st_now["received_bytes"], 5 * chunk);
    // resume from the status, then 2. kill -9 the server after chunk 9.
    // (the server may still be noticing the dropped connection: "being written" is retried)
    let t = Instant::now();
    loop {
        let (code, e) = put_chunk(&s, &id, 5, chunks[5], &sha(chunks[5]));
        if code == 409 && e["error"].as_str().is_some_and(|m| m.contains("being written")) {
            assert!(t.elapsed() < Duration::from_secs(10), "chunk 5 still being written: {e}");
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        assert_eq!(code, 200, "{e}");
        break;
    }
    for (i, c) in chunks.iter().enumerate().take(10).skip(6) {
        assert_eq!(put_chunk(&s, &id, i as u64, c, &sha(c)).0, 200);
    }
    s.kill9();
    let s = s.restart();
    let st_now = s.get(&format!("/api/uploads/{id}"));
    assert_eq!(st_now["chunks_received"], 10, "{st_now}");
    assert_eq!(st_now["state"], "uploading");
    let next = st_now["chunks_received"].as_u64().unwrap() as usize;
    // completing early is refused
    let (code, e) = s.call("POST", &format!("/api/uploads/{id}/complete"), None);
    assert_eq!(code, 409, "{e}");
    // a resent, already received chunk is a no-op; another hash for it is a conflict
    assert_eq!(put_chunk(&s, &id, 3, chunks[3], &sha(chunks[3])).0, 200);
    assert_eq!(put_chunk(&s, &id, 3, chunks[4], &sha(chunks[4])).0, 409);
    // ... and both bodies are read, not left unread: a second request on the same
    // connection is answered (an unread 64 KiB body used to make the client see a
    // broken pipe when the answer came first).
    {
        let mut t = TcpStream::connect(&s.addr).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        for c in [chunks[3], chunks[4]] {
            t.write_all(chunk_head(&s, &id, 3, c).as_bytes()).unwrap();
            t.write_all(c).unwrap();
        }
        let tail = format!(
            "GET /api/uploads/{id} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            s.addr, s.token
        );
        t.write_all(tail.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = t.read_to_string(&mut out);
        let statuses: Vec<&str> = out.match_indices("HTTP/1.1 ").map(|(i, _)| &out[i + 9..i + 12]).collect();
        assert_eq!(statuses, ["200", "409", "200"], "three answers on one connection:\n{out}");
    }
    // out of order
    let (code, e) = put_chunk(&s, &id, next as u64 + 1, chunks[next + 1], &sha(chunks[next + 1]));
    assert_eq!(code, 409, "{e}");
    assert_eq!(e["field"], "index");
    assert!(e["error"].as_str().unwrap().contains(&format!("next chunk is {next}")), "{e}");
    // wrong checksum, missing checksum, wrong length, past the end
    let (code, e) = put_chunk(&s, &id, next as u64, chunks[next], &sha(b"something else"));
    assert_eq!(code, 422, "{e}");
    assert_eq!(e["field"], "X-Chunk-Sha256");
    let (code, e) = finish(
        agent()
            .put(&s.url(&format!("/api/uploads/{id}/chunks/{next}")))
            .set("Authorization", &format!("Bearer {}", s.token))
            .send_bytes(chunks[next]),
    );
    assert_eq!((code, e["field"].as_str()), (400, Some("X-Chunk-Sha256")), "{e}");
    let short = &chunks[next][..100];
    assert_eq!(put_chunk(&s, &id, next as u64, short, &sha(short)).0, 400);
    assert_eq!(put_chunk(&s, &id, 9999, short, &sha(short)).0, 400);
    assert_eq!(s.get(&format!("/api/uploads/{id}"))["chunks_received"], next as u64);
    for (i, c) in chunks.iter().enumerate().skip(next) {
        assert_eq!(put_chunk(&s, &id, i as u64, c, &sha(c)).0, 200, "chunk {i}");
    }
    let (code, done) = s.call("POST", &format!("/api/uploads/{id}/complete"), None);
    assert_eq!(code, 200, "{done}");
    assert_eq!(done["state"], "complete");
    let stored = dd.join(format!("uploads/{id}/stories260K.bin"));
    assert_eq!(sha(&std::fs::read(&stored).unwrap()), want_sha, "sha256 of the reassembled file");
    let tok_id = upload(&s, "tok512.bin", &tok, 4096);

    // --- register, list, inspect, download with Range ---
    let (code, c) = s.call("POST", "/api/checkpoints", Some(json!({"name": "stories260K", "uploads": [id, tok_id]})));
    assert_eq!(code, 201, "{c}");
    let cid = c["id"].as_str().unwrap().to_string();
    assert_eq!(c["format"], "llama2c");
    let list = s.get("/api/checkpoints");
    assert!(list.as_array().unwrap().iter().any(|x| x["id"] == cid.as_str()), "{list}");
    let info = s.get(&format!("/api/checkpoints/{cid}"));
    let summary = &info["summary"];
    assert_eq!(summary["config"]["num_layers"], 5, "{summary}");
    assert_eq!(summary["config"]["vocab_size"], 512);
    assert_eq!(summary["tokenizer_vocab"], 512);
    assert!(info["parameters"].as_u64().unwrap() > 200_000);
    let f = info["files"].as_array().unwrap().iter().find(|f| f["name"] == "stories260K.bin").unwrap().clone();
    assert_eq!(f["sha256"], want_sha.as_str());
    let r = s
        .req("GET", &s.url(&format!("/api/checkpoints/{cid}/files/stories260K.bin")))
        .set("Range", "bytes=100-199")
        .call()
        .unwrap();
    assert_eq!(r.status(), 206);
    let mut part = Vec::new();
    r.into_reader().read_to_end(&mut part).unwrap();
    assert_eq!(part, &bin[100..200]);

    // --- hostile input ---
    let before: Vec<PathBuf> = files_under(&root);
    // tokens
    let (code, e) = call("POST", &s.url("/api/uploads"), None, Some(json!({})));
    assert_eq!((code, e["field"].as_str()), (401, Some("Authorization")), "{e}");
    let (code, _) = call("POST", &s.url("/api/uploads"), Some("not-the-token"), Some(json!({})));
    assert_eq!(code, 401);
    let (code, _) = call("DELETE", &s.url(&format!("/api/checkpoints/{cid}")), Some("x"), None);
    assert_eq!(code, 401);
    let (code, _) = raw(&s, &format!("DELETE /api/checkpoints/{cid} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    assert_eq!(code, 401);
    // path traversal in id positions (raw and encoded), in file names and artefact paths
    for p in [
        "/api/uploads/..%2F..%2Fstudio.db".to_string(),
        "/api/uploads/%2e%2e%2f%2e%2e%2fetc%2fpasswd".to_string(),
        "/api/jobs/..%2f..%2fstudio.db/log".to_string(),
        format!("/api/checkpoints/{}/files/x", "A".repeat(36)),
    ] {
        let (code, body) = raw_get(&s, &p);
        assert_eq!(code, 400, "{p}: {body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        assert!(v["error"].as_str().unwrap().contains("not an id"), "{p}: {v}");
    }
    for p in [
        format!("/api/checkpoints/{cid}/files/..%2F..%2Fstudio.db"),
        format!("/api/checkpoints/{cid}/files/../../studio.db"),
        format!("/api/checkpoints/{cid}/files/token"),
        "/api/../../etc/passwd".to_string(),
        "/api/uploads/../token".to_string(),
    ] {
        let (code, body) = raw_get(&s, &p);
        assert!(code == 404 || code == 400, "{p}: {code} {body}");
        assert!(!body.contains(&s.token), "{p} leaked the token");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        assert!(v["error"].is_string());
    }
    let (code, body) = raw_get(&s, "/../../../../etc/passwd");
    assert!(code == 404 || code == 400, "{code} {body}");
    assert!(!body.contains("root:"));
    let (code, e) = s.call(
        "POST",
        "/api/uploads",
        Some(json!({"file_name": "../../evil.bin", "size": 10, "sha256": sha(b"0123456789")})),
    );
    assert_eq!((code, e["field"].as_str()), (400, Some("file_name")), "{e}");
    // upload limits: announced size and chunk body
    let (code, e) = s.call(
        "POST",
        "/api/uploads",
        Some(json!({"file_name": "big.gguf", "size": 4_000_001u64, "sha256": sha(b"")})),
    );
    assert_eq!((code, e["field"].as_str()), (413, Some("size")), "{e}");
    let (code, u) = s.call(
        "POST",
        "/api/uploads",
        Some(json!({"file_name": "x.gguf", "size": 3_000_000u64, "sha256": sha(b""), "chunk_size": 1_048_576u64})),
    );
    assert_eq!(code, 201, "{u}");
    // a chunk body over the announced chunk size: refused from its Content-Length, before the body
    let (code, body) = raw(
        &s,
        &format!(
            "PUT /api/uploads/{}/chunks/0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nX-Chunk-Sha256: {}\r\n\
             Content-Length: 1048577\r\nConnection: close\r\n\r\n",
            u["id"].as_str().unwrap(),
            s.token,
            sha(b"")
        ),
    );
    assert_eq!(code, 413, "{body}");
    let (code, e) = s.call("POST", "/api/uploads", Some(json!({"file_name": "x.bin", "size": 1, "sha256": "zz"})));
    assert_eq!((code, e["field"].as_str()), (400, Some("sha256")));
    let (code, e) = s.call("POST", "/api/uploads", Some(json!({"file_name": "x.bin", "size": 1})));
    assert_eq!(code, 422, "{e}");
    let (code, _b) = raw(
        &s,
        &format!(
            "POST /api/uploads HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n\
             Content-Length: 8\r\nConnection: close\r\n\r\n{{oops!!}}",
            s.token
        ),
    );
    assert_eq!(code, 400, "{_b}");
    // whole-file checksum mismatch resets the upload
    let body = b"hello world, not what was announced".to_vec();
    let (_, u) = s.call(
        "POST",
        "/api/uploads",
        Some(json!({"file_name": "h.txt", "size": body.len(), "sha256": sha(b"other")})),
    );
    let hid = u["id"].as_str().unwrap().to_string();
    assert_eq!(put_chunk(&s, &hid, 0, &body, &sha(&body)).0, 200);
    let (code, e) = s.call("POST", &format!("/api/uploads/{hid}/complete"), None);
    assert_eq!((code, e["field"].as_str()), (422, Some("sha256")), "{e}");
    assert_eq!(s.get(&format!("/api/uploads/{hid}"))["chunks_received"], 0);
    // files that are not a checkpoint
    let junk: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect();
    let j1 = upload(&s, "junk.bin", &junk, 4096);
    let (code, e) = s.call("POST", "/api/checkpoints", Some(json!({"name": "junk", "uploads": [j1]})));
    assert_eq!((code, e["field"].as_str()), (422, Some("uploads")), "{e}");
    let j2 = upload(&s, "model.safetensors", &junk, 4096);
    let (code, e) = s.call("POST", "/api/checkpoints", Some(json!({"name": "st", "uploads": [j2]})));
    assert_eq!(code, 422, "{e}");
    assert!(e["error"].as_str().unwrap().contains("config.json"), "{e}");
    let j3 = upload(&s, "notes.txt", b"just some text\n", 4096);
    let (code, e) = s.call("POST", "/api/checkpoints", Some(json!({"name": "t", "uploads": [j3]})));
    assert_eq!(code, 422, "{e}");
    let (code, e) =
        s.call("POST", "/api/checkpoints", Some(json!({"name": "t", "uploads": ["../../../../etc/passwd"]})));
    assert_eq!((code, e["field"].as_str()), (400, Some("uploads[0]")), "{e}");
    // a llama2.c .bin without its tokenizer .bin
    let lone = upload(&s, "stories260K.bin", &bin, 256 << 10);
    let (code, e) = s.call("POST", "/api/checkpoints", Some(json!({"name": "no vocab", "uploads": [lone]})));
    assert_eq!((code, e["field"].as_str()), (422, Some("uploads")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("needs its tokenizer .bin"), "{e}");
    assert_eq!(s.get(&format!("/api/uploads/{lone}"))["state"], "complete", "a refused upload stays usable");
    // concurrent registrations of the same uploads: one 201, the others clean 409s
    let lone_tok = upload(&s, "tok512.bin", &tok, 4096);
    let racers: Vec<_> = (0..4)
        .map(|i| {
            let (url, token, ups) = (s.url("/api/checkpoints"), s.token.clone(), json!([lone, lone_tok]));
            std::thread::spawn(move || {
                call("POST", &url, Some(&token), Some(json!({"name": format!("race {i}"), "uploads": ups})))
            })
        })
        .collect();
    let mut codes: Vec<(u16, Value)> = racers.into_iter().map(|t| t.join().unwrap()).collect();
    codes.sort_by_key(|(c, _)| *c);
    assert_eq!(codes.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [201, 409, 409, 409], "{codes:?}");
    let raced = codes[0].1["id"].as_str().unwrap().to_string();
    let tmps: Vec<PathBuf> = files_under(&dd.join("checkpoints"))
        .into_iter()
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(tmps.is_empty(), "temporary checkpoint directories left: {tmps:?}");
    // an upload used twice names the checkpoint that has it
    let (code, e) = s.call("POST", "/api/checkpoints", Some(json!({"name": "again", "uploads": [id]})));
    assert_eq!((code, e["field"].as_str()), (409, Some("uploads[0]")), "{e}");
    assert!(e["error"].as_str().unwrap().contains(&format!("was already used by checkpoint {cid}")), "{e}");
    assert!(
        codes[1].1["error"].as_str().unwrap().contains(&format!("already used by checkpoint {raced}")),
        "{codes:?}"
    );
    let (code, e) = s.call(
        "POST",
        "/api/jobs",
        Some(json!({"spec": {"kind": "eval", "model": cid, "data": [{"name": "a", "upload": id}]}})),
    );
    assert_eq!((code, e["field"].as_str()), (422, Some("spec.data[0].upload")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("already used by checkpoint"), "{e}");
    // every API error is JSON: wrong method, too long a target, unsatisfiable range
    let (code, e) = s.call("PUT", "/api/info", Some(json!({})));
    assert_eq!(code, 405, "{e}");
    let (code, e) = s.call("GET", &format!("/api/info?{}", "x".repeat(10_000)), None);
    assert_eq!(code, 414, "{e}");
    let file_url = s.url(&format!("/api/checkpoints/{cid}/files/stories260K.bin"));
    let (code, e) = finish(s.req("GET", &file_url).set("Range", "bytes=99999999-").call());
    assert_eq!(code, 416, "{e}");
    // a Range that does not parse is ignored: the whole file
    for range in ["bytes=abc", "items=0-5", "bytes=9-2"] {
        let r = s.req("GET", &file_url).set("Range", range).call().unwrap();
        assert_eq!(r.status(), 200, "{range}");
        let mut all = Vec::new();
        r.into_reader().read_to_end(&mut all).unwrap();
        assert_eq!(all.len(), bin.len(), "{range}");
    }
    // DNS rebinding: only the loopback names of this server are accepted as Host
    let port = s.addr.rsplit(':').next().unwrap().to_string();
    for host in ["evil.example", "evil.example:80", &format!("attacker.test:{port}")] {
        let (code, body) = raw(&s, &format!("GET /api/info HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"));
        assert_eq!(code, 421, "{host}: {body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["field"], "Host");
    }
    for host in [format!("localhost:{port}"), "127.0.0.1".to_string(), format!("[::1]:{port}")] {
        let (code, body) = raw(&s, &format!("GET /api/info HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"));
        assert_eq!(code, 200, "{host}: {body}");
    }
    // invalid job specs
    let bad_specs = [
        (
            json!({"spec": {"kind": "train", "model": cid, "stage": "experts", "steps": 0,
                 "data": [{"name": "hu", "upload": j3}]}}),
            422,
            "spec.steps",
        ),
        (
            json!({"spec": {"kind": "train", "model": cid, "stage": "everything", "steps": 5,
                 "data": [{"name": "hu", "upload": j3}]}}),
            422,
            "body",
        ),
        (
            json!({"spec": {"kind": "train", "model": cid, "stage": "experts", "steps": 5, "lr": -1.0,
                 "data": [{"name": "hu", "upload": j3}]}}),
            422,
            "spec.lr",
        ),
        (
            json!({"spec": {"kind": "train", "model": cid, "stage": "experts", "steps": 5,
                 "data": [{"name": "../hu", "upload": j3}]}}),
            422,
            "spec.data[0].name",
        ),
        (
            json!({"spec": {"kind": "train", "model": "../../x", "stage": "experts", "steps": 5,
                 "data": [{"name": "hu", "upload": j3}]}}),
            422,
            "spec.model",
        ),
        (
            json!({"spec": {"kind": "train", "model": "123e4567-e89b-42d3-a456-426614174000", "stage": "experts",
                 "steps": 5, "data": [{"name": "hu", "upload": j3}]}}),
            422,
            "spec.model",
        ),
        (
            json!({"spec": {"kind": "train", "model": cid, "stage": "experts", "steps": 5,
                 "data": [{"name": "hu", "upload": hid}]}}),
            422,
            "spec.data[0].upload",
        ),
        (json!({"spec": {"kind": "upcycle", "model": cid}}), 422, "spec.experts"),
        // checked against the model (stories260K: 5 layers, context 512)
        (json!({"spec": {"kind": "upcycle", "model": cid, "experts": 4, "top_k": 5}}), 422, "spec.top_k"),
        (json!({"spec": {"kind": "upcycle", "model": cid, "experts": 4, "frozen": [0, 4]}}), 422, "spec.frozen[1]"),
        (
            json!({"spec": {"kind": "upcycle", "model": cid, "experts_per_layer": [4, 4, null]}}),
            422,
            "spec.experts_per_layer",
        ),
        (json!({"spec": {"kind": "moerge", "models": [cid, raced], "top_k": 3}}), 422, "spec.top_k"),
        (
            json!({"spec": {"kind": "train", "model": cid, "stage": "dense", "steps": 5, "seq_len": 4096,
                 "data": [{"name": "hu", "upload": j3}]}}),
            422,
            "spec.seq_len",
        ),
        (json!({"spec": {"kind": "merge", "method": "ties", "models": [cid]}}), 422, "spec.base"),
        (json!({"spec": {"kind": "format-disk"}}), 422, "body"),
        (
            json!({"spec": {"kind": "eval", "model": cid, "data": [{"name": "a", "upload": j3}]}, "backend": "tpu"}),
            422,
            "backend",
        ),
    ];
    for (body, status, field) in bad_specs {
        let (code, e) = s.call("POST", "/api/jobs", Some(body.clone()));
        assert_eq!((code, e["field"].as_str()), (status, Some(field)), "{body} -> {e}");
    }
    assert_eq!(s.get("/api/jobs").as_array().unwrap().len(), 0, "no job was created");
    // a job that fails: its error does not show the data directory; once its
    // input checkpoint is deleted it cannot resume (422 naming the field)
    let (code, j) = s.call(
        "POST",
        "/api/jobs",
        Some(json!({"spec": {"kind": "train", "model": raced, "stage": "experts", "steps": 2,
                             "data": [{"name": "t", "upload": j3}]}})),
    );
    assert_eq!(code, 201, "{j}");
    let failed = j["id"].as_str().unwrap().to_string();
    let jf = wait_job(&s, &failed, 120);
    assert_eq!(jf["state"], "failed", "{jf}");
    let err = jf["error"].as_str().unwrap();
    assert!(!err.contains(dd.to_str().unwrap()), "the data dir leaks: {err}");
    assert_eq!(s.call("DELETE", &format!("/api/checkpoints/{raced}"), None).0, 204);
    let (code, e) = s.call("POST", &format!("/api/jobs/{failed}/resume"), None);
    assert_eq!((code, e["field"].as_str()), (422, Some("spec.model")), "{e}");
    // unknown routes and ids
    let (code, e) = s.call("GET", "/api/nothing-here", None);
    assert_eq!(code, 404, "{e}");
    let (code, _) = s.call("GET", "/api/jobs/123e4567-e89b-42d3-a456-426614174000", None);
    assert_eq!(code, 404);

    // nothing outside the data dir, the token file private, the server still serving
    let after = files_under(&root);
    assert!(after.iter().all(|p| p.starts_with(&dd)), "written outside the data dir: {after:?}");
    assert!(before.iter().all(|p| after.contains(p) || p.starts_with(dd.join("uploads"))));
    assert!(!root.join("evil.bin").exists() && !dd.parent().unwrap().join("evil.bin").exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: PathBuf| std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(dd.join("token")), 0o600);
    assert_eq!(mode(dd.join("studio.db")), 0o600);
    for d in ["uploads", "checkpoints", "jobs"] {
        assert_eq!(mode(dd.join(d)), 0o700, "{d}");
    }
    assert_eq!(mode(dd.join(format!("checkpoints/{cid}"))), 0o700);
    assert_eq!(mode(dd.join(format!("checkpoints/{cid}/stories260K.bin"))), 0o600);
    assert_eq!(mode(dd.join(format!("jobs/{failed}"))), 0o700);
    let info = s.get("/api/info");
    assert_eq!(info["max_upload_bytes"], 4_000_000);
    let (code, _) = raw_get(&s, "/");
    assert!(code == 200 || code == 404);
    // deleting works with the token, and the checkpoint is gone
    let (code, _) = s.call("DELETE", &format!("/api/checkpoints/{cid}"), None);
    assert_eq!(code, 204);
    assert_eq!(s.call("GET", &format!("/api/checkpoints/{cid}"), None).0, 404);
    // stale incomplete uploads are deleted at start (--upload-ttl-hours; 0: all)
    let stale = hid.clone();
    assert_eq!(s.get(&format!("/api/uploads/{stale}"))["state"], "uploading");
    drop(s);
    let s = Server::start(&dd, &["--upload-ttl-hours", "0"]);
    assert_eq!(s.call("GET", &format!("/api/uploads/{stale}"), None).0, 404);
    assert!(!dd.join(format!("uploads/{stale}")).exists());
    assert_eq!(s.get(&format!("/api/uploads/{j1}"))["state"], "complete", "complete uploads are kept");
    drop(s);
    let _ = std::fs::remove_dir_all(&root);
}

/// Pids whose command line or working directory mentions `needle` (a
/// job's process works in `DATA/jobs/{id}`; its command line need not name
/// the job).
fn procs_mentioning(needle: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cwd = std::fs::read_link(e.path().join("cwd")).map(|p| p.display().to_string()).unwrap_or_default();
        if pid != std::process::id() && (String::from_utf8_lossy(&cmd).contains(needle) || cwd.contains(needle)) {
            v.push(pid);
        }
    }
    v
}

fn final_loss(s: &Server, job: &str) -> (usize, f64) {
    let m = s.get(&format!("/api/jobs/{job}/metrics"));
    let last = m.as_array().unwrap().last().expect("metrics").clone();
    (last["step"].as_u64().unwrap() as usize, last["loss"].as_f64().unwrap())
}

#[test]
fn train_job_survives_kill9() {
    let Some(data) = data_dir() else { return };
    let root = tmp("train");
    let dd = root.join("data");
    let mut s = Server::start(&dd, &["--workers", "1"]);
    let ckpt = stories_checkpoint(&s, &data);
    let uploaded = s.get(&format!("/api/checkpoints/{ckpt}"))["files"].clone();
    let hu_text = std::fs::read(data.join("corpora/lang/hu/train.txt")).unwrap();
    let hu = upload(&s, "hu-train.txt", &hu_text, 256 << 10);

    // upcycle: 4 experts, expert 0 frozen
    let (code, j) = s.call(
        "POST",
        "/api/jobs",
        Some(json!({"spec": {"kind": "upcycle", "model": ckpt, "experts": 4, "top_k": 2, "seed": 1}})),
    );
    assert_eq!(code, 201, "{j}");
    let up = wait_job(&s, j["id"].as_str().unwrap(), 120);
    assert_eq!(up["state"], "succeeded", "{up} {}", job_log(&s, j["id"].as_str().unwrap()));
    let moe = up["output_checkpoint"].as_str().unwrap().to_string();
    assert!(s.get(&format!("/api/checkpoints/{moe}"))["architecture"].as_str().unwrap().contains("moe"));
    // The job ran from its job file; the output's model card names the
    // command the job stands for, not `run-job job.json`.
    let job_dir = dd.join("jobs").join(j["id"].as_str().unwrap());
    let file: Value = serde_json::from_str(&std::fs::read_to_string(job_dir.join("job.json")).unwrap()).unwrap();
    assert_eq!((file["backend"].as_str(), file["spec"]["experts"].as_u64()), (Some("cpu"), Some(4)), "{file}");
    let card = std::fs::read_to_string(job_dir.join("out/README.md")).unwrap();
    assert!(card.contains("moe-studio --backend=cpu upcycle ../../") && card.contains("--experts=4"), "{card}");
    assert!(!card.contains("run-job"), "{card}");

    let steps = 40;
    let spec = json!({"kind": "train", "model": moe, "stage": "experts", "steps": steps, "seq_len": 64,
                      "batch": 4, "lr": 1e-3, "warmup": 2, "save_every": 5, "seed": 7,
                      "data": [{"name": "hu", "upload": hu}]});
    let (code, j) = s.call("POST", "/api/jobs", Some(json!({"spec": spec, "name": "interrupted"})));
    assert_eq!(code, 201, "{j}");
    let a = j["id"].as_str().unwrap().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let _reader = sse(s.url(&format!("/api/jobs/{a}/events")), &s.token, tx);
    let mut progress = 0;
    let mut saw_running = false;
    let mut killed_at = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(300) {
        let Ok((ev, v)) = rx.recv_timeout(Duration::from_secs(120)) else { break };
        match ev.as_str() {
            "state" => saw_running |= v["state"] == "running",
            "progress" => {
                progress += 1;
                assert!(v["loss"].as_f64().unwrap().is_finite());
                assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0);
                assert!(v["eta_s"].as_f64().is_some());
                assert_eq!(v["steps"], steps);
                assert_eq!(v["stage"], "train/experts");
                let step = v["step"].as_u64().unwrap();
                if step >= 12 {
                    killed_at = step;
                    assert!(!procs_mentioning(&a).is_empty(), "the running job's process is not found");
                    s.kill9();
                    break;
                }
            }
            _ => {}
        }
    }
    assert!(saw_running && progress >= 3, "SSE: running {saw_running}, {progress} progress events");
    assert!(killed_at > 0 && killed_at < steps, "killed at step {killed_at}");
    // the job's process noticed its server was gone and exited
    let t = Instant::now();
    while !procs_mentioning(&a).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10), "orphan job processes {:?}", procs_mentioning(&a));
        std::thread::sleep(Duration::from_millis(100));
    }

    let s = s.restart();
    let ja = s.get(&format!("/api/jobs/{a}"));
    assert_eq!(ja["state"], "interrupted", "{ja}");
    let files = s.get(&format!("/api/checkpoints/{ckpt}"))["files"].clone();
    assert_eq!(files, uploaded, "the uploaded checkpoint's files and sha256 are unchanged");
    let dir = dd.join(format!("checkpoints/{ckpt}"));
    for f in files.as_array().unwrap() {
        let bytes = std::fs::read(dir.join(f["name"].as_str().unwrap())).unwrap();
        assert_eq!(sha(&bytes), f["sha256"].as_str().unwrap(), "{} on disk", f["name"]);
        let orig = std::fs::read(data.join("models/stories260K").join(f["name"].as_str().unwrap())).unwrap();
        assert_eq!(sha(&bytes), sha(&orig));
    }
    let (code, r) = s.call("POST", &format!("/api/jobs/{a}/resume"), None);
    assert_eq!(code, 200, "{r}");
    let ja = wait_job(&s, &a, 600);
    assert_eq!(ja["state"], "succeeded", "{ja}\n{}", job_log(&s, &a));
    assert_eq!(ja["attempts"], 2);
    let log = job_log(&s, &a);
    assert!(log.contains("resuming from"), "{log}");

    // the same spec, uninterrupted
    let (code, j) = s.call("POST", "/api/jobs", Some(json!({"spec": spec, "name": "straight"})));
    assert_eq!(code, 201, "{j}");
    let b = j["id"].as_str().unwrap().to_string();
    let jb = wait_job(&s, &b, 600);
    assert_eq!(jb["state"], "succeeded", "{jb}\n{}", job_log(&s, &b));
    let (sa, la) = final_loss(&s, &a);
    let (sb, lb) = final_loss(&s, &b);
    eprintln!("final loss after kill -9 at step {killed_at} + resume: {la:.9}; uninterrupted: {lb:.9}");
    assert_eq!((sa, sb), (steps as usize, steps as usize));
    assert!((la - lb).abs() <= 1e-6, "resumed {la} vs uninterrupted {lb}");
    let ma = s.get(&format!("/api/jobs/{a}/metrics"));
    let mb = s.get(&format!("/api/jobs/{b}/metrics"));
    assert_eq!(ma.as_array().unwrap().len(), steps as usize);
    for (x, y) in ma.as_array().unwrap().iter().zip(mb.as_array().unwrap()) {
        assert!((x["loss"].as_f64().unwrap() - y["loss"].as_f64().unwrap()).abs() <= 1e-6, "step {}", x["step"]);
    }
    // the trained model is registered and downloadable with Range
    let out = ja["output_checkpoint"].as_str().unwrap();
    let info = s.get(&format!("/api/checkpoints/{out}"));
    assert_eq!(info["source_job"], a.as_str());
    let arts = s.get(&format!("/api/jobs/{a}/artifacts"));
    assert!(arts.as_array().unwrap().iter().any(|f| f["name"] == "final/config.json"), "{arts}");
    let r = s
        .req("GET", &s.url(&format!("/api/jobs/{a}/artifacts/final/config.json")))
        .set("Range", "bytes=0-0")
        .call()
        .unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(r.into_string().unwrap(), "{");
    let (code, _) = raw_get(&s, &format!("/api/jobs/{a}/artifacts/../../../studio.db"));
    assert_eq!(code, 404);
    // another kind through the same queue: eval of the trained model
    let (code, j) = s.call(
        "POST",
        "/api/jobs",
        Some(json!({"spec": {"kind": "eval", "model": out, "data": [{"name": "hu", "upload": hu}],
                             "window": 64, "stride": 64, "max_tokens": 2000}})),
    );
    assert_eq!(code, 201, "{j}");
    let e = j["id"].as_str().unwrap().to_string();
    let je = wait_job(&s, &e, 300);
    assert_eq!(je["state"], "succeeded", "{je}\n{}", job_log(&s, &e));
    let res: Value =
        s.req("GET", &s.url(&format!("/api/jobs/{e}/artifacts/result.json"))).call().unwrap().into_json().unwrap();
    assert!(res.to_string().contains("hu"), "{res}");
    // a task job: multiple-choice accuracy of the same model (`eval --task`)
    let tiny =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/reference/tasks/tiny_stories_mc.jsonl"))
            .unwrap();
    let tu = upload(&s, "tiny.jsonl", &tiny, 1 << 20);
    let (code, j) = s.call(
        "POST",
        "/api/jobs",
        Some(json!({"spec": {"kind": "task", "model": out, "tasks": [{"name": "tiny", "upload": tu}],
                             "target_delimiter": "", "limit": 10}})),
    );
    assert_eq!(code, 201, "{j}");
    let t = j["id"].as_str().unwrap().to_string();
    let jt = wait_job(&s, &t, 300);
    assert_eq!(jt["state"], "succeeded", "{jt}\n{}", job_log(&s, &t));
    let res: moe_shared::api::TaskEvalReport =
        s.req("GET", &s.url(&format!("/api/jobs/{t}/artifacts/result.json"))).call().unwrap().into_json().unwrap();
    let r = &res.tasks[0];
    assert_eq!((r.name.as_str(), r.items, r.samples.len(), r.target_delimiter.as_str()), ("tiny", 10, 10, ""));
    assert!((0.0..=1.0).contains(&r.acc) && r.acc_stderr.is_some(), "{r:?}");
    // SSE of a finished job: its state, then the stream ends
    let (tx, rx) = std::sync::mpsc::channel();
    sse(s.url(&format!("/api/jobs/{a}/events")), &s.token, tx).join().unwrap();
    let evs: Vec<(String, Value)> = rx.try_iter().collect();
    assert_eq!(evs[0].0, "state");
    assert_eq!(evs[0].1["state"], "succeeded");

    // graceful stop (SIGTERM) during a long job: the server closes the event
    // streams, the job saves a checkpoint on its SIGINT and is `interrupted`
    let mut long = spec.clone();
    long["steps"] = json!(100000);
    long["save_every"] = json!(100000);
    let (code, j) = s.call("POST", "/api/jobs", Some(json!({"spec": long})));
    assert_eq!(code, 201, "{j}");
    let c = j["id"].as_str().unwrap().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = sse(s.url(&format!("/api/jobs/{c}/events")), &s.token, tx);
    while let Ok((ev, v)) = rx.recv_timeout(Duration::from_secs(120)) {
        if ev == "progress" && v["step"].as_u64().unwrap() >= 3 {
            break;
        }
    }
    let mut s = s;
    Command::new("kill").args(["-TERM", &s.pid().to_string()]).status().unwrap();
    let t = Instant::now();
    while s.child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(30), "the server did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    }
    reader.join().unwrap();
    let s = s.restart();
    let jc = s.get(&format!("/api/jobs/{c}"));
    assert_eq!(jc["state"], "interrupted", "{jc}");
    let arts = s.get(&format!("/api/jobs/{c}/artifacts"));
    assert!(
        arts.as_array().unwrap().iter().any(|f| f["name"].as_str().unwrap().starts_with("checkpoint-")),
        "a checkpoint saved on SIGINT: {arts}"
    );
    // its model cannot be deleted while the job can resume from that
    // checkpoint: interrupted, and still once cancelled
    let (code, e) = s.call("DELETE", &format!("/api/checkpoints/{moe}"), None);
    assert_eq!(code, 409, "{e}");
    let (code, r) = s.call("POST", &format!("/api/jobs/{c}/resume"), None);
    assert_eq!(code, 200, "{r}");
    let t = Instant::now();
    while s.get(&format!("/api/jobs/{c}"))["state"] != "running" {
        assert!(t.elapsed() < Duration::from_secs(60), "job {c} did not start again");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.call("POST", &format!("/api/jobs/{c}/cancel"), None).0, 200);
    let jc = wait_job(&s, &c, 60);
    assert_eq!(jc["state"], "cancelled", "{jc}");
    let (code, e) = s.call("DELETE", &format!("/api/checkpoints/{moe}"), None);
    assert_eq!(code, 409, "a cancelled train job that can resume uses it: {e}");
    drop(s);
    let _ = std::fs::remove_dir_all(&root);
}

fn rss_kb(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|x| x.parse().ok())
        .unwrap_or(0)
}

/// 20 concurrent chunked uploads of a 50 MB file + 100 concurrent status /
/// SSE clients on loopback; bounded (fixed counts, 10 minute cap). Run with
/// `cargo test -p moe-studio --test server -- --ignored load_test --nocapture`.
#[test]
#[ignore]
fn load_test() {
    let Some(data) = data_dir() else { return };
    let root = tmp("load");
    let dd = root.join("data");
    let s = std::sync::Arc::new(Server::start(&dd, &["--workers", "1"]));
    let deadline = Instant::now() + Duration::from_secs(600);
    // a long training job for the SSE clients to follow
    let ckpt = stories_checkpoint(&s, &data);
    let hu = upload(&s, "hu.txt", &std::fs::read(data.join("corpora/lang/hu/valid.txt")).unwrap(), 1 << 20);
    let (code, j) = s.call(
        "POST",
        "/api/jobs",
        Some(json!({"spec": {"kind": "train", "model": ckpt, "stage": "dense", "steps": 100000, "seq_len": 64,
                              "batch": 2, "save_every": 100000, "data": [{"name": "hu", "upload": hu}]}})),
    );
    assert_eq!(code, 201, "{j}");
    let job = j["id"].as_str().unwrap().to_string();
    let file: Vec<u8> = {
        let mut v = Vec::with_capacity(50_000_000);
        let mut x: u64 = 0x9E3779B97F4A7C15;
        while v.len() < 50_000_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.truncate(50_000_000);
        v
    };
    let file = std::sync::Arc::new(file);
    let file_sha = sha(&file);
    let chunk = 4usize << 20;
    let chunk_shas: std::sync::Arc<Vec<String>> = std::sync::Arc::new(file.chunks(chunk).map(sha).collect());
    let errors = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pid = s.pid();
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                peak.fetch_max(rss_kb(pid, "VmRSS:"), std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let rss_before = rss_kb(pid, "VmRSS:");
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for u in 0..20 {
        let (s, file, shas, errors, file_sha) =
            (s.clone(), file.clone(), chunk_shas.clone(), errors.clone(), file_sha.clone());
        handles.push(std::thread::spawn(move || {
            let (code, v) = s.call(
                "POST",
                "/api/uploads",
                Some(json!({"file_name": format!("load{u}.bin"), "size": file.len(), "sha256": file_sha, "chunk_size": chunk})),
            );
            assert_eq!(code, 201, "{v}");
            let id = v["id"].as_str().unwrap().to_string();
            for (i, c) in file.chunks(chunk).enumerate() {
                let (code, v) = put_chunk(&s, &id, i as u64, c, &shas[i]);
                if code != 200 {
                    eprintln!("upload {u} chunk {i}: {code} {v}");
                    errors.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return 0;
                }
            }
            let (code, v) = s.call("POST", &format!("/api/uploads/{id}/complete"), None);
            if code != 200 || v["state"] != "complete" {
                errors.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                return 0;
            }
            let stored = s.data.join(format!("uploads/{id}/load{u}.bin"));
            let on_disk = std::fs::read(&stored).unwrap();
            assert_eq!(sha(&on_disk), file_sha, "upload {u} verified on disk");
            let _ = s.call("DELETE", &format!("/api/uploads/{id}"), None);
            1
        }));
    }
    let sse_events = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let status_calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut clients = Vec::new();
    for c in 0..100 {
        let (s, job, errors, sse_events, status_calls, stop) =
            (s.clone(), job.clone(), errors.clone(), sse_events.clone(), status_calls.clone(), stop.clone());
        clients.push(std::thread::spawn(move || {
            if c % 2 == 0 {
                // SSE: follow the job for 5 progress events
                let r = match s.req("GET", &s.url(&format!("/api/jobs/{job}/events"))).call() {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("sse {c}: {e}");
                        errors.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        return;
                    }
                };
                let mut rd = BufReader::new(r.into_reader());
                let mut n = 0;
                let mut line = String::new();
                while n < 5 {
                    line.clear();
                    if rd.read_line(&mut line).unwrap_or(0) == 0 {
                        errors.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        return;
                    }
                    if line.starts_with("event: progress") {
                        n += 1;
                        sse_events.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            } else {
                for _ in 0..20 {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        return;
                    }
                    for p in [format!("/api/jobs/{job}"), "/api/uploads".to_string(), "/api/info".to_string()] {
                        let (code, _) = s.call("GET", &p, None);
                        if code != 200 {
                            errors.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        status_calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }));
    }
    let verified: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let upload_s = t0.elapsed().as_secs_f64();
    for c in clients {
        c.join().unwrap();
    }
    let total_s = t0.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    sampler.join().unwrap();
    assert!(Instant::now() < deadline, "the load test ran past its 10 minute cap");
    let (code, _) = s.call("POST", &format!("/api/jobs/{job}/cancel"), None);
    assert_eq!(code, 200);
    let hwm = rss_kb(pid, "VmHWM:");
    println!(
        "LOAD: {verified}/20 uploads of 50 MB verified in {upload_s:.1} s ({:.0} MB/s), {} SSE progress events \
         to 50 clients, {} status requests from 50 clients, all done in {total_s:.1} s; errors {}; server RSS \
         before {} MiB, sampled peak {} MiB, VmHWM {} MiB",
        20.0 * 50.0 / upload_s,
        sse_events.load(std::sync::atomic::Ordering::SeqCst),
        status_calls.load(std::sync::atomic::Ordering::SeqCst),
        errors.load(std::sync::atomic::Ordering::SeqCst),
        rss_before / 1024,
        peak.load(std::sync::atomic::Ordering::SeqCst) / 1024,
        hwm / 1024
    );
    assert_eq!(verified, 20);
    assert_eq!(errors.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(hwm < 512 * 1024, "server peak RSS {} MiB", hwm / 1024);
    let j = wait_job(&s, &job, 60);
    assert_eq!(j["state"], "cancelled", "{j}");
    drop(s);
    let _ = std::fs::remove_dir_all(&root);
}

/// The built frontend: pages of the app fall back to `index.html`, a missing
/// file is a 404 (a missing `demo/manifest.json` used to come back as
/// `index.html` with 200, which the studio then failed to parse as JSON).
/// Also: an upload that cannot fit the disk is refused up front (507).
#[test]
fn static_files_and_page_fallback() {
    let root = tmp("static");
    let dist = root.join("dist");
    std::fs::create_dir_all(dist.join("demo")).unwrap();
    std::fs::write(dist.join("index.html"), "<html>studio</html>").unwrap();
    std::fs::write(dist.join("demo/manifest.json"), "{\"model\": \"m.bin\"}").unwrap();
    let s = Server::start(
        &root.join("data"),
        &["--static-dir", dist.to_str().unwrap(), "--max-upload-bytes", "1000000000000000000"],
    );
    // an upload larger than the data directory's free space is refused when announced
    let (code, e) = s.call(
        "POST",
        "/api/uploads",
        Some(json!({"file_name": "x.gguf", "size": 900_000_000_000_000_000u64, "sha256": "0".repeat(64)})),
    );
    assert_eq!((code, e["field"].as_str()), (507, Some("size")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("bytes free"), "{e}");
    assert_eq!(raw_get(&s, "/demo/manifest.json"), (200, "{\"model\": \"m.bin\"}".to_string()));
    assert_eq!(raw_get(&s, "/"), (200, "<html>studio</html>".to_string()));
    assert_eq!(raw_get(&s, "/jobs"), (200, "<html>studio</html>".to_string()), "a page of the app");
    assert_eq!(raw_get(&s, "/upcycle/"), (200, "<html>studio</html>".to_string()));
    assert_eq!(raw_get(&s, "/demo/missing.json").0, 404);
    assert_eq!(raw_get(&s, "/moe_studio_frontend_bg.wasm").0, 404);
    assert_eq!(raw_get(&s, "/api/nothing").0, 404, "the API never falls back to the page");
    drop(s);
    let _ = std::fs::remove_dir_all(&root);
}
