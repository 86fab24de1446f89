//! The studio's models, kept outside the reactive graph (they are large and
//! not `Send`). Pages read them with [`with_store`] inside closures that also
//! track [`Revision`], which every change bumps.

use std::cell::RefCell;
use std::rc::Rc;

use leptos::prelude::*;
use moe_shared::checkpoint::{Bytes, LoadedModel};

/// A model the user loaded (dense, or an MoE checkpoint from disk).
pub struct InputModel {
    /// Display name (file name or "demo: stories260K").
    pub name: String,
    /// The parsed model.
    pub model: LoadedModel,
    /// Total bytes of the files it came from.
    pub file_bytes: u64,
}

/// A checkpoint the studio produced (upcycled, routed, grafted, MoErged):
/// the exact bytes a download gives, and the same bytes parsed back as a
/// model for the next step.
pub struct Artifact {
    /// Short name, used for the download folder (`stories260K-upcycled`).
    pub name: String,
    /// What made it (`upcycle`, `route`, `graft`, `moerge`).
    pub method: &'static str,
    /// `model.safetensors` bytes.
    pub safetensors: Bytes,
    /// `config.json` bytes (pretty JSON, as the CLI writes it).
    pub config_json: Vec<u8>,
    /// `tokenizer.json`, when the source had a Hugging Face form.
    pub tokenizer_json: Option<Vec<u8>>,
    /// Other files of the output directory (e.g. `ridge_stats.safetensors`).
    pub extra: Vec<(String, Vec<u8>)>,
    /// The checkpoint parsed back (safetensors + config).
    pub model: LoadedModel,
    /// Milliseconds the browser took to make it.
    pub millis: f64,
}

/// Everything loaded or produced in this tab. A removed model leaves an
/// empty slot, so that the indices in [`ModelRef`]s (and the pages'
/// selections) keep naming the same models.
#[derive(Default)]
pub struct Store {
    /// Loaded input models, in load order (`None`: removed).
    pub inputs: Vec<Option<Rc<InputModel>>>,
    /// Produced checkpoints, in creation order (`None`: removed).
    pub artifacts: Vec<Option<Rc<Artifact>>>,
}

impl Store {
    /// Adds a loaded model; returns its index.
    pub fn add_input(&mut self, m: InputModel) -> usize {
        self.inputs.push(Some(Rc::new(m)));
        self.inputs.len() - 1
    }

    /// Adds a produced checkpoint; returns its index.
    pub fn add_artifact(&mut self, a: Artifact) -> usize {
        self.artifacts.push(Some(Rc::new(a)));
        self.artifacts.len() - 1
    }

    /// Drops a model from the store (its memory is freed once no running
    /// step holds it).
    pub fn remove(&mut self, r: &ModelRef) {
        match r {
            ModelRef::Input(i) => {
                if let Some(x) = self.inputs.get_mut(*i) {
                    *x = None;
                }
            }
            ModelRef::Artifact(i) => {
                if let Some(x) = self.artifacts.get_mut(*i) {
                    *x = None;
                }
            }
        }
    }

    /// The loaded models still in the store, with their indices.
    pub fn live_inputs(&self) -> impl Iterator<Item = (usize, &Rc<InputModel>)> {
        self.inputs.iter().enumerate().filter_map(|(i, m)| m.as_ref().map(|m| (i, m)))
    }

    /// The produced checkpoints still in the store, with their indices.
    pub fn live_artifacts(&self) -> impl Iterator<Item = (usize, &Rc<Artifact>)> {
        self.artifacts.iter().enumerate().filter_map(|(i, a)| a.as_ref().map(|a| (i, a)))
    }
}

thread_local! {
    static STORE: RefCell<Store> = RefCell::new(Store::default());
}

/// Reads the store.
pub fn with_store<R>(f: impl FnOnce(&Store) -> R) -> R {
    STORE.with(|s| f(&s.borrow()))
}

/// Changes the store and bumps the revision.
pub fn update_store(rev: Revision, f: impl FnOnce(&mut Store)) {
    STORE.with(|s| f(&mut s.borrow_mut()));
    rev.0.update(|n| *n += 1);
}

/// A counter bumped on every store change (provided as context by the app).
#[derive(Clone, Copy)]
pub struct Revision(pub RwSignal<u64>);

impl Revision {
    /// The app's revision signal.
    pub fn get() -> Self {
        use_context::<Revision>().expect("Revision is provided by App")
    }

    /// Subscribes the calling closure to store changes.
    pub fn track(&self) {
        self.0.track();
    }
}

/// A model to pick in a `<select>`: an input or an artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelRef {
    /// `inputs[i]`.
    Input(usize),
    /// `artifacts[i]`.
    Artifact(usize),
}

impl ModelRef {
    /// Encodes for an `<option value>`.
    pub fn key(&self) -> String {
        match self {
            ModelRef::Input(i) => format!("i{i}"),
            ModelRef::Artifact(i) => format!("a{i}"),
        }
    }

    /// Decodes an `<option value>`.
    pub fn parse(s: &str) -> Option<Self> {
        let (kind, n) = s.split_at(1.min(s.len()));
        let n: usize = n.parse().ok()?;
        match kind {
            "i" => Some(ModelRef::Input(n)),
            "a" => Some(ModelRef::Artifact(n)),
            _ => None,
        }
    }
}

/// A model from the store, whichever list it is in.
#[derive(Clone)]
pub enum Picked {
    /// A loaded input.
    Input(Rc<InputModel>),
    /// A produced checkpoint.
    Artifact(Rc<Artifact>),
}

impl Picked {
    /// The parsed model.
    pub fn model(&self) -> &LoadedModel {
        match self {
            Picked::Input(m) => &m.model,
            Picked::Artifact(a) => &a.model,
        }
    }

    /// Its display name.
    pub fn name(&self) -> &str {
        match self {
            Picked::Input(m) => &m.name,
            Picked::Artifact(a) => &a.name,
        }
    }
}

/// Looks a reference up.
pub fn pick(r: &ModelRef) -> Option<Picked> {
    with_store(|s| match r {
        ModelRef::Input(i) => s.inputs.get(*i).cloned().flatten().map(Picked::Input),
        ModelRef::Artifact(i) => s.artifacts.get(*i).cloned().flatten().map(Picked::Artifact),
    })
}

/// `(reference, label, is_moe)` of every model in the store.
pub fn model_choices() -> Vec<(ModelRef, String, bool)> {
    with_store(|s| {
        let inputs = s.live_inputs().map(|(i, m)| {
            (
                ModelRef::Input(i),
                format!("{} — {}", m.name, crate::summary_line(&m.model.config, m.model.moe.as_ref())),
                m.model.moe.is_some(),
            )
        });
        let arts = s.live_artifacts().map(|(i, a)| {
            let e = a.model.moe.as_ref().map(|m| m.total_experts()).unwrap_or(0);
            (ModelRef::Artifact(i), format!("{} — {} ({} experts in all)", a.name, a.method, e), a.model.moe.is_some())
        });
        inputs.chain(arts).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_refs_round_trip() {
        for r in [ModelRef::Input(3), ModelRef::Artifact(0)] {
            assert_eq!(ModelRef::parse(&r.key()), Some(r));
        }
        assert_eq!(ModelRef::parse(""), None);
        assert_eq!(ModelRef::parse("x1"), None);
    }
}
