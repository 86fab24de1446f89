#!/usr/bin/env python3
"""Golden outputs of mergekit / mergekit-moe run on the committed recipes,
for shared/tests/integration/recipes.rs.

1. Gives the tiny merge fixtures (tests/fixtures/merge/{f32,bf16}/{base,m1,m2},
   made by make_merge_golden.py) a word-level tokenizer (64 words, `<s>`
   prepended; tokenizer.json + tokenizer_config.json) when they lack one:
   mergekit-moe tokenizes the expert prompts with the base's tokenizer.
2. Runs every recipe of tests/reference/recipes/*.yml AS IT IS, from the
   repository root (the recipes' paths are relative to it): merge recipes
   with `mergekit-yaml`, MoE recipes with `mergekit-moe`, both with
   `--random-seed 0`.
3. Writes tests/reference/golden/mergekit_recipes.json: per recipe and
   output tensor the checksums of make_merge_golden.py (dtype, shape, sum,
   sum |x|, sum x^2, first 8 values); for merges with a base also the
   fraction of elements that differ from the base and the L1 norm of
   (out - base) (the DARE statistics); for MoE recipes every value of the
   router tensors (`model.layers.{l}.mlp.gate.weight`) and of the shared
   experts' gates (`model.layers.{l}.mlp.shared_expert_gate.weight`).

Environment: tests/reference/requirements-mergekit.txt (the venv
~/.cache/moe-studio/mergekit-venv):

    ~/.cache/moe-studio/mergekit-venv/bin/python tests/reference/make_recipe_golden.py
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "tests" / "reference" / "recipes"
FIX = ROOT / "tests" / "fixtures" / "merge"
GOLDEN = ROOT / "tests" / "reference" / "golden" / "mergekit_recipes.json"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_merge_golden import checksums  # noqa: E402

WORDS = (
    "code function loop compile test math proof number sum prime story cat dog sun moon tree river house "
    "red blue green big small fast slow happy sad run walk jump sing read write open close left right up down "
    "one two three four five six seven eight nine ten hello world yes no apple bread chair door eagle fire gold"
).split()
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]


def ensure_tokenizers():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(SPECIAL + WORDS)}
    assert len(vocab) == 64, len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIAL)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 64,
    }
    for d in sorted(FIX.glob("*/*")):
        if not (d / "tokenizer.json").exists():
            tok.save(str(d / "tokenizer.json"))
            (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")


def load_all(out_dir):
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(Path(out_dir).glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


def delta_stats(out_dir, base_dir):
    out, base = load_all(out_dir), load_all(base_dir)
    res = {}
    for name in sorted(out):
        o = out[name].to(torch.float64).reshape(-1)
        b = base[name].to(torch.float64).reshape(-1)
        res[name] = {"changed_fraction": float((o != b).double().mean()), "delta_l1": float((o - b).abs().sum())}
    return res


def main():
    ensure_tokenizers()
    from importlib.metadata import version

    golden = {
        "generator": "tests/reference/make_recipe_golden.py",
        "mergekit": version("mergekit"),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "note": "recipes: tests/reference/recipes (paths relative to the repository root); --random-seed 0",
        "recipes": {},
    }
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        for r in sorted(RECIPES.glob("*.yml")):
            conf = yaml.safe_load(r.read_text())
            out = Path(tmp) / r.stem
            tool = "mergekit-yaml" if "merge_method" in conf else "mergekit-moe"
            cmd = [str(bin_dir / tool), str(r.relative_to(ROOT)), str(out), "--random-seed", "0", "--quiet"]
            subprocess.run(cmd, cwd=ROOT, check=True)
            entry = {"tool": tool, "tensors": checksums(out)}
            if tool == "mergekit-yaml" and conf.get("base_model"):
                entry["delta"] = delta_stats(out, ROOT / conf["base_model"])
            if tool == "mergekit-moe":
                t = load_all(out)
                entry["routers"] = {
                    k: [float(x) for x in v.to(torch.float64).reshape(-1)]
                    for k, v in sorted(t.items())
                    if k.endswith(("mlp.gate.weight", "mlp.shared_expert_gate.weight"))
                }
                entry["config"] = json.loads((out / "config.json").read_text())
            golden["recipes"][r.stem] = entry
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({len(golden['recipes'])} recipes)")


if __name__ == "__main__":
    main()
