#!/usr/bin/env python3
"""Compares a PyTorch hand-off run (`moe-studio train --engine torch --emit
JOB`, then `torchrun ... JOB/train.py`) with moe-studio's Burn trainer on the
same stage and data (scripts/torch_handoff_check.sh, issue 17 item 3).

Fails (exit 1) unless:
- every step's loss agrees: |loss_torch - loss_burn| <= --tol (1e-4), and
  the cross-entropy too; prints the table;
- every tensor the stage freezes is bit-identical between JOB/model and
  JOB/out/final (stage experts: expert 0 of every layer and every non-FFN
  tensor; stage router: all but the routers), and every trained one changed;
- moe-studio reads JOB/out/final back: `inspect --json` sees the MoE,
  `logits` equals transformers' logits on the same directory within
  --tol, and `eval` runs.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file


def metrics(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip() and '"step"' in l]


def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, f)))
    return out


def trained(name, stage):
    if re.search(r"\.block_sparse_moe\.gate\.weight$|\.mlp\.gate\.weight$", name):
        return True
    if stage != "experts":
        return False
    m = re.search(r"\.experts\.(\d+)\.", name)
    return m is not None and m.group(1) != "0"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--stage", required=True)
    ap.add_argument("--burn", required=True, help="the Burn trainer's --out")
    ap.add_argument("--job", required=True, help="the emitted job directory (run)")
    ap.add_argument("--eval", required=True, help="NAME=FILE for moe-studio eval")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    bad = []

    burn = metrics(os.path.join(a.burn, "metrics.jsonl"))
    torch_m = metrics(os.path.join(a.job, "out", "metrics.jsonl"))
    if len(burn) != len(torch_m) or not burn:
        bad.append(f"{len(burn)} Burn steps vs {len(torch_m)} torch steps")
    print(f"| step | loss (Burn) | loss (torch FSDP, 2 ranks) | abs diff | ce diff | lb (Burn) | lb (torch) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for b, t in zip(burn, torch_m):
        d = abs(b["loss"] - t["loss"])
        dce = abs(b["ce_loss"] - t["ce_loss"])
        worst = max(worst, d, dce)
        print(f"| {b['step']} | {b['loss']:.7f} | {t['loss']:.7f} | {d:.2e} | {dce:.2e} | "
              f"{b.get('lb_loss') or 0:.6f} | {t.get('lb_loss') or 0:.6f} |")
        if d > a.tol or dce > a.tol:
            bad.append(f"step {b['step']}: |loss diff| {d:.3e}, |ce diff| {dce:.3e} > {a.tol}")
    print(f"max |loss diff| over {len(burn)} steps: {worst:.3e} (tolerance {a.tol})")

    before = tensors(os.path.join(a.job, "model"))
    after = tensors(os.path.join(a.job, "out", "final"))
    burn_final = tensors(os.path.join(a.burn, "final"))
    if sorted(before) != sorted(after):
        bad.append(f"tensor names differ: {sorted(set(before) ^ set(after))}")
    frozen_same = frozen_n = trained_changed = trained_n = 0
    wdiff, compared = 0.0, 0
    for k in sorted(before):
        if k not in after:
            continue
        same = torch.equal(before[k], after[k])
        if trained(k, a.stage):
            trained_n += 1
            trained_changed += not same
        else:
            frozen_n += 1
            frozen_same += same
            if not same:
                bad.append(f"frozen tensor {k} changed (max |diff| {(before[k] - after[k]).abs().max():.3e})")
        if k in burn_final:
            compared += 1
            wdiff = max(wdiff, (burn_final[k].float() - after[k].float()).abs().max().item())
    if trained_changed != trained_n:
        bad.append(f"only {trained_changed} of {trained_n} trained tensors changed")
    print(f"frozen tensors bit-identical: {frozen_same}/{frozen_n}; trained tensors changed: "
          f"{trained_changed}/{trained_n}; max |w_torch - w_burn| after training: "
          + (f"{wdiff:.3e}" if compared else "n/a (Burn wrote another layout)"))

    final = os.path.join(a.job, "out", "final")
    r = subprocess.run([a.bin, "--backend", "cpu", "inspect", final, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        bad.append(f"moe-studio inspect {final}: {r.stderr.strip()}")
    else:
        info = json.loads(r.stdout)
        if not info.get("moe"):
            bad.append(f"moe-studio inspect sees no MoE in {final}")
    ids = [1, 403, 407, 261, 378, 284, 109, 29, 350, 506, 267]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.f32")
        r = subprocess.run([a.bin, "--backend", "cpu", "logits", final, "--ids", ",".join(map(str, ids)),
                            "--out", out], capture_output=True, text=True)
        if r.returncode != 0:
            bad.append(f"moe-studio logits {final}: {r.stderr.strip()}")
        else:
            ours = np.fromfile(out, dtype="<f4")
            from transformers import AutoModelForCausalLM
            m = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
            with torch.no_grad():
                ref = m(torch.tensor([ids])).logits[0].numpy()
            ours = ours.reshape(-1, ref.shape[-1])
            ref = ref[-ours.shape[0]:]
            dl = float(np.abs(ours - ref).max())
            print(f"moe-studio logits of out/final vs transformers' (same files): max |diff| {dl:.3e}")
            if dl > a.tol:
                bad.append(f"logits of {final}: max |diff| {dl:.3e} > {a.tol}")
    r = subprocess.run([a.bin, "--backend", "cpu", "eval", final, "--data", a.eval, "--tokenizer", a.tokenizer,
                        "--max-tokens", "2000", "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        bad.append(f"moe-studio eval {final}: {r.stderr.strip()}")
    else:
        print(f"moe-studio eval of out/final: {r.stdout.strip()[:300]}")
    if bad:
        print("FAILED:\n  " + "\n  ".join(bad), file=sys.stderr)
        sys.exit(1)
    print(f"stage {a.stage}: OK")


if __name__ == "__main__":
    main()
