"""Reference generation throughput for `moe-studio bench generate --reference-python`.

Usage: python bench_generate.py MODEL_GGUF_OR_DIR PROMPT_TOKENS NEW_TOKENS REPEAT
Loads the model with Hugging Face transformers in float32 on the CPU
($MOE_STUDIO_TORCH_DEVICE, default cpu) and runs
`generate` (greedy, KV cache, no early stop: min_new_tokens = max_new_tokens)
on PROMPT_TOKENS deterministic prompt ids ((i*7919+13) % vocab, the Rust side's
ids): one warm-up and REPEAT timed runs. Prints JSON
{"new_tokens": N, "seconds": [...], "tokens_per_s": N / median, "ids": [the new
ids], ...}; the time includes the prompt's prefill, as on the Rust side.
"""
import json
import os
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

DEVICE = os.environ.get("MOE_STUDIO_TORCH_DEVICE", "cpu")


def sync():
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    path, p, n, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if path.endswith(".gguf"):
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = model.to(DEVICE)
    model.eval()
    v = model.config.vocab_size
    ids = torch.tensor([[(i * 7919 + 13) % v for i in range(p)]], device=DEVICE)
    mask = torch.ones_like(ids)
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True,
              attention_mask=mask, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids, **kw)
        times = []
        for _ in range(max(repeat, 1)):
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            sync()
            times.append(time.perf_counter() - t0)
    assert out.shape[1] == p + n, out.shape
    med = sorted(times)[len(times) // 2]
    print(json.dumps({"new_tokens": n, "prompt_tokens": p, "seconds": times, "tokens_per_s": n / med,
                      "ids": out[0, p:].tolist(), "torch_threads": torch.get_num_threads(),
                      "torch": torch.__version__, "transformers": transformers.__version__, "device": DEVICE}))


if __name__ == "__main__":
    main()
