//! Train: DeltaMoE's two training stages on an upcycled MoE, in the tab
//! (compute/train.rs runs the CLI's trainer in the worker). Stage 1 trains
//! the new experts and the routers on the new language (expert 0 frozen,
//! load balancing); stage 2 tunes the routers only on the new language
//! with a replay of the original one and the language prior. While a stage
//! runs the page draws its loss and the routing shares of both languages;
//! the trained checkpoint is downloadable like every other.

use std::rc::Rc;

use leptos::prelude::*;

use crate::app::Shared;
use crate::components::chart::{Line, LineChart};
use crate::components::message::{Message, MessageLine};
use crate::components::model_select::{Filter, ModelSelect};
use crate::components::progress::Progress;
use crate::compute::train::{config, LangText, TrainField, TrainForm, TrainJob, TrainPoint, TrainSummary};
use crate::models::Models;
use crate::store::ModelRef;
use crate::task::Task;
use crate::worker::protocol::{ModelInfo, Reply, Request};

/// The defaults of a stage on the teaching demo: `(steps, lr, batch,
/// seq_len, alpha, prior, replay)`. Each runs in well under 30 s in a tab
/// on a 2-core machine (stories260K-sized models; the tiny model takes a
/// larger learning rate than the paper's 5e-5 for 7B models).
pub fn stage_defaults(
    stage: &str,
) -> (&'static str, &'static str, &'static str, &'static str, &'static str, &'static str, bool) {
    match stage {
        "router" => ("30", "0.01", "8", "64", "0.01", "0.1", true),
        _ => ("40", "0.003", "8", "64", "0.01", "0.1", false),
    }
}

/// The form's signals.
#[derive(Clone, Copy)]
struct FormSignals {
    stage: RwSignal<String>,
    steps: RwSignal<String>,
    lr: RwSignal<String>,
    batch: RwSignal<String>,
    seq_len: RwSignal<String>,
    alpha: RwSignal<String>,
    prior: RwSignal<String>,
    replay: RwSignal<bool>,
}

impl FormSignals {
    fn new(stage: &str) -> Self {
        let (steps, lr, batch, seq, alpha, prior, replay) = stage_defaults(stage);
        FormSignals {
            stage: RwSignal::new(stage.to_string()),
            steps: RwSignal::new(steps.into()),
            lr: RwSignal::new(lr.into()),
            batch: RwSignal::new(batch.into()),
            seq_len: RwSignal::new(seq.into()),
            alpha: RwSignal::new(alpha.into()),
            prior: RwSignal::new(prior.into()),
            replay: RwSignal::new(replay),
        }
    }

    fn set_stage(&self, stage: &str) {
        let (steps, lr, batch, seq, alpha, prior, replay) = stage_defaults(stage);
        self.stage.set(stage.to_string());
        self.steps.set(steps.into());
        self.lr.set(lr.into());
        self.batch.set(batch.into());
        self.seq_len.set(seq.into());
        self.alpha.set(alpha.into());
        self.prior.set(prior.into());
        self.replay.set(replay);
    }

    fn values_untracked(&self) -> TrainForm {
        TrainForm {
            stage: self.stage.get_untracked(),
            steps: self.steps.get_untracked(),
            lr: self.lr.get_untracked(),
            batch: self.batch.get_untracked(),
            seq_len: self.seq_len.get_untracked(),
            alpha: self.alpha.get_untracked(),
            prior: self.prior.get_untracked(),
            replay: self.replay.get_untracked(),
        }
    }

    fn values(&self) -> TrainForm {
        TrainForm {
            stage: self.stage.get(),
            steps: self.steps.get(),
            lr: self.lr.get(),
            batch: self.batch.get(),
            seq_len: self.seq_len.get(),
            alpha: self.alpha.get(),
            prior: self.prior.get(),
            replay: self.replay.get(),
        }
    }
}

/// A language's texts as signals.
#[derive(Clone, Copy)]
struct LangSignals {
    name: RwSignal<String>,
    train: RwSignal<String>,
    heldout: RwSignal<String>,
}

impl LangSignals {
    fn new(name: &str) -> Self {
        LangSignals {
            name: RwSignal::new(name.into()),
            train: RwSignal::new(String::new()),
            heldout: RwSignal::new(String::new()),
        }
    }

