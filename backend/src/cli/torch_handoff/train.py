#!/usr/bin/env python3
"""moe-studio's PyTorch hand-off: one training stage of an MoE on PyTorch
FSDP2 (``torch.distributed.fsdp.fully_shard``: parameters, gradients and
AdamW state sharded over every rank, i.e. FULL_SHARD / ZeRO-3), written by
``moe-studio train ... --engine torch --emit DIR`` beside this file.

It runs the same stage as moe-studio's Burn trainer (shared/src/train,
docs/methods.md §1 "DeltaMoE" and "MoE-LPR stage 2", §2 DUME+/BTX, §3.6
NeuronMoE, §5.2 load balancing):

- model: ``model/``, the checkpoint moe-studio exported, in one of two forms
  (``job.json`` ``modeling``):
  - ``transformers``: a layout a transformers class loads exactly (Mixtral /
    Qwen2-MoE, shared/src/layout/);
  - ``studio``: the studio layout (``model_type: moe_studio``) for what no
    transformers class holds (per-layer expert counts and dense layers,
    router bias, selection bias, several shared experts, granular experts):
    the base family's transformers class with each MoE layer's FFN replaced
    by ``studio_moe.StudioMoeBlock`` (``studio_moe.py`` beside this file);
- freezing (shared/src/train/freeze.rs): stage ``experts`` trains the
  routers (weight and bias), every expert not in its layer's frozen list and
  the shared experts with their gate unless frozen (a zero stand-in shared
  expert stays frozen); stage ``router`` trains the routers only. In the
  transformers form a layer's experts are one fused tensor
  (``mlp.experts.gate_up_proj [E, 2f, d]``, ``down_proj [E, d, f]``): the
  rows of frozen experts get a zero gradient and no weight decay, so they
  stay bit-identical. A dense model (``layout: dense``): stage ``dense``
  trains every tensor, stage ``ffn`` every layer's FFN only;
- data: ``data/tokens.u32``, the packed sequences moe-studio would train on,
  in its order (no re-tokenisation, no shuffling here);
- losses (shared/src/train/losses.rs): next-token cross-entropy +
  ``alpha`` x load balancing (per-layer ``E_l * sum_i f_i P_i`` or
  transformers' pooled form) + ``z_loss`` x router z-loss + ``prior`` x the
  language prior (router cross-entropy against expert 0 on original-language
  sequences). The routing fractions ``f_i`` and the language-prior token
  count are taken over the whole micro-batch of all ranks (all-reduced), so
  the result does not depend on the number of ranks and equals moe-studio's
  single-device trainer with the same global batch;
- ``balance: aux-free`` (DeepSeek-V3 §2.1.2, shared/src/train/balance.rs):
  after every optimizer step each MoE layer's selection bias moves by
  ``bias_update_rate * sign(mean load - load_i)`` over the step's routed
  slots of all ranks;
- optimiser: :class:`BurnAdamW`, Burn 0.21's AdamW (the Burn trainer's
  shared/src/train/adamw.rs) re-implemented operation by operation in f32,
  because torch.optim.AdamW rounds differently (f64 bias corrections,
  ``sqrt(v) / sqrt(1 - b2^t)``, a fused ``addcdiv``) and Adam carries those
  last bits from step to step: given the same gradient both engines now
  write bit-identical weights. Clipping by the global gradient norm as the
  Burn trainer (:func:`clip_global_norm`), warm-up + cosine schedule
  (shared/src/train/schedule.rs), checkpoint cadence and ``keep``. An
  expert no token of the whole step chose gets no update (no gradient, as
  in the Burn trainer).

Launch with torchrun (README.md beside this file). Output: ``OUT/metrics.jsonl``
(one JSON line per step, the fields of moe-studio's metrics), periodic
``OUT/checkpoint-NNNNNN/`` (a loadable model directory + ``dcp/`` for
``--resume``, renamed into place only when complete) and ``OUT/final/`` —
model directories in the exported layout that ``moe-studio
graft|route|eval|inspect|neurons`` read unchanged.
"""

