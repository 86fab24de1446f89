//! The multiple-choice task format: a JSONL file, one item per line,
//! `{"context": STRING, "choices": [STRING, ...], "gold": INDEX}` (other
//! fields are ignored). It is what an lm-evaluation-harness task YAML with
//! `doc_to_text: context`, `doc_to_choice: choices`, `doc_to_target: gold`
//! and `dataset_path: json` reads, so the same file runs in both
//! (`tests/reference/check_task_eval.py`). How an item is scored:
//! [`super::multiple_choice`].
//!
//! Every line is checked before anything runs; a bad line is refused with
//! the file, the line number and what was expected. Where lm-eval is
//! lenient the studio refuses what would make the scores meaningless: a
//! gold index out of range (lm-eval warns and scores the item 0), an empty
//! context (lm-eval conditions on its tokenizer's BOS/EOS token, which a
//! `tokenizer.json` does not name), an empty choice, fewer than 2 choices,
//! a gold given as a list or a string.

use serde::{Deserialize, Serialize};

use crate::error::{Result, StudioError};

/// The format's name in error messages.
const FORMAT: &str = "multiple-choice task (JSONL)";

/// Most items a task may hold (a bound on what one file can make the
/// scorer allocate; lm-eval's largest common tasks, MMLU and HellaSwag,
/// have ~14k and ~10k test items).
pub const MAX_ITEMS: usize = 1_000_000;

/// Most choices per item.
pub const MAX_CHOICES: usize = 1024;

/// One multiple-choice item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McItem {
    /// 1-based line of the file it was read from.
    pub line: usize,
    /// The text the choices continue (non-empty).
    pub context: String,
    /// The candidate continuations (at least 2, none empty), without the
    /// target delimiter.
    pub choices: Vec<String>,
    /// Index of the correct choice.
    pub gold: usize,
}

/// A parsed task: its items in file order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McTask {
    /// Where it was read from (error messages, reports).
    pub file: String,
    /// The items (at least one).
    pub items: Vec<McItem>,
}

impl McTask {
    /// Parses a JSONL task. Blank lines are skipped (as JSON-lines readers
    /// do); line numbers count every line from 1.
    ///
    /// # Errors
    /// [`StudioError::Format`] naming `file` and the line for: a line that
    /// is not a JSON object; a missing or non-string `context`, or an empty
    /// one; a missing or non-list `choices`, fewer than 2 or more than
    /// [`MAX_CHOICES`] of them, a choice that is not a string or is empty;
    /// a missing `gold`, one that is not a non-negative integer (`1.0`,
    /// `"1"`, `[1]`, `-1`), or one out of range of the choices. Also a file
    /// with no item or more than [`MAX_ITEMS`].
    pub fn parse(text: &str, file: &str) -> Result<McTask> {
        let mut items = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            if raw.trim().is_empty() {
                continue;
            }
            if items.len() == MAX_ITEMS {
                return Err(StudioError::format(file, FORMAT, format!("more than {MAX_ITEMS} items")));
            }
            items.push(parse_line(raw, line, file)?);
        }
        if items.is_empty() {
            return Err(StudioError::format(
                file,
                FORMAT,
                "no items: expected one JSON object per line with `context`, `choices` and `gold`",
            ));
        }
        Ok(McTask { file: file.to_string(), items })
    }

    /// The first `limit` items (all when `None`), as lm-eval's `--limit N`.
    pub fn limited(mut self, limit: Option<usize>) -> McTask {
        if let Some(n) = limit {
            self.items.truncate(n);
        }
        self
    }
}