    fn set(&self, t: &LangText) {
        self.name.set(t.name.clone());
        self.train.set(t.train.clone());
        self.heldout.set(t.heldout.clone());
    }

    fn get(&self) -> LangText {
        LangText { name: self.name.get(), train: self.train.get(), heldout: self.heldout.get() }
    }

    fn get_untracked(&self) -> LangText {
        LangText {
            name: self.name.get_untracked(),
            train: self.train.get_untracked(),
            heldout: self.heldout.get_untracked(),
        }
    }
}

/// What a finished stage gives its page.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOutcome {
    /// The trained checkpoint.
    pub model: ModelInfo,
    /// The run.
    pub summary: TrainSummary,
    /// Wall time as the page saw it (`12.3 s`).
    pub wall: String,
}

/// The preset's new language (`hu`) and original language (`en`), when
/// loaded: the stage's default texts.
fn preset_langs(shared: &Shared) -> Option<(LangText, LangText)> {
    let p = shared.preset.get()?;
    let find = |n: &str| p.splits.iter().find(|t| t.name == n).cloned();
    Some((find("hu")?, find("en")?))
}

/// The text editor of one language (collapsed: a textarea of tens of KB
/// takes the main thread long to lay out).
#[component]
fn LangEditor(l: LangSignals, #[prop(into)] role: String, #[prop(into)] id: String) -> impl IntoView {
    let summary = move || {
        format!(
            "{role}: {} — {} characters to train on, {} held out (open to see or edit)",
            l.name.get(),
            l.train.with(String::len),
            l.heldout.with(String::len)
        )
    };
    // The textareas exist only while the details are open: tens of KB of
    // text in a textarea cost the main thread ~100 ms each time it is set.
    let open = RwSignal::new(false);
    let id2 = id.clone();
    let editors = move || {
        open.get().then(|| {
            view! {
                <label>"name " <input type="text" class="short" data-testid=format!("{id2}-name") prop:value=move || l.name.get()
                    on:input=move |ev| l.name.set(event_target_value(&ev))/></label>
                <p class="small">"training text (documents separated by blank lines)"</p>
                <textarea rows="3" data-testid=format!("{id2}-train") prop:value=move || l.train.get_untracked()
                    on:input=move |ev| l.train.set(event_target_value(&ev))></textarea>
                <p class="small">"held-out text (scored before, during and after the stage; never trained on)"</p>
                <textarea rows="2" data-testid=format!("{id2}-heldout") prop:value=move || l.heldout.get_untracked()
                    on:input=move |ev| l.heldout.set(event_target_value(&ev))></textarea>
            }
        })
    };
    view! {
        <details class="ability" on:toggle=move |ev| {
            let d = event_target::<web_sys::HtmlElement>(&ev);
            open.set(d.has_attribute("open"));
        }>
            <summary data-testid=format!("{id}-summary")>{summary}</summary>
            {editors}
        </details>
    }
}

