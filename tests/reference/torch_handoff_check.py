#!/usr/bin/env python3
"""Runs each method of tests/reference/torch_handoff_cases.json through the
PyTorch hand-off and compares it with moe-studio's Burn trainer
(scripts/torch_handoff_check.sh, issue 39; opt-in: it needs torch).

Per stage of every case:
1. the Burn trainer runs the stage (`train --json --out burn-STAGE`, one
   device, the global batch of 4 sequences per micro-step);
2. the same stage is emitted (`train --engine torch --emit torch-STAGE`) and
   run with `torchrun --nproc-per-node 2` (gloo, FSDP2, 2 sequences per rank);
3. it fails (exit 1) unless
   - every step's loss and cross-entropy agree: |torch - Burn| <= --tol
     (1e-5), and the aux-free selection biases are equal;
   - every tensor the stage does not train is bit-identical in the job's
     model/, its out/final and Burn's final; every one it trains changed in
     torch exactly when it changed in Burn, and is within --wtol (1e-4) of
     Burn's;
   - moe-studio reads out/final back: `inspect` sees the MoE in the same
     layout, its logits equal the Burn-trained model's within --ltol (1e-4)
     and PyTorch's own (transformers' class or studio_moe.py) on the same
     files, `eval` runs (and `neurons` for NeuronMoE);
   - torch trains the elements the emitting command counted
     (job.json `parameters`);
   - with `"resume": true`, a second run killed after step 12 (its newest
     checkpoint is step 10) and resumed (`--resume`) logs the same losses as
     the uninterrupted run and ends with the same weights.
4. The structure of every emitted job (layout, modeling, files, tensors,
   trainable counts and names) is compared with
   tests/reference/golden/torch_handoff.json (written with
   --update-golden), which backend/tests/torch_handoff_cli.rs checks
   without torch.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import types

import numpy as np
import torch
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = os.path.join(ROOT, "tests/reference/torch_handoff_cases.json")
GOLDEN = os.path.join(ROOT, "tests/reference/golden/torch_handoff.json")
IDS = [1, 403, 407, 261, 378, 284, 109, 29, 350, 506, 267]


def sub(x, env):
    for k in sorted(env, key=len, reverse=True):
        x = x.replace("$" + k, env[k])
    return x


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(argv)}\n{r.stderr[-4000:]}")
    return r.stdout


def metrics(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip() and '"step"' in l]


def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, f)))
    return out


def header_shapes(d):
    """{name: shape} from the safetensors headers of model directory d."""
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                h = json.loads(fh.read(n))
            out.update({k: v["shape"] for k, v in h.items() if k != "__metadata__"})
    return out


def load_train_py(job):
    spec = importlib.util.spec_from_file_location(f"train_{abs(hash(job))}", os.path.join(job, "train.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def torch_model(job, model_dir):
    """The job's PyTorch model (its train.py's own builder) over model_dir."""
    tp = load_train_py(job)
    j = tp.Job(job)
    view = types.SimpleNamespace(j=j.j, c=j.c, model_dir=model_dir, config_json=json.load(
        open(os.path.join(model_dir, "config.json"))), modeling=j.modeling)
    return tp, (tp.StudioModel(view) if j.modeling == "studio" else tp.TransformersModel(view))


def structure(job):
    """What the golden file records of an emitted job."""
    j = json.load(open(os.path.join(job, "job.json")))
    tp, w = torch_model(job, os.path.join(job, "model"))
    masked = w.select_trainable()
    moe_set = getattr(w, "moe_set", set())
    names, n_train = [], 0
    for n, p in w.model.named_parameters():
        if p.requires_grad:
            names.append(w.sm.canonical_name(n, moe_set) if j.get("modeling") == "studio" else n)
            n_train += p.numel() * (1 - len(masked.get(n, [])) / p.shape[0])
    cfg = json.load(open(os.path.join(job, "model", "config.json")))
    keep = ["stage", "steps", "seq_len", "batch_size", "grad_accum", "devices", "balance", "lb_form", "alpha",
            "prior", "z_loss", "bias_update_rate", "norm_topk", "save_every"]
    return {
        "layout": j["layout"],
        "modeling": j.get("modeling", "transformers"),
        "model_type": cfg.get("model_type"),
        "moe_layers": cfg.get("moe_layers"),
        "files": sorted(os.path.relpath(os.path.join(dp, f), job) for dp, _, fs in os.walk(job) for f in fs
                        if not os.path.relpath(dp, job).startswith("out")),
        "global_batch": j["global_batch"],
        "data": {k: j["data"][k] for k in ("rows", "row_len")},
        "train": {k: j["train"].get(k) for k in keep},
        "parameters": j["parameters"],
        "torch_trainable_elements": int(round(n_train)),
        "torch_trainable_tensors": sorted(names),
        "tensors": header_shapes(os.path.join(job, "model")),
    }


def trained_rule(cfg, stage, balance):
    """name -> whether the stage trains it (shared/src/train/freeze.rs), for any layout's names."""
    studio = cfg.get("moe_studio", {})
    layers = cfg.get("moe_layers")
    frozen = studio.get("frozen_experts", [])
    shared_frozen = studio.get("shared_frozen", [])
    zero_shared = bool(studio.get("zero_shared_expert", False))

    def frozen_of(l):
        if layers is not None and l < len(layers) and layers[l]:
            return set(layers[l].get("frozen", []))
        return set(frozen[l]) if l < len(frozen) else set()

    def sfrozen(l):
        if layers is not None and l < len(layers) and layers[l]:
            return bool(layers[l].get("shared_frozen", False))
        return zero_shared or (l < len(shared_frozen) and bool(shared_frozen[l]))

    def rule(name):
        if stage == "dense":
            return True
        if stage == "ffn":
            return re.match(r"^model\.layers\.\d+\.mlp\.", name) is not None
        m = re.match(r"^model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.(.*)$", name)
        if not m:
            return False
        l, rest = int(m.group(1)), m.group(2)
        if rest in ("gate.weight", "gate.bias"):
            return True
        if rest == "gate.e_score_correction_bias":
            return balance == "aux-free"
        if stage != "experts":
            return False
        e = re.match(r"^experts\.(\d+)\.", rest)
        if e:
            return int(e.group(1)) not in frozen_of(l)
        if rest.startswith(("shared_experts.", "shared_expert.", "shared_expert_gate.")):
            return not sfrozen(l)
        return False

    return rule


