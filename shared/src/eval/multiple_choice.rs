//! Multiple-choice task accuracy with the lm-evaluation-harness semantics
//! (`output_type: multiple_choice`; read in lm-eval 0.4.13:
//! `lm_eval/api/task.py` `construct_requests` / `process_results`,
//! `lm_eval/api/model.py` `_encode_pair`, `lm_eval/models/huggingface.py`
//! `tok_encode` / `_loglikelihood_tokens`, `lm_eval/api/metrics.py`
//! `mean_stderr`). docs/methods.md "Task accuracy" says it in words.
//!
//! For an item with context `c` and choices `x_0 .. x_{n-1}`:
//! 1. each choice is one request `(c, d + x_i)`, `d` the target delimiter
//!    (`" "` unless the task sets another, e.g. `""`);
//! 2. trailing whitespace of `c` moves to the front of the continuation;
//!    `whole = encode(c + cont)`, `ctx = encode(c)`, and the continuation's
//!    tokens are `whole[len(ctx)..]` (so a token that spans the boundary is
//!    scored with the continuation). `encode` uses the tokenizer's own
//!    special-token behaviour (lm-eval's `add_bos_token` default `None`):
//!    SmolLM2 and Qwen add nothing, llama2.c vocabularies (stories260K) and
//!    Llama/Gemma tokenizers prepend BOS to both — except for a string
//!    that already starts with that BOS token's text, which is encoded
//!    without special tokens;
//! 3. the model reads `(ctx + cont)[-(L + 1)..][..-1]` (`L` the model's
//!    context, left truncation) and the request's log-likelihood `ll_i` is
//!    the sum of the log-softmax probabilities of the continuation tokens;
//!    `greedy_i` says whether each was the arg-max token;
//! 4. `pred = argmax ll_i`, `pred_norm = argmax ll_i / chars(x_i)` (Unicode
//!    characters of the choice without delimiter: Python's `len`), and
//!    `pred_bytes = argmax ll_i / bytes(x_i)` (UTF-8 bytes; lm-eval's
//!    `acc_bytes`); ties go to the first index (`np.argmax`);
//! 5. `acc`, `acc_norm`, `acc_bytes` are the means over items of
//!    `pred == gold`, and their standard errors the sample standard
//!    deviation over `sqrt(n)` (`mean_stderr`; none for one item).
//!
//! Requests run longest first in right-padded batches
//! ([`crate::model::Padding`]); the numbers do not depend on the batch size
//! beyond float summation order.

use burn::tensor::{activation::log_softmax, backend::Backend, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::task::McTask;
use crate::error::{Result, StudioError};
use crate::model::{ForwardOptions, Padding, Routing, Transformer};
use crate::tokenizer::Tokenizer;

/// Rows of hidden states sent through the LM head at once.
const HEAD_ROWS: usize = 512;

/// How a task is scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McOptions {
    /// Put between the context and each choice (lm-eval's
    /// `target_delimiter`, default `" "`).
    pub target_delimiter: String,
    /// Requests (context + one choice) per forward pass.
    pub batch: usize,
}

impl Default for McOptions {
    /// lm-eval's delimiter `" "`; the batch of `eval --batch`
    /// ([`super::PerplexityOptions::DEFAULT_BATCH`], the flag is shared).
    fn default() -> Self {
        McOptions { target_delimiter: " ".into(), batch: super::PerplexityOptions::DEFAULT_BATCH }
    }
}

/// One item's scores (lm-eval's logged sample).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McSample {
    /// 1-based line of the task file.
    pub line: usize,
    /// Index of the correct choice.
    pub gold: usize,
    /// Log-likelihood of each choice's continuation (nats, summed over its tokens).
    pub loglikelihoods: Vec<f64>,
    /// Whether every continuation token was the model's arg-max.
    pub greedy: Vec<bool>,
    /// `argmax ll`.
    pub pred: usize,
    /// `argmax ll / chars(choice)`.
    pub pred_norm: usize,
    /// `argmax ll / bytes(choice)`.
    pub pred_bytes: usize,
    /// 1 when `pred == gold`, else 0.
    pub acc: f64,
    /// 1 when `pred_norm == gold`, else 0.
    pub acc_norm: f64,
    /// 1 when `pred_bytes == gold`, else 0.
    pub acc_bytes: f64,
}

/// A mean over items and its standard error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// The mean.
    pub value: f64,
    /// `sample_std / sqrt(n)`; `None` for a single item (lm-eval: "N/A").
    pub stderr: Option<f64>,
}

