//! Operations described once (issue 37): each file here holds one
//! operation's parameters as a typed struct that derives serde (the tab's
//! worker messages, job specs, recipe sections) and, with the `cli`
//! feature, `clap::Args` (the CLI flattens it), with the defaults, the
//! rules and the form's inputs in one place, and turns them into the
//! method's options (`methods/`).
//!
//! The inputs of an operation (a path in the CLI, a loaded model in the
//! tab, a checkpoint id on the server) stay with the caller; what it is
//! asked to do lives here. So far: [`upcycle`], [`moerge`], [`route`], [`graft`],
//! [`merge`], [`neurons`], [`eval`], [`task`], [`train`], [`convert`].
//!
//! What the callers derive from a parameter struct `P` here instead of
//! listing its fields again:
//! - a job spec flattens it (`#[serde(flatten)]`) and reads itself with
//!   [`split_params`], which keeps the refusal of unknown keys;
//! - the command line the server runs for a job is [`flags`]`(&p)`;
//! - the Jobs page's inputs come from the struct's `form_fields()`.

pub mod convert;
pub mod eval;
pub mod form;
pub mod graft;
pub mod merge;
pub mod moerge;
pub mod neurons;
pub mod route;
pub mod task;
pub mod train;
pub mod upcycle;

pub use form::{Field, Input};

use serde::de::{self, DeserializeOwned, Visitor};
use serde::{Deserialize, Serialize};

/// The index of the first item equal to an earlier one (a frozen expert,
/// a dataset or domain name given twice); `None` when all differ.
pub fn first_repeat<T: PartialEq>(items: &[T]) -> Option<usize> {
    (1..items.len()).find(|&i| items[..i].contains(&items[i]))
}

/// A parameter an operation refuses (its `check`): the field (the serde
/// name, `top_k`) and what was expected. Each caller names it its own way:
/// the CLI as a flag ([`ParamError::flag`]), the server as `spec.FIELD`,
/// the tab next to the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    /// The parameter's field name.
    pub field: &'static str,
    /// What is wrong and what is accepted.
    pub message: String,
}

impl ParamError {
    /// The CLI flag of the field (`--top-k`).
    pub fn flag(&self) -> String {
        format!("--{}", self.field.replace('_', "-"))
    }
}

impl std::fmt::Display for ParamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ParamError {}

/// The command-line flags that give a parameter struct's values to the
/// CLI subcommand that flattens it: `--field-name=value` for each field
/// (`_` -> `-`, clap's long names), lists comma-joined, `None` left out.
/// Every field is written, defaults included, so the command does what the
/// struct says whatever the CLI's defaults, with two spellings that follow
/// from how clap reads them:
/// - a `bool` that is `false` by default is a clap flag: its bare `--flag`
///   when `true`, nothing when `false`; one that is `true` by default is a
///   clap option (`ArgAction::Set`): `--flag=false` when `false`, nothing
///   when `true`; an `Option<bool>` set is `--flag=true|false`;
/// - an empty list is left out when the default is empty too, and written
///   `--no-FIELD` (the CLI's alias for "none", as `--no-frozen`) when the
///   default is not.
///
/// Tested against the CLI's own parser (backend `cli` tests).
pub fn flags<P: Serialize + Default>(params: &P) -> Vec<String> {
    let Ok(serde_json::Value::Object(map)) = serde_json::to_value(params) else { return Vec::new() };
    let defaults = match serde_json::to_value(P::default()) {
        Ok(serde_json::Value::Object(d)) => d,
        _ => serde_json::Map::new(),
    };
    let scalar = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    map.iter()
        .filter_map(|(k, v)| {
            let name = k.replace('_', "-");
            let flag = format!("--{name}");
            let default = defaults.get(k);
            match v {
                serde_json::Value::Null => None,
                serde_json::Value::Bool(b) => match default {
                    Some(serde_json::Value::Bool(true)) => (!b).then(|| format!("{flag}=false")),
                    Some(serde_json::Value::Bool(false)) | None => b.then_some(flag),
                    // An `Option<bool>` (clap reads a value).
                    Some(_) => Some(format!("{flag}={b}")),
                },
                serde_json::Value::Array(a) if a.is_empty() => match default {
                    Some(serde_json::Value::Array(d)) if !d.is_empty() => Some(format!("--no-{name}")),
                    _ => None,
                },
                serde_json::Value::Array(a) => {
                    Some(format!("{flag}={}", a.iter().map(scalar).collect::<Vec<_>>().join(",")))
                }
                v => Some(format!("{flag}={}", scalar(v))),
            }
        })
        .collect()
}

