#!/usr/bin/env python3
"""Golden logits of moe-studio's MoE exports loaded by transformers: every
public layout (Mixtral, Qwen2-MoE) on the tiny fixtures, checked to load
with NO missing, unexpected or mismatched keys, and the float32 logits
transformers computes from the exported files.

Each case is made by our CLI from a tiny fixture (tests/fixtures/, see
make_tiny_fixtures.py) with a RANDOM router, multiplicative NOISE on the
non-frozen copies (so that routing matters) and a router temperature of
0.5 (which every public layout folds into the router weight):

    moe-studio upcycle tests/fixtures/<fixture> <CASE args> --out <tmp>/<case>

The Rust test `shared/tests/integration/layouts.rs` regenerates each export
with the same options (the router and the noise depend only on the seed and
the canonical tensor names) and compares its logits to these (< 1e-4).
The `zero-noise` case also records transformers' logits of the DENSE
fixture: an upcycle without noise computes the dense function through the
Qwen2-MoE export (the shared expert is an exact zero). The `shared-expert`,
`granular` cases are issue 15's upcycling variants (docs/methods.md §5) in
the public layouts that hold them; the `shared-expert` case also checks that
the export's `shared_expert` / `shared_expert_gate` tensors are the model's
own (not zero).

Writes tests/reference/golden/layouts.json:
  {"_meta": {...}, "<case>": {"fixture", "args", "class", "model_type",
   "loading_info": {...}, "ids", "logits": [[V floats] x len(ids)],
   "max_abs_diff_vs_dense": float | null}}

Run (CPU, ~1 min; MOE_STUDIO_BIN defaults to $CARGO_TARGET_DIR/debug/moe-studio):
    ~/.cache/moe-studio/pyref-venv/bin/python tests/reference/make_layout_golden.py
Requirements: tests/reference/requirements.txt (torch 2.15, transformers 5.24).
"""

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
GOLDEN = HERE / "golden" / "layouts.json"
IDS = [1, 5, 17, 42, 3, 88, 60, 7, 19, 2, 33, 71]
ROUTED = ["--router-init", "random", "--router-std", "0.5", "--noise", "0.3", "--noise-kind", "mul",
          "--seed", "7", "--temperature", "0.5", "--dtype", "f32"]

# name -> (fixture, upcycle args, expected model_type, allocation or None)
CASES = {
    "llama3-mixtral": ("tiny-llama3", ["--experts", "4", "--top-k", "2", *ROUTED, "--layout", "mixtral"], "mixtral", None),
    "mistral-mixtral-k1": ("tiny-mistral", ["--experts", "3", "--top-k", "1", *ROUTED[:-2]], "mixtral", None),
    "qwen2-qwen2moe": ("tiny-qwen2", ["--experts", "4", "--top-k", "2", *ROUTED, "--layout", "qwen2_moe"], "qwen2_moe", None),
    # issue 16: a Qwen3 base (q/k norms) in its own MoE layout, chosen by `auto`.
    "qwen3-qwen3moe": ("tiny-qwen3", ["--experts", "4", "--top-k", "2", *ROUTED], "qwen3_moe", None),
    "llama3-qwen2moe-dense-layer": ("tiny-llama3", ["--top-k", "2", *ROUTED], "qwen2_moe", {"experts_per_layer": [4, None]}),
    "qwen2-qwen2moe-dense-first": ("tiny-qwen2", ["--top-k", "1", *ROUTED], "qwen2_moe", {"experts_per_layer": [None, 3]}),
    # issue 15's variants in the public layouts that hold them: the model's own
    # sigmoid-gated shared expert (copied FFN, so it is not zero) in Qwen2-MoE;
    # granular experts (f/G) with un-normalised top-k in Qwen2-MoE
    # (moe_intermediate_size, norm_topk_prob false); granular experts in
    # Mixtral (intermediate_size = the expert width).
    "qwen2-qwen2moe-shared-expert": (
        "tiny-qwen2",
        ["--experts", "4", "--top-k", "2", *ROUTED, "--shared-experts", "1", "--shared-gate", "--shared-init", "copy",
         "--layout", "qwen2_moe"],
        "qwen2_moe",
        None,
    ),
    "llama3-qwen2moe-granular-unnormalised": (
        "tiny-llama3",
        ["--experts", "2", "--top-k", "1", "--granularity", "2", "--norm-topk", "false", *ROUTED, "--layout", "qwen2_moe"],
        "qwen2_moe",
        None,
    ),
    "llama3-mixtral-granular": (
        "tiny-llama3",
        ["--experts", "2", "--top-k", "1", "--granularity", "4", *ROUTED],
        "mixtral",
        None,
    ),
    "qwen2-qwen2moe-zero-noise": (
        "tiny-qwen2",
        ["--experts", "4", "--top-k", "2", "--router-init", "random", "--router-std", "0.5", "--seed", "7", "--dtype", "f32"],
        "qwen2_moe",
        None,
    ),
}


def binary():
    b = os.environ.get("MOE_STUDIO_BIN")
    if b:
        return b
    target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache" / "moe-studio" / "target"))
    return str(Path(target) / "debug" / "moe-studio")


def load(path):
    model, info = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    return model.eval(), {k: sorted(map(str, v)) for k, v in info.items()}


def logits_of(model):
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].float()


def main():
    golden = {"_meta": {
        "script": "tests/reference/make_layout_golden.py",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "ids": IDS,
    }}
    tmp = Path(tempfile.mkdtemp(prefix="layout-golden-"))
    for name, (fixture, args, model_type, alloc) in CASES.items():
        out = tmp / name
        cmd = [binary(), "--backend", "ndarray", "upcycle", str(REPO / "tests" / "fixtures" / fixture), *args, "--out", str(out)]
        if alloc is not None:
            af = tmp / f"{name}.alloc.json"
            af.write_text(json.dumps(alloc))
            cmd += ["--allocation", str(af)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        cfg = json.loads((out / "config.json").read_text())
        if cfg["model_type"] != model_type:
            sys.exit(f"{name}: wrote {cfg['model_type']}, expected {model_type}")
        model, info = load(out)
        bad = {k: v for k, v in info.items() if v}
        if bad:
            sys.exit(f"{name}: transformers did not load the export cleanly: {bad}")
        logits = logits_of(model)
        if "shared-expert" in name:
            w = dict(model.named_parameters())["model.layers.0.mlp.shared_expert.down_proj.weight"]
            if float(w.detach().abs().max()) == 0.0:
                sys.exit(f"{name}: the shared expert is zero; expected the model's own (--shared-init copy)")
        diff = None
        if "zero-noise" in name:
            dense, _ = load(REPO / "tests" / "fixtures" / fixture)
            diff = float((logits - logits_of(dense)).abs().max())
            if diff >= 1e-4:
                sys.exit(f"{name}: upcycled export differs from the dense model by {diff}")
        golden[name] = {
            "fixture": fixture,
            "args": args,
            "allocation": alloc,
            "class": type(model).__name__,
            "model_type": model_type,
            "loading_info": info,
            "ids": IDS,
            "logits": [[round(float(x), 6) for x in row] for row in logits.tolist()],
            "max_abs_diff_vs_dense": diff,
        }
        print(f"{name}: {type(model).__name__} loads cleanly; logits std {logits.std():.3f}"
              + (f"; |upcycled - dense| max {diff:.2e}" if diff is not None else ""), file=sys.stderr)
    GOLDEN.write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} B)", file=sys.stderr)


if __name__ == "__main__":
    main()
