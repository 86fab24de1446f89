"""Reference prefill throughput for `moe-studio bench prefill --reference-python`.

Usage: python bench_prefill.py MODEL_GGUF_OR_DIR TOKENS REPEAT
Loads the model with Hugging Face transformers in float32 on the CPU
($MOE_STUDIO_TORCH_DEVICE, default cpu), runs one
warm-up and REPEAT timed forward passes over TOKENS deterministic token ids
(the same ids as the Rust side: (i*7919+13) % vocab), prints JSON
{"tokens": N, "seconds": [every timed run], "tokens_per_s": N / median, ...}.
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
    path, n, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if path.endswith(".gguf"):
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = model.to(DEVICE)
    model.eval()
    v = model.config.vocab_size
    ids = torch.tensor([[(i * 7919 + 13) % v for i in range(n)]], device=DEVICE)
    with torch.inference_mode():
        model(ids)
        sync()
        times = []
        for _ in range(max(repeat, 1)):
            t0 = time.perf_counter()
            model(ids)
            sync()
            times.append(time.perf_counter() - t0)
    med = sorted(times)[len(times) // 2]
    print(json.dumps({"tokens": n, "seconds": times, "tokens_per_s": n / med,
                      "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                      "transformers": transformers.__version__, "device": DEVICE}))


if __name__ == "__main__":
    main()
