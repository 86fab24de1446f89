//! Jobs: server-side work (continued pre-training, upcycling, merges)
//! through `moe-studio serve`: the token, chunked resumable checkpoint
//! uploads, checkpoints and jobs, live progress over server-sent events
//! with a loss curve, artefact downloads and "Open in studio". Served as
//! static files, the page explains that and stays disabled.

use std::cell::RefCell;

use leptos::html;
use leptos::prelude::*;
use moe_shared::api::{
    CheckpointInfo, CreateCheckpoint, CreateJob, DataRef, FileInfo, JobEvent, JobInfo, JobSpec, JobState,
    Progress as ApiProgress, ServerInfo, TrainSpec, TrainStage, UpcycleSpec, UploadState, UploadStatus,
};

use crate::app::Shared;
use crate::components::message::{Message, MessageLine};
use crate::jobs::api::{self, ApiFailure};
use crate::jobs::events::{follow, Follow};
use crate::jobs::loss_chart::LossChart;
use crate::jobs::upload::{self, Pending, UploadProgress};
use crate::store::{update_store, InputModel, Revision};

thread_local! {
    /// The event stream of the job shown (one at a time).
    static FOLLOW: RefCell<Option<Follow>> = const { RefCell::new(None) };
}

/// What the page knows about the job it follows.
#[derive(Debug, Clone, Default, PartialEq)]
struct Live {
    job: Option<String>,
    state: Option<JobState>,
    progress: Option<ApiProgress>,
    loss: Vec<(usize, f64)>,
    log: Vec<String>,
    error: Option<String>,
    output_checkpoint: Option<String>,
    events: usize,
    stream: Option<String>,
}

/// The new-job form.
#[derive(Clone, Copy)]
struct JobForm {
    kind: RwSignal<String>,
    name: RwSignal<String>,
    model: RwSignal<String>,
    experts: RwSignal<String>,
    top_k: RwSignal<String>,
    stage: RwSignal<String>,
    steps: RwSignal<String>,
    lr: RwSignal<String>,
    seq_len: RwSignal<String>,
    batch: RwSignal<String>,
    seed: RwSignal<String>,
    corpus: RwSignal<String>,
    corpus_name: RwSignal<String>,
}

fn num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| format!("{what}: `{}` is not a valid number", s.trim()))
}

fn opt_num<T: std::str::FromStr>(s: &str, what: &str) -> Result<Option<T>, String> {
    if s.trim().is_empty() {
        Ok(None)
    } else {
        num(s, what).map(Some)
    }
}

impl JobForm {
    fn new() -> Self {
        let s = |v: &str| RwSignal::new(v.to_string());
        JobForm {
            kind: s("upcycle"),
            name: s(""),
            model: s(""),
            experts: s("2"),
            top_k: s("2"),
            stage: s("experts"),
            steps: s("20"),
            lr: s("1e-3"),
            seq_len: s("64"),
            batch: s("4"),
            seed: s("0"),
            corpus: s(""),
            corpus_name: s(""),
        }
    }

    fn request(&self) -> Result<CreateJob, String> {
        let model = self.model.get_untracked();
        if model.is_empty() {
            return Err("choose a checkpoint (upload and register one first)".into());
        }
        let seed = opt_num::<u64>(&self.seed.get_untracked(), "seed")?;
        let spec = match self.kind.get_untracked().as_str() {
            "upcycle" => JobSpec::Upcycle(UpcycleSpec {
                model,
                experts: Some(num(&self.experts.get_untracked(), "experts")?),
                experts_per_layer: None,
                top_k: opt_num(&self.top_k.get_untracked(), "top-k")?,
                frozen: None,
                router_init: None,
                noise: None,
                seed,
                dtype: None,
            }),
            "train" => {
                let upload = self.corpus.get_untracked();
                if upload.is_empty() {
                    return Err("choose a corpus (upload a .txt or .jsonl file first)".into());
                }
                let name = self.corpus_name.get_untracked().trim().to_string();
                if name.is_empty() {
                    return Err("name the corpus (e.g. its language: hu)".into());
                }
                let stage = match self.stage.get_untracked().as_str() {
                    "router" => TrainStage::Router,
                    "dense" => TrainStage::Dense,
                    _ => TrainStage::Experts,
                };
                JobSpec::Train(TrainSpec {
                    model,
                    stage,
                    data: vec![DataRef { name, upload, weight: None, original: false, heldout: None }],
                    steps: num(&self.steps.get_untracked(), "steps")?,
                    seq_len: opt_num(&self.seq_len.get_untracked(), "seq len")?,
                    batch: opt_num(&self.batch.get_untracked(), "batch")?,
                    lr: opt_num(&self.lr.get_untracked(), "learning rate")?,
                    warmup: None,
                    min_lr: None,
                    grad_accum: None,
                    clip: None,
                    alpha: None,
                    prior: None,
                    weight_decay: None,
                    save_every: None,
                    seed,
                    devices: None,
                })
            }
            k => return Err(format!("unknown job kind {k}")),
        };
        let name = self.name.get_untracked().trim().to_string();
        Ok(CreateJob { spec, backend: None, name: (!name.is_empty()).then_some(name) })
    }
}

