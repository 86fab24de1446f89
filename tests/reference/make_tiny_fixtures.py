#!/usr/bin/env python3
"""Tiny random Hugging Face checkpoints + their transformers logits.

The real-model test (SmolLM2, shared/tests/smollm2.rs) only covers a Llama
with tied embeddings, no RoPE scaling and f32/GGUF storage. This script builds
three tiny randomly initialised models that cover the other code paths of the
Burn forward and the safetensors loader, saves them with `save_pretrained`,
and records the float32 logits that transformers computes *from the saved
files* (so the storage rounding to bf16/f16 is part of the reference):

  tests/fixtures/tiny-qwen2/    Qwen2ForCausalLM: q/k/v biases, tied
                                embeddings, rope_theta 10000, f32, one file.
  tests/fixtures/tiny-llama3/   LlamaForCausalLM: untied lm_head, rope_scaling
                                llama3 (factor 8, low 1, high 4, original 64),
                                rope_theta 500000, head_dim 16 (> hidden/heads,
                                so one RoPE frequency falls in llama3's
                                "medium" band and is smoothed), bf16 storage,
                                sharded (model.safetensors.index.json).
  tests/fixtures/tiny-mistral/  MistralForCausalLM: untied, f16 storage.
  tests/fixtures/tiny-mixtral/  MixtralForCausalLM written by transformers (the
                                studio's reader on files it did not write):
                                4 experts top-2, untied, bf16 storage.
  tests/fixtures/tiny-qwen2-moe/ Qwen2MoeForCausalLM written by transformers:
                                q/k/v biases, 4 experts top-2,
                                norm_topk_prob true, layer 1 dense
                                (mlp_only_layers), head_dim 16, a shared expert
                                of size 8 whose down projection is ZERO (the
                                form the studio reads exactly), tied, f32.
  tests/fixtures/tiny-qwen3/    Qwen3ForCausalLM: q/k RMSNorm per head
                                (q_norm/k_norm, random weights), no bias,
                                head_dim 16 (!= hidden / heads = 8), tied,
                                rope_theta 1e6, f32.
  tests/fixtures/tiny-qwen3-moe/ Qwen3MoeForCausalLM written by transformers:
                                q/k norms, 4 experts top-2 of width 24
                                (moe_intermediate_size != intermediate_size),
                                norm_topk_prob true, layer 1 dense
                                (mlp_only_layers), head_dim 16, untied, f32.
  tests/fixtures/tiny-gemma2/   Gemma2ForCausalLM: GeGLU (gelu tanh), (1 + w)
                                sandwich RMSNorms, sqrt(d) embedding scale,
                                query_pre_attn_scalar 12 (!= head_dim 16),
                                attention soft-cap 2 and final soft-cap 3 (small,
                                so that tanh bends the values), layer 0 sliding
                                with sliding_window 4 (< the 12-token test
                                sequence), layer 1 full, tied, f32.
  tests/fixtures/tiny-gemma3/   Gemma3ForCausalLM (gemma3_text): Gemma 2's
                                blocks without soft-caps, (1 + w) q/k norms,
                                layer 0 sliding (window 4, RoPE base 1e4
                                unscaled), layer 1 full (RoPE base 1e6 with
                                linear scaling factor 2), query_pre_attn_scalar
                                12, tied, bf16 storage.
  tests/fixtures/tiny-phi3/     Phi3ForCausalLM: fused qkv_proj / gate_up_proj,
                                rope_scaling longrope (short factors
                                [1, 1.5, 2, 3], long [2, 3, 5, 8], original
                                64 of 256: attention factor sqrt(1 + ln 4 /
                                ln 64)), sliding_window 6 over every layer,
                                untied, f32.

Shapes: vocab 96, hidden 32, intermediate 48, 2 layers, 4 heads, 2 kv heads,
max_position_embeddings 256. Every parameter is re-drawn from a seeded normal
(linear/embedding weights std 0.15, biases std 0.1, RMSNorm weights 1 + 0.2 N)
so that biases and norm weights are not the trivial 0 / 1 transformers
initialises them to, and logits are of order 1.

Golden output: tests/reference/golden/tiny_fixtures.json
  {"_meta": {versions, ids},
   "<name>": {"dir": "tests/fixtures/<name>", "storage_dtype": ...,
              "ids": [...], "logits": [[96 floats] x 12]}}

Run (CPU, a few seconds):
    ~/.cache/moe-studio/pyref-venv/bin/python tests/reference/make_tiny_fixtures.py [NAME ...]
(names: rebuild only those fixtures and update their golden entries).
Deterministic: torch.manual_seed(SEED) before each model; eager attention;
float32 on CPU.
"""

