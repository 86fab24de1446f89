#!/usr/bin/env python3
"""A real checkpoint of a family (heavy, opt-in): moe-studio against
transformers on the same GGUF file (transformers loads it with `gguf_file=`,
dequantised to f32; transformers 5.24).

For one GGUF:
1. `moe-studio inspect --json`: the configuration the studio reads.
2. Tokens: transformers' ids of the text (`add_special_tokens=True`) against
   moe-studio's (`logits --text`).
3. Logits of the first `--logits-tokens` ids (moe-studio's tokenization):
   max |difference| and top-1 agreement.
4. Greedy continuation of `--prompt` (`--new-tokens` tokens): transformers'
   `generate(do_sample=False)` against `moe-studio generate --temperature 0`.
5. Perplexity on the same token windows (window / stride as moe-studio's
   `perplexity`, float64 log-softmax, as tests/reference/check_llamacpp.py),
   against `moe-studio perplexity --json`: relative difference.

Prints one JSON object. Files: `bash tests/reference/fetch_family_ggufs.sh`
(Gemma 3 270M). Usage (a release binary; about two minutes on 2 cores):
    ~/.cache/moe-studio/pyref-venv/bin/python tests/reference/check_family_real.py \\
        ~/.cache/moe-studio/family-ggufs/gemma-3-270m-q4_k_m.gguf \\
        --text ../shared/data/corpora/lang/en/valid.txt --bin $CARGO_TARGET_DIR/release/moe-studio
"""

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def last_json(out):
    """The JSON a `--json` command printed: the whole output (pretty-printed,
    e.g. `inspect`) or, after progress lines, its last line."""
    out = out.strip()
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        return json.loads(out.splitlines()[-1])


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def perplexity(model, ids, window, stride):
    n, total, count, prev_end = len(ids), 0.0, 0, 0
    for begin in range(0, n, stride):
        end = min(begin + window, n)
        lo = max(prev_end, begin + 1)
        if lo < end:
            rows = hf_logits(model, ids[begin:end])[lo - begin - 1 : end - begin - 1]
            m = rows.max(axis=1, keepdims=True)
            lse = (np.log(np.exp(rows - m).sum(axis=1, keepdims=True)) + m)[:, 0]
            tgt = np.asarray(ids[lo:end])
            total += float((lse - rows[np.arange(len(tgt)), tgt]).sum())
            count += len(tgt)
        prev_end = end
        if end == n:
            break
    return total / count, count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("--text", required=True)
    ap.add_argument("--bin", required=True, help="the moe-studio binary")
    ap.add_argument("--prompt", default="The capital of France is Paris. The capital of Germany is")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--stride", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=768)
    ap.add_argument("--logits-tokens", type=int, default=32)
    ap.add_argument("--backend", default="ndarray")
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    gguf = Path(a.gguf)
    be = ["--backend", a.backend]

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    load_s = time.time() - t0
    inspect = last_json(run([a.bin, *be, "inspect", a.gguf, "--json"]))

    text = open(a.text, encoding="utf-8").read()
    hf_ids = tok(text, add_special_tokens=True)["input_ids"][: a.max_tokens]
    tmp = tempfile.NamedTemporaryFile(suffix=".f32", delete=False).name
    out = last_json(run([a.bin, *be, "logits", a.gguf, "--text", a.text, "--max-tokens", str(a.max_tokens),
                         "--out", tmp]))
    ids = out["ids"]
    n = min(a.logits_tokens, len(ids))
    ours = np.fromfile(tmp, dtype="<f4").reshape(len(ids), out["vocab"])[:n]
    os.unlink(tmp)
    theirs = hf_logits(model, ids[:n])
    first_diff = next((i for i, (x, y) in enumerate(zip(hf_ids, ids)) if x != y), None)

    prompt_ids = tok(a.prompt, add_special_tokens=True)["input_ids"]
    with torch.no_grad():
        g = model.generate(torch.tensor([prompt_ids]), max_new_tokens=a.new_tokens, do_sample=False)[0].tolist()
    hf_new = g[len(prompt_ids):]
    gen = last_json(run([a.bin, *be, "generate", a.gguf, "--prompt", a.prompt, "--max-new-tokens",
                         str(a.new_tokens), "--temperature", "0", "--json"]))

    nll, count = perplexity(model, ids, a.window, a.stride)
    ppl_hf = float(np.exp(nll))
    r = last_json(run([a.bin, *be, "perplexity", a.gguf, "--text", a.text, "--window", str(a.window), "--stride",
                       str(a.stride), "--max-tokens", str(a.max_tokens), "--json"]))
    print(json.dumps({
        "gguf": a.gguf,
        "transformers_load_seconds": round(load_s, 1),
        "config": inspect.get("config", inspect),
        "tokens_identical": hf_ids == ids,
        "first_token_difference": first_diff,
        "logits_tokens": n,
        "logits_max_abs_diff": float(np.abs(theirs - ours).max()),
        "logits_max_abs": float(np.abs(theirs).max()),
        "top1_agreement": float((theirs.argmax(1) == ours.argmax(1)).mean()),
        "prompt_ids_identical": prompt_ids == gen["prompt_ids"],
        "greedy_identical": hf_new == gen["new_ids"][: len(hf_new)],
        "greedy_transformers": tok.decode(hf_new),
        "greedy_moe_studio": gen["continuation"],
        "window": a.window,
        "stride": a.stride,
        "scored_tokens": count,
        "ppl_transformers": ppl_hf,
        "ppl_moe_studio": r["ppl"],
        "ppl_rel_diff": abs(ppl_hf - r["ppl"]) / r["ppl"],
    }, ensure_ascii=False))


if __name__ == "__main__":
    main()