import argparse
import datetime
import json
import math
import os
import re
import shutil
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
FORMAT = "moe-studio-torch-job"
CHECKPOINT = re.compile(r"^checkpoint-(\d{6})$")


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def lr_at(sched, step):
    """shared/src/train/schedule.rs: the rate of the update at 0-based `step`."""
    lr, warmup, total, min_ratio = sched["lr"], sched["warmup"], sched["total"], sched["min_ratio"]
    if step < warmup:
        return lr * (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    cos = 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (min_ratio + (1.0 - min_ratio) * cos)


def f32(x):
    """`x as f32` in Rust (round to nearest), as a Python float."""
    return float(np.float32(x))


def powi_f32(x, n):
    """Rust's `f32::powi(x, n)` for n >= 0 (compiler-rt's `__powisf2`: square
    and multiply, every product rounded to f32)."""
    x, r = np.float32(x), np.float32(1.0)
    while True:
        if n & 1:
            r = np.float32(r * x)
        n >>= 1
        if n == 0:
            return float(r)
        x = np.float32(x * x)


def local(t):
    """The local shard of an FSDP2 (DTensor) parameter, gradient or state
    tensor (a view: in-place updates reach the DTensor), else `t`."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class BurnAdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter 2019, Algorithm 2) rounded exactly as
    moe-studio's Burn trainer computes it (Burn 0.21's ``AdamW``; the
    trainer's fused copy is shared/src/train/adamw.rs), so both engines
    apply the same update to the same gradient. Per parameter with gradient
    ``g`` at its step ``t`` (1-based, counted per parameter: a parameter
    without a gradient in a step is skipped and its ``t`` does not advance),
    every operation in float32, each result rounded (no fused multiply-add):

        m = m * b1 + g * (1 - b1)
        v = v * b2 + (g * g) * (1 - b2)
        u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
        p = p * f32(1 - lr * wd) - u * f32(lr)      (p - u * f32(lr) when lr * wd = 0)

    ``sqrt`` is the correctly rounded one (through f64: torch's own
    vectorised f32 ``sqrt`` on the CPU is not, in ~17 % of elements).
    ``b1, b2, eps, wd`` are f32 (Burn's config), ``1 - b1`` and
    ``1 - b1^t`` are f32 (``powi``: square and multiply), ``lr * wd`` is f64
    (``lr`` f64, ``wd`` the f32 value widened). torch.optim.AdamW differs
    in the last bits (f64 bias corrections, ``sqrt(v) / sqrt(1 - b2^t)``, a
    fused ``addcdiv``); with it the check measured loss differences up to
    20x larger against the Burn trainer (docs/scaling.md, "Measured").

    Works on FSDP2's DTensor parameters by updating the local shards; the
    state (``step``, ``exp_avg``, ``exp_avg_sq``) has torch.optim.AdamW's
    names and layout, so ``torch.distributed.checkpoint`` saves and loads it
    as it does AdamW's.

    transformers' fused expert tensors (``[E, ...]``, one row block per
    expert) hold what Burn keeps as ``E`` separate tensors; two maps make
    them behave as those:

    - ``expert_rows``: {parameter: ``[E, 1, ...]`` float tensor of row
      indices ``0 .. E-1``, sharded like it}: its ``step`` is then counted
      per expert (a tensor of that shape), and only the experts in
      ``expert_active[parameter]`` (a bool ``[E]``, set before each step;
      absent: all) are updated, as Burn updates only the experts that got a
      gradient (a token);
    - ``row_masks``: {parameter: ``[E, 1, ...]`` float mask, sharded like
      it}: rows with mask 0 are frozen experts; they get no weight decay
      (their gradient is zero, so their update is exactly 0 and they stay
      bit-identical)."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.row_masks = {}
        self.expert_rows = {}
        self.expert_active = {}

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "BurnAdamW.step takes no closure"
        for group in self.param_groups:
            lr = float(group["lr"])
            b1, b2 = np.float32(group["betas"][0]), np.float32(group["betas"][1])
            f1, f2 = float(np.float32(1.0) - b1), float(np.float32(1.0) - b2)
            eps = f32(group["eps"])
            decay = lr * float(np.float32(group["weight_decay"]))
            keep = f32(1.0 - decay) if decay != 0.0 else None
            lr32 = f32(lr)
            for p in group["params"]:
                if p.grad is None:
                    continue
                rows = self.expert_rows.get(p)
                st = self.state[p]
                if not st:
                    st["step"] = (torch.tensor(0.0, dtype=torch.float32) if rows is None
                                  else torch.zeros_like(rows, dtype=torch.float32))
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                pl, g, m, v = local(p), local(p.grad), local(st["exp_avg"]), local(st["exp_avg_sq"])
                if g.dtype != torch.float32 or pl.dtype != torch.float32:
                    raise TypeError(f"BurnAdamW: float32 parameters and gradients, not {pl.dtype} / {g.dtype}")

                # Divisors as device tensors: CUDA turns a division by a host scalar into a
                # multiplication by its reciprocal, which rounds differently.
                def corrections(ts):
                    c = [[1.0 - powi_f32(b, max(int(t), 1)) for t in ts] for b in (b1, b2)]
                    return (torch.tensor(x, dtype=torch.float32, device=g.device) for x in c)

                if rows is None:
                    st["step"] += 1.0
                    c1, c2 = corrections([st["step"].item()])
                    c1, c2 = c1.reshape(()), c2.reshape(())
                    act = None
                else:
                    idx = local(rows).long()
                    full = self.expert_active.get(p)
                    act = (full.to(idx.device)[idx] if full is not None else torch.ones_like(idx, dtype=torch.bool))
                    ts = local(st["step"])
                    ts.add_(act.to(ts.dtype))
                    c1, c2 = corrections(ts.flatten().tolist())
                    c1, c2 = c1.view(ts.shape), c2.view(ts.shape)
                m_new = m * float(b1) + g * f1
                v_new = v * float(b2) + (g * g) * f2
                # The correctly rounded f32 square root (Rust's f32::sqrt), taken through f64:
                # torch's vectorised f32 sqrt on the CPU (AVX2) is off by one ulp in ~17 % of elements.
                u = (m_new / c1) / ((v_new / c2).double().sqrt().float() + eps)
                p_new = pl
                if keep is not None:
                    mask = self.row_masks.get(p)
                    p_new = pl * (keep if mask is None else torch.where(local(mask) > 0, keep, 1.0))
                p_new = p_new - u * lr32
                if act is None:
                    m.copy_(m_new)
                    v.copy_(v_new)
                    pl.copy_(p_new)
                else:
                    m.copy_(torch.where(act, m_new, m))
                    v.copy_(torch.where(act, v_new, v))
                    pl.copy_(torch.where(act, p_new, pl))
        return None


def clip_global_norm(params, max_norm, rank):
    """shared/src/train/trainer/replica.rs::clip_global_norm: the L2 norm of every
    gradient together (f64 over the shards of all ranks); when it exceeds
    `max_norm`, every gradient is scaled by the f32 value of
    `max_norm / (norm + 1e-6)` (as torch's ``clip_grad_norm_``). Returns the
    norm before clipping."""
    from torch.distributed.tensor import DTensor, Replicate

    total, dev = 0.0, None
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        replicated = not isinstance(g, DTensor) or all(isinstance(x, Replicate) for x in g.placements)
        s = local(g).double().square().sum()
        dev = s.device
        total = total + (s if not replicated or rank == 0 else 0.0 * s)
    if dev is None:
        return 0.0
    total = torch.as_tensor(total, dtype=torch.float64, device=dev).reshape(1)
    if dist.is_initialized():
        dist.all_reduce(total)
    norm = math.sqrt(total.item())
    if max_norm is not None and norm > max_norm:
        factor = f32(max_norm / (norm + 1e-6))
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    local(p.grad).mul_(factor)
    return norm


class Job:
    def __init__(self, root):
        path = os.path.join(root, "job.json")
        with open(path) as f:
            j = json.load(f)
        if j.get("format") != FORMAT or j.get("version") not in (1, 2):
            fail(f"{path}: not a {FORMAT} version 1 or 2 file")
        self.j = j
        self.root = root
        self.c = j["train"]
        if self.c.get("stage") not in ("experts", "router", "dense", "ffn"):
            fail(f"{path}: stage {self.c.get('stage')!r}; this job trains the stages experts, router, dense and ffn")
        self.modeling = j.get("modeling", "transformers")
        self.model_dir = os.path.join(root, j["model"])
        d = j["data"]
        self.rows, self.row_len = d["rows"], d["row_len"]
        tok = os.path.join(root, d["tokens"])
        want = self.rows * self.row_len * 4
        if os.path.getsize(tok) != want:
            fail(f"{tok}: {os.path.getsize(tok)} bytes, job.json says {self.rows} x {self.row_len} u32 = {want}")
        self.tokens = np.memmap(tok, dtype="<u4", mode="r", shape=(self.rows, self.row_len))
        self.original = np.fromfile(os.path.join(root, d["original"]), dtype=np.uint8)
        self.source = np.fromfile(os.path.join(root, d["source"]), dtype="<u2")
        if len(self.original) != self.rows or len(self.source) != self.rows:
            fail(f"{d['original']} / {d['source']}: expected {self.rows} entries")
        self.global_batch = j["global_batch"]
        with open(os.path.join(self.model_dir, "config.json")) as f:
            self.config_json = json.load(f)


def rank_batch(job, step, micro, rank, world):
    """Rows of micro-step `micro` of optimizer step `step` that rank `rank` trains on."""
    per = job.global_batch // world
    base = (step * job.c["grad_accum"] + micro) * job.global_batch
    lo, hi = base + rank * per, base + (rank + 1) * per
    rows = torch.from_numpy(np.asarray(job.tokens[lo:hi], dtype=np.int64))
    orig_all = job.original[base : base + job.global_batch]
    return (
        rows[:, :-1].contiguous(),
        rows[:, 1:].contiguous(),
        torch.from_numpy(job.original[lo:hi].astype(np.bool_)),
        int(orig_all.sum()),
        job.source[base : base + job.global_batch],
    )


class Route:
    """One MoE layer's routing in one forward pass: router logits `[tokens, E]`
    (differentiable), this rank's routed slots per expert (`None`: recount
    from the logits), `k` and `E`."""

    def __init__(self, layer, logits, counts, k, e):
        self.layer, self.logits, self.counts, self.k, self.e = layer, logits, counts, k, e


def safetensors_files(d):
    """{tensor name: file} of a model directory (one file or an index)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return dict(json.load(f)["weight_map"])
    from safetensors import safe_open

    out = {}
    for fn in sorted(x for x in os.listdir(d) if x.endswith(".safetensors")):
        with safe_open(os.path.join(d, fn), "pt") as f:
            out.update({k: fn for k in f.keys()})
    return out


class TransformersModel:
    """``modeling: transformers``: a Mixtral / Qwen2-MoE checkpoint, the
    transformers class with fused experts."""

    LAYER = re.compile(r"^model\.layers\.(\d+)\.mlp\.(.*)$")

    def __init__(self, job, compute_dtype="f32"):
        from transformers import AutoConfig, AutoModelForCausalLM

        self.job = job
        kw = {}
        cfg = AutoConfig.from_pretrained(job.model_dir)
        width = getattr(cfg, "moe_intermediate_size", None) or getattr(cfg, "intermediate_size", 0)
        if compute_dtype == "bf16" and any(n % 8 for n in (width, cfg.hidden_size)):
            # transformers' default fused-expert kernel (torch grouped_mm) needs every row of the
            # expert weights ([E, 2f, d] and [E, d, f]) to be a multiple of 16 bytes, i.e. f and d
            # divisible by 8 in bf16 ("strides should be multiple of 16 bytes"); the per-expert
            # loop computes the same.
            kw["experts_implementation"] = "eager"
        self.model = AutoModelForCausalLM.from_pretrained(job.model_dir, dtype=torch.float32, **kw)
        cfg = self.model.config
        self.num_experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
        self.top_k = getattr(cfg, "num_experts_per_tok", None)
        self.dense = job.c["stage"] in ("dense", "ffn")

    def select_trainable(self):
        """Sets requires_grad per shared/src/train/freeze.rs; returns the fused
        expert parameters with frozen experts as {name: frozen expert indices}."""
        job = self.job
        stage = job.c["stage"]
        if self.dense:
            # A dense model (DUME's domain experts): stage dense trains everything, stage ffn
            # every layer's FFN (mlp.gate/up/down_proj) and nothing else.
            if self.num_experts:
                fail(f"stage {stage} on an MoE model: use stage experts or router")
            for name, p in self.model.named_parameters():
                p.requires_grad_(stage == "dense" or ".mlp." in name)
            return {}
        studio = job.config_json.get("moe_studio", {})
        frozen = studio.get("frozen_experts", [])
        shared_frozen = studio.get("shared_frozen", [])
        zero_shared = bool(studio.get("zero_shared_expert", False))
        masked = {}
        seen_router = set()
        for name, p in self.model.named_parameters():
            p.requires_grad_(False)
            m = self.LAYER.match(name)
            if not m:
                continue
            layer, rest = int(m.group(1)), m.group(2)
            if rest == "gate.weight":
                p.requires_grad_(True)
                seen_router.add(layer)
            elif stage == "experts" and rest in ("experts.gate_up_proj", "experts.down_proj"):
                fz = [e for e in (frozen[layer] if layer < len(frozen) else []) if e < p.shape[0]]
                if len(fz) < p.shape[0]:
                    p.requires_grad_(True)
                    if fz:
                        masked[name] = fz
            elif stage == "experts" and (rest.startswith("shared_expert.") or rest == "shared_expert_gate.weight"):
                sf = layer < len(shared_frozen) and shared_frozen[layer]
                if not (zero_shared or sf):
                    p.requires_grad_(True)
            elif stage == "experts" and rest.startswith("experts."):
                fail(f"{name}: unknown expert tensor (this script knows transformers 5's fused "
                     "experts.gate_up_proj / experts.down_proj)")
        moe_layers = {i for i, f in enumerate(frozen) if f} | seen_router
        if not seen_router:
            fail("no router (model.layers.N.mlp.gate.weight) found: is model/ an MoE?")
        missing = sorted(i for i in moe_layers if i not in seen_router)
        if missing:
            fail(f"layers {missing} have frozen experts but no router parameter")
        return masked

    def forward(self, inp):
        if self.dense:
            return self.model(input_ids=inp, use_cache=False).logits, []
        o = self.model(input_ids=inp, output_router_logits=True, use_cache=False)
        router = [r for r in o.router_logits if r is not None]
        return o.logits, [Route(i, r, None, self.top_k, self.num_experts) for i, r in enumerate(router)]

    def expert_params(self):
        """{(layer, expert): [parameters]} of separately stored experts (none here)."""
        return {}

    def fused_experts(self):
        """{name: routed-layer ordinal} of the fused expert tensors (``[E, ...]``)
        that train; the ordinal is the layer's index among the layers with a
        router, as in :meth:`forward`'s routes."""
        names = dict(self.model.named_parameters())
        routers = sorted(int(m.group(1)) for n in names if (m := self.LAYER.match(n)) and m.group(2) == "gate.weight")
        out = {}
        for n, p in names.items():
            m = self.LAYER.match(n)
            if m and m.group(2) in ("experts.gate_up_proj", "experts.down_proj") and p.requires_grad:
                out[n] = routers.index(int(m.group(1)))
        return out

    def selection_biases(self):
        return {}

    def layers(self):
        return None

    def save(self, sd, tmp):
        if getattr(self.model.config, "tie_word_embeddings", False):
            sd.pop("lm_head.weight", None)  # tied: the exported checkpoint has none
        self.model.save_pretrained(tmp, state_dict=sd, safe_serialization=True)


class StudioModel:
    """``modeling: studio``: the studio layout on the base family's
    transformers class with ``studio_moe.StudioMoeBlock`` FFNs."""

    def __init__(self, job):
        sys.path.insert(0, HERE)
        import studio_moe
        from safetensors.torch import load_file

        self.job = job
        self.sm = studio_moe
        j = job.j
        self.specs = studio_moe.moe_layers(job.config_json)
        self.model = studio_moe.build(j["base_config"], job.config_json, j["activation"])
        self.tied = bool(j["base_config"].get("tie_word_embeddings", False))
        self.files = safetensors_files(job.model_dir)
        tensors = {}
        for fn in sorted(set(self.files.values())):
            tensors.update(load_file(os.path.join(job.model_dir, fn)))
        try:
            studio_moe.load_state(self.model, tensors, self.tied)
        except ValueError as e:
            fail(f"{job.model_dir}: {e}")
        self.blocks = studio_moe.moe_block_list(self.model)
        self.moe_set = {l for l, _ in self.blocks}

    def select_trainable(self):
        """shared/src/train/freeze.rs on the per-expert modules."""
        stage = self.job.c["stage"]
        for p in self.model.parameters():
            p.requires_grad_(False)
        for l, blk in self.blocks:
            spec = self.specs[l]
            for p in blk.gate.parameters():
                p.requires_grad_(True)
            if stage != "experts":
                continue
            frozen = set(spec.get("frozen", []))
            for e, ex in enumerate(blk.experts):
                if e not in frozen:
                    ex.requires_grad_(True)
            if not spec.get("shared_frozen", False):
                for ex in blk.shared_experts:
                    ex.requires_grad_(True)
                if blk.shared_expert_gate is not None:
                    blk.shared_expert_gate.requires_grad_(True)
        if not self.blocks:
            fail("model/config.json has no MoE layer (moe_layers all null)")
        return {}

    def forward(self, inp):
        o = self.model(input_ids=inp, use_cache=False)
        return o.logits, [Route(l, b.logits, b.counts, b.top_k, b.num_experts) for l, b in self.blocks]

    def expert_params(self):
        return {(l, e): list(ex.parameters()) for l, b in self.blocks for e, ex in enumerate(b.experts)}

    def fused_experts(self):
        return {}

    def selection_biases(self):
        return {l: b.selection_bias() for l, b in self.blocks if b.selection_bias() is not None}

    def layers(self):
        return len(self.specs)

    def save(self, sd, tmp):
        from safetensors.torch import save_file

        canon = {self.sm.canonical_name(k, self.moe_set): v for k, v in sd.items()}
        if self.tied:
            canon.pop("lm_head.weight", None)
        if set(canon) != set(self.files):
            fail(f"the trained state has other tensors than model/: {sorted(set(canon) ^ set(self.files))[:8]}")
        os.makedirs(tmp, exist_ok=True)
        by_file = {}
        for k, fn in self.files.items():
            by_file.setdefault(fn, {})[k] = canon[k].detach().to(torch.float32).contiguous()
        for fn, ts in by_file.items():
            save_file(ts, os.path.join(tmp, fn), metadata={"format": "pt"})
        idx = os.path.join(self.job.model_dir, "model.safetensors.index.json")
        if os.path.exists(idx):
            shutil.copy2(idx, os.path.join(tmp, "model.safetensors.index.json"))


def load_balancing(routes, form, group_sum):
    """shared/src/train/losses.rs::load_balancing_loss with the routing
    fractions over the whole micro-batch of all ranks. Returns (the rank's
    differentiable term whose mean over ranks is the global loss, counts
    per layer over all ranks)."""
    local = []
    for r in routes:
        if r.counts is None:
            idx = torch.topk(r.logits.detach(), r.k, dim=-1).indices.reshape(-1)
            local.append(torch.bincount(idx, minlength=r.e).to(torch.float64).cpu())
        else:
            local.append(r.counts.to(torch.float64).cpu())
    rows_local = routes[0].logits.shape[0]
    sizes = [len(c) for c in local]
    flat = group_sum(torch.cat(local + [torch.tensor([float(rows_local)], dtype=torch.float64)]))
    world_rows = flat[-1].item()
    stacked = list(torch.split(flat[:-1], sizes))
    if form == "per-layer":
        total = 0.0
        for r, c in zip(routes, stacked):
            p = torch.softmax(r.logits.float(), dim=-1).mean(dim=0)
            f = (c / max(world_rows * r.k, 1.0)).to(torch.float32).to(p.device)
            total = total + (p * f).sum() * r.e
        return total / len(routes), stacked
    # hf-mixtral: counts and probabilities pooled over layers first (equal E).
    e = routes[0].e
    f = (torch.stack(stacked).sum(dim=0) / (world_rows * len(routes))).to(torch.float32)
    psum = sum(torch.softmax(r.logits.float(), dim=-1).sum(dim=0) for r in routes)
    p = psum / (rows_local * len(routes))
    return (p * f.to(p.device)).sum() * e, stacked


def z_loss(routes):
    """ST-MoE Eq. 5 (losses.rs::router_z_loss): mean over rows of lse^2, mean over layers."""
    return sum(torch.logsumexp(r.logits.float(), dim=-1).pow(2).mean() for r in routes) / len(routes)


def language_prior(routes, row_mask, masked_global, world):
    """losses.rs::language_prior_loss over the masked rows of all ranks:
    returns the rank's term whose mean over ranks is the global loss."""
    total = 0.0
    w = row_mask.to(torch.float32)
    for r in routes:
        logp0 = torch.log_softmax(r.logits.float(), dim=-1)[:, 0]
        total = total - (logp0 * w).sum() * world / masked_global
    return total / len(routes)


def update_selection_bias(bias, counts, rate):
    """shared/src/train/balance.rs::update_selection_bias: `b_i += rate *
    sign(mean - c_i)` in f64, stored as f32; a balanced expert keeps its bias."""
    b = bias.detach().cpu().numpy().astype(np.float64)
    c = np.asarray(counts, dtype=np.float64)
    err = c.sum() / max(len(c), 1) - c
    new = np.where(err != 0.0, b + rate * np.sign(err), b).astype(np.float32)
    with torch.no_grad():
        bias.copy_(torch.from_numpy(new).to(bias.device))


def complete_checkpoints(out):
    """[(step, dir)] of the finished checkpoints in `out`, oldest first."""
    found = []
    for d in os.listdir(out):
        m = CHECKPOINT.match(d)
        if m and os.path.exists(os.path.join(out, d, "trainer_state.json")):
            found.append((int(m.group(1)), os.path.join(out, d)))
    return sorted(found)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", default=HERE, help="the job directory (default: this file's)")
    ap.add_argument("--out", default=None, help="output directory (default: JOB/out)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest complete OUT/checkpoint-*")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="compute dtype (bf16: FSDP2 MixedPrecisionPolicy, f32 master weights and reductions)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (a smoke run)")
    args = ap.parse_args()

    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict,
        set_optimizer_state_dict)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor, distribute_tensor

    if "RANK" not in os.environ:
        fail("launch with torchrun (see README.md), e.g. torchrun --nproc_per_node 1 train.py")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    job = Job(args.job)
    c = job.c
    if job.global_batch % world:
        fail(f"{world} ranks do not divide the micro-batch of {job.global_batch} sequences "
             "(job.json global_batch = --batch x --devices of the emitting command)")
    torch.manual_seed(c["seed"])
    out = args.out or os.path.join(job.root, "out")
    os.makedirs(out, exist_ok=True)

    if job.modeling == "studio":
        wrapper = StudioModel(job)
    elif job.modeling == "transformers":
        wrapper = TransformersModel(job, args.dtype)
    else:
        fail(f"job.json: unknown modeling `{job.modeling}` (expected transformers or studio)")
    model = wrapper.model
    model.config.use_cache = False
    model.train()
    masked = wrapper.select_trainable()
    mesh = init_device_mesh(device.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
                              reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to(device)
    named = dict(model.named_parameters())
    # Per fused expert tensor with frozen experts: a [E, 1, 1] row mask, sharded like the parameter.
    masks = {}
    for name, fz in masked.items():
        p = named[name]
        m = torch.ones(p.shape[0], *([1] * (p.dim() - 1)), dtype=torch.float32, device=device)
        m[fz] = 0.0
        masks[name] = distribute_tensor(m, p.device_mesh, p.placements) if isinstance(p, DTensor) else m
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    # Separately stored experts (studio form) that train: dropped from a step no token routed to them.
    expert_params = {key: [p for p in ps if p.requires_grad] for key, ps in wrapper.expert_params().items()}
    expert_params = {key: ps for key, ps in expert_params.items() if ps}
    wd = c["weight_decay"]
    opt = BurnAdamW([p for _, p in trainable], lr=c["lr"], betas=(f32(c["beta1"]), f32(c["beta2"])),
                    eps=c["eps"], weight_decay=wd)
    # Frozen rows of fused expert tensors must not decay.
    opt.row_masks = {named[n]: m for n, m in masks.items()}
    # Fused expert tensors: a step count per expert, and only the experts that got a token update.
    fused = {}
    for name, ordinal in wrapper.fused_experts().items():
        p = named[name]
        idx = torch.arange(p.shape[0], dtype=torch.float32, device=device).view(-1, *([1] * (p.dim() - 1)))
        opt.expert_rows[p] = distribute_tensor(idx, p.device_mesh, p.placements) if isinstance(p, DTensor) else idx
        fused[p] = ordinal
    # Elements that train: the rows of frozen experts inside fused tensors do not.
    n_train = sum(p.numel() * (1 - len(masked.get(n, [])) / p.shape[0]) for n, p in trainable)
    n_all = sum(p.numel() for p in model.parameters())
    sched = {"lr": c["lr"], "warmup": c["warmup"], "total": c["steps"], "min_ratio": c["min_lr_ratio"]}
    alpha = c["alpha"] if c["balance"] == "aux" else 0.0
    aux_free = c["balance"] == "aux-free"
    biases = wrapper.selection_biases()
    ga, L = c["grad_accum"], c["seq_len"]
    steps = c["steps"] if args.max_steps is None else min(c["steps"], args.max_steps)
    needed = steps * ga * job.global_batch
    if needed > job.rows:
        fail(f"{steps} steps need {needed} sequences, data/tokens.u32 holds {job.rows}")

    def group_sum(t):
        t = t.to(device)
        dist.all_reduce(t)
        return t.cpu()

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    start = 0
    metrics_path = os.path.join(out, "metrics.jsonl")
    if args.resume:
        ck = complete_checkpoints(out)
        if not ck:
            fail(f"--resume: no complete checkpoint-NNNNNN (with trainer_state.json) in {out}")
        d = ck[-1][1]
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        dcp.load(state, checkpoint_id=os.path.join(d, "dcp"))
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])
        with open(os.path.join(d, "trainer_state.json")) as f:
            start = json.load(f)["step"]
        log(f"resuming from {d} (step {start})")
        if rank == 0 and os.path.exists(metrics_path):
            with open(metrics_path) as f:
                kept = [l for l in f if l.strip() and json.loads(l)["step"] <= start]
            with open(metrics_path, "w") as f:
                f.writelines(kept)
        dist.barrier()
    elif rank == 0 and os.path.exists(metrics_path):
        os.remove(metrics_path)
    log(f"stage {c['stage']} ({job.modeling} modeling): {int(n_train)} trainable parameters of {n_all}; "
        f"{world} rank(s) on {device.type}, {job.global_batch // world} sequences per rank per micro-step, "
        f"{ga} micro-step(s), seq {L}")

    def save_model_dir(dst):
        """Gathers the full state dict and writes a model directory in the exported layout (rank 0)."""
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            tmp = dst + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            wrapper.save(sd, tmp)
            for f in os.listdir(job.model_dir):
                if not f.endswith((".safetensors", ".safetensors.index.json")):
                    shutil.copy2(os.path.join(job.model_dir, f), os.path.join(tmp, f))
            if os.path.exists(dst):
                shutil.rmtree(dst)
            os.rename(tmp, dst)
        dist.barrier()

    def save_checkpoint(step):
        """`checkpoint-NNNNNN/` written as `.checkpoint-NNNNNN.tmp/` and renamed when complete,
        so a run killed while saving leaves the previous checkpoint as the newest."""
        final = os.path.join(out, f"checkpoint-{step:06d}")
        d = os.path.join(out, f".checkpoint-{step:06d}.tmp")
        if rank == 0:
            shutil.rmtree(d, ignore_errors=True)
        dist.barrier()
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        dcp.save(state, checkpoint_id=os.path.join(d, "dcp"))
        save_model_dir(os.path.join(d, "model.tmpdir"))
        if rank == 0:
            mdir = os.path.join(d, "model.tmpdir")
            for f in os.listdir(mdir):
                os.rename(os.path.join(mdir, f), os.path.join(d, f))
            os.rmdir(mdir)
            with open(os.path.join(d, "trainer_state.json"), "w") as f:
                json.dump({"format": "moe-studio-torch-trainer-state", "step": step}, f)
            shutil.rmtree(final, ignore_errors=True)
            os.rename(d, final)
            ck = complete_checkpoints(out)
            for _, old in ck[: max(len(ck) - max(c["keep"], 1), 0)]:
                shutil.rmtree(old)
        dist.barrier()

    n_layers = wrapper.layers()
    tokens_seen = start * ga * job.global_batch * L
    for step in range(start, steps):
        t0 = time.time()
        ces, lbs, zs, priors = [], [], [], []
        load = None
        routed_layers = None
        src_seq = [0] * len(job.j["sources"])
        for micro in range(ga):
            inp, tgt, row_orig, orig_global, srcs = rank_batch(job, step, micro, rank, world)
            for s in srcs:
                src_seq[int(s)] += 1
            inp, tgt = inp.to(device), tgt.to(device)
            logits, routes = wrapper.forward(inp)
            logits = logits.float()
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
            total = ce
            lb = zl = pr = None
            counts = []
            if routes:
                lb, counts = load_balancing(routes, c["lb_form"], group_sum)
                if alpha > 0:
                    total = total + alpha * lb
                zl = z_loss(routes)
                if c["z_loss"] > 0:
                    total = total + c["z_loss"] * zl
            if routes and orig_global > 0:
                token_mask = row_orig.repeat_interleave(L).to(device)
                pr = language_prior(routes, token_mask, orig_global * L, world)
                if c["prior"] > 0:
                    total = total + c["prior"] * pr
            (total / ga).backward()
            vals = torch.tensor([ce.item()] + [x.item() if x is not None else 0.0 for x in (lb, zl, pr)],
                                dtype=torch.float64)
            vals = group_sum(vals) / world
            ces.append(vals[0].item())
            if lb is not None:
                lbs.append(vals[1].item())
                zs.append(vals[2].item())
            if pr is not None:
                priors.append(vals[3].item())
            load = counts if load is None else [a + b for a, b in zip(load, counts)]
            routed_layers = [r.layer for r in routes]
        for name, m in masks.items():
            g = named[name].grad
            if g is not None:
                g.mul_(m)
        # As Burn: an expert that no token of the step chose (on any rank) has no gradient.
        layer_load = dict(zip(routed_layers, load))
        for (l, e), ps in expert_params.items():
            if layer_load[l][e].item() == 0:
                for p in ps:
                    p.grad = None
        opt.expert_active = {p: layer_load[o] > 0 for p, o in fused.items()}
        ce_m = sum(ces) / len(ces)
        lb_m = sum(lbs) / len(lbs) if lbs else None
        z_m = sum(zs) / len(zs) if zs else None
        pr_m = sum(priors) / len(priors) if priors else None
        loss = ce_m + alpha * (lb_m or 0.0) + c["z_loss"] * (z_m or 0.0) + c["prior"] * (pr_m or 0.0)
        if not math.isfinite(loss):
            fail(f"step {step + 1}: the loss is {loss} (try a lower --lr or --clip); the step was not applied")
        norm = clip_global_norm([p for _, p in trainable], c["clip"], rank)
        lr = lr_at(sched, step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        if aux_free:
            for l, b in biases.items():
                update_selection_bias(b, layer_load[l].tolist(), c["bias_update_rate"])
        tokens = ga * job.global_batch * L
        tokens_seen += tokens
        secs = time.time() - t0
        shares = [(row / max(row.sum().item(), 1.0)).tolist() for row in load]
        if n_layers is None:
            expert_load = shares
        else:
            by_layer = dict(zip(routed_layers, shares))
            expert_load = [by_layer.get(l) for l in range(n_layers)]
        metrics = {
            "step": step + 1, "steps": c["steps"], "loss": loss, "ce_loss": ce_m, "lb_loss": lb_m,
            "prior_loss": pr_m, "z_loss": z_m, "lr": lr, "grad_norm": float(norm), "tokens": tokens,
            "tokens_seen": tokens_seen, "seconds": secs, "tokens_per_s": tokens / secs if secs > 0 else 0.0,
            "expert_load": expert_load, "source_sequences": src_seq, "engine": "torch", "world_size": world,
        }
        if biases:
            metrics["selection_bias"] = [
                biases[l].detach().cpu().double().tolist() if l in biases else None for l in range(n_layers)
            ]
        if rank == 0:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(metrics) + "\n")
            print(f"step {step + 1}/{c['steps']} loss {loss:.6f} ce {ce_m:.6f} lb {lb_m or 0.0:.4f} lr {lr:.3e} "
                  f"grad_norm {float(norm):.4f} {metrics['tokens_per_s']:.0f} tok/s", flush=True)
        every = c["save_every"]
        if every > 0 and (step + 1) % every == 0 and step + 1 < c["steps"]:
            save_checkpoint(step + 1)
    save_model_dir(os.path.join(out, "final"))
    log(f"done: {steps} steps; model in {os.path.join(out, 'final')}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
