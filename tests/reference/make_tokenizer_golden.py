#!/usr/bin/env python3
"""Token ids of transformers' GGUF tokenizers (`AutoTokenizer.from_pretrained(
dir, gguf_file=...)`, transformers 5.24 `integrations/gguf/gguf_tokenizer_mapping.py`)
for a few multilingual lines, per family:

  gemma3  gemma-3-270m-q4_k_m.gguf  (SentencePiece; merges rebuilt from the
          token order, all-space tokens respelled with U+2581)
  phi3    ggml-vocab-phi-3.gguf     (SentencePiece; prefix U+2581 and space
          replacement as a normalizer)
  qwen2   ggml-vocab-qwen2.gguf     (byte-level BPE, pre `qwen2`: the Qwen2 /
          Qwen3 vocabulary)

Plus a synthetic SentencePiece vocabulary (`synthetic_vocab`, written
with gguf-py as architectures `gemma3`, `phi3` and `llama`) whose token
order and scores disagree on the merge order and which holds an all-space
token, so the family rules show on a few short lines; its ids go under
`synthetic` (the Rust test writes the same vocabulary and needs no download).

Files: `bash tests/reference/fetch_family_ggufs.sh`. Writes
tests/reference/golden/gguf_tokenizers.json (the lines, each file's sha256,
`add_special_tokens=True` ids); the Rust test
shared/tests/integration/gguf_tokenizer.rs (`family_tokenizers_match_transformers`)
builds ours from the same files and compares.

Run: ~/.cache/moe-studio/pyref-venv/bin/python tests/reference/make_tokenizer_golden.py
"""

import hashlib
import json
import os
import tempfile
from pathlib import Path

import gguf
from transformers import AutoTokenizer

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("MOE_STUDIO_CACHE", Path.home() / ".cache" / "moe-studio")) / "family-ggufs"

LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Árvíztűrő tükörfúrógép: a magyar ékezetek próbája.",
    "Όλοι οι άνθρωποι γεννιούνται ελεύθεροι και ίσοι.",
    "人人生而自由，在尊严和权利上一律平等。",
    "def f(x):\n    return x ** 2  # squares\n\tprint(f(3))",
    "  two leading spaces,   three inside, trailing  ",
    "numbers 1234567 and 3.14159; emoji 🤖🚀 and café",
    "\n\nnewlines\n\n\nand tabs\t\tend",
]

FILES = {
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "phi3": "ggml-vocab-phi-3.gguf",
    "qwen2": "ggml-vocab-qwen2.gguf",
}


def sha256(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


SYNTHETIC_LINES = ["abc", "a  b", " abc", "cab ab", "  a", "hé", "<bos>ab", "a\n  c"]


def synthetic_vocab():
    """`<pad> <eos> <bos> <unk>`, the 256 byte tokens, then pieces whose
    scores rise along the list (so by score `ab` beats `bc`, by order `bc`
    beats `ab`), among them `"  "` (two spaces, Gemma's spelling of a
    whitespace token)."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [3, 3, 3, 2] + [6] * 256
    pieces = ["\u2581", "a", "b", "c", "bc", "ab", "\u2581a", "  ", "\u2581\u2581", "ca", "\u2581ab", "\n"]
    scores = [0.0] * len(tokens) + [float(i) for i in range(len(pieces))]
    return tokens + pieces, scores, types + [1] * len(pieces)


def synthetic(arch, d):
    tokens, scores, types = synthetic_vocab()
    path = Path(d) / f"synthetic-{arch}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=path.name)
    return [tok(line, add_special_tokens=True)["input_ids"] for line in SYNTHETIC_LINES]


def main():
    out = {"lines": LINES, "files": {}}
    with tempfile.TemporaryDirectory() as d:
        out["synthetic"] = {"lines": SYNTHETIC_LINES, **{a: synthetic(a, d) for a in ("gemma3", "phi3", "llama")}}
    print("synthetic", out["synthetic"])
    for family, name in FILES.items():
        tok = AutoTokenizer.from_pretrained(str(CACHE), gguf_file=name)
        ids = [tok(line, add_special_tokens=True)["input_ids"] for line in LINES]
        out["files"][family] = {
            "file": name,
            "bytes": (CACHE / name).stat().st_size,
            "sha256": sha256(CACHE / name),
            "ids": ids,
        }
        print(family, [len(i) for i in ids])
    dst = HERE / "golden" / "gguf_tokenizers.json"
    dst.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(dst, dst.stat().st_size, "B")


if __name__ == "__main__":
    main()