fn parse_line(raw: &str, line: usize, file: &str) -> Result<McItem> {
    let err = |what: String| StudioError::format(file, FORMAT, format!("line {line}: {what}"));
    let v: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| err(format!("not valid JSON ({e}); expected one object per line")))?;
    let obj = v.as_object().ok_or_else(|| err(format!("expected a JSON object, found {}", kind(&v))))?;
    let context =
        match obj.get("context") {
            None => return Err(err("no `context` (the text the choices continue)".into())),
            Some(serde_json::Value::String(s)) if s.is_empty() => return Err(err(
                "`context` is empty: lm-eval would condition on its tokenizer's BOS/EOS token, which the studio does \
                 not guess; put the text before the choices in `context`"
                    .into(),
            )),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => return Err(err(format!("`context` must be a string, found {}", kind(other)))),
        };
    let choices = match obj.get("choices") {
        None => return Err(err("no `choices` (a list of at least 2 strings)".into())),
        Some(serde_json::Value::Array(a)) => a,
        Some(other) => return Err(err(format!("`choices` must be a list of strings, found {}", kind(other)))),
    };
    if choices.len() < 2 || choices.len() > MAX_CHOICES {
        return Err(err(format!("{} choice(s): expected 2 to {MAX_CHOICES}", choices.len())));
    }
    let choices = choices
        .iter()
        .enumerate()
        .map(|(j, c)| match c {
            serde_json::Value::String(s) if s.is_empty() => Err(err(format!("choice {j} is empty"))),
            serde_json::Value::String(s) => Ok(s.clone()),
            other => Err(err(format!("choice {j} must be a string, found {}", kind(other)))),
        })
        .collect::<Result<Vec<String>>>()?;
    let n = choices.len();
    let gold = match obj.get("gold") {
        None => return Err(err(format!("no `gold` (the index of the correct choice, 0-{})", n - 1))),
        Some(g) => match g.as_u64() {
            Some(x) if usize::try_from(x).is_ok_and(|x| x < n) => x as usize,
            Some(x) => return Err(err(format!("`gold` {x} is out of range: the item has {n} choices (0-{})", n - 1))),
            None => {
                return Err(err(format!(
                    "`gold` must be a non-negative integer index (0-{}), found {}",
                    n - 1,
                    describe(g)
                )))
            }
        },
    };
    Ok(McItem { line, context, choices, gold })
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// `kind` with the value for numbers and short strings (`-1`, `1.5`, `"1"`).
fn describe(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Number(x) => format!("{x}"),
        serde_json::Value::String(s) if s.chars().count() <= 20 => format!("the string {s:?}"),
        other => kind(other).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(line: &str) -> Result<McTask> {
        McTask::parse(line, "t.jsonl")
    }

    #[test]
    fn parses_items_and_skips_blank_lines() {
        let text = "{\"context\":\"a\",\"choices\":[\"x\",\"y\"],\"gold\":1,\"id\":7}\n\n  \n\
                    {\"context\":\"b c \",\"choices\":[\"p\",\"q\",\"r\"],\"gold\":0}\n";
        let t = McTask::parse(text, "t.jsonl").unwrap();
        assert_eq!(t.items.len(), 2);
        assert_eq!(t.items[0], McItem { line: 1, context: "a".into(), choices: vec!["x".into(), "y".into()], gold: 1 });
        assert_eq!((t.items[1].line, t.items[1].context.as_str(), t.items[1].gold), (4, "b c ", 0));
        assert_eq!(t.clone().limited(Some(1)).items.len(), 1);
        assert_eq!(t.limited(None).items.len(), 2);
    }

    #[test]
    fn bad_lines_name_file_line_and_expectation() {
        let ok = "{\"context\":\"a\",\"choices\":[\"x\",\"y\"],\"gold\":0}\n";
        let cases = [
            ("{\"context\":\"a\",\"gold\":0}", "no `choices`"),
            (
                "{\"context\":\"a\",\"choices\":\"xy\",\"gold\":0}",
                "`choices` must be a list of strings, found a string",
            ),
            ("{\"context\":\"a\",\"choices\":[\"x\"],\"gold\":0}", "1 choice(s): expected 2"),
            ("{\"context\":\"a\",\"choices\":[\"x\",3],\"gold\":0}", "choice 1 must be a string, found a number"),
            ("{\"context\":\"a\",\"choices\":[\"x\",\"\"],\"gold\":0}", "choice 1 is empty"),
            (
                "{\"context\":\"a\",\"choices\":[\"x\",\"y\"],\"gold\":2}",
                "`gold` 2 is out of range: the item has 2 choices (0-1)",
            ),
            ("{\"context\":\"a\",\"choices\":[\"x\",\"y\"],\"gold\":-1}", "non-negative integer index (0-1), found -1"),
            ("{\"context\":\"a\",\"choices\":[\"x\",\"y\"],\"gold\":1.0}", "found 1.0"),
            ("{\"context\":\"a\",\"choices\":[\"x\",\"y\"],\"gold\":\"1\"}", "found the string \"1\""),
            ("{\"context\":\"a\",\"choices\":[\"x\",\"y\"],\"gold\":[1]}", "found a list"),
            ("{\"context\":\"a\",\"choices\":[\"x\",\"y\"]}", "no `gold`"),
            ("{\"choices\":[\"x\",\"y\"],\"gold\":0}", "no `context`"),
            ("{\"context\":\"\",\"choices\":[\"x\",\"y\"],\"gold\":0}", "`context` is empty"),
            ("{\"context\":3,\"choices\":[\"x\",\"y\"],\"gold\":0}", "`context` must be a string, found a number"),
            ("[1,2]", "expected a JSON object, found a list"),
            ("{\"context\": \"a\"", "not valid JSON"),
        ];
        for (bad, want) in cases {
            let e = one(&format!("{ok}\n{bad}\n")).unwrap_err().to_string();
            assert!(e.starts_with("t.jsonl: malformed multiple-choice task (JSONL): line 3: "), "{e}");
            assert!(e.contains(want), "{bad}: {e}");
        }
        assert!(one("\n \n").unwrap_err().to_string().contains("no items"));
    }
}
