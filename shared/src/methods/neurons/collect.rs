//! NeuronMoE's collection pass (methods.md §3): labelled texts through the
//! model, every linear map's output units pooled per text into
//! [`PooledActivations`], with each language's mean FFN input per layer.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::NeuronLayout;
use crate::error::{Result, StudioError};
use crate::model::{ForwardOptions, Padding, Pooling, Trace, Transformer};

/// Options of the collection pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectOptions {
    /// How a neuron's activations are pooled over a text's tokens (reference:
    /// mean).
    pub pooling: Pooling,
    /// Each text is truncated to its first `max_tokens` tokens (>= 1).
    pub max_tokens: usize,
}

impl Default for CollectOptions {
    fn default() -> Self {
        CollectOptions { pooling: Pooling::Mean, max_tokens: 256 }
    }
}

/// The pooled matrix and what belongs to it.
#[derive(Debug, Clone)]
pub struct PooledActivations {
    /// Neuron layout (columns).
    pub layout: NeuronLayout,
    /// Language codes; `labels` index into this.
    pub languages: Vec<String>,
    /// Language of each text (row).
    pub labels: Vec<usize>,
    /// Row-major `[texts, neurons]`: text `t`'s pooled score of neuron `n`
    /// at `t * num_neurons + n`.
    pub data: Vec<f32>,
    /// Tokens used per language (after truncation).
    pub tokens: Vec<usize>,
    /// Per language, the mean over its texts of each layer's token-mean FFN
    /// input (the post-attention RMSNorm output, what a router sees),
    /// `[L * d]` layer-major.
    pub hidden_means: Vec<Vec<f64>>,
    /// Hidden size `d`.
    pub hidden_size: usize,
    /// The options the matrix was collected with.
    pub options: CollectOptions,
}

impl PooledActivations {
    /// Number of texts (rows).
    pub fn num_texts(&self) -> usize {
        self.labels.len()
    }

    /// Texts per language.
    pub fn texts_per_language(&self) -> Vec<usize> {
        let mut n = vec![0; self.languages.len()];
        for &l in &self.labels {
            n[l] += 1;
        }
        n
    }

    /// One neuron's scores over all texts (a strided copy; for tests and
    /// dumps).
    pub fn column(&self, neuron: usize) -> Vec<f32> {
        let n = self.layout.num_neurons();
        (0..self.num_texts()).map(|t| self.data[t * n + neuron]).collect()
    }

    /// Checks what the Average Precision needs: at least two languages,
    /// each with at least two texts.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] naming the language concerned.
    pub fn validate(&self) -> Result<()> {
        if self.languages.len() < 2 {
            return Err(StudioError::Invalid(format!(
                "language-specific neurons need at least 2 languages (texts of the other languages are the negatives); got {}",
                if self.languages.is_empty() { "none".to_string() } else { format!("only `{}`", self.languages[0]) }
            )));
        }
        for (code, n) in self.languages.iter().zip(self.texts_per_language()) {
            if n < 2 {
                return Err(StudioError::Invalid(format!(
                    "language `{code}` has {n} text(s); the Average Precision needs at least 2 per language \
                     (reference: ~500; give more non-empty lines)"
                )));
            }
        }
        Ok(())
    }
}

/// Streams labelled texts through a model and builds [`PooledActivations`]
/// (one forward pass per text; memory = the pooled matrix plus one pass).
pub struct NeuronCollector<'a, B: Backend> {
    model: &'a Transformer<B>,
    layout: NeuronLayout,
    languages: Vec<String>,
    options: CollectOptions,
    labels: Vec<usize>,
    data: Vec<f32>,
    tokens: Vec<usize>,
    hidden_sums: Vec<Vec<f64>>,
    device: B::Device,
}

impl<'a, B: Backend> NeuronCollector<'a, B> {
    /// A collector for texts of `languages` (codes; each text is added with
    /// its index in this list).
    ///
    /// # Errors
    /// [`StudioError::Invalid`] for no languages, a repeated or empty code, or
    /// `max_tokens == 0`.
    pub fn new(model: &'a Transformer<B>, languages: Vec<String>, options: CollectOptions) -> Result<Self> {
        if languages.is_empty() {
            return Err(StudioError::Invalid("no languages given".into()));
        }
        for (i, c) in languages.iter().enumerate() {
            if c.trim().is_empty() {
                return Err(StudioError::Invalid(format!("language {i} has an empty code")));
            }
            if languages[..i].contains(c) {
                return Err(StudioError::Invalid(format!("language `{c}` is given twice (merge its files instead)")));
            }
        }
        if options.max_tokens == 0 {
            return Err(StudioError::Invalid("max_tokens must be >= 1".into()));
        }
        let layout = NeuronLayout::of_model(model);
        let d = model.config.hidden_size;
        let nl = languages.len();
        let device = model.embed_tokens.weight.val().device();
        Ok(NeuronCollector {
            layout,
            hidden_sums: vec![vec![0.0; model.layers.len() * d]; nl],
            tokens: vec![0; nl],
            languages,
            options,
            labels: Vec::new(),
            data: Vec::new(),
            model,
            device,
        })
    }

    /// The neuron layout (columns).
    pub fn layout(&self) -> &NeuronLayout {
        &self.layout
    }

    /// Reserves the pooled matrix for `texts` more rows up front (avoids the
    /// transient double allocation of a growing vector).
    pub fn reserve(&mut self, texts: usize) {
        self.data.reserve_exact(texts * self.layout.num_neurons());
        self.labels.reserve_exact(texts);
    }

    /// Texts added so far.
    pub fn num_texts(&self) -> usize {
        self.labels.len()
    }

