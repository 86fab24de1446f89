#!/usr/bin/env python3
"""Multiple-choice "next paragraph" tasks made from the shared corpora.

For each corpus (default: lang/en, lang/hu, lang/el, lang/tr, domain/docs,
domain/code, domain/math) it reads the held-out split `valid.txt` and writes
`OUT/<name>.jsonl`, one item per line in the format `moe-studio eval --task`
and an lm-evaluation-harness `multiple_choice` task read:

    {"context": "<the paragraphs before, each ending in \\n>",
     "choices": ["<paragraph>", ...], "gold": <index>}

An item is a position i >= 1 in a document: the context is the document's
paragraphs before i (the nearest ones, as many whole paragraphs as fit in
--context-chars, at least one), the gold choice is paragraph i, and the
--choices - 1 distractors are paragraphs of OTHER documents of the same
file, of a similar length when enough exist (0.5x to 2x the gold's
characters), all distinct. The context ends with "\\n" and the choices have
none, so the tasks are meant for `--target-delimiter ''` (lm-eval:
`target_delimiter: ""`): lm-eval then moves that "\\n" to the front of each
continuation and scores exactly the text "\\n<paragraph>" after the context.

Documents and paragraphs follow corpora/SOURCES.md: documents are separated
by a blank line and each paragraph is one line; in domain/code a document is
one file (it starts with a `# ===== file: ... =====` line; blank lines inside
a file are kept in the context, and choices are non-blank lines).

Deterministic: positions and distractors come from a SplitMix64 stream
seeded with --seed and the task name (no dependence on Python's `random`),
so the same data and options give byte-identical files; `OUT/tasks.json`
records the options and the sha256 of every input and output. Standard
library only. The outputs are derived from the corpora and are never
committed (the rule for anything built from ../shared/data).

    python3 tests/reference/make_tasks.py --data ../shared/data --out /tmp/tasks
    moe-studio eval MODEL --task en=/tmp/tasks/en.jsonl --target-delimiter '' --json
"""

import argparse
import hashlib
import json
import os
import sys

CORPORA = ["lang/en", "lang/hu", "lang/el", "lang/tr", "domain/docs", "domain/code", "domain/math"]
CODE_FILE_MARK = "# ===== file: "
MASK = (1 << 64) - 1


class SplitMix64:
    """SplitMix64 (Steele, Lea, Flood 2014): a small, fully specified PRNG."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        """A uniform integer in [0, n) (rejection sampling, no modulo bias)."""
        limit = (1 << 64) - ((1 << 64) % n)
        while True:
            x = self.next()
            if x < limit:
                return x % n

    def shuffle(self, xs):
        """Fisher-Yates in place."""
        for i in range(len(xs) - 1, 0, -1):
            j = self.below(i + 1)
            xs[i], xs[j] = xs[j], xs[i]


def seed_for(seed, name):
    h = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(h[:8], "little")


def documents(text, code):
    """Lists of lines per document (see the module docstring)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    docs = []
    if code:
        for line in lines:
            if line.startswith(CODE_FILE_MARK) or not docs:
                docs.append([])
            docs[-1].append(line)
        # the blank line that separates two files belongs to neither
        for d in docs:
            while d and d[-1] == "":
                d.pop()
    else:
        cur = []
        for line in lines:
            if line.strip() == "":
                if cur:
                    docs.append(cur)
                cur = []
            else:
                cur.append(line)
        if cur:
            docs.append(cur)
    return [d for d in docs if d]


def make_task(name, text, code, args):
    rng = SplitMix64(seed_for(args.seed, name))
    docs = documents(text, code)
    usable = lambda s: s.strip() != "" and args.min_chars <= len(s) <= args.max_chars  # noqa: E731
    # Candidate positions: a usable paragraph with at least one paragraph before it
    # (for code: not the file's header line, and some non-blank line before it).
    positions = []
    for d, lines in enumerate(docs):
        for i in range(1, len(lines)):
            if not usable(lines[i]) or (code and i < 2):
                continue
            if len(lines[i - 1]) + 1 > args.context_chars:
                continue
            positions.append((d, i))
    pool = [(d, i) for d, lines in enumerate(docs) for i, s in enumerate(lines) if usable(s) and not (code and i == 0)]
    rng.shuffle(positions)
    items = []
    for d, i in positions:
        if len(items) == args.items:
            break
        lines = docs[d]
        gold = lines[i]
        # the nearest whole paragraphs before i within the budget
        start, size = i, 0
        while start > 0 and size + len(lines[start - 1]) + 1 <= args.context_chars:
            start -= 1
            size += len(lines[start]) + 1
        context = "".join(s + "\n" for s in lines[start:i])
        if context.strip() == "":
            continue
        others = [(e, j) for e, j in pool if e != d and docs[e][j] != gold]
        near = [p for p in others if 0.5 * len(gold) <= len(docs[p[0]][p[1]]) <= 2.0 * len(gold)]
        cands = near if len(near) >= 4 * (args.choices - 1) else others
        picked = []
        order = list(range(len(cands)))
        rng.shuffle(order)
        for k in order:
            s = docs[cands[k][0]][cands[k][1]]
            if s not in picked and s != gold:
                picked.append(s)
            if len(picked) == args.choices - 1:
                break
        if len(picked) < args.choices - 1:
            continue
        g = rng.below(args.choices)
        choices = picked[:g] + [gold] + picked[g:]
        items.append({"context": context, "choices": choices, "gold": g})
    return items


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("MOE_STUDIO_DATA", "../shared/data"),
                    help="the shared data directory (holds corpora/)")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--corpora", default=",".join(CORPORA),
                    help="comma-separated corpus folders under corpora/ (task name: the last part)")
    ap.add_argument("--items", type=int, default=100, help="items per task (fewer when the file has fewer)")
    ap.add_argument("--choices", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--context-chars", type=int, default=500, help="most characters of context")
    ap.add_argument("--min-chars", type=int, default=20, help="shortest paragraph used as a choice")
    ap.add_argument("--max-chars", type=int, default=300, help="longest paragraph used as a choice")
    args = ap.parse_args()
    if args.choices < 2 or args.items < 1:
        sys.exit("--choices must be >= 2 and --items >= 1")
    os.makedirs(args.out, exist_ok=True)
    manifest = {"generator": "tests/reference/make_tasks.py", "target_delimiter": "",
                "options": {k: v for k, v in vars(args).items() if k not in ("data", "out")}, "tasks": {}}
    for corpus in args.corpora.split(","):
        src = os.path.join(args.data, "corpora", corpus, "valid.txt")
        if not os.path.isfile(src):
            sys.exit(f"{src}: not found (set --data or MOE_STUDIO_DATA)")
        name = corpus.rstrip("/").split("/")[-1]
        with open(src, encoding="utf-8") as f:
            text = f.read()
        items = make_task(name, text, corpus.startswith("domain/code"), args)
        if not items:
            sys.exit(f"{src}: no item could be made (documents too short for the options?)")
        dst = os.path.join(args.out, f"{name}.jsonl")
        tmp = dst + ".tmp"
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for it in items:
                f.write(json.dumps(it, ensure_ascii=False) + "\n")
        os.replace(tmp, dst)
        manifest["tasks"][name] = {"source": f"corpora/{corpus}/valid.txt", "source_sha256": sha256(src),
                                   "file": f"{name}.jsonl", "items": len(items), "sha256": sha256(dst)}
        print(f"{name}: {len(items)} items -> {dst}")
    with open(os.path.join(args.out, "tasks.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
