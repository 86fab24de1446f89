//! Autoregressive generation with a KV cache: greedy decoding by default,
//! temperature and nucleus (top-p) sampling as options.
//!
//! Source: Holtzman et al., "The Curious Case of Neural Text Degeneration"
//! (2020), §3.1 for top-p.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::error::{Result, StudioError};
use crate::model::Transformer;

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Nucleus mass in `(0, 1]`; `1` disables top-p.
    pub top_p: f32,
    /// RNG seed for sampling.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, top_p: 1.0, seed: 0 }
    }
}

/// Index of the largest value (first on ties, like `torch.argmax`).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn sample(logits: &[f32], s: &Sampling, rng: &mut StdRng) -> u32 {
    if s.temperature <= 0.0 {
        return argmax(logits);
    }
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<(usize, f64)> =
        logits.iter().enumerate().map(|(i, l)| (i, (((l - max) / s.temperature) as f64).exp())).collect();
    let z: f64 = probs.iter().map(|p| p.1).sum();
    probs.iter_mut().for_each(|p| p.1 /= z);
    if s.top_p < 1.0 {
        probs.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
        let mut acc = 0.0;
        let mut keep = 0;
        for p in &probs {
            acc += p.1;
            keep += 1;
            if acc >= s.top_p as f64 {
                break;
            }
        }
        probs.truncate(keep);
        let z: f64 = probs.iter().map(|p| p.1).sum();
        probs.iter_mut().for_each(|p| p.1 /= z);
    }
    let mut r: f64 = rng.random();
    for (i, p) in &probs {
        r -= p;
        if r <= 0.0 {
            return *i as u32;
        }
    }
    probs.last().map(|p| p.0 as u32).unwrap_or(0)
}

/// Generates up to `max_new_tokens` after `prompt` (token ids), stopping
/// early at `eos`. Returns only the new ids.
///
/// # Errors
/// [`StudioError::Invalid`] for an empty prompt, a prompt id outside the
/// vocabulary, or a total length beyond `max_position_embeddings`.
pub fn generate<B: Backend>(
    model: &Transformer<B>,
    prompt: &[u32],
    max_new_tokens: usize,
    sampling: Sampling,
    eos: Option<u32>,
    device: &B::Device,
) -> Result<Vec<u32>> {
    generate_with(model, prompt, max_new_tokens, sampling, eos, device, |_| {})
}

/// [`generate`], calling `on_token(new tokens so far)` after each new token
/// (progress in the browser studio).
///
/// # Errors
/// As [`generate`].
pub fn generate_with<B: Backend>(
    model: &Transformer<B>,
    prompt: &[u32],
    max_new_tokens: usize,
    sampling: Sampling,
    eos: Option<u32>,
    device: &B::Device,
    mut on_token: impl FnMut(usize),
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        return Err(StudioError::Invalid("the prompt encodes to no tokens".into()));
    }
    let v = model.config.vocab_size;
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= v) {
        return Err(StudioError::Invalid(format!("prompt token id {bad} is outside the vocabulary ({v})")));
    }
    if prompt.len() + max_new_tokens > model.config.max_position_embeddings {
        return Err(StudioError::Invalid(format!(
            "prompt ({}) + new tokens ({max_new_tokens}) exceed the model's context ({})",
            prompt.len(),
            model.config.max_position_embeddings
        )));
    }
    let mut rng = StdRng::seed_from_u64(sampling.seed);
    let mut cache = model.new_cache();
    let mut out = Vec::with_capacity(max_new_tokens);
    let mut input: Vec<u32> = prompt.to_vec();
    for _ in 0..max_new_tokens {
        let n = input.len();
        let ids: Vec<i64> = input.iter().map(|&x| x as i64).collect();
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, n]), device);
        let logits = model.forward_last(tokens, Some(&mut cache));
        let logits: Vec<f32> = logits.into_data().convert::<f32>().to_vec().expect("f32 logits");
        let next = sample(&logits, &sampling, &mut rng);
        out.push(next);
        on_token(out.len());
        if Some(next) == eos {
            break;
        }
        input = vec![next];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_first_maximum() {
        assert_eq!(argmax(&[0.0, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        let s = Sampling { temperature: 1.0, top_p: 0.5, seed: 7 };
        let mut rng = StdRng::seed_from_u64(s.seed);
        // Token 2 holds > 50% of the mass: it is the whole nucleus.
        for _ in 0..50 {
            assert_eq!(sample(&[0.0, 0.0, 5.0, 0.0], &s, &mut rng), 2);
        }
    }
}
