//! Key checking for recipes: every mapping of a recipe is checked against
//! the fields of the serde type it becomes ([`fields_of`], so the list of
//! supported keys is the type itself, never a second list), keys mergekit
//! knows but the studio does not implement are refused with the reason,
//! and an unknown key gets the nearest supported one (Levenshtein distance,
//! `strsim`) as a suggestion. docs/methods.md §6.1 "mergekit recipes".

use serde_yaml_ng::{Mapping, Value};

use crate::error::{Result, StudioError};

pub use crate::ops::fields_of;

/// The candidate nearest to `word` by Levenshtein distance, when it is
/// close enough to be a likely misspelling (distance at most 3 and less
/// than half the word's length, or one is a prefix of the other).
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let w = word.to_ascii_lowercase();
    let (best, dist) = candidates
        .into_iter()
        .map(|c| (c, strsim::levenshtein(&w, &c.to_ascii_lowercase())))
        .min_by_key(|&(_, d)| d)?;
    let prefix = best.starts_with(&w) || w.starts_with(best);
    ((dist <= 3 && dist * 2 < w.len().max(2)) || (prefix && w.len() >= 3)).then_some(best)
}

/// A key mergekit (or mergekit-moe) accepts that the studio refuses, with
/// the reason and what to do instead.
pub type Refused = (&'static str, &'static str);

/// Checks the keys of the mapping at `path` (`""` for the top level)
/// against `allowed` (normally [`fields_of`] of its type) and `refused`.
///
/// # Errors
/// [`StudioError::Config`] naming `source` and the key's path: a refused
/// key with its reason; an unknown key with the nearest allowed key (or
/// the list of allowed keys); a value that is not a mapping.
pub fn check_keys<'v>(
    source: &str,
    path: &str,
    value: &'v Value,
    allowed: &[&str],
    refused: &[Refused],
) -> Result<&'v Mapping> {
    let Value::Mapping(map) = value else {
        let what = if path.is_empty() { "the recipe".to_string() } else { format!("`{path}`") };
        return Err(StudioError::config(source, format!("{what} must be a mapping of keys to values")));
    };
    for k in map.keys() {
        let Some(k) = k.as_str() else {
            return Err(StudioError::config(source, format!("{}: keys must be strings (got {k:?})", at(path))));
        };
        if allowed.contains(&k) {
            continue;
        }
        let full = join(path, k);
        if let Some((_, why)) = refused.iter().find(|(r, _)| *r == k) {
            return Err(StudioError::config(source, format!("`{full}` is not supported: {why}")));
        }
        let hint = match nearest(k, allowed.iter().copied()) {
            Some(n) => format!("did you mean `{}`?", join(path, n)),
            None => format!("the keys here are: {}", allowed.join(", ")),
        };
        return Err(StudioError::config(source, format!("unknown key `{full}`: {hint}")));
    }
    Ok(map)
}

/// `path.key` (or `key` at the top level).
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn at(path: &str) -> String {
    if path.is_empty() {
        "the recipe".into()
    } else {
        format!("`{path}`")
    }
}

/// The value of `key` in `map`, when present and not `null`.
pub fn get<'v>(map: &'v Mapping, key: &str) -> Option<&'v Value> {
    map.get(key).filter(|v| !v.is_null())
}

/// A number (an integer or float YAML scalar) at `path`.
///
/// # Errors
/// [`StudioError::Config`]: a list (mergekit's gradients and per-tensor
/// `filter` lists are not supported) or another non-number.
pub fn number(source: &str, path: &str, v: &Value) -> Result<f64> {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(x) if x.is_finite() => Ok(x),
            Some(x) => Err(StudioError::config(source, format!("`{path}`: {x} is not a finite number"))),
            None => Err(StudioError::config(source, format!("`{path}`: not a number"))),
        },
        Value::Sequence(_) => Err(StudioError::config(
            source,
            format!(
                "`{path}`: per-layer gradients and per-tensor `filter` lists are not supported; give one number \
                 for every tensor"
            ),
        )),
        other => Err(StudioError::config(source, format!("`{path}`: expected a number, got {}", kind(other)))),
    }
}

