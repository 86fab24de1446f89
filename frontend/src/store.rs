//! The studio's models, held by its Web Worker ([`crate::worker`]): the
//! loaded inputs and the checkpoints made from them. The page sees them as
//! [`crate::worker::protocol::ModelInfo`]s ([`crate::models`]).
//!
//! Slots never move: a removed model leaves an empty slot, so the
//! [`ModelRef`]s the page holds keep naming the same models, also after the
//! worker restarts and restores them.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use moe_shared::checkpoint::LoadedModel;
use moe_shared::tensor_io::Bytes;
use serde::{Deserialize, Serialize};

use crate::worker::protocol::{ModelInfo, TensorMeta};

/// Where a loaded model came from (what restoring it needs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Origin {
    /// The build's demo (fetched again on restore).
    Demo,
    /// The build's "real model" (`demo/real/`, fetched again on restore).
    Real,
    /// Files the user picked or the page fetched (a server checkpoint),
    /// kept in the browser's storage under these names.
    Files(Vec<String>),
}

/// A model the user loaded (dense, or an MoE checkpoint from disk).
pub struct InputModel {
    /// Display name (unique).
    pub name: String,
    /// The parsed model.
    pub model: LoadedModel,
    /// Total bytes of the files it came from.
    pub file_bytes: u64,
    /// Where it came from.
    pub origin: Origin,
    /// Whether a copy is in the browser's storage.
    pub kept: Cell<bool>,
}

/// A checkpoint the studio produced (upcycled, routed, grafted, MoErged):
/// the exact bytes a download gives, and the same bytes parsed back as a
/// model for the next step.
pub struct Artifact {
    /// Short name (unique), used for the download names
    /// (`stories260K-upcycled-2x`).
    pub name: String,
    /// What made it (`upcycle`, `route`, `graft`, `moerge`).
    pub method: String,
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
    /// Milliseconds the worker took to make it.
    pub millis: f64,
    /// Whether a copy is in the browser's storage.
    pub kept: Cell<bool>,
}

impl Artifact {
    /// The files of its output directory with their bytes, in the CLI's
    /// order.
    pub fn files(&self) -> Vec<(&str, &[u8])> {
        let mut v: Vec<(&str, &[u8])> =
            vec![("model.safetensors", self.safetensors.as_slice()), ("config.json", &self.config_json)];
        if let Some(t) = &self.tokenizer_json {
            v.push(("tokenizer.json", t));
        }
        v.extend(self.extra.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
        v
    }
}

/// Everything loaded or produced in the studio.
#[derive(Default)]
pub struct Store {
    /// Loaded input models, in load order (`None`: removed).
    pub inputs: Vec<Option<Rc<InputModel>>>,
    /// Produced checkpoints, in creation order (`None`: removed).
    pub artifacts: Vec<Option<Rc<Artifact>>>,
}

/// `name`, or `name-2`, `name-3`, ... — the first not in `taken`.
pub fn unique_name<'a>(name: &str, taken: impl IntoIterator<Item = &'a str> + Clone) -> String {
    let free = |n: &str| !taken.clone().into_iter().any(|t| t == n);
    if free(name) {
        return name.to_string();
    }
    (2..).map(|i| format!("{name}-{i}")).find(|n| free(n)).expect("a free name")
}

impl Store {
    /// Every name in use.
    pub fn names(&self) -> Vec<&str> {
        self.live_inputs()
            .map(|(_, m)| m.name.as_str())
            .chain(self.live_artifacts().map(|(_, a)| a.name.as_str()))
            .collect()
    }

    /// `name` made unique among the models in the store.
    pub fn unique(&self, name: &str) -> String {
        unique_name(name, self.names())
    }

    /// Adds a loaded model at the next slot (its name made unique);
    /// returns the slot.
    pub fn add_input(&mut self, mut m: InputModel) -> usize {
        m.name = self.unique(&m.name);
        self.inputs.push(Some(Rc::new(m)));
        self.inputs.len() - 1
    }

    /// Adds a produced checkpoint at the next slot (its name made unique);
    /// returns the slot.
    pub fn add_artifact(&mut self, mut a: Artifact) -> usize {
        a.name = self.unique(&a.name);
        self.artifacts.push(Some(Rc::new(a)));
        self.artifacts.len() - 1
    }