/// A task's accuracies and per-item scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McReport {
    /// Items scored.
    pub items: usize,
    /// Requests (one per choice) whose context was cut from the left to fit the model.
    pub truncated: usize,
    /// The delimiter used.
    pub target_delimiter: String,
    /// Accuracy of `argmax ll`.
    pub acc: Metric,
    /// Accuracy of `argmax ll / chars`.
    pub acc_norm: Metric,
    /// Accuracy of `argmax ll / bytes`.
    pub acc_bytes: Metric,
    /// Per item, in file order.
    pub samples: Vec<McSample>,
}

/// Scores `task` with `model` (learned routing for an MoE):
/// `on_progress(done, total)` counts requests (one per choice).
///
/// # Errors
/// [`StudioError::Invalid`] for a batch of 0, and, naming the file, line
/// and choice: a context that is only whitespace or encodes to no token, a
/// choice whose continuation encodes to no token or to more tokens than
/// the model's context; tokenizer and model errors.
pub fn evaluate_task<B: Backend>(
    model: &Transformer<B>,
    tok: &Tokenizer,
    task: &McTask,
    opts: &McOptions,
    device: &B::Device,
    on_progress: impl FnMut(usize, usize),
) -> Result<McReport> {
    if opts.batch == 0 {
        return Err(StudioError::Invalid("batch (requests per forward pass) must be >= 1".into()));
    }
    let max_len = model.config.max_position_embeddings;
    let bos = added_prefix_text(tok)?;
    let mut requests = Vec::new();
    for item in &task.items {
        for (j, choice) in item.choices.iter().enumerate() {
            let at = || format!("{}: line {}, choice {j}", task.file, item.line);
            let (ctx, cont) =
                encode_pair(tok, bos.as_deref(), &item.context, &format!("{}{choice}", opts.target_delimiter))?;
            if ctx.is_empty() {
                return Err(StudioError::Invalid(format!(
                    "{}: the context encodes to no token (it is only whitespace?)",
                    at()
                )));
            }
            if cont.is_empty() {
                return Err(StudioError::Invalid(format!(
                    "{}: the continuation {:?} encodes to no token after the context",
                    at(),
                    format!("{}{choice}", opts.target_delimiter)
                )));
            }
            if cont.len() > max_len {
                return Err(StudioError::Invalid(format!(
                    "{}: the continuation has {} tokens, more than the model's context ({max_len})",
                    at(),
                    cont.len()
                )));
            }
            requests.push((ctx, cont));
        }
    }
    let truncated = requests.iter().filter(|(c, x)| c.len() + x.len() > max_len + 1).count();
    let scores = loglikelihoods(model, &requests, opts.batch, device, on_progress)?;
    let mut samples = Vec::with_capacity(task.items.len());
    let mut next = 0;
    for item in &task.items {
        let n = item.choices.len();
        samples.push(score_item(&item.choices, item.gold, item.line, &scores[next..next + n]));
        next += n;
    }
    let metric = |f: fn(&McSample) -> f64| {
        let xs: Vec<f64> = samples.iter().map(f).collect();
        Metric { value: xs.iter().sum::<f64>() / xs.len() as f64, stderr: mean_stderr(&xs) }
    };
    Ok(McReport {
        items: samples.len(),
        truncated,
        target_delimiter: opts.target_delimiter.clone(),
        acc: metric(|s| s.acc),
        acc_norm: metric(|s| s.acc_norm),
        acc_bytes: metric(|s| s.acc_bytes),
        samples,
    })
}

/// Python's `str.isspace` (what `str.rstrip()` strips): Unicode
/// `White_Space` plus the information separators U+001C-U+001F.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The text of the token the tokenizer adds in front of a text (its BOS),
/// when it adds one: lm-eval's `has_bos_prefix(string, decode(prefix_token_id))`
/// check compares a string's start with it.
///
/// # Errors
/// Tokenizer errors.
pub fn added_prefix_text(tok: &Tokenizer) -> Result<Option<String>> {
    let ids = tok.encode("", true)?;
    Ok(ids.first().and_then(|&id| tok.token_text(id)).filter(|t| !t.is_empty()))
}

/// lm-eval's `tok_encode` with `add_special_tokens=None`: the tokenizer's
/// default special tokens, none when `text` already starts with the BOS
/// text `bos`.
fn tok_encode(tok: &Tokenizer, bos: Option<&str>, text: &str) -> Result<Vec<u32>> {
    let special = !bos.is_some_and(|b| text.starts_with(b));
    tok.encode(text, special)
}

