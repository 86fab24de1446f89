//! The new-job form as plain data (no signals, so it is tested natively):
//! the job kinds (the registry's, `moe_shared::job_operations!`), one [`Field`] per field of the kind's spec type
//! (both from `shared::jobs`, with the CLI's defaults as hints), the values
//! typed so far ([`FormState`]), the
//! request built from them ([`FormState::build`]) and where an error of
//! the server (`field: "spec.top_k"`) or of the form belongs
//! ([`FieldError`]).

use std::collections::BTreeMap;
use std::str::FromStr;

use moe_shared::api::{CreateJob, DataRef, JobSpec};

/// The kinds, their inputs and defaults are the spec's own (`shared::jobs`).
pub use moe_shared::jobs::{Field, Input, JobKind as Kind};

/// One row of a [`Input::Data`] field: a [`DataRef`] as typed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DataRow {
    /// Dataset / language / domain name.
    pub name: String,
    /// Upload id.
    pub upload: String,
    /// Held-out upload id (route), empty = none.
    pub heldout: String,
    /// Mixture weight (train), empty = 1.
    pub weight: String,
    /// An original language of the model (train).
    pub original: bool,
}

/// What the form holds. Values are kept per field name across kinds, so a
/// model or corpus picked for one kind stays picked for the next.
#[derive(Debug, Clone, PartialEq)]
pub struct FormState {
    /// The kind shown.
    pub kind: Kind,
    /// The job's display name (empty = none).
    pub name: String,
    /// Text, number, choice and single-checkpoint fields.
    pub values: BTreeMap<&'static str, String>,
    /// [`Input::Checkpoints`] fields: ids in the order they were ticked.
    pub picked: BTreeMap<&'static str, Vec<String>>,
    /// [`Input::Data`] fields.
    pub data: BTreeMap<&'static str, Vec<DataRow>>,
}

impl Default for FormState {
    fn default() -> Self {
        Self::new()
    }
}

