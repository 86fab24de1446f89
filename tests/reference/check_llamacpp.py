#!/usr/bin/env python3
"""llama.cpp's own loader and evaluator on a GGUF written by
`moe-studio convert --to gguf`, against moe-studio on the same file.

Runs in the llama.cpp venv (scripts/llamacpp_venv.sh: llama-cpp-python
0.3.36 built here from the llama.cpp source it vendors). For one GGUF:

1. llama.cpp loads it (`Llama(model_path)`: its vocabulary needs
   `tokenizer.ggml.pre`, its `llama` MoE needs `ffn_*_exps` + `ffn_gate_inp`)
   and tokenizes the text; the ids are compared with moe-studio's.
2. Logits of the first `--logits-tokens` ids (moe-studio's tokenization)
   from `Llama.eval` with all logits kept, against `moe-studio logits` of the
   same GGUF: max |difference|.
   With `--ref-gguf` (the same model in F32), also llama.cpp's logits of
   this file against its own logits of the reference: what the type alone
   does inside llama.cpp, to read the difference above against.
3. Perplexity on the same token windows (window / stride as moe-studio's
   `perplexity`, float64 log-softmax; the Python twin of
   `shared/src/eval/perplexity.rs`, as tests/reference/make_golden.py),
   against `moe-studio perplexity --json` of the same GGUF: relative
   difference.

Prints one JSON object. Usage:
    ~/.cache/moe-studio/llamacpp-venv/bin/python tests/reference/check_llamacpp.py \
        FILE.gguf --text TEXT --bin target/release/moe-studio [--window 256 --stride 128 --max-tokens 1024]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from llama_cpp import Llama


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def ours_ids(binary, gguf, text_file, n):
    tmp = tempfile.NamedTemporaryFile(suffix=".f32", delete=False).name
    out = json.loads(run([binary, "--backend", "ndarray", "logits", gguf, "--text", text_file,
                          "--max-tokens", str(n), "--out", tmp]).strip().splitlines()[-1])
    logits = np.fromfile(tmp, dtype="<f4").reshape(len(out["ids"]), out["vocab"])
    os.unlink(tmp)
    return out["ids"], logits


def llama_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def perplexity(llm, ids, window, stride):
    n, total, count, prev_end = len(ids), 0.0, 0, 0
    for begin in range(0, n, stride):
        end = min(begin + window, n)
        lo = max(prev_end, begin + 1)
        if lo < end:
            lg = llama_logits(llm, ids[begin:end]).astype(np.float64)
            rows = lg[lo - begin - 1 : end - begin - 1]
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
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--stride", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--logits-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ref-gguf", help="the same model at higher precision (F32): llama.cpp's logits of this file vs "
                    "its logits of the reference on the same ids, i.e. what the type alone does inside llama.cpp")
    a = ap.parse_args()

    t0 = time.time()
    llm = Llama(model_path=a.gguf, n_ctx=max(a.window, a.logits_tokens), n_batch=max(a.window, a.logits_tokens),
                logits_all=True, n_threads=a.threads, verbose=False, seed=0,
                # an f32 KV cache (llama.cpp's default is f16), so the logits compare in f32
                type_k=0, type_v=0)
    load_s = time.time() - t0
    text = open(a.text, encoding="utf-8").read()
    # add_bos=True adds BOS only where the vocabulary's add_bos_token says so, as moe-studio's `--text`
    # (moe_shared::eval::text_ids) and llama.cpp's own perplexity.
    ll_ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[: a.max_tokens]

    ids, ours = ours_ids(a.bin, a.gguf, a.text, a.max_tokens)
    same_tokens = ll_ids == ids
    first_diff = next((i for i, (x, y) in enumerate(zip(ll_ids, ids)) if x != y), None)
    n = min(a.logits_tokens, len(ids))
    theirs = llama_logits(llm, ids[:n])
    logits_diff = float(np.abs(theirs - ours[:n]).max())
    top1_agree = float((theirs.argmax(1) == ours[:n].argmax(1)).mean())

    vs_ref = None
    if a.ref_gguf:
        ref = Llama(model_path=a.ref_gguf, n_ctx=a.logits_tokens, n_batch=a.logits_tokens, logits_all=True,
                    n_threads=a.threads, verbose=False, seed=0, type_k=0, type_v=0)
        vs_ref = float(np.abs(theirs - llama_logits(ref, ids[:n])).max())
        del ref

    nll, count = perplexity(llm, ids, a.window, a.stride)
    ppl_llama = float(np.exp(nll))
    tmp_text = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8")
    tmp_text.write(text)
    tmp_text.close()
    r = json.loads(run([a.bin, "--backend", "ndarray", "perplexity", a.gguf, "--text", tmp_text.name, "--window",
                        str(a.window), "--stride", str(a.stride), "--max-tokens", str(a.max_tokens), "--json"]))
    os.unlink(tmp_text.name)
    out = {
        "gguf": a.gguf,
        "llama_cpp_python": __import__("llama_cpp").__version__,
        "n_vocab": llm.n_vocab(),
        "load_seconds": round(load_s, 2),
        "tokens_identical": same_tokens,
        "first_token_difference": first_diff,
        "logits_tokens": n,
        "logits_max_abs_diff": logits_diff,
        "top1_agreement": top1_agree,
        "llama_cpp_vs_ref_max_abs_diff": vs_ref,
        "window": a.window,
        "stride": a.stride,
        "scored_tokens": count,
        "ppl_llama_cpp": ppl_llama,
        "ppl_moe_studio": r["ppl"],
        "ppl_rel_diff": abs(ppl_llama - r["ppl"]) / r["ppl"],
        "scored_tokens_moe_studio": r["tokens"],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