/// The charts and the before/after table of a stage's points.
#[component]
pub fn TrainCharts(points: Signal<Vec<TrainPoint>>, #[prop(into)] id: String) -> impl IntoView {
    let id2 = id.clone();
    let loss = move || {
        let pts = points.get();
        let steps: Vec<&TrainPoint> = pts.iter().filter(|p| p.loss.is_some()).collect();
        if steps.is_empty() {
            return None;
        }
        let mut lines = vec![Line {
            label: "next-token loss (nats/token)".into(),
            points: steps.iter().filter_map(|p| p.ce.map(|c| (p.step as f64, c))).collect(),
            dashed: false,
            color: 0,
        }];
        if steps.iter().any(|p| p.prior.is_some()) {
            lines.push(Line {
                label: "language-prior loss".into(),
                points: steps.iter().filter_map(|p| p.prior.map(|c| (p.step as f64, c))).collect(),
                dashed: true,
                color: 3,
            });
        }
        Some(
            view! { <LineChart title="Training loss per step" x_label="step" lines=lines id=format!("{}-loss-chart", id.clone())/> },
        )
    };
    let shares = move || {
        let pts = points.get();
        let evals: Vec<(f64, &Vec<crate::compute::train::LangEval>)> =
            pts.iter().filter_map(|p| p.eval.as_ref().map(|e| (p.step as f64, e))).collect();
        let first = evals.first()?.1;
        let mut lines = Vec::new();
        for (li, l) in first.iter().enumerate() {
            lines.push(Line {
                label: format!("{}: share to the new experts", l.name),
                points: evals.iter().filter_map(|(s, e)| e.get(li).map(|x| (*s, x.new_share))).collect(),
                dashed: li > 0,
                color: 1 + li,
            });
        }
        let mut per_expert = Vec::new();
        if let Some(n) = first[0].expert_share.as_ref().map(Vec::len) {
            for (li, l) in first.iter().enumerate() {
                for e in 0..n {
                    per_expert.push(Line {
                        label: format!("{} → expert {e}{}", l.name, if e == 0 { " (frozen)" } else { "" }),
                        points: evals
                            .iter()
                            .filter_map(|(s, ev)| ev.get(li)?.expert_share.as_ref()?.get(e).map(|x| (*s, *x)))
                            .collect(),
                        dashed: li > 0,
                        color: e,
                    });
                }
            }
        }
        Some(view! {
            <LineChart title="Routing: share of each language's held-out tokens sent to the new (trainable) experts, mean over layers"
                x_label="step" lines=lines max=1.0 id=format!("{}-share-chart", id2.clone())/>
            {(!per_expert.is_empty()).then(|| view! {
                <LineChart title="Routing share per expert (solid: new language, dashed: original language)"
                    x_label="step" lines=per_expert max=1.0/>
            })}
        })
    };
    view! { {loss}{shares} }
}

/// The before/after table of a finished (or running) stage.
#[component]
pub fn TrainTable(points: Signal<Vec<TrainPoint>>, #[prop(into)] id: String) -> impl IntoView {
    move || {
        let pts = points.get();
        let evals: Vec<&TrainPoint> = pts.iter().filter(|p| p.eval.is_some()).collect();
        let (first, last) = (evals.first()?, evals.last()?);
        let (a, b) = (first.eval.as_ref()?, last.eval.as_ref()?);
        let rows = a
            .iter()
            .zip(b)
            .map(|(x, y)| {
                let change = 100.0 * (y.ppl / x.ppl - 1.0);
                view! {
                    <tr>
                        <td>{x.name.clone()}</td>
                        <td>{format!("{:.3}", x.ppl)}</td>
                        <td>{format!("{:.3}", y.ppl)}</td>
                        <td>{format!("{change:+.1}%")}</td>
                        <td>{format!("{:.3}", x.new_share)}</td>
                        <td>{format!("{:.3}", y.new_share)}</td>
                    </tr>
                }
            })
            .collect_view();
        Some(view! {
            <table class="grid" data-testid=id.clone()>
                <thead><tr><th>"language (held out)"</th><th>{format!("perplexity at step {}", first.step)}</th>
                    <th>{format!("at step {}", last.step)}</th><th>"change"</th>
                    <th>"share to new experts before"</th><th>"after"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
        })
    }
}