/// The JSON of the YAML value at `path` (a section handed to a serde
/// type). YAML writes infinities and NaN (`.inf`, `.nan`) that JSON cannot
/// hold: `serde_json` would make them `null`, which a field with a default
/// then reads as its default (a recipe's `scale: .inf` ran with scale 1), so
/// they are refused here, naming the key.
///
/// # Errors
/// [`StudioError::Config`] naming `source` and the key path of a
/// non-finite number, or what `serde_json` cannot represent.
pub fn to_json(source: &str, path: &str, v: &Value) -> Result<serde_json::Value> {
    fn check(source: &str, path: &str, v: &Value) -> Result<()> {
        match v {
            Value::Number(n) if n.as_f64().is_some_and(|x| !x.is_finite()) => Err(StudioError::config(
                source,
                format!("`{path}`: {} is not a finite number", n.as_f64().unwrap_or_default()),
            )),
            Value::Sequence(items) => {
                items.iter().enumerate().try_for_each(|(i, x)| check(source, &format!("{path}[{i}]"), x))
            }
            Value::Mapping(m) => m.iter().try_for_each(|(k, x)| {
                let key = k.as_str().map(str::to_string).unwrap_or_else(|| format!("{k:?}"));
                check(source, &if path.is_empty() { key.clone() } else { format!("{path}.{key}") }, x)
            }),
            Value::Tagged(t) => check(source, path, &t.value),
            _ => Ok(()),
        }
    }
    check(source, path, v)?;
    serde_json::to_value(v).map_err(|e| StudioError::config(source, format!("`{path}`: {e}")))
}

/// A boolean at `path`.
///
/// # Errors
/// [`StudioError::Config`] for anything else (lists included).
pub fn boolean(source: &str, path: &str, v: &Value) -> Result<bool> {
    match v {
        Value::Bool(b) => Ok(*b),
        other => Err(StudioError::config(source, format!("`{path}`: expected true or false, got {}", kind(other)))),
    }
}

/// A string at `path`.
///
/// # Errors
/// [`StudioError::Config`] for anything else.
pub fn string(source: &str, path: &str, v: &Value) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        other => Err(StudioError::config(source, format!("`{path}`: expected a string, got {}", kind(other)))),
    }
}

/// A list of strings at `path`.
///
/// # Errors
/// [`StudioError::Config`] for anything else.
pub fn strings(source: &str, path: &str, v: &Value) -> Result<Vec<String>> {
    match v {
        Value::Sequence(s) => s.iter().enumerate().map(|(i, x)| string(source, &format!("{path}[{i}]"), x)).collect(),
        other => Err(StudioError::config(source, format!("`{path}`: expected a list of strings, got {}", kind(other)))),
    }
}

/// The YAML kind of `v`, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Two {
        merge_method: String,
        #[serde(default)]
        base_model: Option<String>,
    }

    #[test]
    fn fields_come_from_the_type_and_misspellings_get_the_nearest() {
        assert_eq!(fields_of::<Two>(), &["merge_method", "base_model"]);
        assert_eq!(fields_of::<u32>(), &[] as &[&str]);
        assert_eq!(nearest("merge_metod", ["merge_method", "base_model"]), Some("merge_method"));
        assert_eq!(nearest("basemodel", ["merge_method", "base_model"]), Some("base_model"));
        assert_eq!(nearest("tokenizer", ["merge_method", "base_model"]), None);
        let v: Value = serde_yaml_ng::from_str("merge_method: ties\nbase_modle: x\n").unwrap();
        let e = check_keys("r.yml", "", &v, fields_of::<Two>(), &[]).unwrap_err().to_string();
        assert_eq!(e, "r.yml: unknown key `base_modle`: did you mean `base_model`?");
        let v: Value = serde_yaml_ng::from_str("merge_method: ties\nslices: []\n").unwrap();
        let e = check_keys("r.yml", "", &v, fields_of::<Two>(), &[("slices", "no layer ranges")]).unwrap_err();
        assert_eq!(e.to_string(), "r.yml: `slices` is not supported: no layer ranges");
        let v: Value = serde_yaml_ng::from_str("zzz: 1\n").unwrap();
        let e = check_keys("r.yml", "models[0]", &v, fields_of::<Two>(), &[]).unwrap_err().to_string();
        assert!(e.contains("unknown key `models[0].zzz`: the keys here are: merge_method, base_model"), "{e}");
    }
}