impl FormState {
    /// The form as first shown: the required numbers and choices filled
    /// in (small values for training, which suit a demo model), every
    /// optional field empty, the spec's minimum of data rows.
    pub fn new() -> Self {
        let values = [
            ("experts", "2"),
            ("stage", "experts"),
            ("method", "linear"),
            ("steps", "20"),
            ("seq_len", "64"),
            ("batch", "4"),
            ("lr", "1e-3"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
        let mut data = BTreeMap::new();
        for k in Kind::ALL {
            for fd in k.fields() {
                if let Input::Data { rows, .. } = fd.input {
                    data.insert(fd.key, vec![DataRow::default(); rows]);
                }
            }
        }
        FormState { kind: Kind::default(), name: String::new(), values, picked: BTreeMap::new(), data }
    }

    /// The value of field `key` ("" when unset).
    pub fn value(&self, key: &str) -> &str {
        self.values.get(key).map(String::as_str).unwrap_or("")
    }

    /// Sets field `key` (`key` must be a field of some kind).
    pub fn set(&mut self, key: &'static str, v: impl Into<String>) {
        self.values.insert(key, v.into());
    }

    /// The checkpoints ticked for field `key`, in order.
    pub fn picked(&self, key: &str) -> &[String] {
        self.picked.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Ticks (appends) or unticks checkpoint `id` of field `key`.
    pub fn tick(&mut self, key: &'static str, id: &str, on: bool) {
        let v = self.picked.entry(key).or_default();
        v.retain(|x| x != id);
        if on {
            v.push(id.to_string());
        }
    }

    /// The rows of data field `key`.
    pub fn rows(&self, key: &str) -> &[DataRow] {
        self.data.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Row `i` of data field `key`, for editing (created when missing).
    pub fn row_mut(&mut self, key: &'static str, i: usize) -> &mut DataRow {
        let v = self.data.entry(key).or_default();
        if v.len() <= i {
            v.resize(i + 1, DataRow::default());
        }
        &mut v[i]
    }

    /// Fills what the user has not chosen yet: empty checkpoint fields
    /// with `checkpoint` (the newest one), empty data rows with the text
    /// uploads (row i the i-th, named after its file).
    pub fn fill_defaults(&mut self, checkpoint: Option<&str>, texts: &[(String, String)]) {
        for k in Kind::ALL {
            for fd in k.fields() {
                match fd.input {
                    Input::Checkpoint => {
                        if let Some(c) = checkpoint.filter(|_| self.value(fd.key).is_empty()) {
                            self.set(fd.key, c);
                        }
                    }
                    Input::Data { .. } if !texts.is_empty() => {
                        let rows = self.data.entry(fd.key).or_default();
                        for (i, r) in rows.iter_mut().enumerate() {
                            if r.upload.is_empty() {
                                let (id, file) = &texts[i % texts.len()];
                                r.upload = id.clone();
                                if r.name.is_empty() {
                                    r.name = data_name(file);
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// The request for the kind shown: each input of the kind
    /// ([`Kind::fields`], the registry's) as its spec field's JSON value,
    /// read by the spec's own deserializer. Nothing here names a kind.
    ///
    /// # Errors
    /// The first field that is missing or does not parse.
    pub fn build(&self) -> Result<CreateJob, FieldError> {
        let mut map = serde_json::Map::new();
        map.insert("kind".into(), self.kind.as_str().into());
        for fd in self.kind.fields() {
            match self.json_value(fd)? {
                Some(v) => {
                    map.insert(fd.key.to_string(), v);
                }
                None if fd.required => return Err(FieldError::form(fd.key, "required")),
                None => {}
            }
        }
        let spec: JobSpec =
            serde_json::from_value(serde_json::Value::Object(map)).map_err(|e| FieldError::form("", e.to_string()))?;
        // An empty name is no name; any other goes through the server's check.
        let name = match self.name.trim() {
            "" => None,
            n => Some(moe_shared::api::check_name("name", n).map_err(|e| FieldError::form("name", e.error))?),
        };
        Ok(CreateJob { spec, backend: None, name })
    }

    fn opt<T: FromStr>(&self, key: &str) -> Result<Option<T>, FieldError> {
        parse_num(self.value(key)).map_err(|e| FieldError::form(key, e))
    }

    /// The spec's JSON value of input `fd` as typed, `None` when empty (the
    /// spec's default): numbers parsed, a [`Input::Flag`] on or off, a
    /// choice as its spec value (a `true` / `false` choice as a `bool`),
    /// lists split at commas, data rows as [`DataRef`]s.
    fn json_value(&self, fd: &Field) -> Result<Option<serde_json::Value>, FieldError> {
        use serde_json::Value;
        let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        Ok(match fd.input {
            Input::Checkpoint => match self.choice(fd.key) {
                Some(id) => Some(Value::String(id)),
                None => return Err(FieldError::form(fd.key, "choose a checkpoint (upload and register one first)")),
            },
            Input::OptCheckpoint => self.choice(fd.key).map(Value::String),
            Input::Checkpoints => Some(strings(self.picked(fd.key).to_vec())),
            Input::Data { .. } => Some(serde_json::to_value(self.data_refs(fd.key)?).unwrap_or_default()),
            Input::Int => self.opt::<u64>(fd.key)?.map(Value::from),
            Input::Float => match self.opt::<f64>(fd.key)? {
                Some(x) => Some(
                    serde_json::Number::from_f64(x)
                        .map(Value::Number)
                        .ok_or_else(|| FieldError::form(fd.key, format!("`{x}` is not a finite number")))?,
                ),
                None => None,
            },
            Input::Flag => Some(Value::Bool(self.value(fd.key) == "true")),
            Input::IntList => self.list::<u64>(fd.key)?.map(Value::from),
            Input::FloatList => self.list::<f64>(fd.key)?.map(Value::from),
            Input::LayerList => self.layers(fd.key)?.map(|l| serde_json::to_value(l).unwrap_or_default()),
            Input::Names => Some(strings(
                self.value(fd.key).split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect(),
            )),
            // `true` / `false` choose a `bool` that is on by default.
            Input::Choice(["true", "false"]) => self.choice(fd.key).map(|c| Value::Bool(c == "true")),
            Input::Choice(_) => self.choice(fd.key).map(|c| Value::String(fd.value_of(&c).to_string())),
        })
    }

    fn choice(&self, key: &str) -> Option<String> {
        Some(self.value(key).to_string()).filter(|v| !v.is_empty())
    }

    fn list<T: FromStr>(&self, key: &str) -> Result<Option<Vec<T>>, FieldError> {
        let v = self.value(key).trim();
        if v.is_empty() {
            return Ok(None);
        }
        if v == "none" {
            return Ok(Some(Vec::new()));
        }
        v.split(',')
            .enumerate()
            .map(|(i, x)| {
                parse_num(x)
                    .and_then(|n| n.ok_or_else(|| "empty entry".to_string()))
                    .map_err(|e| FieldError { index: Some(i), ..FieldError::form(key, e) })
            })
            .collect::<Result<Vec<T>, _>>()
            .map(Some)
    }

    fn layers(&self, key: &str) -> Result<Option<Vec<Option<usize>>>, FieldError> {
        let v = self.value(key).trim();
        if v.is_empty() {
            return Ok(None);
        }
        v.split(',')
            .enumerate()
            .map(|(i, x)| match x.trim() {
                "-" | "dense" => Ok(None),
                x => parse_num(x)
                    .and_then(|n| n.ok_or_else(|| "empty entry (write - for a dense layer)".to_string()).map(Some))
                    .map_err(|e| FieldError { index: Some(i), ..FieldError::form(key, e) }),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    fn data_refs(&self, key: &'static str) -> Result<Vec<DataRef>, FieldError> {
        let Some(Input::Data { weight, original, heldout, .. }) = self.kind.field(key).map(|f| f.input) else {
            return Ok(Vec::new());
        };
        self.rows(key)
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let at = |e: String| FieldError { index: Some(i), ..FieldError::form(key, e) };
                if r.upload.is_empty() {
                    return Err(at("choose an uploaded .txt or .jsonl file".into()));
                }
                Ok(DataRef {
                    name: r.name.trim().to_string(),
                    upload: r.upload.clone(),
                    weight: if weight { parse_num(&r.weight).map_err(|e| at(format!("weight: {e}")))? } else { None },
                    original: original && r.original,
                    heldout: Some(r.heldout.clone()).filter(|h| heldout && !h.is_empty()),
                })
            })
            .collect()
    }
}

/// A dataset name from a file name: its stem, limited to `[A-Za-z0-9_-]`
/// (`hu.train.txt` -> `hu`).
pub fn data_name(file: &str) -> String {
    let stem = file.split('.').next().unwrap_or("");
    let label: String = stem.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').take(64).collect();
    if label.is_empty() {
        "data".into()
    } else {
        label
    }
}

/// Parses a number as typed: empty = `None`; surrounding spaces and `_`
/// separators are ignored.
///
/// # Errors
/// A sentence quoting the text.
pub fn parse_num<T: FromStr>(s: &str) -> Result<Option<T>, String> {
    let t: String = s.trim().chars().filter(|c| *c != '_').collect();
    if t.is_empty() {
        return Ok(None);
    }
    t.parse().map(Some).map_err(|_| format!("`{}` is not a valid number here", s.trim()))
}

/// Where an error of the form or of the server belongs: the tab's one
/// refusal type.
pub use crate::validate::FieldError;

impl FieldError {
    /// Places the server's error `field` / `message` on the form of `kind`
    /// (`spec.top_k` -> `top_k`; `spec.data[0].upload` -> `data`, row 0,
    /// `.upload`; `name` -> the job name). A field the form has no input for
    /// (`spec`, `backend`) gives an empty `key`.
    pub fn from_server(kind: Kind, field: Option<&str>, message: &str) -> Self {
        let general = FieldError { key: String::new(), index: None, sub: String::new(), message: message.into() };
        let Some(field) = field else { return general };
        if field == "name" {
            return FieldError::form("name", message);
        }
        let Some(path) = field.strip_prefix("spec.") else { return general };
        let e = FieldError::at_path(path, message);
        match kind.field(&e.key) {
            Some(fd) => FieldError { key: fd.key.to_string(), ..e },
            None => general,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moe_shared::api::{TrainEngine, UpcycleSpec};
    use moe_shared::ops::upcycle::{RouterInitArg, UpcycleParams};

    const A: &str = "123e4567-e89b-42d3-a456-426614174000";
    const B: &str = "123e4567-e89b-42d3-a456-426614174001";
    const U: &str = "123e4567-e89b-42d3-a456-426614174002";

    /// Every field set to a valid value (lists with two entries).
    fn full(kind: Kind) -> FormState {
        let mut s = FormState { kind, ..FormState::new() };
        for fd in kind.fields() {
            match fd.input {
                Input::Checkpoint | Input::OptCheckpoint => s.set(fd.key, A),
                Input::Checkpoints => {
                    s.tick(fd.key, A, true);
                    s.tick(fd.key, B, true);
                }
                Input::Data { .. } => {
                    *s.row_mut(fd.key, 0) = DataRow {
                        name: "en".into(),
                        upload: U.into(),
                        heldout: U.into(),
                        weight: "2".into(),
                        original: true,
                    };
                    *s.row_mut(fd.key, 1) = DataRow { name: "hu".into(), upload: U.into(), ..DataRow::default() };
                }
                // top-k within the two domains / models of the lists above
                Input::Int if fd.key == "top_k" => s.set(fd.key, "2"),
                Input::Int => s.set(fd.key, "3"),
                Input::Flag => s.set(fd.key, "true"),
                Input::Float => s.set(fd.key, "0.5"),
                Input::Choice(c) => s.set(fd.key, c[1]),
                Input::IntList => s.set(fd.key, "0,1"),
                Input::LayerList => s.set(fd.key, "2,-"),
                Input::FloatList => s.set(fd.key, "0.5,0.5"),
                Input::Names => s.set(fd.key, "hu"),
            }
        }
        s
    }

    #[test]
    fn every_kind_maps_its_inputs_one_to_one_to_the_spec_fields() {
        for kind in Kind::ALL {
            let req = full(kind).build().unwrap();
            assert_eq!(req.spec.kind(), kind.as_str());
            assert_eq!(Kind::parse(kind.as_str()), Some(kind));
            let json = serde_json::to_value(&req.spec).unwrap();
            let mut keys: Vec<&str> =
                json.as_object().unwrap().keys().map(String::as_str).filter(|k| *k != "kind").collect();
            let mut inputs: Vec<&str> = kind.fields().iter().map(|f| f.key).collect();
            keys.sort();
            inputs.sort();
            assert_eq!(keys, inputs, "{kind:?}");
            // and every input reaches the spec: no field is left at null
            for (k, v) in json.as_object().unwrap() {
                assert!(!v.is_null(), "{kind:?}.{k} was not filled from its input");
            }
            // the server's own checks of the field values pass (apart from
            // the kinds whose two "exactly one of" fields were both filled)
            if kind != Kind::Upcycle {
                req.spec.validate().unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            }
        }
    }

    #[test]
    fn input_test_ids_do_not_collide_with_the_page_s_other_ids() {
        // `job-{key}` must not be a test id of the job card or the form itself.
        let taken = ["kind", "name", "submit", "live", "state", "live-stage", "step", "loss", "tps", "eta", "events"];
        let taken2 = ["cancel", "resume", "open", "log", "error", "artifacts", "follow"];
        for k in Kind::ALL {
            for fd in k.fields() {
                assert!(!taken.contains(&fd.key) && !taken2.contains(&fd.key), "{k:?}.{}", fd.key);
                assert!(!fd.key.starts_with("form-") && !fd.key.starts_with("row-"), "{}", fd.key);
            }
        }
    }

    #[test]
    fn empty_optional_fields_are_the_server_defaults() {
        let mut s = FormState::new();
        s.set("model", A);
        let req = s.build().unwrap();
        assert_eq!(
            req.spec,
            JobSpec::Upcycle(UpcycleSpec {
                model: A.into(),
                experts: Some(2),
                experts_per_layer: None,
                dtype: None,
                params: UpcycleParams::default(),
            })
        );
        assert_eq!(req.name, None);
        req.spec.validate().unwrap();

        s.kind = Kind::Eval;
        s.fill_defaults(Some(B), &[(U.to_string(), "hu.txt".to_string())]);
        s.set("window", " 64 ");
        s.name = " ppl ".into();
        let req = s.build().unwrap();
        let JobSpec::Eval(e) = &req.spec else { panic!() };
        assert_eq!(e.model, A, "a chosen checkpoint is kept");
        assert_eq!(
            e.data,
            vec![DataRef { name: "hu".into(), upload: U.into(), weight: None, original: false, heldout: None }]
        );
        let d = moe_shared::ops::eval::EvalParams::default();
        assert_eq!(e.params, moe_shared::ops::eval::EvalParams { window: 64, ..d });
        assert_eq!(req.name.as_deref(), Some("ppl"));
    }

    #[test]
    fn train_reads_weight_and_original_eval_does_not() {
        let mut s = FormState { kind: Kind::Train, ..FormState::new() };
        s.set("model", A);
        *s.row_mut("data", 0) =
            DataRow { name: "hu".into(), upload: U.into(), weight: "0.5".into(), original: true, ..Default::default() };
        let JobSpec::Train(t) = s.build().unwrap().spec else { panic!() };
        assert_eq!((t.steps, t.params.seq_len, t.params.batch, t.params.lr), (20, 64, 4, Some(1e-3)));
        assert_eq!((t.data[0].weight, t.data[0].original), (Some(0.5), true));
        assert_eq!(t.engine, None, "unset: the server's default (burn)");
        s.set("engine", "torch");
        let JobSpec::Train(t) = s.build().unwrap().spec else { panic!() };
        assert_eq!(t.engine, Some(TrainEngine::Torch));
        s.kind = Kind::Eval;
        let JobSpec::Eval(e) = s.build().unwrap().spec else { panic!() };
        assert_eq!((e.data[0].weight, e.data[0].original), (None, false));
    }

    #[test]
    fn task_jobs_carry_the_delimiter_they_name() {
        let mut s = FormState { kind: Kind::Task, ..FormState::new() };
        s.set("model", A);
        *s.row_mut("tasks", 0) = DataRow { name: "en".into(), upload: U.into(), ..Default::default() };
        let JobSpec::Task(t) = s.build().unwrap().spec else { panic!() };
        assert_eq!((t.params.target_delimiter.as_str(), t.params.limit, t.tasks[0].name.as_str()), (" ", None, "en"));
        s.set("target_delimiter", "none");
        s.set("limit", "10");
        let req = s.build().unwrap();
        req.spec.validate().unwrap();
        let JobSpec::Task(t) = req.spec else { panic!() };
        assert_eq!((t.params.target_delimiter.as_str(), t.params.limit), ("", Some(10)));
        s.set("target_delimiter", "space");
        let JobSpec::Task(t) = s.build().unwrap().spec else { panic!() };
        assert_eq!(t.params.target_delimiter, " ");
    }

    #[test]
    fn lists_and_choices() {
        let mut s = FormState::new();
        s.set("model", A);
        s.set("experts", "");
        s.set("experts_per_layer", "2, -,4");
        s.set("frozen", "none");
        s.set("router_init", "random");
        let JobSpec::Upcycle(u) = s.build().unwrap().spec else { panic!() };
        assert_eq!(u.experts_per_layer, Some(vec![Some(2), None, Some(4)]));
        assert_eq!(u.params.frozen, Vec::<usize>::new());
        assert_eq!(u.params.router_init, RouterInitArg::Random);
        s.set("norm_topk", "false");
        let JobSpec::Upcycle(u) = s.build().unwrap().spec else { panic!() };
        assert!(!u.params.norm_topk);
        // What the server runs: none frozen and the un-normalised top-k as the CLI reads them.
        let argv = moe_shared::ops::flags(&u.params);
        assert!(
            argv.contains(&"--no-frozen".to_string()) && argv.contains(&"--norm-topk=false".to_string()),
            "{argv:?}"
        );
        s.set("frozen", "0,x");
        let e = s.build().unwrap_err();
        assert_eq!((e.key.as_str(), e.index), ("frozen", Some(1)));
        assert_eq!(e.text(), "#2: `x` is not a valid number here");

        let mut m = FormState { kind: Kind::Moerge, ..FormState::new() };
        m.tick("models", B, true);
        m.tick("models", A, true);
        m.tick("models", B, false);
        m.tick("models", B, true);
        let JobSpec::Moerge(x) = m.build().unwrap().spec else { panic!() };
        assert_eq!(x.models, vec![A.to_string(), B.to_string()], "in the order ticked");
    }

    #[test]
    fn numbers_parse_or_name_the_field() {
        assert_eq!(parse_num::<usize>(" 1_000 "), Ok(Some(1000)));
        assert_eq!(parse_num::<f64>("1e-3"), Ok(Some(1e-3)));
        assert_eq!(parse_num::<usize>(""), Ok(None));
        assert!(parse_num::<usize>("-1").is_err());
        assert!(parse_num::<usize>("2.5").is_err());
        let mut s = FormState::new();
        s.set("model", A);
        s.set("top_k", "two");
        assert_eq!(s.build().unwrap_err(), FieldError::form("top_k", "`two` is not a valid number here"));
        s.set("model", "");
        assert_eq!(s.build().unwrap_err().key, "model");
        let mut t = FormState { kind: Kind::Route, ..FormState::new() };
        t.set("model", A);
        let e = t.build().unwrap_err();
        assert_eq!((e.key.as_str(), e.index), ("domains", Some(0)), "a data row without a file");
        assert_eq!(data_name("hu.train.txt"), "hu");
        assert_eq!(data_name("ü.txt"), "data");
    }

    #[test]
    fn server_fields_land_on_their_inputs() {
        let e = FieldError::from_server(Kind::Upcycle, Some("spec.top_k"), "3 is more than the 2 experts of a layer");
        assert_eq!((e.key.as_str(), e.index, e.sub.as_str()), ("top_k", None, ""));
        assert_eq!(e.text(), "3 is more than the 2 experts of a layer");
        let e = FieldError::from_server(Kind::Eval, Some("spec.data[0].upload"), "upload x not found");
        assert_eq!((e.key.as_str(), e.index, e.sub.as_str()), ("data", Some(0), ".upload"));
        assert_eq!(e.text(), "#1 upload: upload x not found");
        let e = FieldError::from_server(Kind::Moerge, Some("spec.models[1]"), "is an MoE");
        assert_eq!((e.key.as_str(), e.index), ("models", Some(1)));
        assert_eq!(FieldError::from_server(Kind::Train, Some("name"), "too long").key, "name");
        for (kind, f) in [
            (Kind::Train, Some("spec")),
            (Kind::Train, Some("backend")),
            (Kind::Eval, None),
            (Kind::Graft, Some("spec.top_k")),
        ] {
            assert_eq!(FieldError::from_server(kind, f, "x").key, "", "{f:?} has no input on {kind:?}");
        }
    }
}
