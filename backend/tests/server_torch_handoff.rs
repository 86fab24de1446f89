//! A train job with `engine: torch` through the real server (issue 17 item
//! 5): the job runs `moe-studio train ... --engine torch --emit out`, its
//! artefacts are the PyTorch job (downloadable), no checkpoint is
//! registered from it, and the job says its engine. The default engine
//! (burn) is what `server.rs`'s train tests run.

mod common;

use common::*;
use serde_json::json;

#[test]
fn a_torch_train_job_emits_the_pytorch_job_as_its_artefacts() {
    let Some(data) = data_dir() else { return };
    let root = tmp("torch");
    let s = Server::start(&root.join("data"), &["--workers", "1"]);
    let ckpt = stories_checkpoint(&s, &data);
    let hu = upload(&s, "hu-valid.txt", &std::fs::read(data.join("corpora/lang/hu/valid.txt")).unwrap(), 256 << 10);
    let (code, j) = s.call(
        "POST",
        "/api/jobs",
        Some(json!({"spec": {"kind": "upcycle", "model": ckpt, "experts": 4, "top_k": 2, "router_init": "random"}})),
    );
    assert_eq!(code, 201, "{j}");
    let up = wait_job(&s, j["id"].as_str().unwrap(), 120);
    assert_eq!(up["state"], "succeeded", "{up}");
    let moe = up["output_checkpoint"].as_str().unwrap().to_string();

    let spec = json!({"kind": "train", "model": moe, "stage": "experts", "steps": 3, "seq_len": 16, "batch": 2,
                      "engine": "torch", "data": [{"name": "hu", "upload": hu}]});
    let (code, j) = s.call("POST", "/api/jobs", Some(json!({ "spec": spec })));
    assert_eq!(code, 201, "{j}");
    let id = j["id"].as_str().unwrap().to_string();
    let done = wait_job(&s, &id, 180);
    assert_eq!(done["state"], "succeeded", "{done}\n{}", job_log(&s, &id));
    assert_eq!(done["spec"]["engine"], "torch");
    assert!(done["output_checkpoint"].is_null(), "nothing trained, nothing registered: {done}");
    let list = s.get(&format!("/api/jobs/{id}/artifacts"));
    let names: Vec<&str> = list.as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    for want in ["train.py", "README.md", "job.json", "requirements.txt", "data/tokens.u32", "model/config.json"] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }
    let r = s.req("GET", &s.url(&format!("/api/jobs/{id}/artifacts/job.json"))).call().unwrap();
    let job: serde_json::Value = serde_json::from_reader(r.into_reader()).unwrap();
    assert_eq!((job["train"]["steps"].as_u64(), job["layout"].as_str()), (Some(3), Some("mixtral")));
    assert_eq!(job["data"]["rows"].as_u64(), Some(3 * 2));

    // Stage all has no hand-off: refused before a job exists.
    let (code, e) = s.call(
        "POST",
        "/api/jobs",
        Some(json!({"spec": {"kind": "train", "model": ckpt, "stage": "all", "steps": 3, "engine": "torch",
                              "data": [{"name": "hu", "upload": hu}]}})),
    );
    assert_eq!((code, e["field"].as_str()), (422, Some("spec.engine")), "{e}");
}
