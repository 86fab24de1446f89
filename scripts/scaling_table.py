#!/usr/bin/env python3
"""Prints the tables of docs/scaling.md: parameters, trainable parameters per
training stage, memory per stage and the GPUs each stage needs, for dense
checkpoints upcycled to an MoE (DeltaMoE, docs/methods.md §2).

Pure arithmetic from the public config.json values listed in MODELS; no
dependency beyond the standard library. Usage: python3 scripts/scaling_table.py

Conventions (the same as the studio's upcycle):
- every FFN becomes `experts` SwiGLU experts (copies of the dense FFN), top-k
  routing with a linear router [hidden -> experts] per layer, no router bias;
- stage `experts`: experts 1.. and the routers train, expert 0 and every
  non-FFN tensor (embeddings, attention, norms, LM head) are frozen
  (`--frozen 0`, shared/src/train/freeze.rs);
- stage `router`: only the routers train;
- memory: see the two regimes in `state_bytes`.
"""

GB = 1e9

# name: (hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, tied, qkv_bias)
MODELS = {
    "SmolLM2-135M": (576, 1536, 30, 9, 3, 64, 49152, True, False),
    "Llama-3.2-3B": (3072, 8192, 28, 24, 8, 128, 128256, True, False),
    "Qwen2.5-7B": (3584, 18944, 28, 28, 4, 128, 152064, False, True),
    "Llama-3.1-70B": (8192, 28672, 80, 64, 8, 128, 128256, False, False),
}
EXPERTS = 4
TOP_K = 2
GPUS = {"80 GB": 80 * GB, "141 GB": 141 * GB}
# Fraction of a GPU's memory the model state may take; the rest is kept for
# activations (with activation checkpointing), the allocator and buffers.
USABLE = 0.75


def counts(m, experts=EXPERTS):
    """Parameter counts of model `m` upcycled to `experts` experts per layer
    (a mean: NeuronMoE's counts differ per layer)."""
    h, i, L, nh, nkv, hd, v, tied, bias = m
    attn = h * nh * hd + 2 * h * nkv * hd + nh * hd * h
    if bias:
        attn += nh * hd + 2 * nkv * hd
    norms = 2 * h
    ffn = 3 * h * i
    embed = v * h * (1 if tied else 2) + h  # + final norm
    dense = L * (attn + norms + ffn) + embed
    router = h * experts
    moe = L * (attn + norms + experts * ffn + router) + embed
    stage_experts = L * ((experts - 1) * ffn + router)
    stage_router = L * router
    active = L * (attn + norms + TOP_K * ffn + router) + embed
    return dict(dense=dense, moe=moe, experts=stage_experts, router=stage_router, ffn=L * ffn,
                active=active, active_trainable=L * ((TOP_K - 0.5) * ffn + router))


# (method, stage as the user runs it, what it needs, experts per MoE layer)
NEURON_EXPERTS = 1 + 49 / 28
DUME_EXPERTS = 4
PLAN = [
    ("DeltaMoE", "`upcycle`", "stream", EXPERTS),
    ("DeltaMoE", "`train --stage experts` (phase 1)", "experts", EXPERTS),
    ("DeltaMoE", "`train --stage router` (MoE-LPR stage 2)", "router", EXPERTS),
    ("DeltaMoE", "`graft`", "stream", EXPERTS),
    ("NeuronMoE", "`neurons` (dense forward passes)", "forward-dense", EXPERTS),
    ("NeuronMoE", "`allocate`", "host", EXPERTS),
    ("NeuronMoE", "`upcycle --allocation`", "stream", NEURON_EXPERTS),
    ("NeuronMoE", "`train --stage experts` (stage 1)", "experts", NEURON_EXPERTS),
    ("NeuronMoE", "`train --stage router` (stage 2)", "router", NEURON_EXPERTS),
    ("NeuronMoE", "`neurons` on the MoE (analysis)", "forward-moe", NEURON_EXPERTS),
    ("DUME", "`train --stage ffn` (each domain expert, its FFNs)", "ffn", DUME_EXPERTS),
    ("DUME", "`train --stage dense` (BTX's branches, every weight)", "dense", DUME_EXPERTS),
    ("DUME", "`moerge`", "stream", DUME_EXPERTS),
    ("DUME", "`route` (ridge statistics + solve)", "forward-moe", DUME_EXPERTS),
    ("DUME", "`train --stage router` (DUME+, BTX)", "router", DUME_EXPERTS),
]


def plan_engine(m, kind, experts):
    """`engine | GPUs` of one row of the plan table."""
    if kind == "stream":
        return "moe-studio CLI, streaming (one tensor at a time in host memory; no GPU) | 0 / 0"
    if kind == "host":
        return "moe-studio CLI (arithmetic on `neurons` output) | 0 / 0"
    c = counts(m, experts)
    if kind.startswith("forward"):
        w = 4 * (c["dense"] if kind == "forward-dense" else c["moe"])
        n = "/".join(" 1 " if w <= USABLE * GPUS[g] else " 0 (CPU) " for g in ("80 GB", "141 GB")).strip()
        return f"Burn, one process, inference (f32 weights {w / GB:.0f} GB): one GPU if they fit, else the CPU | {n}"
    total = c["dense"] if kind in ("dense", "ffn") else c["moe"]
    trainable = c[kind]
    b32 = state_bytes(total, trainable, "f32")
    b16 = state_bytes(total, trainable, "bf16+master")
    if b32 <= USABLE * GPUS["80 GB"]:
        return "Burn (`--devices N` for more GPUs of the machine) | 1+ / 1+"
    fsdp = "PyTorch FSDP2 job (`--engine torch --emit`, torchrun)"
    if b32 <= USABLE * GPUS["141 GB"]:
        return f"Burn on one 141 GB GPU; on 80 GB GPUs the {fsdp} | {gpus_needed(b16, GPUS['80 GB'])}+ / 1+"
    return f"{fsdp} | {gpus_needed(b16, GPUS['80 GB'])}+ / {gpus_needed(b16, GPUS['141 GB'])}+"


