"""Reference training throughput for `moe-studio bench train --reference-python`.

Usage: python bench_train.py MODEL_DIR SEQ_LEN BATCH STEPS STAGE LR
Loads the (Mixtral-layout) model with transformers in float32 on the CPU,
freezes what the studio's stage freezes (experts: everything but the routers
and the non-frozen experts; router: everything but the routers; dense:
nothing), and runs 1 warm-up + STEPS timed training steps (forward with the
router aux loss at coefficient 0.01, backward, global-norm clipping at 1.0,
AdamW) on BATCH x SEQ_LEN deterministic token ids ((j*7919+13) % vocab, j
running over the batch). Prints JSON {"seconds": [per timed step],
"tokens_per_s": ..., ...}. $MOE_STUDIO_TORCH_DEVICE (default cpu) runs it on
another torch device (scripts/gpu_check.sh: cuda).
"""
import json
import os
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    path, seq, batch, steps, stage, lr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], float(sys.argv[6])
    dev = os.environ.get("MOE_STUDIO_TORCH_DEVICE", "cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(dev)
    model.train()
    cfg = model.config
    studio = getattr(cfg, "moe_studio", None) or {}
    frozen = studio.get("frozen_experts") if isinstance(studio, dict) else None
    trainable = 0
    for name, p in model.named_parameters():
        layer = int(name.split(".layers.")[1].split(".")[0]) if ".layers." in name else None
        fl = (frozen[layer] or []) if (frozen is not None and layer is not None and layer < len(frozen)) else [0]
        if stage == "dense":
            keep = True
        elif name.endswith("mlp.gate.weight") or ".block_sparse_moe.gate." in name:
            keep = True
        elif stage == "experts" and ".experts." in name:
            rest = name.split(".experts.")[1].split(".")[0]
            if rest.isdigit():  # one module per expert (transformers 4.x layout)
                keep = int(rest) not in fl
            else:  # fused [E, ...] expert tensors (transformers 5.x): mask the frozen experts' gradients
                keep = True
                mask = torch.ones(p.shape[0], *([1] * (p.dim() - 1)), device=dev)
                if fl:
                    mask[fl] = 0.0
                p.register_hook(lambda g, m=mask: g * m)
                trainable -= p[0].numel() * len(fl)
        else:
            keep = False
        p.requires_grad_(keep)
        trainable += p.numel() if keep else 0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    v = cfg.vocab_size

    def batch_ids(step):
        base = step * batch * seq
        return torch.tensor([[((base + b * seq + i) * 7919 + 13) % v for i in range(seq)] for b in range(batch)],
                            device=dev)

    def one(step):
        ids = batch_ids(step)
        out = model(input_ids=ids, labels=ids, output_router_logits=hasattr(cfg, "num_local_experts"))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(out.loss)  # (reading the loss waits for the device)

    one(0)
    times, losses = [], []
    for s in range(steps):
        t0 = time.perf_counter()
        losses.append(one(s + 1))
        times.append(time.perf_counter() - t0)
    med = sorted(times)[len(times) // 2]
    print(json.dumps({"tokens_per_s": batch * seq / med, "seconds": times, "steps": steps, "losses": losses,
                      "trainable": trainable, "torch_threads": torch.get_num_threads(),
                      "torch": torch.__version__, "transformers": transformers.__version__, "device": dev}))


if __name__ == "__main__":
    main()
