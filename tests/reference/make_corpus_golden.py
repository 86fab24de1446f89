"""Golden token streams of `moe_shared::corpus` (tests/reference/golden/corpus_streams.json).

For each fixture text file and each document split (the `--docs` of every command that reads
text), the token stream that Hugging Face's tokenizer gives when the file is cut into documents
the way Hugging Face `datasets`' text loader cuts it (`sample_by`: line, paragraph, document)
and each document is encoded with the tokenizer's special tokens followed by its end-of-text
token: `tokenizer(doc)["input_ids"] + [eos]` per document, concatenated. With its SHA-256 over
little-endian u32 ids, which the studio's reports carry (`stream_sha256`).

The splits, written out here (not imported from `datasets`, whose "paragraph" mode splits on
the two characters "\\n\\n" and so differs from the studio only on lines holding whitespace):
  line:  every non-empty line, trailing whitespace removed
  blank: maximal runs of non-blank lines joined by "\\n" (a blank line is empty or whitespace)
  file:  the whole file, leading/trailing blank lines and trailing whitespace removed

Run (the pyref venv of tests/reference/requirements.txt; seconds):
  ~/.cache/moe-studio/pyref-venv/bin/python tests/reference/make_corpus_golden.py \\
      --tokenizer ../shared/data/models/smollm2-135m-instruct/tokenizer.json
"""

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ["tests/fixtures/corpus/two_docs.txt"]


def documents(text, split):
    lines = text.split("\n")
    if text.endswith("\n"):
        lines = lines[:-1]
    lines = [l[:-1] if l.endswith("\r") else l for l in lines]
    if split == "line":
        return [l.rstrip() for l in lines if l.strip()]
    if split == "blank":
        docs, cur = [], []
        for l in lines:
            if l.strip():
                cur.append(l)
            elif cur:
                docs.append("\n".join(cur))
                cur = []
        if cur:
            docs.append("\n".join(cur))
        return docs
    if split == "file":
        keep = [i for i, l in enumerate(lines) if l.strip()]
        return ["\n".join(lines[keep[0] : keep[-1] + 1]).rstrip()] if keep else []
    raise ValueError(split)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="SmolLM2's tokenizer.json")
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    eos = tok.token_to_id("<|endoftext|>")
    out = {"tokenizer": "SmolLM2-135M-Instruct tokenizer.json", "eos": eos, "files": {}}
    for rel in FIXTURES:
        text = (ROOT / rel).read_text(encoding="utf-8")
        per = {}
        for split in ["line", "blank", "file"]:
            docs = documents(text, split)
            doc_ids = [tok.encode(d, add_special_tokens=True).ids for d in docs]
            ids = [i for d in doc_ids for i in d + [eos]]
            per[split] = {
                "documents": len(docs),
                "document_ids": doc_ids,
                "ids": ids,
                "sha256": hashlib.sha256(np.asarray(ids, dtype="<u4").tobytes()).hexdigest(),
            }
        out["files"][rel] = per
    dst = ROOT / "tests/reference/golden/corpus_streams.json"
    dst.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
