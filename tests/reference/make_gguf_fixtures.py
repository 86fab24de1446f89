#!/usr/bin/env python3
"""GGUF files made from the tiny transformers fixtures, the way llama.cpp's
`convert_hf_to_gguf.py` writes them, with the `gguf` Python package.

  tests/fixtures/tiny-llama3.gguf   tests/fixtures/tiny-llama3 (Llama,
                                    rope_scaling llama3: factor 8, low 1,
                                    high 4, original 64, rope_theta 500000,
                                    head_dim 16) as GGUF architecture
                                    `llama`: q/k rows permuted to llama.cpp's
                                    interleaved RoPE order (`LlamaModel.permute`)
                                    and the per-frequency RoPE divisors as the
                                    F32 tensor `rope_freqs.weight`
                                    (`LlamaModel.generate_extra_tensors`; no
                                    `rope.scaling.*` keys, as llama.cpp writes
                                    it for Llama 3.1+). Weights F32 (the
                                    fixture's bf16 values, exact). No
                                    tokenizer (the fixture has none);
                                    `llama.vocab_size` gives V.
  tests/fixtures/tiny-qwen3.gguf    tests/fixtures/tiny-qwen3 (q/k RMSNorm,
                                    head_dim 16, tied) as GGUF architecture
                                    `qwen3` (`Qwen3Model` of the converter:
                                    no q/k permutation, `blk.N.attn_{q,k}_norm`,
                                    no `output.weight` when tied). F32.
  tests/fixtures/tiny-gemma2.gguf   tests/fixtures/tiny-gemma2 as `gemma2`
                                    (`Gemma2Model`): every `*norm.weight`
                                    stored as 1 + w, the sandwich norms as
                                    `post_attention_norm` / `ffn_norm` (the
                                    pre-FFN norm) / `post_ffw_norm`, no
                                    lm_head (tied), keys
                                    `gemma2.attention.sliding_window`,
                                    `gemma2.{attn,final}_logit_softcapping`,
                                    no `rope.freq_base` and no
                                    `query_pre_attn_scalar` (the converter
                                    writes neither). F32.
  tests/fixtures/tiny-gemma3.gguf   tests/fixtures/tiny-gemma3 as `gemma3`
                                    (`Gemma3Model`): norms (q/k norms
                                    included) as 1 + w, `rope.freq_base` of
                                    the global layers (1e6) with their linear
                                    scaling (`rope.scaling.type/factor`),
                                    `attention.sliding_window`. The bf16
                                    weights as F32 (exact); 1 + w is computed
                                    in f32 (the converter adds in the
                                    checkpoint's dtype, which for bf16
                                    rounds: exactness here is the point).
  tests/fixtures/tiny-phi3.gguf     tests/fixtures/tiny-phi3 as `phi3`
                                    (`Phi3MiniModel`): fused `attn_qkv` and
                                    `ffn_up` (= gate_up_proj, gate rows
                                    first), `rope_factors_{long,short}.weight`,
                                    `rope.scaling.original_context_length`,
                                    `rope.scaling.attn_factor`,
                                    `attention.sliding_window`,
                                    `rope.dimension_count`. F32.

The test (shared/tests/integration/gguf_families.rs) loads it and the
safetensors original and compares their logits with each other and with the
transformers golden of the original (tests/reference/golden/tiny_fixtures.json).

Run (CPU, a second):
    ~/.cache/moe-studio/pyref-venv/bin/python tests/reference/make_gguf_fixtures.py
"""

import json
import math
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"


def load_dir(d):
    tensors = {}
    for f in sorted(d.glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


def permute(w, n_head, n_head_kv=None):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg, rope):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.generate_extra_tensors."""
    base = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rope.get("factor", 8.0)
    low_freq_factor = rope.get("low_freq_factor", 1.0)
    high_freq_factor = rope.get("high_freq_factor", 4.0)
    old_context_len = rope.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(1)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
BLOCK = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_up_proj": "ffn_up",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


# gguf-py tensor_mapping.py: Gemma's sandwich norms.
GEMMA_BLOCK = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def gguf_name(hf, arch="llama"):
    if hf in NAMES:
        return NAMES[hf]
    parts = hf.split(".")
    layer, module, suffix = parts[2], ".".join(parts[3:-1]), parts[-1]
    if arch.startswith("gemma") and module in GEMMA_BLOCK:
        return f"blk.{layer}.{GEMMA_BLOCK[module]}.{suffix}"
    return f"blk.{layer}.{BLOCK[module]}.{suffix}"


def family_keys(w, arch, cfg, rope):
    """The keys and extra tensors of `Gemma2Model` / `Gemma3Model` /
    `Phi3MiniModel.set_gguf_parameters` / `generate_extra_tensors`."""
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
    elif arch == "gemma3":
        full = rope.get("full_attention", rope)
        if full.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
    elif arch == "phi3":
        orig = rope["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        scale = cfg["max_position_embeddings"] / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))


def write_gguf(name, arch):
    src = FIXTURES / name
    cfg = json.loads((src / "config.json").read_text())
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    out = FIXTURES / f"{name}.gguf"
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    if arch != "phi3":  # Phi3MiniModel writes no key/value length
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if arch == "gemma3":
        w.add_rope_freq_base(rope.get("full_attention", rope).get("rope_theta", 1_000_000.0))
    elif arch != "gemma2":
        w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if not arch.startswith("gemma"):
        w.add_rope_dimension_count(head_dim)
    family_keys(w, arch, cfg, rope)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    note = ""
    if rope.get("rope_type") == "llama3":
        factors = llama3_rope_factors(cfg, rope)
        w.add_tensor("rope_freqs.weight", factors)
        note = f"; rope_freqs {factors.tolist()}"
    for hf, t in sorted(load_dir(src).items()):
        if arch.startswith("gemma") and hf == "lm_head.weight":
            continue
        a = t.float().numpy()
        if arch.startswith("gemma") and hf.endswith("norm.weight"):
            a = a + np.float32(1.0)
        if arch == "llama" and hf.endswith("q_proj.weight"):
            a = permute(a, n_head, n_head)
        elif arch == "llama" and hf.endswith("k_proj.weight"):
            a = permute(a, n_head, n_kv)
        w.add_tensor(gguf_name(hf, arch), np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{out}: {out.stat().st_size} B{note}", file=sys.stderr)
    assert out.stat().st_size < 300_000


def main():
    write_gguf("tiny-llama3", "llama")
    write_gguf("tiny-qwen3", "qwen3")
    write_gguf("tiny-gemma2", "gemma2")
    write_gguf("tiny-gemma3", "gemma3")
    write_gguf("tiny-phi3", "phi3")


if __name__ == "__main__":
    main()
