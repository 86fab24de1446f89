#!/usr/bin/env python3
"""Checks that no Rust source file of the three crates is over LIMIT (900) lines unless its module
note says why it is one concern (a line starting `//! One concern:` in its first 80 lines); issue 37
("one concern per file"). Prints each offender with its length; exit status 1 when there is one.

Usage: python3 scripts/check_long_files.py [DIR ...]   (default: shared/src backend/src frontend/src)
"""
import os
import sys

LIMIT = 900
NOTE = "//! One concern:"


def offenders(dirs):
    """[(path, lines)] of the files over LIMIT lines without the note, and the number of files seen."""
    out, seen = [], 0
    for d in dirs:
        for dirpath, _, files in os.walk(d):
            for name in sorted(files):
                if not name.endswith(".rs"):
                    continue
                seen += 1
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    lines = f.readlines()
                if len(lines) > LIMIT and not any(l.startswith(NOTE) for l in lines[:80]):
                    out.append((path, len(lines)))
    return out, seen


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [d if os.path.isabs(d) else os.path.join(root, d) for d in (argv or ["shared/src", "backend/src", "frontend/src"])]
    bad, seen = offenders(dirs)
    for path, n in bad:
        print(f"{os.path.relpath(path, root)}: {n} lines (> {LIMIT}): split it by concern, or say why it is one"
              f" in a `{NOTE}` line of its module note")
    if not bad:
        print(f"{seen} source files, none over {LIMIT} lines without a one-concern note")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
