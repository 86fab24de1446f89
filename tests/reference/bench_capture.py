"""Reference capture throughput for `moe-studio bench ridge|neurons --reference-python`.

Usage:
  python bench_capture.py ridge   MODEL_DIR IDS_JSON CONTEXT REPEAT
  python bench_capture.py neurons MODEL_GGUF_OR_DIR TEXTS_JSON REPEAT

IDS_JSON / TEXTS_JSON is a file written by the Rust side: the token ids it
runs, so both sides do the same work on the same tokens.

ridge: DUME's statistics (methods.md §2): the ids (one stream) are cut into
sequences of CONTEXT tokens; each runs through the model (transformers,
float32, CPU) with a forward hook on every layer's post_attention_layernorm
(the FFN input, what the router sees); per layer the rows x (with a constant 1
appended) are accumulated in float64 into A += X^T X and B[:, 0] += X^T 1,
as `moe-studio route` does for domain 0. The model is the studio's upcycled
copy, whose experts are equal, so learned routing computes what the studio's
forced routing computes.

neurons: NeuronMoE's capture (methods.md §3): each text runs alone; forward
hooks on every nn.Linear of the decoder layers (q/k/v/o, gate/up/down) and on
post_attention_layernorm mean-pool the outputs over the text's tokens and copy
the pooled rows to the host, as `moe-studio neurons` does.

Prints JSON {"seconds": [...], "tokens": N, "tokens_per_s": N / median, ...}.
"""
import json
import os
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

DEVICE = os.environ.get("MOE_STUDIO_TORCH_DEVICE", "cpu")


def load(path):
    if path.endswith(".gguf"):
        return AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def layers_of(model):
    return model.model.layers


def ridge(model, ids, context):
    seqs = [ids[i:i + context] for i in range(0, len(ids), context)]
    seqs = [s for s in seqs if len(s) >= 2]
    d = model.config.hidden_size
    a = [torch.zeros(d + 1, d + 1, dtype=torch.float64, device=DEVICE) for _ in layers_of(model)]
    b = [torch.zeros(d + 1, dtype=torch.float64, device=DEVICE) for _ in layers_of(model)]
    cur = {}

    def hook(l):
        def f(_m, _i, out):
            cur[l] = out
        return f

    hs = [layer.post_attention_layernorm.register_forward_hook(hook(l)) for l, layer in enumerate(layers_of(model))]
    tokens = 0
    for s in seqs:
        model(torch.tensor([s], device=DEVICE))
        for l in range(len(a)):
            x = cur[l].reshape(-1, d).to(torch.float64)
            x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=torch.float64, device=DEVICE)], 1)
            a[l] += x.T @ x
            b[l] += x.sum(0)
        tokens += len(s)
    for h in hs:
        h.remove()
    return tokens, float(sum(t.trace() for t in a))  # (reading it waits for the device)


def neurons(model, texts):
    pooled = []
    hs = []
    for layer in layers_of(model):
        mods = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
        mods.append(layer.post_attention_layernorm)
        for m in mods:
            hs.append(m.register_forward_hook(lambda _m, _i, out: pooled.append(out.mean(1))))
    tokens = 0
    rows = []
    for t in texts:
        pooled.clear()
        model(torch.tensor([t], device=DEVICE))
        rows.append(torch.cat(pooled, 1).cpu().numpy().copy())
        tokens += len(t)
    for h in hs:
        h.remove()
    return tokens, float(sum(r.sum() for r in rows))


def main():
    kind, path, data = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
    model = load(path).to(DEVICE)
    model.eval()
    if kind == "ridge":
        context, repeat = int(sys.argv[4]), int(sys.argv[5])
        run = lambda: ridge(model, data, context)
    else:
        repeat = int(sys.argv[4])
        run = lambda: neurons(model, data)
    with torch.inference_mode():
        run()
        times = []
        for _ in range(max(repeat, 1)):
            t0 = time.perf_counter()
            tokens, check = run()
            times.append(time.perf_counter() - t0)
    med = sorted(times)[len(times) // 2]
    print(json.dumps({"tokens": tokens, "seconds": times, "tokens_per_s": tokens / med, "check": check,
                      "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                      "transformers": transformers.__version__, "device": DEVICE}))


if __name__ == "__main__":
    main()