/// Reads a job spec made of its inputs `I` (a struct with
/// `deny_unknown_fields`) and a flattened parameter struct `P` from one
/// JSON object: the keys that are fields of `P` go to `P` (its defaults
/// fill the rest and a `null` value), the others to `I`. serde's `flatten` cannot refuse
/// unknown keys; this does, naming every accepted key.
///
/// # Errors
/// A message for an unknown key, a missing input, or a value of the wrong
/// type (serde's).
pub fn split_params<I: DeserializeOwned, P: DeserializeOwned>(value: serde_json::Value) -> Result<(I, P), String> {
    let serde_json::Value::Object(map) = value else { return Err("expected a JSON object".into()) };
    let (inputs, params) = (fields_of::<I>(), fields_of::<P>());
    if let Some(k) = map.keys().find(|k| !inputs.contains(&k.as_str()) && !params.contains(&k.as_str())) {
        let all: Vec<String> = inputs.iter().chain(params).map(|f| format!("`{f}`")).collect();
        return Err(format!("unknown field `{k}`, expected one of {}", all.join(", ")));
    }
    let (mut p, i): (serde_json::Map<_, _>, serde_json::Map<_, _>) =
        map.into_iter().partition(|(k, _)| params.contains(&k.as_str()));
    // `null` is "unset" (the default), as the specs stored before a
    // parameter moved here wrote their unset options.
    p.retain(|_, v| !v.is_null());
    let i = serde_json::from_value(serde_json::Value::Object(i)).map_err(|e| e.to_string())?;
    let p = serde_json::from_value(serde_json::Value::Object(p)).map_err(|e| e.to_string())?;
    Ok((i, p))
}

/// The field names of a `#[derive(Deserialize)]` struct, as serde's derive
/// declares them (the names a YAML/JSON mapping may use).
///
/// Works by handing the type a deserializer that records the `fields` of
/// `deserialize_struct` and stops; a type that is not a plain struct (an
/// enum, a struct with a flattened field) gives `&[]`.
pub fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut out: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldGrabber(&mut out));
    out
}

struct FieldGrabber<'a>(&'a mut &'static [&'static str]);

impl<'de> de::Deserializer<'de> for FieldGrabber<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> std::result::Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> std::result::Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("fields recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct P {
        rate: f64,
        cap: Option<usize>,
        no_bias: bool,
        layers: Vec<usize>,
        name: String,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct I {
        model: String,
    }

    #[test]
    fn flags_write_every_set_field() {
        let p = P { rate: 0.05, cap: None, no_bias: true, layers: vec![1, 2], name: "a b".into() };
        let mut f = flags(&p);
        f.sort();
        assert_eq!(f, ["--layers=1,2", "--name=a b", "--no-bias", "--rate=0.05"]);
        let mut f = flags(&P { cap: Some(3), layers: vec![4], ..P::default() });
        f.sort();
        assert_eq!(f, ["--cap=3", "--layers=4", "--name=", "--rate=0.0"]);
        // A list that is empty by default is left out when empty.
        assert!(!flags(&P::default()).iter().any(|f| f.contains("layers")));
    }

    /// A struct whose defaults are a `true` and a non-empty list.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Q {
        norm: bool,
        frozen: Vec<usize>,
        normalize: Option<bool>,
    }

    impl Default for Q {
        fn default() -> Self {
            Q { norm: true, frozen: vec![0], normalize: None }
        }
    }

    #[test]
    fn flags_spell_true_defaults_and_emptied_lists_as_the_cli_reads_them() {
        assert_eq!(flags(&Q::default()), ["--frozen=0"]);
        let mut f = flags(&Q { norm: false, frozen: vec![], normalize: Some(false) });
        f.sort();
        assert_eq!(f, ["--no-frozen", "--norm=false", "--normalize=false"]);
        let mut f = flags(&Q { norm: true, frozen: vec![1, 2], normalize: Some(true) });
        f.sort();
        assert_eq!(f, ["--frozen=1,2", "--normalize=true"]);
    }

    #[test]
    fn split_params_refuses_unknown_keys_naming_all() {
        let (i, p): (I, P) = split_params(serde_json::json!({"model": "m", "rate": 0.5})).unwrap();
        assert_eq!((i, p), (I { model: "m".into() }, P { rate: 0.5, ..P::default() }));
        let e = split_params::<I, P>(serde_json::json!({"model": "m", "rat": 0.5})).unwrap_err();
        assert!(e.starts_with("unknown field `rat`, expected one of `model`, `rate`"), "{e}");
        let (_, p): (I, P) = split_params(serde_json::json!({"model": "m", "rate": null})).unwrap();
        assert_eq!(p, P::default(), "null is the default");
        let e = split_params::<I, P>(serde_json::json!({"rate": 0.5})).unwrap_err();
        assert!(e.contains("model"), "{e}");
        assert_eq!(fields_of::<I>(), ["model"]);
    }
}
