#!/usr/bin/env python3
"""Packed expert tensors (transformers 5's MoE layout) as transformers and
mergekit-moe 0.1.5 write them, for the studio's reader
(shared/src/layout/packed.rs) and its tests.

Two fixtures, both tiny (vocab 96, hidden 32, 2 layers, 4 experts, as
make_tiny_fixtures.py):

  tests/fixtures/tiny-qwen3-moe-packed/
      The SAME model as tests/fixtures/tiny-qwen3-moe (same spec, seed and
      randomisation: make_tiny_fixtures.specs()), saved by transformers with
      `save_pretrained(save_original_format=False)`: its model layout,
      `model.layers.{l}.mlp.experts.gate_up_proj [E, 2f, d]` and
      `...experts.down_proj [E, d, f]` instead of the per-expert
      `experts.{e}.{gate,up,down}_proj.weight` of the default save. This
      script checks that every packed tensor is, bit for bit, the per-expert
      twin's tensors stacked (gate rows, then up rows) and that transformers
      computes bit-identical logits from both directories.

  tests/fixtures/tiny-mergekit-moe/
      The output of `mergekit-moe` 0.1.5 (`gate_mode: random`, 4 experts,
      top-2, Mixtral, bfloat16) on a tiny random Llama (default RoPE, untied,
      a character-level tokenizer so that mergekit, which loads the base's
      tokenizer, and the studio's `route` can run) whose four "expert"
      models are the base plus seeded noise (std 0.05). mergekit writes the
      packed Mixtral form under transformers 5's `mlp.` names
      (`mlp.gate.weight`, `mlp.experts.gate_up_proj`,
      `mlp.experts.down_proj`) and copies the tokenizer. Its router is
      `torch.randn` (unseeded in mergekit): the fixture is what one run
      wrote, and the golden logits are transformers' on that directory.

Golden output: tests/reference/golden/packed_experts.json
  {"_meta": {...},
   "tiny-qwen3-moe-packed": {"dir", "twin", "packed_tensors": {name: shape},
       "ids", "logits": [[96] x 12], "max_abs_diff_vs_twin": 0.0},
   "tiny-mergekit-moe": {"dir", "mergekit_config", "tensors": {name: shape},
       "ids", "logits": [[96] x 12], "loading_info": {...}}}

Run (CPU, ~30 s; re-running rewrites both fixtures, and mergekit's random
router makes the second one different each time):
    ~/.cache/moe-studio/pyref-venv/bin/python tests/reference/make_packed_golden.py [qwen3|mergekit]
mergekit-moe runs from MERGEKIT_PYTHON (default
~/.cache/moe-studio/mergekit-venv/bin/python: tests/reference/requirements-mergekit.txt).
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import safetensors
import safetensors.torch
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, MixtralForCausalLM, PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_tiny_fixtures as tf  # noqa: E402

REPO = HERE.parent.parent
FIXTURES = REPO / "tests" / "fixtures"
GOLDEN = HERE / "golden" / "packed_experts.json"
IDS = tf.IDS
MERGEKIT_PYTHON = os.environ.get(
    "MERGEKIT_PYTHON", str(Path.home() / ".cache/moe-studio/mergekit-venv/bin/python")
)

# Characters of the tiny tokenizer (ids 3..95 after <unk>, <s>, </s>).
CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"-()[]{}/@#$%^&*_+=<>|~`"


def logits_of(cls, path):
    model, info = cls.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0]
    return logits, {k: sorted(map(str, v)) for k, v in info.items()}


def qwen3_packed(golden):
    spec = next(s for s in tf.specs() if s["name"] == "tiny-qwen3-moe")
    twin = FIXTURES / "tiny-qwen3-moe"
    out = FIXTURES / "tiny-qwen3-moe-packed"
    # make_tiny_fixtures.save with save_original_format=False
    torch.manual_seed(tf.SEED)
    cfg = spec["config"]
    cfg._attn_implementation = "eager"
    model = spec["cls"](cfg).eval()
    tf.randomize(model, tf.SEED)
    model = model.to(spec["dtype"])
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True, save_original_format=False)
    for f in out.iterdir():
        if f.name not in tf.KEEP and f.suffix != ".safetensors":
            f.unlink()
    packed = safetensors.torch.load_file(out / "model.safetensors")
    per_expert = safetensors.torch.load_file(twin / "model.safetensors")
    shapes = {}
    for name, t in sorted(packed.items()):
        if name.endswith("experts.gate_up_proj"):
            p = name[: -len("gate_up_proj")]
            e = t.shape[0]
            gate = torch.stack([per_expert[f"{p}{i}.gate_proj.weight"] for i in range(e)])
            up = torch.stack([per_expert[f"{p}{i}.up_proj.weight"] for i in range(e)])
            assert torch.equal(t, torch.cat([gate, up], dim=1)), name
            shapes[name] = list(t.shape)
        elif name.endswith("experts.down_proj"):
            p = name[: -len("down_proj")]
            down = torch.stack([per_expert[f"{p}{i}.down_proj.weight"] for i in range(t.shape[0])])
            assert torch.equal(t, down), name
            shapes[name] = list(t.shape)
        else:
            assert torch.equal(t, per_expert[name]), name
    assert shapes, "transformers wrote no packed tensors"
    logits, info = logits_of(spec["cls"], out)
    twin_logits, _ = logits_of(spec["cls"], twin)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    diff = float((logits - twin_logits).abs().max())
    assert diff == 0.0, diff
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"tiny-qwen3-moe-packed: {sorted(shapes)} {size} B; logits = twin's bit for bit", file=sys.stderr)
    golden["tiny-qwen3-moe-packed"] = {
        "dir": "tests/fixtures/tiny-qwen3-moe-packed",
        "twin": "tests/fixtures/tiny-qwen3-moe",
        "packed_tensors": shapes,
        "ids": IDS,
        "logits": [[float(x) for x in row] for row in logits.tolist()],
        "max_abs_diff_vs_twin": diff,
    }


def char_tokenizer(out):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in CHARS:
        vocab[c] = len(vocab)
    assert len(vocab) == 96, len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=True
    )
    fast.save_pretrained(out)


def tiny_llama(out, seed, base_state=None, noise=0.0):
    cfg = LlamaConfig(**tf.COMMON, tie_word_embeddings=False, rope_theta=10000.0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    if base_state is None:
        tf.randomize(model, seed)
    else:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(model.named_parameters()):
                p.copy_(base_state[name] + noise * torch.randn(p.shape, generator=g))
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    char_tokenizer(out)
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def mergekit_moe(golden):
    out = FIXTURES / "tiny-mergekit-moe"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = tiny_llama(tmp / "base", tf.SEED)
        for i in range(4):
            tiny_llama(tmp / f"expert{i}", tf.SEED + 1 + i, base_state=base, noise=0.05)
        config = "\n".join(
            [
                f"base_model: {tmp / 'base'}",
                "gate_mode: random",
                "dtype: bfloat16",
                "experts_per_token: 2",
                "experts:",
                *[f"  - source_model: {tmp / f'expert{i}'}" for i in range(4)],
                "",
            ]
        )
        (tmp / "moe.yml").write_text(config)
        if out.exists():
            shutil.rmtree(out)
        subprocess.run(
            [MERGEKIT_PYTHON, "-m", "mergekit.scripts.moe", str(tmp / "moe.yml"), str(out)],
            check=True,
        )
    # The config mergekit copies holds our temporary paths: name them generically.
    cfg_yml = (out / "mergekit_moe_config.yml").read_text().replace(str(tmp), "/tmp/tiny-mergekit-moe-inputs")
    (out / "mergekit_moe_config.yml").write_text(cfg_yml)
    tensors = {}
    with safetensors.safe_open(out / "model.safetensors", "pt") as f:
        for name in f.keys():
            tensors[name] = list(f.get_slice(name).get_shape())
    assert "model.layers.0.mlp.experts.gate_up_proj" in tensors, sorted(tensors)
    logits, info = logits_of(MixtralForCausalLM, out)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    files = sorted(f.name for f in out.iterdir())
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"tiny-mergekit-moe: {files} {size} B; logits max|.| {logits.abs().max():.3f}", file=sys.stderr)
    golden["tiny-mergekit-moe"] = {
        "dir": "tests/fixtures/tiny-mergekit-moe",
        "mergekit_config": cfg_yml,
        "tensors": tensors,
        "ids": IDS,
        "logits": [[float(x) for x in row] for row in logits.tolist()],
        "loading_info": info,
    }


def main():
    only = sys.argv[1:]
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    golden["_meta"] = {
        "script": "tests/reference/make_packed_golden.py",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "mergekit": subprocess.run(
            [MERGEKIT_PYTHON, "-c", "import importlib.metadata as m; print(m.version('mergekit'))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip(),
        "seed": tf.SEED,
    }
    if not only or "qwen3" in only:
        qwen3_packed(golden)
    if not only or "mergekit" in only:
        mergekit_moe(golden)
    with open(GOLDEN, "w") as f:
        json.dump(golden, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} B)", file=sys.stderr)


if __name__ == "__main__":
    main()
