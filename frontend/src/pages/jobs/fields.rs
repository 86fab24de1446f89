//! The few input components every job form is made of, driven by a
//! [`Field`]: a text/number box, a checkbox, a choice, a checkpoint picker (one, one or
//! none, several in order), rows of uploaded corpora ([`DataRow`]s), and
//! the error line under an input. Test ids: `job-{key}`,
//! `job-{key}-{checkpoint id}`, `job-{key}-{row}-{name|upload|heldout|weight|original}`,
//! `job-error-{key}`.

use leptos::prelude::*;

use super::form::{data_name, Field, Input};
use super::state::{short, Ctx};

/// One input of the form with its label and error line.
pub fn form_field(ctx: Ctx, fd: &'static Field) -> impl IntoView {
    let key = fd.key;
    let input = match fd.input {
        Input::Checkpoint => checkpoint_select(ctx, key, false).into_any(),
        Input::OptCheckpoint => checkpoint_select(ctx, key, true).into_any(),
        Input::Checkpoints => checkpoint_ticks(ctx, key).into_any(),
        Input::Data { weight, original, heldout, .. } => data_rows(ctx, key, weight, original, heldout).into_any(),
        Input::Choice(choices) => {
            choice_select(ctx, key, choices, (!fd.required).then_some(fd.hint.as_str())).into_any()
        }
        Input::Int | Input::Float | Input::IntList | Input::LayerList | Input::FloatList | Input::Names => {
            text_box(ctx, key, fd.hint.as_str()).into_any()
        }
        Input::Flag => flag_box(ctx, key).into_any(),
    };
    let block = matches!(fd.input, Input::Checkpoints | Input::Data { .. });
    view! {
        <div class=if block { "job-field block" } else { "job-field" } data-field=key>
            <span class="job-label">{fd.label}</span>
            " "
            {input}
            {error_line(ctx, key)}
        </div>
    }
}

/// The error of the last submission about field `key`, if it is about it.
pub fn error_line(ctx: Ctx, key: &'static str) -> impl IntoView {
    move || {
        ctx.field_error.with(|e| e.as_ref().filter(|e| e.key == key).map(|e| e.text())).map(|t| {
            view! { <span class="msg error small field-error" role="alert" data-testid=format!("job-error-{key}")>{t}</span> }
        })
    }
}

/// A text box bound to field `key` (numbers and lists are parsed on submit).
pub fn text_box(ctx: Ctx, key: &'static str, hint: &'static str) -> impl IntoView {
    let form = ctx.form;
    view! {
        <input type="text" size="10" data-testid=format!("job-{key}") placeholder=hint
            prop:value=move || form.with(|f| f.value(key).to_string())
            on:input=move |ev| form.update(|f| f.set(key, event_target_value(&ev)))/>
    }
}

/// A checkbox bound to field `key` (`"true"` when ticked, empty when not).
pub fn flag_box(ctx: Ctx, key: &'static str) -> impl IntoView {
    let form = ctx.form;
    view! {
        <input type="checkbox" data-testid=format!("job-{key}")
            prop:checked=move || form.with(|f| f.value(key) == "true")
            on:change=move |ev| form.update(|f| f.set(key, if event_target_checked(&ev) { "true" } else { "" }))/>
    }
}

/// A select of `choices`; with `default` an empty first choice stands for
/// the server's default.
pub fn choice_select(
    ctx: Ctx,
    key: &'static str,
    choices: &'static [&'static str],
    default: Option<&'static str>,
) -> impl IntoView {
    let form = ctx.form;
    let now = form.with_untracked(|f| f.value(key).to_string());
    view! {
        <select class="short" data-testid=format!("job-{key}")
            on:change=move |ev| form.update(|f| f.set(key, event_target_value(&ev)))
            prop:value=move || form.with(|f| f.value(key).to_string())>
            {default.map(|d| view! { <option value="" selected=now.is_empty()>{format!("default ({d})")}</option> })}
            {choices.iter().map(|c| view! { <option value=*c selected=now == *c>{*c}</option> }).collect_view()}
        </select>
    }
}

/// A select of the registered checkpoints (with "(none)" when `optional`).
pub fn checkpoint_select(ctx: Ctx, key: &'static str, optional: bool) -> impl IntoView {
    let form = ctx.form;
    view! {
        <select data-testid=format!("job-{key}")
            on:change=move |ev| form.update(|f| f.set(key, event_target_value(&ev)))
            prop:value=move || form.with(|f| f.value(key).to_string())>
            {optional.then(|| view! { <option value="">"(none)"</option> })}
            {move || ctx.checkpoints.get().into_iter().map(|c| {
                let selected = form.with_untracked(|f| f.value(key) == c.id);
                view! { <option value=c.id.clone() selected=selected>{format!("{} ({}, {})", c.name, c.architecture, short(&c.id))}</option> }
            }).collect_view()}
        </select>
    }
}