    /// Runs one text (token ids, truncated to `max_tokens`) and appends its
    /// pooled row. Returns the number of tokens used.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] for an unknown language index, an empty text
    /// or a capture that disagrees with the layout.
    pub fn add_text(&mut self, language: usize, ids: &[u32]) -> Result<usize> {
        self.add_texts(&[(language, ids)])
    }

    /// [`NeuronCollector::add_text`] for several texts in one right-padded
    /// forward pass (pooling runs over each text's own tokens, so the rows
    /// equal one-by-one rows up to float summation order); rows are appended
    /// in the given order. Returns the number of tokens used.
    ///
    /// # Errors
    /// As [`NeuronCollector::add_text`], for any of the texts (then none is
    /// added).
    pub fn add_texts(&mut self, texts: &[(usize, &[u32])]) -> Result<usize> {
        if texts.is_empty() {
            return Ok(0);
        }
        let rows = self.pooled_rows(texts)?;
        let n = self.layout.num_neurons();
        let width = rows.len() / texts.len();
        let mut used_total = 0;
        for (&(language, ids), row) in texts.iter().zip(rows.chunks(width)) {
            self.data.extend_from_slice(&row[..n]);
            for (s, v) in self.hidden_sums[language].iter_mut().zip(&row[n..]) {
                *s += f64::from(*v);
            }
            self.labels.push(language);
            let used = ids.len().min(self.options.max_tokens);
            self.tokens[language] += used;
            used_total += used;
        }
        Ok(used_total)
    }

    /// One capture pass over `texts`: `[texts, neurons + L*d]` row-major
    /// (pooled neurons, then each layer's token-mean FFN input).
    fn pooled_rows(&self, texts: &[(usize, &[u32])]) -> Result<Vec<f32>> {
        for &(language, ids) in texts {
            if language >= self.languages.len() {
                return Err(StudioError::Invalid(format!(
                    "language index {language} out of range ({} languages)",
                    self.languages.len()
                )));
            }
            if ids.is_empty() {
                return Err(StudioError::Invalid(format!(
                    "an empty text (0 tokens) for language `{}`",
                    self.languages[language]
                )));
            }
        }
        let cut: Vec<&[u32]> = texts.iter().map(|(_, ids)| &ids[..ids.len().min(self.options.max_tokens)]).collect();
        let (t, padding) = Padding::pad_tensor::<B>(&cut, 0, &self.device)?;
        let opts = ForwardOptions {
            capture_neurons: Some(self.options.pooling),
            capture_ffn_inputs: true,
            ..Default::default()
        };
        let mut trace = Trace::default();
        let _ = self.model.forward_hidden_masked(t, Some(&padding), None, opts, Some(&mut trace));
        if trace.neurons.len() != self.layout.num_layers() || trace.ffn_inputs.len() != self.layout.num_layers() {
            return Err(StudioError::Invalid(format!(
                "the capture returned {} layers of neurons for a {}-layer model",
                trace.neurons.len(),
                self.layout.num_layers()
            )));
        }
        let (b, d) = (padding.batch(), self.model.config.hidden_size);
        let mut parts: Vec<Tensor<B, 2>> = Vec::with_capacity(8 * self.layout.num_layers());
        for (l, (layer, comps)) in trace.neurons.into_iter().zip(&self.layout.layers).enumerate() {
            let names: Vec<&str> = layer.iter().map(|(n, _)| n.as_str()).collect();
            let want: Vec<&str> = comps.iter().map(|c| c.component.as_str()).collect();
            if names != want {
                return Err(StudioError::Invalid(format!("layer {l}: captured {names:?}, expected {want:?}")));
            }
            parts.extend(layer.into_iter().map(|(_, t)| t));
        }
        // Token means of the FFN inputs over each text's real positions.
        let keep = padding.position_weights::<B>(&self.device);
        let lengths: Vec<f32> = padding.lengths().iter().map(|&l| l as f32).collect();
        let lengths = Tensor::<B, 2>::from_data(TensorData::new(lengths, [b, 1]), &self.device);
        for x in trace.ffn_inputs {
            parts.push((x * keep.clone()).sum_dim(1).reshape([b, d]) / lengths.clone());
        }
        let rows = Tensor::cat(parts, 1).into_data().convert::<f32>();
        rows.to_vec::<f32>().map_err(|e| StudioError::Invalid(format!("reading pooled activations: {e:?}")))
    }

    /// Runs one text through a plain forward pass (no capture) with the same
    /// truncation; for measuring the capture overhead.
    pub fn plain_forward(&self, ids: &[u32]) {
        let ids = &ids[..ids.len().min(self.options.max_tokens)];
        if ids.is_empty() {
            return;
        }
        let t = Tensor::<B, 2, Int>::from_data(
            TensorData::new(ids.iter().map(|&x| i64::from(x)).collect::<Vec<_>>(), [1, ids.len()]),
            &self.device,
        );
        let h = self.model.forward_hidden(t, None);
        let _ = h.into_data();
    }

    /// The collected matrix.
    ///
    /// # Errors
    /// As [`PooledActivations::validate`].
    pub fn finish(self) -> Result<PooledActivations> {
        let counts = {
            let mut n = vec![0usize; self.languages.len()];
            for &l in &self.labels {
                n[l] += 1;
            }
            n
        };
        let hidden_means = self
            .hidden_sums
            .into_iter()
            .zip(&counts)
            .map(|(s, &n)| s.into_iter().map(|x| x / n.max(1) as f64).collect())
            .collect();
        let p = PooledActivations {
            layout: self.layout,
            languages: self.languages,
            labels: self.labels,
            data: self.data,
            tokens: self.tokens,
            hidden_means,
            hidden_size: self.model.config.hidden_size,
            options: self.options,
        };
        p.validate()?;
        Ok(p)
    }
}
