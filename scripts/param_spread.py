#!/usr/bin/env python3
"""Where each operation parameter is named in the crates' code (issue 37, "a parameter lives in at
most 3 files"): for each NAME, the non-test source files of shared/src, backend/src and
frontend/src whose code (comments, doc comments and `#[cfg(test)]` modules removed) contains NAME
as a whole word. `grep -rl` counts tests and docs too; this counts what a change to the parameter
must touch.

Usage: python3 scripts/param_spread.py [--max N] NAME...   (exit 1 when a NAME is in more than N files)
       python3 scripts/param_spread.py                      (the parameters issue 37 names)
"""
import os
import re
import sys

DIRS = ("shared/src", "backend/src", "frontend/src")
DEFAULT = ("drop_ratio", "shared_gate", "router_std", "max_tokens")


def code_of(text):
    """`text` without `#[cfg(test)]` items (the braced block after the attribute), `//` comments
    and string-free of nothing else (strings stay: a flag name in a string is a use)."""
    out, i = [], 0
    while True:
        j = text.find("#[cfg(test)]", i)
        if j < 0:
            out.append(text[i:])
            break
        out.append(text[i:j])
        k = text.find("{", j)
        semi = text.find(";", j)
        if k < 0 or (0 <= semi < k):  # `#[cfg(test)] mod tests;` or a one-line item
            i = semi + 1 if semi >= 0 else len(text)
            continue
        depth = 0
        for p in range(k, len(text)):
            if text[p] == "{":
                depth += 1
            elif text[p] == "}":
                depth -= 1
                if depth == 0:
                    break
        i = p + 1
    return "\n".join(l.split("//", 1)[0] for l in "".join(out).splitlines())


def main(argv):
    limit = None
    if argv[:1] == ["--max"]:
        limit, argv = int(argv[1]), argv[2:]
    names = argv or list(DEFAULT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = {}
    for d in DIRS:
        for dirpath, _, fs in os.walk(os.path.join(root, d)):
            if os.sep + "tests" in dirpath[len(root):] or dirpath.endswith("/tests"):
                continue
            for f in fs:
                if f.endswith(".rs") and f != "tests.rs":
                    p = os.path.join(dirpath, f)
                    files[os.path.relpath(p, root)] = code_of(open(p, encoding="utf-8").read())
    bad = 0
    for n in names:
        pat = re.compile(r"\b" + re.escape(n) + r"\b")
        hits = sorted(p for p, c in files.items() if pat.search(c))
        over = limit is not None and len(hits) > limit
        bad += over
        print(f"{n}: {len(hits)} file(s){' (over ' + str(limit) + ')' if over else ''}: {', '.join(hits)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