def logits_of(binary, model, out):
    run([binary, "--backend", "cpu", "logits", model, "--ids", ",".join(map(str, IDS)), "--out", out])
    return np.fromfile(out, dtype="<f4")


def torchrun(torchrun_bin, job, extra=(), background=False):
    argv = [torchrun_bin, "--standalone", "--nproc-per-node", "2", os.path.join(job, "train.py"), "--device", "cpu",
            *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if background:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(argv)}\n{(r.stdout + r.stderr)[-6000:]}")
    return r.stdout


def check_resume(torchrun_bin, job, kill_after=12):
    """Kill a second run after step `kill_after`, resume it, compare with out/."""
    out = os.path.join(job, "out-resume")
    shutil.rmtree(out, ignore_errors=True)
    p = torchrun(torchrun_bin, job, ["--out", out], background=True)
    mpath = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + 600
    while time.time() < deadline:
        if os.path.exists(mpath) and any(m["step"] >= kill_after for m in metrics(mpath)):
            break
        if p.poll() is not None:
            sys.exit("FAILED: the run to interrupt ended before step %d" % kill_after)
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    killed_at = max(m["step"] for m in metrics(mpath))
    ck = sorted(d for d in os.listdir(out) if re.match(r"^checkpoint-\d{6}$", d))
    torchrun(torchrun_bin, job, ["--out", out, "--resume"])
    a, b = metrics(os.path.join(job, "out", "metrics.jsonl")), metrics(mpath)
    if [m["step"] for m in a] != [m["step"] for m in b]:
        return None, f"resumed steps {[m['step'] for m in b]} vs {[m['step'] for m in a]}"
    dl = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
    ta, tb = tensors(os.path.join(job, "out", "final")), tensors(os.path.join(out, "final"))
    dw = max((ta[k] - tb[k]).abs().max().item() for k in ta)
    info = {"killed_after_step": killed_at, "resumed_from": ck[-1] if ck else None, "max_abs_loss_diff": dl,
            "max_abs_weight_diff": dw}
    bad = None if dl == 0.0 and dw == 0.0 else f"resume: max |loss diff| {dl:.3e}, max |weight diff| {dw:.3e}"
    return info, bad


