//! llama2.c "version 0" checkpoints (Karpathy's llama2.c `run.c` layout).
//!
//! Layout: 7 little-endian `i32` (dim, hidden_dim, n_layers, n_heads,
//! n_kv_heads, vocab_size — negative when the classifier is untied —,
//! seq_len), then f32 weights: token_embedding `[V, d]`, rms_att `[L, d]`,
//! wq `[L, d, d]`, wk `[L, kv, d]`, wv `[L, kv, d]`, wo `[L, d, d]`,
//! rms_ffn `[L, d]`, w1 `[L, f, d]`, w2 `[L, d, f]`, w3 `[L, f, d]`,
//! rms_final `[d]`, freq_cis_real/imag `[seq, head/2]` (skipped), wcls
//! `[V, d]` when untied. Linear weights are `[out, in]` like PyTorch.
//!
//! llama2.c rotates interleaved pairs `(2i, 2i+1)`; the studio's model uses
//! Hugging Face's rotate-half layout, so q/k rows are permuted within each
//! head on load exactly as transformers' `convert_llama_weights_to_hf.py`
//! `permute` does.

use std::collections::HashMap;

use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::error::{Result, StudioError};
use crate::tensor_io::{Bytes, DType, TensorInfo, TensorSource};

/// A parsed llama2.c checkpoint exposed with Hugging Face tensor names.
#[derive(Debug, Clone)]
pub struct Llama2cModel {
    name: String,
    bytes: Bytes,
    config: ModelConfig,
    /// HF name -> (shape, float offset into the weights, permute q/k heads).
    tensors: Vec<(TensorInfo, usize, Option<usize>)>,
    index: HashMap<String, usize>,
}

/// Permutes rows of a `[heads * head_dim, in]` weight from llama2.c /
/// llama.cpp interleaved RoPE order to Hugging Face rotate-half order:
/// within each head, row `2i + j` moves to `j * head_dim/2 + i`.
pub fn interleaved_to_half(w: &[f32], heads: usize, head_dim: usize, in_features: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    let half = head_dim / 2;
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = (h * head_dim + 2 * i + j) * in_features;
                let dst = (h * head_dim + j * half + i) * in_features;
                out[dst..dst + in_features].copy_from_slice(&w[src..src + in_features]);
            }
        }
    }
    out
}

