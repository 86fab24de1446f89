#!/usr/bin/env python3
"""Training FLOPs per token of a stage, from a model's config.json (issue 35 item 3: baselines at
matched FLOPs). Standard library only.

Counting (the usual 2 FLOPs per multiply-add, Kaplan et al. 2020 / the 6N rule written per matrix):
every linear map W [out, in] a token goes through costs 2·out·in forward, 2·out·in for the gradient
of its input (needed wherever a trainable parameter lies below it; taken for every layer here,
the trainable parameters reach layer 0 in every stage counted), and 2·out·in for its weight gradient
when W is trainable. Causal self-attention adds 2·2·(s/2)·heads·head_dim per layer forward (QKᵀ and
AV over on average s/2 earlier positions at sequence length s) and twice that backward. Embedding
lookups are free; the LM head counts. So a dense model with every weight trainable costs about 6P.

Stages (`moe-studio train --stage`): dense (every weight), ffn (the FFNs only; forward and input
gradients as dense), experts (an upcycled MoE: frozen expert 0, attention, norms, embeddings; top-k of
E experts computed forward and backward, weight gradients for the router and the trainable experts a
token is routed to — k·(E − frozen)/E of them on average under balanced routing, what the
load-balancing loss drives the router to), router (the routers only), all (an MoE with everything
but the frozen experts trainable).

Usage: flops.py CONFIG_JSON STAGE SEQ [EXPERTS TOP_K FROZEN]   prints GFLOP per token
       flops.py CONFIG_JSON ratio SEQ EXPERTS TOP_K FROZEN    prints MoE stage experts / dense
"""
import json
import sys


def shapes(cfg):
    d = cfg["hidden_size"]
    f = cfg["intermediate_size"]
    h = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", h)
    hd = cfg.get("head_dim") or d // h
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d  # q, k, v, o
    ffn = 3 * d * f  # gate, up, down
    head = cfg["vocab_size"] * d
    return d, h, hd, attn, ffn, head, cfg["num_hidden_layers"]


def gflop(cfg, stage, seq, experts=1, top_k=1, frozen=0):
    d, h, hd, attn, ffn, head, layers = shapes(cfg)
    score = 2 * 2 * (seq / 2) * h * hd  # QK^T and AV, per layer, forward
    router = experts * d
    if stage in ("dense", "ffn"):
        active = layers * (attn + ffn) + head
        fwd = 2 * active + layers * score
        bwd_in = 2 * active + 2 * layers * score
        trainable = active if stage == "dense" else layers * ffn
    else:
        active = layers * (attn + top_k * ffn + router) + head
        fwd = 2 * active + layers * score
        bwd_in = 2 * active + 2 * layers * score
        experts_trained = top_k * (experts - frozen) / experts
        if stage == "experts":
            trainable = layers * (experts_trained * ffn + router)
        elif stage == "router":
            trainable = layers * router
        elif stage == "all":
            trainable = layers * (attn + experts_trained * ffn + router) + head
        else:
            raise SystemExit(f"unknown stage {stage}")
    return (fwd + bwd_in + 2 * trainable) / 1e9


def main():
    a = sys.argv[1:]
    cfg = json.load(open(a[0]))
    if a[1] == "ratio":
        seq, e, k, fr = int(a[2]), int(a[3]), int(a[4]), int(a[5])
        print(f"{gflop(cfg, 'experts', seq, e, k, fr) / gflop(cfg, 'dense', seq):.4f}")
        return
    stage, seq = a[1], int(a[2])
    rest = [int(x) for x in a[3:6]] if len(a) > 3 else []
    print(f"{gflop(cfg, stage, seq, *rest):.4f}")


if __name__ == "__main__":
    main()