def compare(a, binary, name, stage_kind, burn, job, eval_spec, tok, neurons=None):
    """Item 2 of issue 39 for one stage; returns (numbers, failures)."""
    bad = []
    bm = metrics(os.path.join(burn, "metrics.jsonl"))
    tm = metrics(os.path.join(job, "out", "metrics.jsonl"))
    if len(bm) != len(tm) or not bm:
        bad.append(f"{len(bm)} Burn steps vs {len(tm)} torch steps")
    print(f"| step | loss (Burn) | loss (torch FSDP, 2 ranks) | abs diff | ce diff | lb (Burn) | lb (torch) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    worst = worst_ce = bias = 0.0
    for b, t in zip(bm, tm):
        d, dce = abs(b["loss"] - t["loss"]), abs(b["ce_loss"] - t["ce_loss"])
        worst, worst_ce = max(worst, d), max(worst_ce, dce)
        print(f"| {b['step']} | {b['loss']:.7f} | {t['loss']:.7f} | {d:.2e} | {dce:.2e} | "
              f"{b.get('lb_loss') or 0:.6f} | {t.get('lb_loss') or 0:.6f} |")
        if d > a.tol or dce > a.tol:
            bad.append(f"step {b['step']}: |loss diff| {d:.3e}, |ce diff| {dce:.3e} > {a.tol}")
        for lb, lt in zip(b.get("selection_bias") or [], t.get("selection_bias") or []):
            if (lb is None) != (lt is None):
                bad.append(f"step {b['step']}: selection bias present in one engine only")
            elif lb is not None:
                bias = max(bias, max(abs(x - y) for x, y in zip(lb, lt)))
        if bool(b.get("selection_bias")) != bool(t.get("selection_bias")):
            bad.append(f"step {b['step']}: selection biases logged by one engine only")
    if bias > 1e-6:
        bad.append(f"selection biases differ by {bias:.3e}")
    print(f"max |loss diff| over {len(bm)} steps: {worst:.3e}, ce {worst_ce:.3e} (tolerance {a.tol})")

    cfg = json.load(open(os.path.join(job, "model", "config.json")))
    rule = trained_rule(cfg, stage_kind, json.load(open(os.path.join(job, "job.json")))["train"]["balance"])
    before = tensors(os.path.join(job, "model"))
    after = tensors(os.path.join(job, "out", "final"))
    burn_final = tensors(os.path.join(burn, "final"))
    if sorted(before) != sorted(after):
        bad.append(f"tensor names differ (model/ vs out/final): {sorted(set(before) ^ set(after))[:6]}")
    same_layout = sorted(burn_final) == sorted(after)
    if not same_layout:
        bad.append(f"Burn's final has other tensor names: {sorted(set(burn_final) ^ set(after))[:6]}")
    frozen_same = frozen_n = trained_n = changed_n = 0
    wdiff = 0.0
    for k in sorted(before):
        if k not in after or k not in burn_final:
            continue
        t_changed = not torch.equal(before[k], after[k])
        b_changed = not torch.equal(before[k], burn_final[k])
        if rule(k):
            trained_n += 1
            changed_n += t_changed
            if t_changed != b_changed:
                bad.append(f"{k}: changed in {'torch' if t_changed else 'Burn'} only")
            wdiff = max(wdiff, (burn_final[k].float() - after[k].float()).abs().max().item())
        else:
            frozen_n += 1
            ok = not t_changed and not b_changed
            frozen_same += ok
            if not ok:
                bad.append(f"frozen tensor {k} changed (torch {t_changed}, Burn {b_changed})")
    if wdiff > a.wtol:
        bad.append(f"trained weights differ from Burn's by {wdiff:.3e} > {a.wtol}")
    if changed_n == 0:
        bad.append("no trained tensor changed")
    print(f"frozen tensors bit-identical (model/, torch, Burn): {frozen_same}/{frozen_n}; trained tensors changed: "
          f"{changed_n}/{trained_n} (as in Burn); max |w_torch - w_burn|: {wdiff:.3e}")

    final = os.path.join(job, "out", "final")
    info = json.loads(run([binary, "--backend", "cpu", "inspect", final, "--json"]))
    if bool(info.get("moe")) != (stage_kind not in ("dense", "ffn")):
        bad.append(f"moe-studio inspect of {final}: MoE {bool(info.get('moe'))}, stage {stage_kind}")
    with tempfile.TemporaryDirectory() as tmp:
        ours = logits_of(binary, final, os.path.join(tmp, "t.f32"))
        burn_l = logits_of(binary, os.path.join(burn, "final"), os.path.join(tmp, "b.f32"))
    d_burn = float(np.abs(ours - burn_l).max())
    tp, w = torch_model(job, final)
    with torch.no_grad():
        w.model.eval()
        ref = w.model(input_ids=torch.tensor([IDS])).logits[0].numpy()
    ours2 = ours.reshape(-1, ref.shape[-1])
    d_torch = float(np.abs(ours2 - ref[-ours2.shape[0]:]).max())
    print(f"logits of out/final read back by moe-studio: vs the Burn-trained model {d_burn:.3e}, vs PyTorch on the "
          f"same files {d_torch:.3e}")
    if d_burn > a.ltol:
        bad.append(f"logits vs the Burn-trained model: {d_burn:.3e} > {a.ltol}")
    if d_torch > a.ltol:
        bad.append(f"logits vs PyTorch on the same files: {d_torch:.3e} > {a.ltol}")
    ev = json.loads(run([binary, "--backend", "cpu", "eval", final, "--data", eval_spec, "--tokenizer", tok,
                         "--max-tokens", "2000", "--json"]))
    print(f"moe-studio eval of out/final: {json.dumps(ev)[:200]}")
    if neurons:
        with tempfile.TemporaryDirectory() as tmp:
            run([binary, "--backend", "cpu", "neurons", final, *neurons, "--tokenizer", tok, "--out", tmp])
            print(f"moe-studio neurons of out/final: {sorted(os.listdir(tmp))[:6]}")
    return {"steps": len(bm), "max_abs_loss_diff": worst, "max_abs_ce_diff": worst_ce,
            "max_abs_selection_bias_diff": bias, "frozen_bit_identical": f"{frozen_same}/{frozen_n}",
            "trained_changed": f"{changed_n}/{trained_n}", "max_abs_weight_diff": wdiff,
            "max_abs_logit_diff_vs_burn": d_burn, "max_abs_logit_diff_vs_pytorch": d_torch}, bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--torchrun", required=True)
    ap.add_argument("--data", required=True, help="MOE_STUDIO_DATA")
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", default="20")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--wtol", type=float, default=1e-4)
    ap.add_argument("--ltol", type=float, default=1e-4)
    ap.add_argument("--update-golden", action="store_true", help=f"write {os.path.relpath(GOLDEN, ROOT)}")
    a = ap.parse_args()
    spec = json.load(open(CASES))
    m = os.path.join(a.data, "models/stories260K")
    env = {"STORIES": os.path.join(m, "stories260K.bin"), "TOK": os.path.join(m, "tok512.bin"), "D": a.data,
           "W": a.work, "STEPS": a.steps}
    eval_spec = f"en={a.data}/corpora/lang/en/valid.txt"
    golden = json.load(open(GOLDEN)) if os.path.exists(GOLDEN) else {"stages": {}}
    fresh, report, failures = {}, {}, []
    wanted = a.cases.split(",") if a.cases else None
    for case in spec["cases"]:
        if wanted and case["name"] not in wanted:
            continue
        print(f"\n### case {case['name']}: {case['what']}", flush=True)
        for fn, body in case.get("files", {}).items():
            with open(os.path.join(a.work, fn), "w") as f:
                json.dump(body, f)
        for cmd in case["prepare"]:
            run([a.bin, "--backend", "cpu", *[sub(x, env) for x in cmd]])
        for st in case["stages"]:
            name = st["name"]
            src = st["input"]
            inp = os.path.join(a.work, f"torch-{src[1:]}", "out", "final") if src.startswith("@") else sub(src, env)
            train = [sub(x, env) for x in st.get("train", spec["train"])]
            argv = [a.bin, "--backend", "cpu", "train", inp, "--stage", st["stage"], *st["args"], *train]
            burn, job = os.path.join(a.work, f"burn-{name}"), os.path.join(a.work, f"torch-{name}")
            print(f"\n== {name}: Burn (1 device x 4 sequences) vs torchrun --nproc-per-node 2 (FSDP2, gloo, 2 x 2)",
                  flush=True)
            t0 = time.time()
            run(argv + ["--json", "--out", burn])
            t_burn = time.time() - t0
            run(argv + ["--engine", "torch", "--emit", job, "--json"])
            s = structure(job)
            if s["torch_trainable_elements"] != s["parameters"]["trainable"]:
                failures.append(f"{name}: torch trains {s['torch_trainable_elements']} elements, the emitting "
                                f"command counted {s['parameters']['trainable']}")
            t0 = time.time()
            lines = [l for l in torchrun(a.torchrun, job).splitlines() if re.match(r"^(stage|step|done)", l)]
            t_torch = time.time() - t0
            print("\n".join(lines[:2] + lines[-1:]))
            neurons = None
            if case["name"] == "neuronmoe":
                neurons = ["--lang", f"en={a.data}/corpora/lang/en/valid.txt", "--lang",
                           f"hu={a.data}/corpora/lang/hu/valid.txt", "--new", "hu", "--top-n", "50",
                           "--max-texts", "8", "--max-tokens", "32"]
            nums, bad = compare(a, a.bin, name, st["stage"], burn, job, eval_spec, env["TOK"], neurons)
            nums.update({"seconds_burn": round(t_burn, 1), "seconds_torchrun": round(t_torch, 1)})
            if st.get("resume"):
                info, rbad = check_resume(a.torchrun, job)
                print(f"resume: {json.dumps(info)}")
                nums["resume"] = info
                if rbad:
                    bad.append(rbad)
            failures += [f"{name}: {b}" for b in bad]
            report[name] = nums
            fresh[name] = s
            old = golden["stages"].get(name)
            if not a.update_golden and old is not None and old != s:
                diff = sorted(k for k in set(old) | set(s) if old.get(k) != s.get(k))
                failures.append(f"{name}: the emitted job's structure differs from the golden file in {diff} "
                                "(rerun with --update-golden if intended)")
            print(f"{name}: {'OK' if not bad else 'FAILED'}", flush=True)
    print("\n| stage | max abs loss diff | max abs weight diff | logits vs Burn | frozen bit-identical |")
    print("|---|---:|---:|---:|---:|")
    for n, r in report.items():
        print(f"| {n} | {r['max_abs_loss_diff']:.1e} | {r['max_abs_weight_diff']:.1e} | "
              f"{r['max_abs_logit_diff_vs_burn']:.1e} | {r['frozen_bit_identical']} |")
    if a.update_golden:
        if wanted:
            sys.exit("--update-golden needs every case (drop --cases)")
        out = {"comment": "Written by scripts/torch_handoff_check.sh --update-golden: the structure of each emitted "
                          "job (checked without torch by backend/tests/torch_handoff_cli.rs) and, under `measured`, "
                          "the numbers of that run.",
               "steps": int(a.steps), "stages": fresh, "measured": report}
        with open(GOLDEN, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {GOLDEN}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        sys.exit(1)
    print("torch hand-off check: OK")


if __name__ == "__main__":
    main()