impl Llama2cModel {
    /// Parses a llama2.c checkpoint, checking the file size against the
    /// header exactly.
    ///
    /// # Errors
    /// [`StudioError::Format`] naming `file_name` when the header is invalid
    /// or the size does not match the header.
    pub fn parse(bytes: Bytes, file_name: &str) -> Result<Self> {
        let buf = bytes.as_slice();
        crate::tensor_io::bytes::refuse_lfs_pointer(buf, file_name, "llama2.c")?;
        let fmt = |what: String| StudioError::format(file_name, "llama2.c", what);
        if buf.len() < 28 {
            return Err(fmt(format!("file is {} bytes, shorter than the 28-byte header", buf.len())));
        }
        let h: Vec<i32> = (0..7).map(|i| i32::from_le_bytes(buf[4 * i..4 * i + 4].try_into().expect("4"))).collect();
        let names = ["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"];
        for (i, n) in names.iter().enumerate() {
            if (i != 5 && h[i] <= 0) || h[i] == 0 || h[i].unsigned_abs() > 1 << 24 {
                return Err(fmt(format!("header field `{n}` = {} is out of range", h[i])));
            }
        }
        let (d, f, l, nh, nkv) = (h[0] as usize, h[1] as usize, h[2] as usize, h[3] as usize, h[4] as usize);
        let shared = h[5] > 0;
        let v = h[5].unsigned_abs() as usize;
        let seq = h[6] as usize;
        if d % nh != 0 || nh % nkv != 0 {
            return Err(fmt(format!("dim {d} / n_heads {nh} / n_kv_heads {nkv} are inconsistent")));
        }
        let hd = d / nh;
        let kv = nkv * hd;
        let config = ModelConfig {
            architecture: Architecture::Llama,
            vocab_size: v,
            hidden_size: d,
            intermediate_size: f,
            num_layers: l,
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: seq,
            tie_word_embeddings: shared,
            attention_bias: false,
            bos_token_id: Some(1),
            eos_token_id: Some(2),
            family_params: Default::default(),
        };
        config.validate(file_name)?;
        // The size the header implies, checked against the file before any
        // tensor is listed (a 28-byte header claiming 2^24 layers must cost
        // nothing), in u128 so that no product overflows.
        let (d_, f_, l_, v_, kv_) = (d as u128, f as u128, l as u128, v as u128, kv as u128);
        let per_layer = d_ + d_ * d_ + 2 * kv_ * d_ + d_ * d_ + d_ + 3 * f_ * d_;
        let floats = v_ * d_ * if shared { 1 } else { 2 } + l_ * per_layer + d_ + seq as u128 * hd as u128;
        let expected = 28 + 4 * floats;
        if buf.len() as u128 != expected {
            return Err(fmt(format!(
                "file is {} bytes but the header (dim {d}, hidden {f}, layers {l}, heads {nh}/{nkv}, vocab {v}, seq {seq}, {} classifier) needs exactly {expected}",
                buf.len(),
                if shared { "shared" } else { "separate" }
            )));
        }
        // Offsets in floats, after the header.
        let mut off = 0usize;
        let mut tensors: Vec<(TensorInfo, usize, Option<usize>)> = Vec::new();
        let mut push = |name: String, shape: Vec<usize>, at: usize, perm: Option<usize>| {
            tensors.push((TensorInfo { name, dtype: DType::F32, shape }, at, perm));
        };
        push("model.embed_tokens.weight".into(), vec![v, d], off, None);
        off += v * d;
        let stacked: [(&str, Vec<usize>, Option<usize>); 9] = [
            ("input_layernorm.weight", vec![d], None),
            ("self_attn.q_proj.weight", vec![d, d], Some(nh)),
            ("self_attn.k_proj.weight", vec![kv, d], Some(nkv)),
            ("self_attn.v_proj.weight", vec![kv, d], None),
            ("self_attn.o_proj.weight", vec![d, d], None),
            ("post_attention_layernorm.weight", vec![d], None),
            ("mlp.gate_proj.weight", vec![f, d], None),
            ("mlp.down_proj.weight", vec![d, f], None),
            ("mlp.up_proj.weight", vec![f, d], None),
        ];
        for (suffix, shape, perm) in stacked.iter() {
            let n: usize = shape.iter().product();
            for layer in 0..l {
                push(format!("model.layers.{layer}.{suffix}"), shape.clone(), off + layer * n, *perm);
            }
            off += l * n;
        }
        push("model.norm.weight".into(), vec![d], off, None);
        off += d;
        off += seq * hd; // freq_cis_real + freq_cis_imag: seq * (hd/2) each
        if !shared {
            push("lm_head.weight".into(), vec![v, d], off, None);
            off += v * d;
        }
        debug_assert_eq!(28 + 4 * off as u128, expected);
        let index = tensors.iter().enumerate().map(|(i, t)| (t.0.name.clone(), i)).collect();
        Ok(Llama2cModel { name: file_name.to_string(), bytes, config, tensors, index })
    }

    /// The model configuration implied by the header (llama, RoPE theta
    /// 10000, RMSNorm eps 1e-5, BOS 1, EOS 2).
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
}

impl TensorSource for Llama2cModel {
    fn source_name(&self) -> &str {
        &self.name
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        self.tensors.iter().map(|t| t.0.clone()).collect()
    }
    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.index.get(name).map(|&i| self.tensors[i].0.clone())
    }
    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| StudioError::tensor(&self.name, name, "not in a llama2.c checkpoint"))?;
        let (info, off, perm) = &self.tensors[i];
        let n = info.numel();
        let start = 28 + 4 * off;
        let raw = &self.bytes.as_slice()[start..start + 4 * n];
        let v: Vec<f32> = raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(match perm {
            Some(heads) => interleaved_to_half(&v, *heads, self.config.head_dim, info.shape[1]),
            None => v,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_moves_pairs_to_halves() {
        // One head, head_dim 4, in_features 1: rows [r0 r1 r2 r3] (pairs
        // (r0,r1), (r2,r3)) become [r0 r2 r1 r3].
        assert_eq!(interleaved_to_half(&[0., 1., 2., 3.], 1, 4, 1), vec![0., 2., 1., 3.]);
    }

    #[test]
    fn size_mismatch_is_reported() {
        let mut b = Vec::new();
        for x in [8i32, 16, 1, 2, 2, 10, 4] {
            b.extend(x.to_le_bytes());
        }
        b.extend(vec![0u8; 40]);
        let e = Llama2cModel::parse(Bytes::from_vec(b), "tiny.bin").unwrap_err().to_string();
        assert!(e.contains("tiny.bin") && e.contains("needs exactly"), "{e}");
    }
}
