//! Right padding: texts of different lengths in one `[batch, seq]` batch.
//!
//! Row `b` of a padded batch holds a text of `lengths[b]` tokens at
//! positions `0..lengths[b]`, then filler ids up to `seq`. The model
//! ([`super::Transformer::forward_hidden_masked`]) keeps every padded
//! position out of what a text's numbers depend on:
//! - attention: with right padding the causal mask already does it — a
//!   real query at position `i < lengths[b]` sees keys `0..=i`, all real —
//!   so the per-text logits equal the unbatched ones (up to the float
//!   summation order of a larger matrix product);
//! - MoE layers route only the real tokens: padded rows are neither
//!   computed by an expert nor counted in the routing trace (logits,
//!   chosen experts, counts), so the load-balancing and language-prior
//!   losses, routing loads and accuracies see real tokens only
//!   (transformers #28505: padding must not count in the auxiliary loss);
//! - neuron pooling (mean / max over tokens) runs over the real positions;
//! - captured FFN inputs keep the `[batch, seq, d]` shape; their padded rows
//!   hold meaningless values and consumers take [`Padding::valid_rows`]
//!   (ridge statistics do).
//!
//! Losses over next tokens use [`Padding::target_weights`].

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use crate::error::{Result, StudioError};

/// Lengths of the texts of a right-padded batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Padding {
    lengths: Vec<usize>,
    seq: usize,
}

impl Padding {
    /// A batch of `lengths.len()` texts padded to `seq` positions.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] for an empty batch or a length outside
    /// `1..=seq`.
    pub fn new(lengths: Vec<usize>, seq: usize) -> Result<Self> {
        if lengths.is_empty() {
            return Err(StudioError::Invalid("a padded batch needs at least one text".into()));
        }
        if let Some((b, l)) = lengths.iter().enumerate().find(|(_, &l)| l == 0 || l > seq) {
            return Err(StudioError::Invalid(format!(
                "padded batch: text {b} has {l} tokens, expected 1..={seq} (the padded length)"
            )));
        }
        Ok(Padding { lengths, seq })
    }

    /// Right-pads `texts` with `pad_id` to the longest one: the ids
    /// `[batch * seq]` (batch-major) and the padding.
    ///
    /// # Errors
    /// As [`Padding::new`] (an empty batch or an empty text).
    pub fn pad(texts: &[&[u32]], pad_id: u32) -> Result<(Vec<i64>, Padding)> {
        let seq = texts.iter().map(|t| t.len()).max().unwrap_or(0);
        let padding = Padding::new(texts.iter().map(|t| t.len()).collect(), seq)?;
        let mut ids = Vec::with_capacity(texts.len() * seq);
        for t in texts {
            ids.extend(t.iter().map(|&x| i64::from(x)));
            ids.extend(std::iter::repeat_n(i64::from(pad_id), seq - t.len()));
        }
        Ok((ids, padding))
    }

    /// The token tensor `[batch, seq]` of [`Padding::pad`].
    ///
    /// # Errors
    /// As [`Padding::pad`].
    pub fn pad_tensor<B: Backend>(
        texts: &[&[u32]],
        pad_id: u32,
        device: &B::Device,
    ) -> Result<(Tensor<B, 2, Int>, Padding)> {
        let (ids, p) = Padding::pad(texts, pad_id)?;
        let t = Tensor::from_data(TensorData::new(ids, [p.batch(), p.seq]), device);
        Ok((t, p))
    }

    /// Texts in the batch.
    pub fn batch(&self) -> usize {
        self.lengths.len()
    }

    /// Padded length.
    pub fn seq(&self) -> usize {
        self.seq
    }

    /// Real tokens per text.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// Whether no position is padding.
    pub fn is_full(&self) -> bool {
        self.lengths.iter().all(|&l| l == self.seq)
    }

    /// Real tokens in the batch.
    pub fn num_valid(&self) -> usize {
        self.lengths.iter().sum()
    }

    /// Flat row indices `b * seq + s` of the real tokens, batch-major (the
    /// row order of the routing trace under padding).
    pub fn valid_rows(&self) -> Vec<i64> {
        let mut v = Vec::with_capacity(self.num_valid());
        for (b, &l) in self.lengths.iter().enumerate() {
            v.extend((0..l).map(|s| (b * self.seq + s) as i64));
        }
        v
    }

    /// [`Padding::valid_rows`] as a tensor `[num_valid]`.
    pub fn valid_rows_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 1, Int> {
        let rows = self.valid_rows();
        let n = rows.len();
        Tensor::from_data(TensorData::new(rows, [n]), device)
    }

    /// The real rows of `x: [batch, seq, d]` as `[num_valid, d]`, batch-major.
    pub fn select_valid<B: Backend>(&self, x: Tensor<B, 3>) -> Tensor<B, 2> {
        let [b, s, d] = x.dims();
        let flat = x.reshape([b * s, d]);
        if self.is_full() {
            return flat;
        }
        let device = flat.device();
        flat.select(0, self.valid_rows_tensor::<B>(&device))
    }

    /// `[batch, seq, 1]`: 1 at real positions, 0 at padding.
    pub fn position_weights<B: Backend>(&self, device: &B::Device) -> Tensor<B, 3> {
        let mut w = vec![0f32; self.batch() * self.seq];
        for (b, &l) in self.lengths.iter().enumerate() {
            w[b * self.seq..b * self.seq + l].fill(1.0);
        }
        Tensor::from_data(TensorData::new(w, [self.batch(), self.seq, 1]), device)
    }

    /// `[batch, seq]`: 1 where position `s` predicts a real next token
    /// (`s + 1 < lengths[b]`), else 0 — the weights of a next-token loss
    /// whose targets are the inputs shifted by one.
    pub fn target_weights(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.batch() * self.seq];
        for (b, &l) in self.lengths.iter().enumerate() {
            w[b * self.seq..b * self.seq + l.saturating_sub(1)].fill(1.0);
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad_and_rows() {
        let (ids, p) = Padding::pad(&[&[5, 6, 7], &[8]], 0).unwrap();
        assert_eq!(ids, vec![5, 6, 7, 8, 0, 0]);
        assert_eq!(p.lengths(), &[3, 1]);
        assert_eq!(p.valid_rows(), vec![0, 1, 2, 3]);
        assert_eq!(p.target_weights(), vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        assert!(!p.is_full());
        assert_eq!(p.num_valid(), 4);
    }

    #[test]
    fn bad_lengths_are_refused() {
        assert!(Padding::new(vec![], 4).is_err());
        let e = Padding::new(vec![2, 5], 4).unwrap_err().to_string();
        assert!(e.contains("text 1 has 5 tokens") && e.contains("1..=4"), "{e}");
        assert!(Padding::pad(&[&[1], &[]], 0).is_err());
    }
}