/// One training stage: the MoE, the stage's options and texts, the Start
/// button, the live charts and the result. `prefix` makes its test ids
/// unique on a page (`{prefix}-run`, `{prefix}-ok`, `{prefix}-error-lr`);
/// `fixed_stage` hides the stage choice; `model` is the MoE to train (the
/// caller may bind it to an earlier step's output; `pinned` keeps it there
/// instead of following the newest MoE); `outcome` receives the finished
/// stage.
#[component]
pub fn TrainPanel(
    #[prop(into)] prefix: String,
    #[prop(optional)] fixed_stage: Option<&'static str>,
    model: RwSignal<Option<ModelRef>>,
    outcome: RwSignal<Option<TrainOutcome>>,
    #[prop(optional)] pinned: bool,
) -> impl IntoView {
    let shared = Shared::get();
    let models = Models::get();
    let f = FormSignals::new(fixed_stage.unwrap_or("experts"));
    let new = LangSignals::new("hu");
    let orig = LangSignals::new("en");
    Effect::new(move |_| {
        if let Some((n, o)) = preset_langs(&shared) {
            new.set(&n);
            orig.set(&o);
        }
    });
    // The newest MoE is the stage's default input (upcycled, or the stage
    // before); the user may pick any model, a dense one is refused next to
    // the field.
    let newest_moe = StoredValue::new(None::<ModelRef>);
    Effect::new(move |_| {
        let last = models.choices().into_iter().filter(|(_, _, moe)| *moe).map(|(r, _, _)| r).next_back();
        if !pinned && last.is_some() && last != newest_moe.get_value() {
            newest_moe.set_value(last.clone());
            model.set(last);
        }
    });
    let task = Task::new();
    let msg = RwSignal::new(Message::None);
    let refused = RwSignal::new(None::<(TrainField, String)>);
    let points = RwSignal::new(Vec::<TrainPoint>::new());
    // The page's own checks, on every change: the form's numbers (the
    // server's rules), the texts, the model.
    let invalid = Memo::new(move |_| -> Result<(), (TrainField, String)> {
        let form = f.values();
        config(&form)?;
        if let Some(r) = model.get() {
            if let Some(m) = models.find(&r) {
                if m.moe.is_none() {
                    return Err((
                        TrainField::Model,
                        format!(
                            "{} is dense: this stage trains an MoE's experts and routers (upcycle it first)",
                            m.name
                        ),
                    ));
                }
            }
        }
        let (n, o) = (new.get(), orig.get());
        if n.train.trim().is_empty() {
            return Err((TrainField::NewText, format!("the {} training text is empty", n.name)));
        }
        if n.heldout.trim().is_empty() {
            return Err((TrainField::NewText, format!("the {} held-out text is empty", n.name)));
        }
        if form.replay && o.train.trim().is_empty() {
            return Err((TrainField::OrigText, format!("the {} training text is empty (replay is on)", o.name)));
        }
        if o.heldout.trim().is_empty() {
            return Err((TrainField::OrigText, format!("the {} held-out text is empty", o.name)));
        }
        Ok(())
    });
    Effect::new(move |_| {
        let _ = (f.values(), model.get(), new.get(), orig.get());
        refused.set(None);
    });
    let pfx = StoredValue::new(prefix.clone());
    let field_error = move |field: TrainField| {
        let p = pfx.get_value();
        move || {
            let from_page = invalid.get().err().filter(|(f, _)| *f == field);
            let from_worker = refused.get().filter(|(f, _)| *f == field);
            from_page.or(from_worker).map(|(_, e)| {
                view! { <span class="msg error small field-error" role="alert" data-testid=format!("{p}-error-{}", field.id())>{e}</span> }
            })
        }
    };
    let run = move |_| {
        if invalid.get_untracked().is_err() {
            return;
        }
        let Some(r) = model.get_untracked() else {
            return refused.set(Some((TrainField::Model, "upcycle a model first (Upcycle page)".into())));
        };
        let job = TrainJob {
            form: f.values_untracked(),
            new: new.get_untracked(),
            original: orig.get_untracked(),
            eval_every: 5,
        };
        msg.set(Message::None);
        refused.set(None);
        points.set(Vec::new());
        outcome.set(None);
        leptos::task::spawn_local(async move {
            let on_point: Rc<dyn Fn(TrainPoint)> = Rc::new(move |p| points.update(|v| v.push(p)));
            match task.call_observed(Request::Train { model: r, job }, None, Some(on_point)).await {
                Ok((Reply::Train(info, summary), _)) => {
                    let last = summary.points.last().cloned();
                    let first = summary.points.first().cloned();
                    let line = match (first.and_then(|p| p.eval), last.and_then(|p| p.eval)) {
                        (Some(a), Some(b)) => a
                            .iter()
                            .zip(&b)
                            .map(|(x, y)| format!("{} held-out perplexity {:.2} → {:.2}", x.name, x.ppl, y.ppl))
                            .collect::<Vec<_>>()
                            .join(", "),
                        _ => String::new(),
                    };
                    msg.set(Message::Ok(format!(
                        "made {}: {} steps of {} tokens, {} trainable parameters ({} frozen), in {}; {line}",
                        info.name,
                        summary.points.len().saturating_sub(1),
                        summary.tokens_per_step,
                        crate::format_params(summary.trainable as u64),
                        crate::format_params(summary.frozen as u64),
                        task.wall()
                    )));
                    outcome.set(Some(TrainOutcome { model: info, summary, wall: task.wall() }));
                }
                Ok((Reply::TrainRefused(field, why), _)) => refused.set(Some((field, why))),
                Ok(_) => {}
                Err(e) => msg.set(Message::Error(e)),
            }
        });
    };
    let p = prefix.clone();
    let stage_choice = move || {
        fixed_stage.is_none().then(|| {
            view! {
                <label>"stage "
                    <select data-testid=format!("{}-stage", p.clone()) on:change=move |ev| f.set_stage(&event_target_value(&ev))>
                        <option value="experts" selected=move || f.stage.get() == "experts">"1 · experts: new experts + routers on the new language (expert 0 frozen)"</option>
                        <option value="router" selected=move || f.stage.get() == "router">"2 · router: routers only, new language + replay of the original, language prior"</option>
                    </select>
                </label>
            }
        })
    };
    let num_input = move |label: &'static str, sig: RwSignal<String>, field: TrainField, id: String| {
        view! {
            <label>{label}" " <input type="text" class="short" data-testid=id prop:value=move || sig.get()
                on:input=move |ev| sig.set(event_target_value(&ev))/></label>
            {field_error(field)}
        }
    };
    let pts = Signal::derive(move || points.get());
    view! {
        <div class="form">
            <label>"MoE model " <ModelSelect value=model filter=Filter::Any id=format!("{prefix}-model") hold=Signal::derive(move || task.running())/></label>
            {field_error(TrainField::Model)}
            {stage_choice}
            {field_error(TrainField::Stage)}
        </div>
        <div class="row">
            {num_input("steps", f.steps, TrainField::Steps, format!("{prefix}-steps"))}
            {num_input("learning rate", f.lr, TrainField::Lr, format!("{prefix}-lr"))}
            {num_input("batch", f.batch, TrainField::Batch, format!("{prefix}-batch"))}
            {num_input("sequence length", f.seq_len, TrainField::SeqLen, format!("{prefix}-seq-len"))}
            {num_input("load balancing α", f.alpha, TrainField::Alpha, format!("{prefix}-alpha"))}
            {num_input("language prior β", f.prior, TrainField::Prior, format!("{prefix}-prior"))}
        </div>
        <label class="inline"><input type="checkbox" data-testid=format!("{prefix}-replay") prop:checked=move || f.replay.get()
            on:change=move |ev| f.replay.set(event_target_checked(&ev))/>
            "replay the original language (mixed 1:1 with the new one, tagged original: the language prior sends its tokens to expert 0)"</label>
        <LangEditor l=new role="new language" id=format!("{prefix}-new")/>
        {field_error(TrainField::NewText)}
        <LangEditor l=orig role="original language" id=format!("{prefix}-orig")/>
        {field_error(TrainField::OrigText)}
        <button data-testid=format!("{prefix}-run") on:click=run disabled=move || task.running() || invalid.get().is_err()>
            {move || if f.stage.get() == "router" { "Run stage 2 (router tuning)" } else { "Run stage 1 (new experts)" }}</button>
        <Progress task=task/>
        <MessageLine msg=msg id=prefix.clone()/>
        <TrainCharts points=pts id=prefix.clone()/>
        <TrainTable points=pts id=format!("{prefix}-table")/>
    }
}

/// The Train page.
#[component]
pub fn TrainPage() -> impl IntoView {
    let model = RwSignal::new(None::<ModelRef>);
    let outcome = RwSignal::new(None::<TrainOutcome>);
    view! {
        <h2>"Train an upcycled MoE (DeltaMoE stages 1 and 2)"</h2>
        <p class="lead">"Stage 1 teaches the new experts a new language while expert 0 — the original FFN — stays frozen; \
            the routers learn to send the new language to them (with a load-balancing loss). Stage 2 tunes only the routers \
            on the new language mixed with the original one, whose tokens the language prior sends back to expert 0. \
            The CLI's own trainer runs here, in the tab; the result downloads like every checkpoint."</p>
        <TrainPanel prefix="train" model=model outcome=outcome/>
        <p class="hint">"Next: " <b>"Graft"</b> " adds the post-training delta of an instruct model to the trained MoE."</p>
    }
}
