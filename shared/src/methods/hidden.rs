//! Router rows from hidden states (mergekit's `hidden` gate mode,
//! `mergekit/moe/router.py`), for [`super::RouterInit::Hidden`].
//!
//! For expert `e` of layer `l` the row is the mean FFN input of the prompts
//! given for `e` — the post-attention-norm hidden state, exactly what the
//! router multiplies — minus the mean over its negative prompts when there
//! are any; [`super::RouterInit`] then L2-normalises each row. Tokens are
//! averaged within a prompt, then prompts are averaged, so every prompt
//! weighs the same.
//!
//! Differences from mergekit, on purpose: mergekit reads the residual
//! stream entering each decoder layer (`output_hidden_states`) and, in its
//! default `hidden` mode, only the last token; we use the vector the router
//! actually sees and average all tokens (mergekit's `hidden_avg`).

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use crate::error::{Result, StudioError};
use crate::model::{ForwardOptions, Trace, Transformer};

/// Prompts (token ids) that characterise one expert.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpertPrompts {
    /// Texts the expert should take (at least one).
    pub positive: Vec<Vec<u32>>,
    /// Texts it should not take (optional).
    pub negative: Vec<Vec<u32>>,
}

/// Mean FFN input of every layer over `prompts`: `[L][d]` (mean over
/// tokens within a prompt, then over prompts).
///
/// # Errors
/// [`StudioError::Invalid`] for no prompts, an empty prompt, or a token id
/// outside the vocabulary.
pub fn mean_ffn_inputs<B: Backend>(
    model: &Transformer<B>,
    prompts: &[Vec<u32>],
    device: &B::Device,
) -> Result<Vec<Vec<f32>>> {
    if prompts.is_empty() {
        return Err(StudioError::Invalid("hidden router: an expert has no prompts".into()));
    }
    let (layers, d, v) = (model.layers.len(), model.config.hidden_size, model.config.vocab_size);
    let mut acc = vec![vec![0f64; d]; layers];
    for p in prompts {
        if p.is_empty() {
            return Err(StudioError::Invalid("hidden router: a prompt has no tokens".into()));
        }
        if let Some(bad) = p.iter().find(|&&t| t as usize >= v) {
            return Err(StudioError::Invalid(format!("hidden router: token id {bad} is outside the vocabulary ({v})")));
        }
        let ids: Vec<i64> = p.iter().map(|&t| i64::from(t)).collect();
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, p.len()]), device);
        let mut trace = Trace::default();
        let opts = ForwardOptions { capture_ffn_inputs: true, ..Default::default() };
        let _ = model.forward_hidden_with(tokens, None, opts, Some(&mut trace));
        for (a, x) in acc.iter_mut().zip(trace.ffn_inputs) {
            let mean: Vec<f32> = x.mean_dim(1).into_data().convert::<f32>().to_vec().expect("f32 data");
            a.iter_mut().zip(mean).for_each(|(a, m)| *a += f64::from(m));
        }
    }
    let n = prompts.len() as f64;
    Ok(acc.into_iter().map(|a| a.into_iter().map(|x| (x / n) as f32).collect()).collect())
}

/// Router rows `[L][E][d]` for `experts` (one prompt set per expert):
/// positive mean minus negative mean, unnormalised.
///
/// # Errors
/// As [`mean_ffn_inputs`].
pub fn hidden_router_rows<B: Backend>(
    model: &Transformer<B>,
    experts: &[ExpertPrompts],
    device: &B::Device,
) -> Result<Vec<Vec<Vec<f32>>>> {
    let mut rows = vec![Vec::with_capacity(experts.len()); model.layers.len()];
    for e in experts {
        let mut pos = mean_ffn_inputs(model, &e.positive, device)?;
        if !e.negative.is_empty() {
            let neg = mean_ffn_inputs(model, &e.negative, device)?;
            for (p, n) in pos.iter_mut().zip(neg) {
                p.iter_mut().zip(n).for_each(|(p, n)| *p -= n);
            }
        }
        for (r, p) in rows.iter_mut().zip(pos) {
            r.push(p);
        }
    }
    Ok(rows)
}