    /// Puts a model back at its slot (restore), growing the lists.
    pub fn put(&mut self, r: &ModelRef, m: Slot) {
        match (r, m) {
            (ModelRef::Input(i), Slot::Input(m)) => {
                if self.inputs.len() <= *i {
                    self.inputs.resize_with(i + 1, || None);
                }
                self.inputs[*i] = Some(Rc::new(m));
            }
            (ModelRef::Artifact(i), Slot::Artifact(a)) => {
                if self.artifacts.len() <= *i {
                    self.artifacts.resize_with(i + 1, || None);
                }
                self.artifacts[*i] = Some(Rc::new(a));
            }
            _ => {}
        }
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

    /// Marks a model as kept or not in the browser's storage.
    pub fn set_kept(&self, r: &ModelRef, kept: bool) {
        match r {
            ModelRef::Input(i) => {
                if let Some(Some(m)) = self.inputs.get(*i) {
                    m.kept.set(kept);
                }
            }
            ModelRef::Artifact(i) => {
                if let Some(Some(a)) = self.artifacts.get(*i) {
                    a.kept.set(kept);
                }
            }
        }
    }

    /// The loaded models still in the store, with their indices.
    pub fn live_inputs(&self) -> impl Iterator<Item = (usize, &Rc<InputModel>)> + Clone {
        self.inputs.iter().enumerate().filter_map(|(i, m)| m.as_ref().map(|m| (i, m)))
    }

    /// The produced checkpoints still in the store, with their indices.
    pub fn live_artifacts(&self) -> impl Iterator<Item = (usize, &Rc<Artifact>)> + Clone {
        self.artifacts.iter().enumerate().filter_map(|(i, a)| a.as_ref().map(|a| (i, a)))
    }

    /// What the page shows of every model.
    pub fn infos(&self) -> Vec<ModelInfo> {
        let inputs = self.live_inputs().map(|(i, m)| info(ModelRef::Input(i), &Picked::Input(m.clone())));
        let arts = self.live_artifacts().map(|(i, a)| info(ModelRef::Artifact(i), &Picked::Artifact(a.clone())));
        inputs.chain(arts).collect()
    }
}

/// A model to put back at a slot.
pub enum Slot {
    /// A loaded model.
    Input(InputModel),
    /// A produced checkpoint.
    Artifact(Artifact),
}

/// The page's view of one model.
pub fn info(r: ModelRef, p: &Picked) -> ModelInfo {
    let m = p.model();
    let (method, bytes, files, millis, kept) = match p {
        Picked::Input(i) => (None, i.file_bytes, Vec::new(), 0.0, i.kept.get()),
        Picked::Artifact(a) => (
            Some(a.method.clone()),
            a.safetensors.len() as u64,
            a.files().into_iter().map(|(n, b)| (n.to_string(), b.len() as u64)).collect(),
            a.millis,
            a.kept.get(),
        ),
    };
    ModelInfo {
        r,
        name: p.name().to_string(),
        method,
        config: m.config.clone(),
        moe: m.moe.clone(),
        format: format!("{:?}", m.format).to_lowercase(),
        bytes,
        tokenizer: m.tokenizer.is_some(),
        tensors: m
            .source
            .tensors()
            .into_iter()
            .map(|t| TensorMeta { name: t.name, dtype: t.dtype.to_string(), shape: t.shape })
            .collect(),
        files,
        millis,
        kept,
    }
}

thread_local! {
    static STORE: RefCell<Store> = RefCell::new(Store::default());
}

/// Reads the store.
pub fn with_store<R>(f: impl FnOnce(&Store) -> R) -> R {
    STORE.with(|s| f(&s.borrow()))
}

/// Changes the store.
pub fn update_store<R>(f: impl FnOnce(&mut Store) -> R) -> R {
    STORE.with(|s| f(&mut s.borrow_mut()))
}

/// A model to pick in a `<select>`: an input or an artifact.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

/// Looks a reference up, or says it is gone.
///
/// # Errors
/// A message naming the slot when the model was removed.
pub fn need(r: &ModelRef) -> Result<Picked, String> {
    pick(r).ok_or_else(|| format!("the chosen model ({}) is no longer loaded: pick another one", r.key()))
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

    #[test]
    fn names_are_made_unique() {
        assert_eq!(unique_name("a", ["b", "c"]), "a");
        assert_eq!(unique_name("a", ["a", "a-2", "b"]), "a-3");
        assert_eq!(unique_name("x-upcycled", ["x-upcycled"]), "x-upcycled-2");
    }
}