/// A tick box per registered checkpoint; the ticked ones are taken in the
/// order they were ticked (shown as #1, #2, ...).
pub fn checkpoint_ticks(ctx: Ctx, key: &'static str) -> impl IntoView {
    let form = ctx.form;
    view! {
        <span class="ticks">
            {move || ctx.checkpoints.get().into_iter().map(|c| {
                let (id, id2, id3) = (c.id.clone(), c.id.clone(), c.id.clone());
                let order = move || form.with(|f| f.picked(key).iter().position(|x| *x == id3).map(|i| format!(" #{}", i + 1)).unwrap_or_default());
                view! {
                    <label class="tick">
                        <input type="checkbox" data-testid=format!("job-{key}-{}", c.id)
                            prop:checked=move || form.with(|f| f.picked(key).contains(&id))
                            on:change=move |ev| { let on = event_target_checked(&ev); form.update(|f| f.tick(key, &id2, on)); }/>
                        {format!(" {} ({})", c.name, c.architecture)}
                        <b>{order}</b>
                    </label>
                }
            }).collect_view()}
            {move || ctx.checkpoints.with(|c| c.is_empty()).then(|| view! { <span class="small">"no checkpoints yet"</span> })}
        </span>
    }
}

/// A select of the completed text uploads bound to row `i`'s `upload`
/// (`heldout = false`) or `heldout` file; choosing a file names an unnamed
/// (or file-named) row after it.
fn upload_select(ctx: Ctx, key: &'static str, i: usize, heldout: bool) -> impl IntoView {
    let form = ctx.form;
    let get = move |f: &super::form::FormState| {
        f.rows(key).get(i).map(|r| if heldout { r.heldout.clone() } else { r.upload.clone() }).unwrap_or_default()
    };
    let set = move |v: String| {
        let texts = ctx.texts_untracked();
        let file_of = |id: &str| texts.iter().find(|(x, _)| x == id).map(|x| x.1.clone());
        form.update(|f| {
            let r = f.row_mut(key, i);
            if heldout {
                r.heldout = v;
                return;
            }
            // A name the user typed is kept; one taken from the old file follows the new one.
            let auto = r.name.is_empty() || file_of(&r.upload).map(|x| data_name(&x)).as_ref() == Some(&r.name);
            if let Some(file) = file_of(&v).filter(|_| auto) {
                r.name = data_name(&file);
            }
            r.upload = v;
        });
    };
    let tid = format!("job-{key}-{i}-{}", if heldout { "heldout" } else { "upload" });
    view! {
        <select class="short" data-testid=tid on:change=move |ev| set(event_target_value(&ev))
            prop:value=move || form.with(get)>
            <option value="">{if heldout { "(no held-out file)" } else { "(choose a file)" }}</option>
            {move || {
                let now = form.with_untracked(get);
                ctx.texts().into_iter().map(|(id, file)| {
                    let selected = now == id;
                    view! { <option value=id.clone() selected=selected>{file}</option> }
                }).collect_view()
            }}
        </select>
    }
}

/// The rows of a data field: name + uploaded file (+ held-out file,
/// weight, original language where the spec reads them), add / remove.
pub fn data_rows(ctx: Ctx, key: &'static str, weight: bool, original: bool, heldout: bool) -> impl IntoView {
    let form = ctx.form;
    let n = Memo::new(move |_| form.with(|f| f.rows(key).len()));
    let row = move |i: usize| {
        let name = move || form.with(|f| f.rows(key).get(i).map(|r| r.name.clone()).unwrap_or_default());
        let w = move || form.with(|f| f.rows(key).get(i).map(|r| r.weight.clone()).unwrap_or_default());
        let orig = move || form.with(|f| f.rows(key).get(i).is_some_and(|r| r.original));
        view! {
            <div class="data-row" data-testid=format!("job-{key}-{i}")>
                {format!("#{} ", i + 1)}
                <input type="text" size="8" placeholder="name" data-testid=format!("job-{key}-{i}-name")
                    prop:value=name on:input=move |ev| form.update(|f| f.row_mut(key, i).name = event_target_value(&ev))/>
                " " {upload_select(ctx, key, i, false)}
                {heldout.then(|| view! { " held-out " {upload_select(ctx, key, i, true)} })}
                {weight.then(|| view! {
                    " weight " <input type="text" size="4" placeholder="1" data-testid=format!("job-{key}-{i}-weight")
                        prop:value=w on:input=move |ev| form.update(|f| f.row_mut(key, i).weight = event_target_value(&ev))/>
                })}
                {original.then(|| view! {
                    <label class="tick"><input type="checkbox" data-testid=format!("job-{key}-{i}-original") prop:checked=orig
                        on:change=move |ev| { let on = event_target_checked(&ev); form.update(|f| f.row_mut(key, i).original = on); }/>
                        " original language"</label>
                })}
                " "
                <button class="secondary" data-testid=format!("job-{key}-{i}-remove") disabled=move || n.get() <= 1
                    on:click=move |_| form.update(|f| { if let Some(v) = f.data.get_mut(key) { if i < v.len() { v.remove(i); } } })>"−"</button>
            </div>
        }
    };
    view! {
        <div class="data-rows">
            {move || (0..n.get()).map(row).collect_view()}
            <button class="secondary" data-testid=format!("job-{key}-add")
                on:click=move |_| form.update(|f| { let n = f.rows(key).len(); f.row_mut(key, n); })>"+ file"</button>
        </div>
    }
}
