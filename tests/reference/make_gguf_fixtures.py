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
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf):
    if hf in NAMES:
        return NAMES[hf]
    parts = hf.split(".")
    layer, module, suffix = parts[2], ".".join(parts[3:-1]), parts[-1]
    return f"blk.{layer}.{BLOCK[module]}.{suffix}"


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
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    note = ""
    if rope.get("rope_type") == "llama3":
        factors = llama3_rope_factors(cfg, rope)
        w.add_tensor("rope_freqs.weight", factors)
        note = f"; rope_freqs {factors.tolist()}"
    for hf, t in sorted(load_dir(src).items()):
        a = t.float().numpy()
        if arch == "llama" and hf.endswith("q_proj.weight"):
            a = permute(a, n_head, n_head)
        elif arch == "llama" and hf.endswith("k_proj.weight"):
            a = permute(a, n_head, n_kv)
        w.add_tensor(gguf_name(hf), np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{out}: {out.stat().st_size} B{note}", file=sys.stderr)
    assert out.stat().st_size < 300_000


def main():
    write_gguf("tiny-llama3", "llama")
    write_gguf("tiny-qwen3", "qwen3")


if __name__ == "__main__":
    main()
