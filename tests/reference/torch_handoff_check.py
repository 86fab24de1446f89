#!/usr/bin/env python3
"""Runs each method of tests/reference/torch_handoff_cases.json through the
PyTorch hand-off and compares it with moe-studio's Burn trainer
(scripts/torch_handoff_check.sh, issue 39; opt-in: it needs torch).

First, train.py's optimiser (BurnAdamW) against Burn's AdamW arithmetic
(shared/src/train/adamw.rs) transcribed in numpy f32: bit-identical
(:func:`check_optimizer`). Then per stage of every case:
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
     Burn's, except the rounding-decided elements, which are within 2 lr;
   - moe-studio reads out/final back: `inspect` sees the MoE in the same
     layout, its logits with the rounding-decided elements set to Burn's
     values equal the Burn-trained model's within --ltol (1e-4) (the raw
     difference is reported), and PyTorch's own (transformers' class or
     studio_moe.py) on the same files within --ltol, `eval` runs (and
     `neurons` for NeuronMoE);
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

A rounding-decided element is one whose first gradient is within ~eps
(1e-8) of zero, read off Burn's own run (it keeps a checkpoint of every
step, :func:`first_steps`): Adam's first step moves an element by
lr g / (|g| + eps) beside the weight decay, ~lr for any gradient well
above eps, so an element that its tensor's first Burn step (step 1, or
the first step an expert got a token) moved by less than 0.5 lr, and not
by exactly the weight decay alone (a gradient of exactly 0), had
|g| < eps; there the two engines' rounding noise in g (other summation
orders) decides a first move anywhere in 0..lr, a gap that later steps
carry but do not grow.
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
from safetensors import safe_open
from safetensors.torch import load_file, save_file

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


def substituted(src, dst, values):
    """Copies model directory src to dst with the tensors in ``values``
    ({name: tensor}) replaced, each safetensors file keeping its metadata."""
    shutil.copytree(src, dst)
    for f in sorted(os.listdir(dst)):
        if not f.endswith(".safetensors"):
            continue
        path = os.path.join(dst, f)
        with safe_open(path, "pt") as fh:
            meta, names = fh.metadata(), list(fh.keys())
        if not any(n in values for n in names):
            continue
        ts = load_file(path)
        ts.update({n: values[n].to(ts[n].dtype).contiguous() for n in names if n in values})
        save_file(ts, path, metadata=meta)


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


def check_optimizer():
    """train.py's BurnAdamW against shared/src/train/adamw.rs transcribed
    op by op in numpy float32 (each product, sum, quotient and square root
    rounded to f32, no fused multiply-add): bit-identical over 4 steps with
    a warm-up rate and weight decay, on a fused expert tensor ``[3, 40, 50]``
    (expert 1 frozen, expert 2 without a token in step 3: it keeps its
    weights and moments and its own step count, as Burn's separate expert
    tensors), a vector and a matrix left without a gradient in step 2 (its
    step count does not advance). Returns a failure message or None."""
    spec = importlib.util.spec_from_file_location("train_src",
                                                  os.path.join(ROOT, "backend/src/cli/torch_handoff/train.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    rng = np.random.default_rng(5)
    shapes = [(3, 40, 50), (11,), (64, 9)]
    start = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    # Gradients spanning many magnitudes, some below eps, some exactly zero.
    grads = [[(rng.standard_normal(s) * 10.0 ** rng.uniform(-11, -1, s)).astype(np.float32) for s in shapes]
             for _ in range(4)]
    for g in grads:
        g[0][1] = 0.0  # expert 1 of the fused tensor: frozen
        g[1][:3] = 0.0
    grads[2][0][2] = 0.0  # expert 2 got no token in step 3
    lrs = [1e-3 / 3, 2e-3 / 3, 1e-3, 7.3e-4]
    b1, b2, eps, wd = 0.9, 0.95, 1e-8, 0.01
    params = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in start]
    opt = m.BurnAdamW(params, lr=lrs[0], betas=(m.f32(b1), m.f32(b2)), eps=eps, weight_decay=wd)
    mask = torch.ones(3, 1, 1)
    mask[1] = 0.0
    opt.row_masks = {params[0]: mask}
    opt.expert_rows = {params[0]: torch.arange(3, dtype=torch.float32).view(3, 1, 1)}
    f = np.float32
    # The reference keeps each expert of the fused tensor as its own tensor (as Burn does).
    ref = [start[0][e].copy() for e in range(3)] + [x.copy() for x in start[1:]]
    mom = [(np.zeros_like(x), np.zeros_like(x), 0) for x in ref]
    for step, lr in enumerate(lrs):
        active = [step != 2 or e != 2 for e in range(3)]
        opt.expert_active = {params[0]: torch.tensor(active)}
        for i, p in enumerate(params):
            p.grad = None if (i == 2 and step == 1) else torch.from_numpy(grads[step][i].copy())
        for j in range(len(ref)):
            if (j == 4 and step == 1) or (j < 3 and not active[j]):
                continue
            mm, vv, t = mom[j]
            t += 1
            g = grads[step][0][j] if j < 3 else grads[step][j - 2]
            mm = mm * f(b1) + g * (f(1) - f(b1))
            vv = vv * f(b2) + (g * g) * (f(1) - f(b2))
            c1, c2 = f(1) - f(m.powi_f32(f(b1), t)), f(1) - f(m.powi_f32(f(b2), t))
            u = (mm / c1) / (np.sqrt(vv / c2) + f(eps))
            keep = f(1) if j == 1 else f(1.0 - lr * float(f(wd)))  # Burn: a frozen expert does not train
            ref[j] = ref[j] * keep - u * f(lr)
            mom[j] = (mm, vv, t)
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.step()
    want = [np.stack(ref[:3])] + ref[3:]
    for i, p in enumerate(params):
        got = p.detach().numpy()
        n = int((got.view(np.uint32) != want[i].view(np.uint32)).sum())
        if n:
            return f"BurnAdamW: {n} of {got.size} elements of parameter {i} differ from the f32 transcription"
    if not np.array_equal(params[0].detach().numpy()[1], start[0][1]):
        return "BurnAdamW: the frozen expert changed"
    if opt.state[params[0]]["step"].flatten().tolist() != [4.0, 4.0, 3.0]:
        return f"BurnAdamW: per-expert step counts {opt.state[params[0]]['step'].flatten().tolist()}, want [4, 4, 3]"
    if int(opt.state[params[2]]["step"].item()) != 3:
        return "BurnAdamW: a step without a gradient advanced the step count"
    return None


def check_bf16(torchrun_bin, job, input_dir, loss_rtol=1e-2):
    """Runs the emitted job again with ``--dtype bf16`` (FSDP2 MixedPrecisionPolicy: bf16
    compute, f32 master weights and gradient reduction) and compares it with the f32 run in
    JOB/out: per-step losses within ``loss_rtol`` relative, every tensor the f32 run left
    unchanged bit-identical to the input here too, the saved weights f32, and the relative
    size of the weight-update difference (reported, not bounded: bf16 rounding of the
    gradients moves Adam's small-gradient elements anywhere in 0..lr)."""
    out = os.path.join(job, "out-bf16")
    shutil.rmtree(out, ignore_errors=True)
    torchrun(torchrun_bin, job, ["--dtype", "bf16", "--out", out])
    f32, bf = metrics(os.path.join(job, "out", "metrics.jsonl")), metrics(os.path.join(out, "metrics.jsonl"))
    bad = []
    if len(bf) != len(f32):
        bad.append(f"bf16: {len(bf)} steps logged, f32 {len(f32)}")
    rel = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(f32, bf))
    if rel > loss_rtol:
        bad.append(f"bf16: loss {rel:.1e} relative from the f32 run (bound {loss_rtol})")
    w0, wf, wb = tensors(input_dir), tensors(os.path.join(job, "out", "final")), tensors(os.path.join(out, "final"))
    frozen = [k for k in w0 if k in wf and torch.equal(w0[k], wf[k])]
    same = sum(torch.equal(w0[k], wb[k]) for k in frozen)
    if same != len(frozen):
        bad.append(f"bf16: {len(frozen) - same} of {len(frozen)} frozen tensors changed")
    not_f32 = sorted(k for k, v in wb.items() if v.dtype != torch.float32)
    if not_f32:
        bad.append(f"bf16: saved weights not f32 (master weights): {not_f32[:3]}")
    num = den = 0.0
    for k in wf:
        if k in w0 and k not in frozen:
            uf, ub = wf[k].double() - w0[k].double(), wb[k].double() - w0[k].double()
            num += float(((uf - ub) ** 2).sum())
            den += float((uf ** 2).sum())
    info = {"max_rel_loss_diff": rel, "frozen_bit_identical": f"{same}/{len(frozen)}",
            "rel_update_diff": (num / den) ** 0.5 if den else 0.0,
            "loss_first_last_f32": [f32[0]["loss"], f32[-1]["loss"]], "loss_first_last_bf16": [bf[0]["loss"], bf[-1]["loss"]]}
    return info, bad


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