/// lm-eval's `_encode_pair` for a causal model: the context's and the
/// continuation's token ids, after moving the context's trailing
/// whitespace to the continuation and splitting the encoding of the whole
/// at the length of the context's encoding. `bos`: [`added_prefix_text`].
///
/// # Errors
/// Tokenizer errors.
pub fn encode_pair(
    tok: &Tokenizer,
    bos: Option<&str>,
    context: &str,
    continuation: &str,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let ctx = context.trim_end_matches(is_py_space);
    let cont = format!("{}{continuation}", &context[ctx.len()..]);
    let whole = tok_encode(tok, bos, &format!("{ctx}{cont}"))?;
    let ctx_enc = tok_encode(tok, bos, ctx)?;
    let cont_enc = whole.get(ctx_enc.len()..).map(<[u32]>::to_vec).unwrap_or_default();
    Ok((ctx_enc, cont_enc))
}

/// The index of the largest value, the first of equal ones (`np.argmax`
/// on finite and `-inf` values).
fn argmax(xs: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, x) in xs.enumerate() {
        if i == 0 || x > best.1 {
            best = (i, x);
        }
    }
    best.0
}

/// lm-eval's `process_results` for one item: the three predictions and
/// accuracies from the choices' `(loglikelihood, greedy)`.
pub fn score_item(choices: &[String], gold: usize, line: usize, scores: &[(f64, bool)]) -> McSample {
    let lls: Vec<f64> = scores.iter().map(|s| s.0).collect();
    let pred = argmax(lls.iter().copied());
    let pred_norm = argmax(lls.iter().zip(choices).map(|(l, c)| l / c.chars().count() as f64));
    let pred_bytes = argmax(lls.iter().zip(choices).map(|(l, c)| l / c.len() as f64));
    let hit = |p: usize| if p == gold { 1.0 } else { 0.0 };
    McSample {
        line,
        gold,
        greedy: scores.iter().map(|s| s.1).collect(),
        loglikelihoods: lls,
        pred,
        pred_norm,
        pred_bytes,
        acc: hit(pred),
        acc_norm: hit(pred_norm),
        acc_bytes: hit(pred_bytes),
    }
}

/// lm-eval's `mean_stderr`: `sqrt(Σ(x - mean)² / (n - 1)) / sqrt(n)`;
/// `None` for fewer than 2 values.
pub fn mean_stderr(xs: &[f64]) -> Option<f64> {
    let n = xs.len();
    if n < 2 {
        return None;
    }
    let mu = xs.iter().sum::<f64>() / n as f64;
    let var = xs.iter().map(|x| (x - mu) * (x - mu)).sum::<f64>() / (n - 1) as f64;
    Some(var.sqrt() / (n as f64).sqrt())
}