def state_bytes(total, trainable, regime):
    """Bytes of weights + gradients + AdamW state for one full replica.

    - `f32` (the Burn engine today: f32 weights, f32 gradients, AdamW m and v
      in f32): 4 B per parameter + 12 B per trainable parameter.
    - `bf16+master` (mixed precision as in the ZeRO paper, §3: bf16 weights and
      gradients, f32 master copy + m + v of the trainable parameters):
      2 B per parameter + 14 B per trainable parameter.
    """
    if regime == "f32":
        return 4 * total + 12 * trainable
    return 2 * total + 14 * trainable


def gpus_needed(bytes_, cap):
    """Smallest N with bytes_/N <= USABLE*cap (fully sharded state, ZeRO-3 / FSDP)."""
    n = 1
    while bytes_ / n > USABLE * cap:
        n += 1
    return n


def fmt_p(x):
    return f"{x / 1e9:.2f} B" if x >= 1e9 else f"{x / 1e6:.1f} M"


def main():
    print(f"### Parameters ({EXPERTS} experts, top-{TOP_K})\n")
    print("| model | dense | upcycled MoE | active per token | trainable, stage `experts` | trainable, stage `router` |")
    print("|---|---|---|---|---|---|")
    rows = {}
    for name, m in MODELS.items():
        c = counts(m)
        rows[name] = c
        print(f"| {name} | {fmt_p(c['dense'])} | {fmt_p(c['moe'])} | {fmt_p(c['active'])} | "
              f"{fmt_p(c['experts'])} | {fmt_p(c['router'])} |")
    for regime, title in (("f32", "f32 weights, gradients and AdamW state (the Burn engine today)"),
                          ("bf16+master", "bf16 weights/gradients + f32 master and AdamW state (PyTorch FSDP / ZeRO-3)")):
        print(f"\n### Model state of one full replica: {title}\n")
        print("| model | stage | state (GB) | fits one 80 GB GPU | GPUs if fully sharded, 80 GB | GPUs if fully sharded, 141 GB |")
        print("|---|---|---|---|---|---|")
        for name, c in rows.items():
            for stage in ("experts", "router"):
                b = state_bytes(c["moe"], c[stage], regime)
                fits = b <= USABLE * GPUS["80 GB"]
                print(f"| {name} | `{stage}` | {b / GB:.1f} | {'yes' if fits else 'no'} | "
                      f"{gpus_needed(b, GPUS['80 GB'])} | {gpus_needed(b, GPUS['141 GB'])} |")
    print("\n### Plan: the engine of every stage of every method\n")
    print("Training stages take Burn when one replica's f32 state fits 75 % of one GPU (more GPUs: `--devices`,")
    print("data parallel in one process), else the PyTorch FSDP2 job (`train --engine torch --emit DIR`,")
    print("bf16 + f32 master, fully sharded, any number of nodes with torchrun). NeuronMoE's rows use the")
    print(f"paper's mean allocation ({NEURON_EXPERTS:.2f} experts per layer: 1 + 49 new over Llama-3.2-3B's 28 layers);")
    print(f"DUME's MoErge has {DUME_EXPERTS} domain experts, top-{TOP_K}, a router bias.\n")
    print("| model | method | stage | engine | GPUs (80 GB / 141 GB) |")
    print("|---|---|---|---|---|")
    for name, m in MODELS.items():
        for method, stage, kind, experts in PLAN:
            print(f"| {name} | {method} | {stage} | {plan_engine(m, kind, experts)} |")
    print("\n### Training FLOPs per token\n")
    print("| model | forward (2·active) | backward, stage `experts` | total | tokens/s per GPU at 10 % MFU, H100 bf16 (989 TFLOP/s dense) |")
    print("|---|---|---|---|---|")
    for name, c in rows.items():
        fwd = 2 * c["active"]
        # Activation gradients flow through every active tensor (2·active);
        # weight gradients only for the trainable active tensors (2·trainable
        # active: on average TOP_K - 1/2 of the TOP_K chosen experts are
        # trainable, since expert 0 is frozen and is chosen about half the time
        # when TOP_K = 2 of 4 — an estimate; routing decides it).
        bwd = 2 * c["active"] + 2 * c["active_trainable"]
        tot = fwd + bwd
        print(f"| {name} | {fwd / 1e9:.2f} GFLOP | {bwd / 1e9:.2f} GFLOP | {tot / 1e9:.2f} GFLOP | "
              f"{0.10 * 989e12 / tot:,.0f} |")


if __name__ == "__main__":
    main()
