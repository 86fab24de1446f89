//! Uploads: files sent in chunks with sha256 checks, the unfinished ones
//! (kept in `localStorage`) resumed where the server stopped, the completed
//! ones listed with a tick box, and the ticked files registered as one
//! checkpoint.

use leptos::html;
use leptos::prelude::*;
use moe_shared::api::{CheckpointInfo, CreateCheckpoint, ServerInfo, UploadState, UploadStatus};

use super::form::parse_num;
use super::state::{short, Ctx};
use crate::components::message::Message;
use crate::jobs::api::{self, ApiFailure};
use crate::jobs::upload::{self, Pending, UploadProgress};

fn file_list(input: &NodeRef<html::Input>) -> Vec<web_sys::File> {
    let Some(list) = input.get_untracked().and_then(|i| i.files()) else { return Vec::new() };
    (0..list.length()).filter_map(|i| list.get(i)).collect()
}

/// The "Upload files" fieldset.
pub fn uploads_section(ctx: Ctx, info: RwSignal<Option<ServerInfo>>, off: Signal<bool>) -> impl IntoView {
    let (msg, busy, token, uploads) = (ctx.msg, ctx.busy, ctx.token, ctx.uploads);
    let progress = RwSignal::new(None::<UploadProgress>);
    let pending = RwSignal::new(upload::pending());
    let checked = RwSignal::new(Vec::<String>::new());
    let ckpt_name = RwSignal::new(String::new());
    let chunk_kib = RwSignal::new(String::new());
    let files_input = NodeRef::<html::Input>::new();
    let resume_input = NodeRef::<html::Input>::new();

    let chunk_size = move || -> Result<Option<u64>, String> {
        Ok(parse_num::<f64>(&chunk_kib.get_untracked())
            .map_err(|e| format!("chunk size: {e}"))?
            .map(|k| (k * 1024.0).round() as u64))
    };
    let on_progress = move |p: UploadProgress| progress.set(Some(p));

    // Uploads the picked files one after the other; the completed ones are
    // ticked for the next checkpoint.
    let start_upload = move |_| {
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
            ctx.refresh();
        });
    };

    // Continues one pending upload from where the server stopped, then the
    // files of the batch that were not started yet.
    let resume = move |p: Pending| {
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
            ctx.refresh();
        });
    };

    let discard = move |p: Pending| {
        leptos::task::spawn_local(async move {
            let url = format!("api/uploads/{}", p.id);
            let r = api::request("DELETE", &url, Some(&token.get_untracked()), api::Body::None, &[]).await;
            match r {
                Ok(_) | Err(ApiFailure::Http { status: 404, .. }) => {
                    upload::forget(&p.id);
                    pending.set(upload::pending());
                    ctx.refresh();
                }
                Err(e) => ctx.fail("discarding the upload", e),
            }
        });
    };

    let register = move |_| {
        let ids = checked.get_untracked();
        if ids.is_empty() {
            return msg.set(Message::Error("tick the uploaded files of the model first".into()));
        }
        // The server's own check of names (no empty, control or bidi characters).
        let name = match moe_shared::api::check_name("name", &ckpt_name.get_untracked()) {
            Ok(n) => n,
            Err(e) => return msg.set(Message::Error(format!("checkpoint name: {}", e.error))),
        };
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
                    ctx.form.update(|f| f.set("model", c.id.clone()));
                }
                Err(e) => ctx.fail("registering the checkpoint", e),
            }
            busy.set(false);
            ctx.refresh();
        });
    };

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

    let pending_view = move || {
        let list = pending.get();
        (!list.is_empty()).then(|| {
            view! {
                <div class="notice" data-testid="pending-uploads">
                    <b>"Unfinished uploads"</b>
                    " (kept in this browser; the server keeps the chunks it verified)"
                    <ul>
                        {list.into_iter().map(|p| {
                            let p2 = p.clone();
                            let p3 = p.clone();
                            view! {
                                <li>
                                    {format!("{} · {} · ", p.file_name, crate::format_bytes(p.size))}
                                    <button data-testid="upload-resume" on:click=move |_| resume(p2.clone()) disabled=move || busy.get()>"Resume"</button>
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

    view! {
        <fieldset class="form" disabled=move || off.get()>
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
    }
}