fn fmt_eta(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}h {:02}m", s / 3600, s / 60 % 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

fn short(id: &str) -> String {
    id.chars().take(8).collect()
}

fn file_list(input: &NodeRef<html::Input>) -> Vec<web_sys::File> {
    let Some(list) = input.get_untracked().and_then(|i| i.files()) else { return Vec::new() };
    (0..list.length()).filter_map(|i| list.get(i)).collect()
}

/// The Jobs page.
#[component]
pub fn JobsPage() -> impl IntoView {
    let shared = Shared::get();
    let rev = Revision::get();
    let info = RwSignal::new(None::<ServerInfo>);
    let token = RwSignal::new(api::load(api::TOKEN_KEY).unwrap_or_default());
    let msg = RwSignal::new(Message::None);
    let busy = RwSignal::new(false);
    let progress = RwSignal::new(None::<UploadProgress>);
    let pending = RwSignal::new(upload::pending());
    let uploads = RwSignal::new(Vec::<UploadStatus>::new());
    let checked = RwSignal::new(Vec::<String>::new());
    let ckpt_name = RwSignal::new(String::new());
    let chunk_kib = RwSignal::new(String::new());
    let checkpoints = RwSignal::new(Vec::<CheckpointInfo>::new());
    let jobs = RwSignal::new(Vec::<JobInfo>::new());
    let live = RwSignal::new(Live::default());
    let artefacts = RwSignal::new(Vec::<FileInfo>::new());
    let form = JobForm::new();
    let files_input = NodeRef::<html::Input>::new();
    let resume_input = NodeRef::<html::Input>::new();

    // Counts messages, so a test can wait for the next one.
    let msg_seq = RwSignal::new(0u64);
    Effect::new(move |_| {
        msg.track();
        msg_seq.update(|n| *n += 1);
    });
    let fail = move |what: &str, e: String| msg.set(Message::Error(format!("{what}: {e}")));

    let refresh = move || {
        leptos::task::spawn_local(async move {
            match api::get::<Vec<UploadStatus>>("api/uploads").await {
                Ok(v) => uploads.set(v),
                Err(e) => fail("listing uploads", e.into()),
            }
            match api::get::<Vec<CheckpointInfo>>("api/checkpoints").await {
                Ok(v) => {
                    if form.model.get_untracked().is_empty() {
                        if let Some(c) = v.first() {
                            form.model.set(c.id.clone());
                        }
                    }
                    checkpoints.set(v)
                }
                Err(e) => fail("listing checkpoints", e.into()),
            }
            match api::get::<Vec<JobInfo>>("api/jobs").await {
                Ok(v) => jobs.set(v),
                Err(e) => fail("listing jobs", e.into()),
            }
        });
    };

    // The server's description (`api/info`): shown on the page; it also
    // marks the backend as present if the studio's first probe failed.
    Effect::new(move |_| {
        if shared.backend.get().is_some() && info.get_untracked().is_none() {
            leptos::task::spawn_local(async move {
                if let Ok(i) = api::get::<ServerInfo>("api/info").await {
                    info.set(Some(i));
                    if shared.backend.get_untracked() != Some(true) {
                        shared.backend.set(Some(true));
                    }
                    refresh();
                }
            });
        }
    });
    Effect::new(move |_| {
        let t = token.get();
        api::save(api::TOKEN_KEY, t.trim());
    });

    let chunk_size = move || -> Result<Option<u64>, String> {
        Ok(opt_num::<f64>(&chunk_kib.get_untracked(), "chunk size")?.map(|k| (k * 1024.0).round() as u64))
    };
    let on_progress = move |p: UploadProgress| progress.set(Some(p));

    // Uploads the picked files one after the other; the completed ones are
    // ticked for the next checkpoint.
    let start_upload = {
        move |_| {
            let files = file_list(&files_input);
            if files.is_empty() {
                msg.set(Message::Error("choose the files to upload first".into()));
                return;
            }
            let cs = match chunk_size() {
                Ok(c) => c,
                Err(e) => return msg.set(Message::Error(e)),
            };
            busy.set(true);
            msg.set(Message::None);
            leptos::task::spawn_local(async move {
                let mut done = Vec::new();
                let mut err = None;
                for f in &files {
                    match upload::upload_file(f, cs, &token.get_untracked(), &on_progress).await {
                        Ok(st) => done.push(st),
                        Err(e) => {
                            err = Some(format!("uploading {}: {e}", f.name()));
                            break;
                        }
                    }
                }
                pending.set(upload::pending());
                if !done.is_empty() {
                    checked.update(|c| c.extend(done.iter().map(|s| s.id.clone())));
                }
                match err {
                    Some(e) => msg.set(Message::Error(format!("{e}. The upload is kept: press Resume to continue."))),
                    None => msg.set(Message::Ok(format!(
                        "uploaded {} (sha256 verified by the server)",
                        done.iter()
                            .map(|s| format!("{} ({})", s.file_name, crate::format_bytes(s.size)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))),
                }
                busy.set(false);
                refresh();
            });
        }
    };

    // Continues one pending upload from where the server stopped, then the
    // files of the batch that were not started yet.
    let resume = {
        move |p: Pending| {
            let file = upload::file_of(&p.id)
                .or_else(|| file_list(&resume_input).into_iter().find(|f| f.name() == p.file_name))
                .or_else(|| file_list(&files_input).into_iter().find(|f| f.name() == p.file_name));
            let Some(file) = file else {
                msg.set(Message::Error(format!(
                    "pick {} again (\"file to resume\") — this tab no longer has it after a reload",
                    p.file_name
                )));
                return;
            };
            busy.set(true);
            msg.set(Message::None);
            leptos::task::spawn_local(async move {
                let tok = token.get_untracked();
                let mut result = upload::continue_upload(&p.id, &file, &tok, &on_progress).await.map(|s| vec![s]);
                // The files of the same pick that were never started.
                if let Ok(mut done) = result.clone() {
                    let mut known: Vec<String> = uploads.get_untracked().iter().map(|u| u.file_name.clone()).collect();
                    known.push(p.file_name.clone());
                    let cs = chunk_size().ok().flatten().or(Some(p.chunk_size));
                    let mut failed = None;
                    for f in file_list(&files_input).into_iter().chain(file_list(&resume_input)) {
                        if known.contains(&f.name()) || upload::pending().iter().any(|q| q.file_name == f.name()) {
                            continue;
                        }
                        known.push(f.name());
                        match upload::upload_file(&f, cs, &tok, &on_progress).await {
                            Ok(s) => done.push(s),
                            Err(e) => {
                                failed = Some(ApiFailure::Network(format!("uploading {}: {e}", f.name())));
                                break;
                            }
                        }
                    }
                    result = match failed {
                        Some(e) => Err(e),
                        None => Ok(done),
                    };
                }
                pending.set(upload::pending());
                match result {
                    Ok(done) => {
                        checked.update(|c| c.extend(done.iter().map(|s| s.id.clone())));
                        msg.set(Message::Ok(format!(
                            "resumed and completed {} (sha256 verified by the server)",
                            done.iter().map(|s| s.file_name.clone()).collect::<Vec<_>>().join(", ")
                        )));
                    }
                    Err(e) => msg.set(Message::Error(format!("resuming {}: {e}", p.file_name))),
                }
                busy.set(false);
                refresh();
            });
        }
    };

    let discard = move |p: Pending| {
        leptos::task::spawn_local(async move {
            let r = api::request(
                "DELETE",
                &format!("api/uploads/{}", p.id),
                Some(&token.get_untracked()),
                api::Body::None,
                &[],
            )
            .await;
            match r {
                Ok(_) | Err(ApiFailure::Http { status: 404, .. }) => {
                    upload::forget(&p.id);
                    pending.set(upload::pending());
                    refresh();
                }
                Err(e) => fail("discarding the upload", e.into()),
            }
        });
    };

    let register = move |_| {
        let ids = checked.get_untracked();
        let name = ckpt_name.get_untracked().trim().to_string();
        if ids.is_empty() {
            return msg.set(Message::Error("tick the uploaded files of the model first".into()));
        }
        if name.is_empty() {
            return msg.set(Message::Error("name the checkpoint".into()));
        }
        busy.set(true);
        leptos::task::spawn_local(async move {
            let body = CreateCheckpoint { name, uploads: ids };
            match api::send::<_, CheckpointInfo>("POST", "api/checkpoints", &token.get_untracked(), Some(&body)).await {
                Ok(c) => {
                    msg.set(Message::Ok(format!(
                        "registered checkpoint {} ({}, {} parameters)",
                        c.name,
                        c.architecture,
                        crate::format_params(c.parameters as u64)
                    )));
                    checked.set(Vec::new());
                    form.model.set(c.id.clone());
                }
                Err(e) => fail("registering the checkpoint", e.into()),
            }
            busy.set(false);
            refresh();
        });
    };

    let load_artefacts = move |id: String| {
        leptos::task::spawn_local(async move {
            match api::get::<Vec<FileInfo>>(&format!("api/jobs/{id}/artifacts")).await {
                Ok(v) if live.get_untracked().job.as_deref() == Some(id.as_str()) => artefacts.set(v),
                Ok(_) => {}
                Err(e) => fail("listing artefacts", e.into()),
            }
        });
    };

    // Shows job `id` and follows its event stream.
    let watch = move |id: String| {
        FOLLOW.with(|f| f.borrow_mut().take());
        artefacts.set(Vec::new());
        let current = jobs.get_untracked().into_iter().find(|j| j.id == id);
        live.set(Live {
            job: Some(id.clone()),
            state: current.as_ref().map(|j| j.state),
            progress: current.as_ref().and_then(|j| j.progress.clone()),
            error: current.as_ref().and_then(|j| j.error.clone()),
            output_checkpoint: current.as_ref().and_then(|j| j.output_checkpoint.clone()),
            ..Live::default()
        });
        let id2 = id.clone();
        leptos::task::spawn_local(async move {
            // Steps done before the page looked: from metrics.jsonl.
            if let Ok(m) = api::get::<Vec<serde_json::Value>>(&format!("api/jobs/{id2}/metrics")).await {
                let pts: Vec<(usize, f64)> = m
                    .iter()
                    .filter_map(|v| Some((v.get("step")?.as_u64()? as usize, v.get("loss")?.as_f64()?)))
                    .collect();
                live.update(|l| {
                    if l.job.as_deref() == Some(id2.as_str()) {
                        let mut all = pts;
                        all.extend(l.loss.iter().copied());
                        all.sort_by_key(|p| p.0);
                        all.dedup_by_key(|p| p.0);
                        l.loss = all;
                    }
                });
            }
        });
        let id3 = id.clone();
        let on_event = move |ev: JobEvent| {
            let mut terminal = false;
            live.update(|l| {
                l.events += 1;
                l.stream = None;
                match ev {
                    JobEvent::State { state, error, output_checkpoint } => {
                        l.state = Some(state);
                        l.error = error;
                        if output_checkpoint.is_some() {
                            l.output_checkpoint = output_checkpoint;
                        }
                        terminal = state.is_terminal();
                    }
                    JobEvent::Progress(p) => {
                        if let Some(loss) = p.loss.filter(|_| p.step > 0) {
                            if l.loss.last().is_none_or(|&(s, _)| s < p.step) {
                                l.loss.push((p.step, loss));
                            }
                        }
                        l.progress = Some(p);
                    }
                    JobEvent::Log { line } => {
                        l.log.push(line);
                        let n = l.log.len();
                        if n > 200 {
                            l.log.drain(..n - 200);
                        }
                    }
                }
            });
            if terminal {
                // Closing from inside the stream's own callback is not
                // allowed: do it on the next tick.
                let id = id3.clone();
                leptos::task::spawn_local(async move {
                    FOLLOW.with(|f| {
                        if f.borrow().as_ref().is_some_and(|x| x.job == id) {
                            f.borrow_mut().take();
                        }
                    });
                    load_artefacts(id);
                    refresh();
                });
            }
        };
        let on_error = move |e: String| live.update(|l| l.stream = Some(e));
        match follow(&id, on_event, on_error) {
            Ok(f) => FOLLOW.with(|x| *x.borrow_mut() = Some(f)),
            Err(e) => fail("following the job", e),
        }
        load_artefacts(id);
    };

    let submit = move |_| {
        let req = match form.request() {
            Ok(r) => r,
            Err(e) => return msg.set(Message::Error(e)),
        };
        busy.set(true);
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            match api::send::<_, JobInfo>("POST", "api/jobs", &token.get_untracked(), Some(&req)).await {
                Ok(j) => {
                    msg.set(Message::Ok(format!("job {} ({}) submitted", short(&j.id), j.kind)));
                    jobs.update(|v| v.insert(0, j.clone()));
                    watch(j.id);
                }
                Err(e) => fail("submitting the job", e.into()),
            }
            busy.set(false);
        });
    };

    let act = move |what: &'static str| {
        let Some(id) = live.get_untracked().job else { return };
        leptos::task::spawn_local(async move {
            let url = format!("api/jobs/{id}/{what}");
            match api::send::<(), JobInfo>("POST", &url, &token.get_untracked(), None).await {
                Ok(j) => {
                    msg.set(Message::Ok(format!("job {}: {what} → {}", short(&j.id), j.state.as_str())));
                    jobs.update(|v| {
                        if let Some(x) = v.iter_mut().find(|x| x.id == j.id) {
                            *x = j.clone();
                        }
                    });
                    if what == "resume" {
                        watch(j.id);
                    }
                }
                Err(e) => fail(&format!("{what} job"), e.into()),
            }
        });
    };

    // Downloads the output checkpoint's files and loads them as a model of
    // this tab (the same parser as the Load page).
    let open_in_studio = move |_| {
        let Some(cid) = live.get_untracked().output_checkpoint else {
            return msg.set(Message::Error("this job has no output checkpoint (yet)".into()));
        };
        busy.set(true);
        msg.set(Message::None);
        leptos::task::spawn_local(async move {
            let r: Result<String, String> = async {
                let c: CheckpointInfo = api::get(&format!("api/checkpoints/{cid}")).await?;
                let mut files = Vec::new();
                let mut total = 0;
                for f in c.files.iter().filter(|f| {
                    matches!(f.name.rsplit_once('.').map(|x| x.1), Some("safetensors" | "json" | "gguf" | "bin"))
                }) {
                    let url = format!("api/checkpoints/{cid}/files/{}", f.name);
                    let bytes = crate::web::fetch_bytes(&url).await?;
                    total += bytes.len() as u64;
                    files.push(crate::web::PickedFile { name: f.name.clone(), bytes });
                }
                let (_, model, _) = crate::load::model_from_files(files)?;
                let line = format!("opened {} in the studio: {}", c.name, crate::summary_line(&model.config));
                let name = c.name.clone();
                update_store(rev, |s| {
                    s.add_input(InputModel { name, model, file_bytes: total });
                });
                Ok(line)
            }
            .await;
            match r {
                Ok(l) => msg.set(Message::Ok(l)),
                Err(e) => fail("opening the output", e),
            }
            busy.set(false);
        });
    };

    let off = move || shared.backend.get() != Some(true) || info.get().is_none();

    let upload_view = move || {
        progress.get().map(|p| {
            let (done, total) = (p.done, p.total.max(1));
            let text = match p.phase {
                "hashing" => format!(
                    "{}: hashing {} / {}",
                    p.file_name,
                    crate::format_bytes(p.done),
                    crate::format_bytes(p.total)
                ),
                ph => format!(
                    "{}: {ph} — chunk {} / {} ({} / {})",
                    p.file_name,
                    p.chunks,
                    p.chunks_total,
                    crate::format_bytes(p.done),
                    crate::format_bytes(p.total)
                ),
            };
            view! {
                <div class="progress">
                    <progress data-testid="upload-progress" max=total.to_string() value=done.to_string()></progress>
                    <span data-testid="upload-status" data-chunks=p.chunks.to_string() data-phase=p.phase>{text}</span>
                </div>
            }
        })
    };

    let resume_cb = resume;
    let pending_view = move || {
        let list = pending.get();
        (!list.is_empty()).then(|| {
            view! {
                <div class="notice" data-testid="pending-uploads">
                    <b>"Unfinished uploads"</b>
                    " (kept in this browser; the server keeps the chunks it verified)"
                    <ul>
                        {list.into_iter().map(|p| {
                            let r = resume_cb;
                            let p2 = p.clone();
                            let p3 = p.clone();
                            view! {
                                <li>
                                    {format!("{} · {} · ", p.file_name, crate::format_bytes(p.size))}
                                    <button data-testid="upload-resume" on:click=move |_| r(p2.clone()) disabled=move || busy.get()>"Resume"</button>
                                    " "
                                    <button class="secondary" on:click=move |_| discard(p3.clone()) disabled=move || busy.get()>"Discard"</button>
                                </li>
                            }
                        }).collect_view()}
                    </ul>
                    <label class="small">"file to resume (after a reload) " <input type="file" multiple node_ref=resume_input data-testid="upload-resume-files"/></label>
                </div>
            }
        })
    };

    let uploads_view = move || {
        let list: Vec<UploadStatus> = uploads.get().into_iter().filter(|u| u.state == UploadState::Complete).collect();
        view! {
            <table class="grid" data-testid="uploads">
                <thead><tr><th></th><th>"file"</th><th>"size"</th><th>"sha256"</th><th>"id"</th></tr></thead>
                <tbody>
                    {list.into_iter().map(|u| {
                        let id = u.id.clone();
                        let id2 = u.id.clone();
                        view! {
                            <tr>
                                <td><input type="checkbox" data-testid=format!("upload-check-{}", u.file_name)
                                    prop:checked=move || checked.with(|c| c.contains(&id))
                                    on:change=move |ev| {
                                        let on = event_target_checked(&ev);
                                        checked.update(|c| { c.retain(|x| *x != id2); if on { c.push(id2.clone()); } });
                                    }/></td>
                                <td>{u.file_name.clone()}</td>
                                <td>{crate::format_bytes(u.size)}</td>
                                <td><code class="small">{u.sha256.chars().take(16).collect::<String>()}"…"</code></td>
                                <td><code class="small">{short(&u.id)}</code></td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
        }
    };

    let checkpoints_view = move || {
        view! {
            <table class="grid" data-testid="checkpoints">
                <thead><tr><th>"name"</th><th>"architecture"</th><th>"parameters"</th><th>"format"</th><th>"files"</th><th>"from job"</th></tr></thead>
                <tbody>
                    {checkpoints.get().into_iter().map(|c| view! {
                        <tr data-testid=format!("checkpoint-{}", c.id)>
                            <td><b>{c.name.clone()}</b></td>
                            <td>{c.architecture.clone()}</td>
                            <td>{crate::format_params(c.parameters as u64)}</td>
                            <td>{format!("{:?}", c.format)}</td>
                            <td class="small">{c.files.iter().map(|f| format!("{} ({})", f.name, crate::format_bytes(f.size))).collect::<Vec<_>>().join(", ")}</td>
                            <td>{c.source_job.as_deref().map(short).unwrap_or_default()}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        }
    };

    let corpus_options = move || {
        uploads
            .get()
            .into_iter()
            .filter(|u| u.state == UploadState::Complete && (u.file_name.ends_with(".txt") || u.file_name.ends_with(".jsonl")))
            .map(|u| view! { <option value=u.id.clone()>{format!("{} ({})", u.file_name, crate::format_bytes(u.size))}</option> })
            .collect_view()
    };
    // The corpus select shows its first option; keep the form in step.
    Effect::new(move |_| {
        let list = uploads.get();
        let ok = |id: &str| list.iter().any(|u| u.id == id && u.state == UploadState::Complete);
        if !ok(&form.corpus.get_untracked()) {
            if let Some(u) = list.iter().find(|u| {
                u.state == UploadState::Complete && (u.file_name.ends_with(".txt") || u.file_name.ends_with(".jsonl"))
            }) {
                form.corpus.set(u.id.clone());
                if form.corpus_name.get_untracked().is_empty() {
                    let stem = u.file_name.split('.').next().unwrap_or("data");
                    let label: String =
                        stem.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').take(64).collect();
                    form.corpus_name.set(if label.is_empty() { "data".into() } else { label });
                }
            }
        }
    });

    let text_field = move |label: &'static str, sig: RwSignal<String>, tid: &'static str| {
        view! {
            <label>{label} " "
                <input type="text" size="8" data-testid=tid prop:value=move || sig.get() on:input=move |ev| sig.set(event_target_value(&ev))/>
            </label>
        }
    };

    let jobs_view = move || {
        view! {
            <table class="grid" data-testid="jobs-table">
                <thead><tr><th>"job"</th><th>"kind"</th><th>"state"</th><th>"progress"</th><th>"output"</th><th></th></tr></thead>
                <tbody>
                    {jobs.get().into_iter().map(|j| {
                        let id = j.id.clone();
                        let prog = j.progress.as_ref().map(|p| if p.steps > 0 { format!("{} {}/{}", p.stage, p.step, p.steps) } else { p.stage.clone() }).unwrap_or_default();
                        view! {
                            <tr data-testid=format!("job-row-{}", j.id)>
                                <td><code>{short(&j.id)}</code> " " {j.name.clone().unwrap_or_default()}</td>
                                <td>{j.kind.clone()}</td>
                                <td class=format!("state {}", j.state.as_str())>{j.state.as_str()}</td>
                                <td>{prog}</td>
                                <td>{j.output_checkpoint.as_deref().map(short).unwrap_or_default()}</td>
                                <td><button class="secondary" data-testid=format!("job-follow-{}", j.id) on:click=move |_| watch(id.clone())>"Show"</button></td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
        }
    };

    // The followed job's card: rebuilt only when another job is shown; its
    // fields follow the events one by one (so an open log stays open).
    let job_id = Memo::new(move |_| live.with(|l| l.job.clone()));
    let prog = move || live.with(|l| l.progress.clone().unwrap_or_default());
    let dash = || "–".to_string();
    let live_view = move || {
        let id = job_id.get()?;
        let state = move || live.with(|l| l.state.map(|s| s.as_str()).unwrap_or("…"));
        let running = move || live.with(|l| matches!(l.state, Some(JobState::Running | JobState::Queued)));
        let resumable = move || {
            live.with(|l| matches!(l.state, Some(JobState::Interrupted | JobState::Cancelled | JobState::Failed)))
        };
        let pct = move || {
            let p = prog();
            if p.steps > 0 {
                p.step as f64 / p.steps as f64
            } else if live.with(|l| l.state == Some(JobState::Succeeded)) {
                1.0
            } else {
                0.0
            }
        };
        let id2 = id.clone();
        let arts = move || {
            let arts = artefacts.get();
            let id = id2.clone();
            (!arts.is_empty()).then(|| view! {
                <div data-testid="job-artifacts">
                    <b>"Artefacts"</b>
                    <ul class="small">
                        {arts.into_iter().map(|f| {
                            let url = api::artifact_url(&id, &f.name);
                            let file = f.name.rsplit('/').next().unwrap_or(&f.name).to_string();
                            view! { <li><a href=url download=file data-testid=format!("artifact-{}", f.name)>{f.name.clone()}</a>
                                {format!(" ({})", crate::format_bytes(f.size))}</li> }
                        }).collect_view()}
                    </ul>
                </div>
            })
        };
        Some(view! {
            <div class="card" data-testid="job-live" data-job=id.clone()>
                <h3>"Job " <code>{short(&id)}</code> " — " <span data-testid="job-state" class=move || format!("state {}", state())>{state}</span></h3>
                <progress max="1" value=move || pct().to_string()></progress>
                <table class="grid small">
                    <tr><th>"stage"</th><td data-testid="job-stage">{move || prog().stage}</td>
                        <th>"step"</th><td data-testid="job-step" data-step=move || prog().step.to_string()>{move || { let p = prog(); format!("{} / {}", p.step, p.steps) }}</td>
                        <th>"loss"</th><td data-testid="job-loss">{move || prog().loss.map(|x| format!("{x:.4}")).unwrap_or_else(dash)}</td></tr>
                    <tr><th>"tokens/s"</th><td data-testid="job-tps">{move || prog().tokens_per_s.map(|x| format!("{x:.0}")).unwrap_or_else(dash)}</td>
                        <th>"ETA"</th><td data-testid="job-eta">{move || prog().eta_s.map(fmt_eta).unwrap_or_else(dash)}</td>
                        <th>"events"</th><td data-testid="job-events">{move || live.with(|l| l.events)}</td></tr>
                </table>
                {move || live.with(|l| l.stream.clone()).map(|s| view! { <p class="msg small">{s}</p> })}
                {move || live.with(|l| l.error.clone()).map(|e| view! { <pre class="msg error small" data-testid="job-error">{e}</pre> })}
                <LossChart points=Signal::derive(move || live.with(|l| l.loss.clone()))/>
                <p>
                    <button data-testid="job-cancel" on:click=move |_| act("cancel") disabled=move || !running()>"Cancel"</button>
                    " "
                    <button data-testid="job-resume" on:click=move |_| act("resume") disabled=move || !resumable()>"Resume"</button>
                    " "
                    <button data-testid="job-open" on:click=open_in_studio disabled=move || busy.get() || live.with(|l| l.output_checkpoint.is_none())>"Open in studio"</button>
                </p>
                {arts}
                <details>
                    <summary>{move || live.with(|l| format!("log ({} lines)", l.log.len()))}</summary>
                    <pre class="small" data-testid="job-log">{move || live.with(|l| l.log.join("\n"))}</pre>
                </details>
            </div>
        })
    };

    view! {
        <h2>"Server jobs"</h2>
        <p class="lead">"Full-scale work — continued pre-training of the new experts, router tuning with replay, merges of 7B models — \
            runs on a server with " <code>"moe-studio serve"</code> " (CUDA / wgpu / CPU). This page uploads checkpoints to it and follows the jobs live."</p>
        {move || off().then(|| view! {
            <div class="notice" data-testid="jobs-static">
                <b>"No server: this studio is served as static files."</b>
                " Everything on the other pages still works in this tab. To run server jobs, start "
                <code>"moe-studio serve"</code> " and open the address it prints."
            </div>
        })}
        <fieldset class="form" disabled=off data-testid="jobs-server">
            <legend>"Server"</legend>
            <p class="small" data-testid="server-info">{move || info.get().map(|i| format!(
                "moe-studio {} · backends {} (default {}) · {} worker(s) · uploads up to {}",
                i.version, i.backends.join(", "), i.default_backend, i.workers, crate::format_bytes(i.max_upload_bytes)))}</p>
            <label>"token " <input type="password" size="40" data-testid="jobs-token" placeholder="printed by moe-studio serve (DATA_DIR/token)"
                prop:value=move || token.get() on:input=move |ev| token.set(event_target_value(&ev))/></label>
            " "
            <button class="secondary" data-testid="jobs-refresh" on:click=move |_| refresh()>"Refresh"</button>
        </fieldset>
        <div data-testid="jobs-msg" data-seq=move || msg_seq.get().to_string()>
            <MessageLine msg=msg id="jobs"/>
        </div>
        <fieldset class="form" disabled=off>
            <legend>"Upload files"</legend>
            <p class="small">"A model's files (llama2.c: the " <code>".bin"</code> " + its " <code>"tok*.bin"</code>
                "; Hugging Face: " <code>"*.safetensors"</code> " + " <code>"config.json"</code> " + " <code>"tokenizer.json"</code>
                "; or one " <code>".gguf"</code> ") or a corpus (" <code>".txt"</code> ", " <code>".jsonl"</code>
                "). Sent in chunks with sha256 checks; an interrupted upload resumes where it stopped."</p>
            <input type="file" multiple node_ref=files_input data-testid="upload-files"/>
            <label>" chunk size (KiB) " <input type="text" size="6" data-testid="upload-chunk-kib"
                placeholder=move || info.get().map(|i| (i.default_chunk_size / 1024).to_string()).unwrap_or_default()
                prop:value=move || chunk_kib.get() on:input=move |ev| chunk_kib.set(event_target_value(&ev))/></label>
            " "
            <button data-testid="upload-start" on:click=start_upload disabled=move || busy.get()>"Upload"</button>
            {upload_view}
            {pending_view}
            <h4>"Uploaded files"</h4>
            {uploads_view}
            <label>"checkpoint name " <input type="text" data-testid="ckpt-name" placeholder="e.g. stories260K"
                prop:value=move || ckpt_name.get() on:input=move |ev| ckpt_name.set(event_target_value(&ev))/></label>
            " "
            <button data-testid="ckpt-register" on:click=register disabled=move || busy.get()>"Register the ticked files as a checkpoint"</button>
        </fieldset>
        <h3>"Checkpoints"</h3>
        {checkpoints_view}
        <fieldset class="form" disabled=off>
            <legend>"New job"</legend>
            <label>"kind " <select data-testid="job-kind" on:change=move |ev| form.kind.set(event_target_value(&ev)) prop:value=move || form.kind.get()>
                <option value="upcycle">"upcycle (dense → MoE)"</option>
                <option value="train">"train (experts / router / dense)"</option>
            </select></label>
            " "
            <label>"model " <select data-testid="job-model" on:change=move |ev| form.model.set(event_target_value(&ev)) prop:value=move || form.model.get()>
                {move || checkpoints.get().into_iter().map(|c| view! {
                    <option value=c.id.clone() selected=form.model.get_untracked() == c.id>{format!("{} ({}, {})", c.name, c.architecture, short(&c.id))}</option>
                }).collect_view()}
            </select></label>
            " "
            {text_field("name", form.name, "job-name")}
            <div>
                {move || (form.kind.get() == "upcycle").then(|| view! {
                    <span>{text_field("experts", form.experts, "job-experts")} " " {text_field("top-k", form.top_k, "job-topk")}</span>
                })}
                {move || (form.kind.get() == "train").then(|| view! {
                    <span>
                        <label>"stage " <select data-testid="job-train-stage" on:change=move |ev| form.stage.set(event_target_value(&ev)) prop:value=move || form.stage.get()>
                            <option value="experts">"experts (new experts + routers)"</option>
                            <option value="router">"router"</option>
                            <option value="dense">"dense"</option>
                        </select></label>
                        " " {text_field("steps", form.steps, "job-steps")}
                        " " {text_field("lr", form.lr, "job-lr")}
                        " " {text_field("seq len", form.seq_len, "job-seqlen")}
                        " " {text_field("batch", form.batch, "job-batch")}
                        <br/>
                        <label>"corpus " <select data-testid="job-corpus" on:change=move |ev| form.corpus.set(event_target_value(&ev)) prop:value=move || form.corpus.get()>
                            {corpus_options}
                        </select></label>
                        " " {text_field("corpus name", form.corpus_name, "job-corpus-name")}
                    </span>
                })}
                " " {text_field("seed", form.seed, "job-seed")}
            </div>
            <button data-testid="job-submit" on:click=submit disabled=move || busy.get()>"Start job"</button>
        </fieldset>
        <h3>"Jobs"</h3>
        {jobs_view}
        {live_view}
    }
}