/// lm-eval's `_loglikelihood_tokens` for a causal model: per request
/// `(context ids, continuation ids)` the summed log-probability of the
/// continuation and whether it is the greedy continuation. Requests run
/// longest first, `batch` per right-padded forward pass; the input is
/// `(ctx + cont)[-(L + 1)..][..-1]` with `L` the model's context.
/// `on_progress(done, total)` after each batch.
///
/// # Errors
/// [`StudioError::Invalid`] for a batch of 0, an empty context or
/// continuation, or a continuation longer than `L`.
pub fn loglikelihoods<B: Backend>(
    model: &Transformer<B>,
    requests: &[(Vec<u32>, Vec<u32>)],
    batch: usize,
    device: &B::Device,
    mut on_progress: impl FnMut(usize, usize),
) -> Result<Vec<(f64, bool)>> {
    if batch == 0 {
        return Err(StudioError::Invalid("batch (requests per forward pass) must be >= 1".into()));
    }
    let max_len = model.config.max_position_embeddings;
    if let Some((i, _)) =
        requests.iter().enumerate().find(|(_, (c, x))| c.is_empty() || x.is_empty() || x.len() > max_len)
    {
        return Err(StudioError::Invalid(format!(
            "request {i}: the context and the continuation need 1 or more tokens, the continuation at most {max_len}"
        )));
    }
    // lm-eval's order: longest first, then by the tokens (its Collator).
    let mut order: Vec<usize> = (0..requests.len()).collect();
    let whole: Vec<Vec<u32>> = requests.iter().map(|(c, x)| [c.as_slice(), x.as_slice()].concat()).collect();
    order.sort_by(|&a, &b| whole[b].len().cmp(&whole[a].len()).then_with(|| whole[a].cmp(&whole[b])));
    let (v, d) = (model.config.vocab_size, model.config.hidden_size);
    // (Σ log p, all greedy so far) per request.
    let mut out = vec![(0.0, true); requests.len()];
    let mut done = 0;
    for group in order.chunks(batch) {
        // The model's input: the last L + 1 tokens without the last one.
        let inputs: Vec<&[u32]> = group
            .iter()
            .map(|&r| {
                let w = &whole[r];
                &w[w.len().saturating_sub(max_len + 1)..w.len() - 1]
            })
            .collect();
        let (tokens, padding) = Padding::pad_tensor::<B>(&inputs, 0, device)?;
        let seq = padding.seq();
        let fo = ForwardOptions { routing: Routing::Learned, ..Default::default() };
        let hidden = model.forward_hidden_masked(tokens, Some(&padding), None, fo, None);
        // Position p of an input predicts its token p + 1: the continuation
        // of length k is predicted by the input's last k positions.
        let (mut rows, mut targets, mut owner) = (Vec::new(), Vec::new(), Vec::new());
        for (j, (&r, inp)) in group.iter().zip(&inputs).enumerate() {
            let cont = &requests[r].1;
            let first = inp.len() - cont.len();
            for (p, &t) in (first..inp.len()).zip(cont) {
                rows.push((j * seq + p) as i64);
                targets.push(i64::from(t));
                owner.push(r);
            }
        }
        let flat = hidden.reshape([group.len() * seq, d]);
        for ((rs, ts), os) in rows.chunks(HEAD_ROWS).zip(targets.chunks(HEAD_ROWS)).zip(owner.chunks(HEAD_ROWS)) {
            let m = rs.len();
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(rs.to_vec(), [m]), device);
            let h = flat.clone().select(0, idx).reshape([1, m, d]);
            let logp = log_softmax(model.head(h), 2).reshape([m, v]);
            let tgt = Tensor::<B, 2, Int>::from_data(TensorData::new(ts.to_vec(), [m, 1]), device);
            let best = logp.clone().argmax(1).into_data().convert::<i64>().to_vec::<i64>().expect("i64 arg-max");
            let picked = logp.gather(1, tgt).into_data().convert::<f32>().to_vec::<f32>().expect("f32 log-probs");
            for (((&r, &lp), &b), &t) in os.iter().zip(&picked).zip(&best).zip(ts) {
                out[r].0 += f64::from(lp);
                out[r].1 &= b == t;
            }
        }
        done += group.len();
        on_progress(done, requests.len());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_of_equals_and_handles_neg_inf() {
        assert_eq!(argmax([1.0, 3.0, 3.0, 2.0].into_iter()), 1);
        assert_eq!(argmax([f64::NEG_INFINITY, f64::NEG_INFINITY].into_iter()), 0);
        assert_eq!(argmax([f64::NEG_INFINITY, -5.0].into_iter()), 1);
    }

    #[test]
    fn stderr_is_lm_evals_mean_stderr() {
        // statistics.stdev([1, 0, 1, 1]) / sqrt(4) = 0.5 / 2
        assert!((mean_stderr(&[1.0, 0.0, 1.0, 1.0]).unwrap() - 0.25).abs() < 1e-15);
        assert_eq!(mean_stderr(&[1.0]), None);
    }

    #[test]
    fn norm_divides_by_characters_and_bytes_by_utf8_bytes() {
        // "é" is 1 character and 2 bytes. ll: -3 vs -2 -> 1; per character
        // -1.5 vs -2 -> 0; per byte -1.5 vs -1 -> 1.
        let choices = vec!["ab".to_string(), "é".to_string()];
        let s = score_item(&choices, 0, 3, &[(-3.0, false), (-2.0, true)]);
        assert_eq!((s.pred, s.pred_norm, s.pred_bytes), (1, 0, 1));
        assert_eq!((s.acc, s.acc_norm, s.acc_bytes), (0.0, 1.0, 0.0));
        assert_eq!((s.line, s.gold, s.greedy.clone()), (3, 0, vec![false, true]));
    }

    #[test]
    fn python_whitespace_includes_the_separators() {
        assert!(is_py_space('\u{1f}') && is_py_space('\n') && is_py_space('\u{a0}') && !is_py_space('\u{200b}'));
    }
}
