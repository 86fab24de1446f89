#!/usr/bin/env python3
"""Golden logits of an upcycled stories260K loaded by transformers'
MixtralForCausalLM: checks that moe-studio's Mixtral-layout export loads
unchanged in the ecosystem and computes what our model computes.

The checkpoint is made by our CLI (4 experts, top-2, a RANDOM router and
multiplicative NOISE on the non-frozen copies, so that routing matters, and a
router temperature of 0.5, which must be folded into the gate weight since
Mixtral has no temperature):

    cargo run -p moe-studio -- upcycle ../shared/data/models/stories260K/stories260K.bin \
        --experts 4 --top-k 2 --router-init random --router-std 0.5 \
        --noise 0.3 --noise-kind mul --seed 7 --temperature 0.5 --dtype f32 \
        --out /tmp/stories260k-mixtral
    ~/.cache/moe-studio/pyref-venv/bin/python tests/reference/make_mixtral_golden.py /tmp/stories260k-mixtral

Writes tests/reference/golden/stories260k_mixtral.json: the CLI arguments,
the token ids, and the logits of every position ([len(ids) * 512] floats,
row-major, rounded to 6 decimals), computed in float32 on the CPU. The Rust test
`shared/tests/upcycle.rs::mixtral_export_matches_transformers` regenerates the
same checkpoint (the router and noise depend only on the seed and tensor
names) and compares its logits to these (< 1e-4).

Requirements: tests/reference/requirements.txt (torch 2.15, transformers 5.24).
"""

import argparse
import json
import os
import sys

import torch
from transformers import MixtralForCausalLM

CLI_ARGS = [
    "--experts", "4", "--top-k", "2", "--router-init", "random", "--router-std", "0.5",
    "--noise", "0.3", "--noise-kind", "mul", "--seed", "7", "--temperature", "0.5", "--dtype", "f32",
]
IDS = [1, 403, 407, 261, 378, 275, 300, 30, 280, 261, 286, 370, 330, 450, 268, 46]
HERE = os.path.dirname(os.path.abspath(__file__))


def check_provenance(cfg):
    """The directory must come from the CLI_ARGS run (seed, noise, router)."""
    p = cfg.get("moe_studio", {}).get("provenance", {})
    want = {
        "method": "upcycle",
        "seed": 7,
        "temperature": 0.5,
        "router_init": {"kind": "random", "std": 0.5},
        "noise": {"kind": "multiplicative", "std": 0.3},
    }
    got = {k: p.get(k) for k in want}
    if got != want:
        sys.exit(f"config.json provenance {got} is not the CLI_ARGS run {want}")
    if cfg.get("model_type") != "mixtral" or cfg.get("num_local_experts") != 4 or cfg.get("num_experts_per_tok") != 2:
        sys.exit("not a 4-expert top-2 Mixtral-layout directory")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="Mixtral-layout directory written by `moe-studio upcycle` with CLI_ARGS")
    ap.add_argument("--out", default=os.path.join(HERE, "golden", "stories260k_mixtral.json"))
    a = ap.parse_args()
    with open(os.path.join(a.dir, "config.json")) as f:
        cfg = json.load(f)
    check_provenance(cfg)
    torch.manual_seed(0)
    model, info = MixtralForCausalLM.from_pretrained(a.dir, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"transformers did not load the checkpoint cleanly: {bad}")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0].float()
    out = {
        "description": "MixtralForCausalLM (transformers, f32, CPU) logits of stories260K upcycled by "
        "`moe-studio upcycle stories260K.bin " + " ".join(CLI_ARGS) + "`; see make_mixtral_golden.py",
        "cli_args": CLI_ARGS,
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "ids": IDS,
        "vocab_size": logits.shape[1],
        "logits": [round(float(x), 6) for x in logits.reshape(-1).tolist()],
    }
    with open(a.out, "w") as f:
        json.dump(out, f)
    print(f"wrote {a.out} ({len(out['logits'])} logits)")


if __name__ == "__main__":
    main()
