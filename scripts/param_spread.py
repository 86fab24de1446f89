#!/usr/bin/env python3
"""Where each operation parameter is named in the crates' code (issue 37, "a parameter lives in at
most 3 files"): for each NAME, the non-test source files of shared/src, backend/src and
frontend/src whose code (comments, doc comments and `#[cfg(test)]` modules removed) contains NAME
as a whole word. `grep -rl` counts tests and docs too; this counts what a change to the parameter
must touch.

Usage: python3 scripts/param_spread.py [--max N] NAME...   (exit 1 when a NAME is in more than N files)
       python3 scripts/param_spread.py                      (the parameters issue 37 names)
       python3 scripts/param_spread.py --self-test          (the stripping on a planted file)
"""
import os
import re
import sys

DIRS = ("shared/src", "backend/src", "frontend/src")
DEFAULT = ("drop_ratio", "shared_gate", "router_std", "max_tokens")


def spans(text):
    """Two copies of `text`, each as long as it: `code` with every comment blanked (strings kept:
    a flag name in a string is a use), `bare` with string and character literals blanked too (so
    braces are counted only where they are code). Knows `//`, nested `/* */`, strings with
    escapes, raw strings (`r#"..."#`, `br"..."`), char literals and lifetimes."""
    code, bare = list(text), list(text)
    i, n = 0, len(text)

    def blank(a, b, both):
        for k in range(a, b):
            if text[k] != "\n":
                bare[k] = " "
                if both:
                    code[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j, True)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j, True)
            i = j
        elif c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) \
                and (m := RAW.match(text, i)):
            close = '"' + m.group(1)
            j = text.find(close, m.end())
            j = n if j < 0 else j + len(close)
            blank(m.end(), j - len(close), False)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j, False)
            i = j + 1
        elif c == "'":
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 2)
                j = n if j < 0 else j
            elif i + 2 < n and text[i + 2] == "'":
                j = i + 2
            else:  # a lifetime
                i += 1
                continue
            blank(i + 1, j, False)
            i = j + 1
        else:
            i += 1
    return "".join(code), "".join(bare)


RAW = re.compile(r'b?r(#*)"')
TEST_ATTR = re.compile(r"#\[cfg\((?:test|all\(test\b[^\]]*\)|any\(test\b[^\]]*\))\)\]")


def code_of(text):
    """`text`'s code outside tests: comments removed, and each item under `#[cfg(test)]` (or
    `cfg(all(test, ...))` / `cfg(any(test, ...))`) removed up to its closing brace, or its `;`
    for `mod tests;` and one-line items."""
    code, bare = spans(text)
    keep = list(code)
    for m in TEST_ATTR.finditer(bare):
        k, semi = bare.find("{", m.end()), bare.find(";", m.end())
        if k < 0 or 0 <= semi < k:
            stop = semi + 1 if semi >= 0 else len(text)
        else:
            depth, stop = 0, len(text)
            for p in range(k, len(bare)):
                if bare[p] == "{":
                    depth += 1
                elif bare[p] == "}":
                    depth -= 1
                    if depth == 0:
                        stop = p + 1
                        break
        for q in range(m.start(), stop):
            keep[q] = " "
    return "".join(keep)


SELF_TEST = r"""fn real() { let u = "http://x"; kept_a(); }
/* gone_a in a block /* nested */ still comment */
const C: char = '{';
fn lt<'a>(x: &'a str) -> &'a str { kept_b() }
#[cfg(test)]
mod tests {
    fn t() { let s = "}"; let c = '}'; gone_b(); }
}
fn after() { kept_c(); let r = r#"a "quoted" } kept_d"#; } // gone_c
#[cfg(all(test, feature = "x"))]
mod more { fn z() { gone_d(); } }
#[cfg(test)]
mod tests2;
fn last() { kept_e(); }
"""


def self_test():
    """The stripping keeps code and strings, drops comments and test items (braces in strings,
    chars and raw strings, lifetimes, nested block comments, `cfg(all(test, ...))`)."""
    code = code_of(SELF_TEST)
    kept = [n for n in ("kept_a", "kept_b", "kept_c", "kept_d", "kept_e") if n in code]
    gone = [n for n in ("gone_a", "gone_b", "gone_c", "gone_d", "tests2") if n not in code]
    if len(kept) == 5 and len(gone) == 5 and "http://x" in code:
        print("self-test: code and strings kept, comments and test items removed")
        return 0
    print(f"self-test failed: kept {kept} (expected 5), removed {gone} (expected 5):\n{code}")
    return 1


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
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