def first_steps(burn, before, burn_final, names, bm, wd):
    """Each trained tensor's first Adam step in the Burn run (its
    checkpoint-NNNNNN of every step): {name: (step, lr of that step,
    |w_step - w_before| per element, mask of the elements that moved by
    exactly the weight decay alone, i.e. whose gradient was exactly 0)}.
    A tensor's first step is the first one that changed it (an expert
    without a token gets no step, and Burn does not advance its count), so
    its update there is Adam's first, bias-corrected
    ``w (1 - lr wd) - lr g / (|g| + eps)``; a tensor Burn never changed is
    left out."""
    out, prev, todo = {}, before, [k for k in names if not torch.equal(before[k], burn_final[k])]
    for step in range(1, len(bm) + 1):
        if not todo:
            break
        ck = os.path.join(burn, f"checkpoint-{step:06d}")
        cur = burn_final if step == len(bm) else tensors(ck) if os.path.isdir(ck) else None
        if cur is None:
            sys.exit(f"FAILED: {ck} missing (the Burn run keeps a checkpoint of every step)")
        lr = bm[step - 1]["lr"]
        keep = float(np.float32(1.0 - lr * wd))
        for k in list(todo):
            if not torch.equal(prev[k], cur[k]):
                w0, w1 = prev[k].float(), cur[k].float()
                out[k] = (step, lr, (w1 - w0).abs(), torch.eq(w1, w0) | torch.eq(w1, w0 * keep))
                todo.remove(k)
        prev = cur
    return out


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
    lr_peak = max(m["lr"] for m in bm)
    wd = float(np.float32(json.load(open(os.path.join(job, "job.json")))["train"]["weight_decay"]))
    firsts = first_steps(burn, before, burn_final, [k for k in before if rule(k) and k in burn_final], bm, wd)
    zero_grad_n = rd_beyond = 0
    frozen_same = frozen_n = trained_n = changed_n = 0
    wdiff = wdiff_rest = wdiff_rd = 0.0
    rounding, substitute = [], {}
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
            diff = (burn_final[k].float() - after[k].float()).abs()
            wdiff = max(wdiff, diff.max().item())
            if k not in firsts:
                wdiff_rest = max(wdiff_rest, diff.max().item())
                continue
            first, lr_f, move, no_grad = firsts[k]
            zero_grad_n += int(no_grad.sum())
            rd = (move < 0.5 * lr_f) & ~no_grad
            if bool(rd.any()):
                wdiff_rd = max(wdiff_rd, diff[rd].max().item())
                rd_beyond += int((diff[rd] > a.wtol).sum())
                for idx in rd.nonzero().tolist():
                    rounding.append({"tensor": k, "index": idx, "first_step": first,
                                     "first_move_over_lr": move[tuple(idx)].item() / lr_f,
                                     "weight_diff": diff[tuple(idx)].item()})
                sub_t = after[k].clone()
                sub_t[rd] = burn_final[k][rd].to(sub_t.dtype)
                substitute[k] = sub_t
                rest = diff[~rd]
                wdiff_rest = max(wdiff_rest, rest.max().item() if rest.numel() else 0.0)
            else:
                wdiff_rest = max(wdiff_rest, diff.max().item())
        else:
            frozen_n += 1
            ok = not t_changed and not b_changed
            frozen_same += ok
            if not ok:
                bad.append(f"frozen tensor {k} changed (torch {t_changed}, Burn {b_changed})")
    if wdiff_rest > a.wtol:
        bad.append(f"trained weights (rounding-decided elements aside) differ from Burn's by {wdiff_rest:.3e} > "
                   f"{a.wtol}")
    if wdiff_rd > 2 * lr_peak:
        bad.append(f"rounding-decided elements differ from Burn's by {wdiff_rd:.3e} > 2 lr = {2 * lr_peak:.3e}")
    if changed_n == 0:
        bad.append("no trained tensor changed")
    print(f"frozen tensors bit-identical (model/, torch, Burn): {frozen_same}/{frozen_n}; trained tensors changed: "
          f"{changed_n}/{trained_n} (as in Burn); max |w_torch - w_burn|: {wdiff:.3e}")
    late = sorted({f for f, _, _, _ in firsts.values() if f > 1})
    n_late = sum(f > 1 for f, _, _, _ in firsts.values())
    print(f"first Adam step in Burn: step 1 for {len(firsts) - n_late} trained tensors"
          + (f", steps {late} for {n_late} (no step before: an expert without a token)" if late else "")
          + f"; elements with a first gradient of exactly 0 (moved by the weight decay only): {zero_grad_n}")
    print(f"rounding-decided elements (Burn's first step moved them < 0.5 lr): {len(rounding)}, {rd_beyond} of them "
          f"beyond {a.wtol}; max |w_torch - w_burn| of the rest {wdiff_rest:.3e} (tolerance {a.wtol}), of them "
          f"{wdiff_rd:.3e} (tolerance 2 lr = {2 * lr_peak:.3e})")
    worst_rd = sorted(rounding, key=lambda r: -r["weight_diff"])[:8]
    for r in worst_rd:
        print(f"  {r['tensor']}{r['index']}: first step {r['first_step']}, moved {r['first_move_over_lr']:.3f} lr, "
              f"final |diff| {r['weight_diff']:.3e}")

    final = os.path.join(job, "out", "final")
    info = json.loads(run([binary, "--backend", "cpu", "inspect", final, "--json"]))
    if bool(info.get("moe")) != (stage_kind not in ("dense", "ffn")):
        bad.append(f"moe-studio inspect of {final}: MoE {bool(info.get('moe'))}, stage {stage_kind}")
    with tempfile.TemporaryDirectory() as tmp:
        ours = logits_of(binary, final, os.path.join(tmp, "t.f32"))
        burn_l = logits_of(binary, os.path.join(burn, "final"), os.path.join(tmp, "b.f32"))
        # The torch-trained weights with the rounding-decided elements set to
        # Burn's values: what is left of the logit difference is the rest.
        if substitute:
            substituted(final, os.path.join(tmp, "sub"), substitute)
            sub_l = logits_of(binary, os.path.join(tmp, "sub"), os.path.join(tmp, "s.f32"))
        else:
            sub_l = ours
    d_burn = float(np.abs(ours - burn_l).max())
    d_sub = float(np.abs(sub_l - burn_l).max())
    tp, w = torch_model(job, final)
    with torch.no_grad():
        w.model.eval()
        ref = w.model(input_ids=torch.tensor([IDS])).logits[0].numpy()
    ours2 = ours.reshape(-1, ref.shape[-1])
    d_torch = float(np.abs(ours2 - ref[-ours2.shape[0]:]).max())
    print(f"logits of out/final read back by moe-studio: vs the Burn-trained model {d_burn:.3e} (with the "
          f"{len(rounding)} rounding-decided elements set to Burn's: {d_sub:.3e}), vs PyTorch on the same files "
          f"{d_torch:.3e}")
    if d_sub > a.ltol:
        bad.append(f"logits vs the Burn-trained model (rounding-decided elements substituted): {d_sub:.3e} > "
                   f"{a.ltol}")
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
            "rounding_decided_elements": len(rounding), "rounding_decided_beyond_wtol": rd_beyond,
            "zero_first_gradient_elements": zero_grad_n, "rounding_decided": worst_rd,
            "max_abs_weight_diff_rest": wdiff_rest, "max_abs_weight_diff_rounding_decided": wdiff_rd,
            "max_abs_logit_diff_vs_burn": d_burn, "max_abs_logit_diff_vs_burn_substituted": d_sub,
            "max_abs_logit_diff_vs_pytorch": d_torch}, bad


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
    bad = check_optimizer()
    print(f"BurnAdamW vs shared/src/train/adamw.rs in f32: {bad or 'bit-identical'}", flush=True)
    if bad:
        failures.append(bad)
    wanted = a.cases.split(",") if a.cases else None
    unknown = sorted(set(wanted or []) - {c["name"] for c in spec["cases"]})
    if unknown:
        sys.exit(f"--cases: no case {', '.join(unknown)} in {CASES} "
                 f"(cases: {', '.join(c['name'] for c in spec['cases'])})")
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
            # Burn keeps a checkpoint of every step (the rounding-decided
            # elements are read off its step 1); training is the same.
            every = argv.index("--save-every") + 1
            burn_argv = argv[:every] + ["1"] + argv[every + 1:] + ["--keep", a.steps]
            t0 = time.time()
            run(burn_argv + ["--json", "--out", burn])
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
            for d in os.listdir(burn):  # Burn's per-step checkpoints served first_steps only (~10 MB each)
                if re.match(r"^checkpoint-\d{6}$", d):
                    shutil.rmtree(os.path.join(burn, d))
            if st.get("bf16"):
                info, bbad = check_bf16(a.torchrun, job, inp)
                print(f"bf16: {json.dumps(info)}")
                nums["bf16"] = info
                bad += bbad
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
    print("\n| stage | max abs loss diff | frozen bit-identical | rounding-decided elements (beyond wtol) | "
          "their max abs weight diff | max abs weight diff of the rest | logits vs Burn | substituted logits vs Burn |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for n, r in report.items():
        print(f"| {n} | {r['max_abs_loss_diff']:.1e} | {r['frozen_bit_identical']} | {r['rounding_decided_elements']} "
              f"({r['rounding_decided_beyond_wtol']}) | "
              f"{r['max_abs_weight_diff_rounding_decided']:.1e} | {r['max_abs_weight_diff_rest']:.1e} | "
              f"{r['max_abs_logit_diff_vs_burn']:.1e} | {r['max_abs_logit_diff_vs_burn_substituted']:.1e} |")
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