import json
import platform
import shutil
import sys
from pathlib import Path

import torch
import transformers
import safetensors
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIXTURES = REPO / "tests" / "fixtures"
GOLDEN = HERE / "golden" / "tiny_fixtures.json"

SEED = 20240607
IDS = [1, 5, 17, 42, 3, 88, 60, 7, 19, 2, 33, 71]
KEEP = ("config.json", "model.safetensors.index.json")

COMMON = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
)


def randomize(model, seed):
    """Re-draws every parameter from a seeded normal (see module doc); a
    Qwen2-MoE shared expert's down projection is then set to zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * r)
            elif name.endswith(".bias"):
                p.copy_(0.1 * r)
            elif "shared_expert.down_proj" in name:
                p.zero_()
            else:
                p.copy_(0.15 * r)


def specs():
    return [
        dict(
            name="tiny-qwen2",
            cls=Qwen2ForCausalLM,
            config=Qwen2Config(**COMMON, tie_word_embeddings=True, rope_theta=10000.0),
            dtype=torch.float32,
            shard=None,
        ),
        dict(
            name="tiny-llama3",
            cls=LlamaForCausalLM,
            config=LlamaConfig(
                **COMMON,
                head_dim=16,
                tie_word_embeddings=False,
                rope_theta=500000.0,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
            dtype=torch.bfloat16,
            shard="20KB",
        ),
        dict(
            name="tiny-mistral",
            cls=MistralForCausalLM,
            config=MistralConfig(**COMMON, tie_word_embeddings=False, rope_theta=10000.0),
            dtype=torch.float16,
            shard=None,
        ),
        dict(
            name="tiny-mixtral",
            cls=MixtralForCausalLM,
            config=MixtralConfig(
                **COMMON, tie_word_embeddings=False, rope_theta=10000.0, num_local_experts=4, num_experts_per_tok=2
            ),
            dtype=torch.bfloat16,
            shard=None,
        ),
        dict(
            name="tiny-qwen2-moe",
            cls=Qwen2MoeForCausalLM,
            config=Qwen2MoeConfig(
                **COMMON,
                head_dim=16,
                tie_word_embeddings=True,
                rope_theta=10000.0,
                num_experts=4,
                num_experts_per_tok=2,
                norm_topk_prob=True,
                moe_intermediate_size=48,
                shared_expert_intermediate_size=8,
                mlp_only_layers=[1],
            ),
            dtype=torch.float32,
            shard=None,
        ),
        dict(
            name="tiny-qwen3",
            cls=Qwen3ForCausalLM,
            config=Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=True, rope_theta=1000000.0),
            dtype=torch.float32,
            shard=None,
        ),
        dict(
            name="tiny-qwen3-moe",
            cls=Qwen3MoeForCausalLM,
            config=Qwen3MoeConfig(
                **COMMON,
                head_dim=16,
                tie_word_embeddings=False,
                rope_theta=1000000.0,
                num_experts=4,
                num_experts_per_tok=2,
                norm_topk_prob=True,
                moe_intermediate_size=24,
                mlp_only_layers=[1],
            ),
            dtype=torch.float32,
            shard=None,
        ),
        dict(
            name="tiny-gemma2",
            cls=Gemma2ForCausalLM,
            config=Gemma2Config(
                **{**COMMON, "hidden_act": "gelu_pytorch_tanh"},
                hidden_activation="gelu_pytorch_tanh",
                head_dim=16,
                tie_word_embeddings=True,
                query_pre_attn_scalar=12,
                attn_logit_softcapping=2.0,
                final_logit_softcapping=3.0,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
            ),
            dtype=torch.float32,
            shard=None,
        ),
        dict(
            name="tiny-gemma3",
            cls=Gemma3ForCausalLM,
            config=Gemma3TextConfig(
                **{**COMMON, "hidden_act": "gelu_pytorch_tanh"},
                hidden_activation="gelu_pytorch_tanh",
                head_dim=16,
                tie_word_embeddings=True,
                query_pre_attn_scalar=12,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention"],
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
            ),
            dtype=torch.bfloat16,
            shard=None,
        ),
        dict(
            name="tiny-phi3",
            cls=Phi3ForCausalLM,
            config=Phi3Config(
                **COMMON,
                tie_word_embeddings=False,
                pad_token_id=0,
                original_max_position_embeddings=64,
                sliding_window=6,
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": [1.0, 1.5, 2.0, 3.0],
                    "long_factor": [2.0, 3.0, 5.0, 8.0],
                    "original_max_position_embeddings": 64,
                },
            ),
            dtype=torch.float32,
            shard=None,
        ),
    ]


def save(spec, out):
    torch.manual_seed(SEED)
    cfg = spec["config"]
    cfg._attn_implementation = "eager"
    model = spec["cls"](cfg).eval()
    randomize(model, SEED)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "not tied"
    model = model.to(spec["dtype"])
    if out.exists():
        shutil.rmtree(out)
    kw = {"safe_serialization": True}
    if spec["shard"]:
        kw["max_shard_size"] = spec["shard"]
    model.save_pretrained(out, **kw)
    for f in out.iterdir():
        if f.name not in KEEP and f.suffix != ".safetensors":
            f.unlink()


def logits_from_saved(spec, out):
    model = spec["cls"].from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32, n
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0]
    assert logits.shape == (len(IDS), spec["config"].vocab_size)
    return model, logits


def main():
    only = sys.argv[1:]  # fixture names to (re)build; all when none
    golden = json.loads(GOLDEN.read_text()) if only and GOLDEN.exists() else {}
    golden.update({
        "_meta": {
            "script": "tests/reference/make_tiny_fixtures.py",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "safetensors": safetensors.__version__,
            "seed": SEED,
        }
    })
    for spec in specs():
        name = spec["name"]
        if only and name not in only:
            continue
        out = FIXTURES / name
        save(spec, out)
        model, logits = logits_from_saved(spec, out)
        files = sorted(f.name for f in out.iterdir())
        size = sum(f.stat().st_size for f in out.iterdir())
        assert size < 200_000, (name, size)
        if spec["shard"]:
            assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 1
        cfg_json = json.loads((out / "config.json").read_text())
        print(
            f"{name}: {files} {size} B; logits std {logits.std():.3f} max|.| {logits.abs().max():.3f}; "
            f"rope: rope_theta={cfg_json.get('rope_theta')} rope_scaling={cfg_json.get('rope_scaling')} "
            f"rope_parameters={cfg_json.get('rope_parameters')} tie={cfg_json.get('tie_word_embeddings')} "
            f"dtype={cfg_json.get('dtype', cfg_json.get('torch_dtype'))}",
            file=sys.stderr,
        )
        golden[name] = {
            "dir": f"tests/fixtures/{name}",
            "storage_dtype": str(spec["dtype"]).replace("torch.", ""),
            "ids": IDS,
            "logits": [[float(x) for x in row] for row in logits.tolist()],
        }
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    with open(GOLDEN, "w") as f:
        json.dump(golden, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} B)", file=sys.stderr)


if __name__ == "__main__":
    main()
