#!/usr/bin/env python3
"""The texts of the fetched teaching preset (scripts/demo_preset.sh without
stories260K; issue 19 item 3), from what a fresh machine can fetch or has.

    demo_texts.py HELP_DIR STDLIB_DIR FORTUNES_DIR OUT_DIR
    demo_texts.py --math-only OUT_DIR      (math.txt and math.heldout.txt only)

HELP_DIR      /usr/share/help of Debian's `gnome-user-docs` package (GNOME
              Help, Mallard XML pages in 40+ languages; `apt-get download
              gnome-user-docs` + `dpkg-deb -x`): hu/ and the base's languages.
STDLIB_DIR    the local Python standard library (sysconfig's "stdlib").
FORTUNES_DIR  /usr/share/games/fortunes of Debian's `fortunes` package
              (quotations, literature, jokes in English; `%`-separated).

Writes into OUT_DIR NAME.txt (training) and NAME.heldout.txt (held out),
documents separated by a blank line (the shared corpora's convention, and
what the CLI's `.txt` reader splits on), for
  en    English quotations and short prose from the fortune files of
        FORTUNE_FILES (one entry a document): general English unlike the
        base's help pages. (English GNOME Help, used before, was no new
        domain for a base that learnt the same pages in four other
        languages: DUME could not beat averaging on it, see
        docs/teaching-preset.md.)
  hu    the Hungarian GNOME Help: one document per page (its titles,
        descriptions and paragraphs, one per line);
  code  Python standard-library modules: one file per document group
        (a `# ===== file: NAME =====` line, then the source; the file's own
        blank lines separate its blocks, as in the corpora);
  math  arithmetic questions and answers in a fixed chat form ("User: What
        is 27 plus 58? Assistant: 27 plus 58 is 85."), one exchange per
        document -- the "instruct" ability of the graft, generated here
        (seeded, no input);
and general.txt, the base model's pretraining text: the same GNOME Help
pages in German, Spanish, French and Italian -- none of the experts'
domains, so that each expert's text is new to the base (as news, code and
Hungarian are to stories260K, trained on TinyStories only) and the experts
really differ.
Pages (and code files) are held out by a hash of their name, 1 in 10, so
that held-out documents are never trained on and en/hu hold out the same
pages. Paragraphs shorter than 40 characters (menu labels, headers) are
skipped. The documents of each file are then shuffled (seeded), so that the
first ones scripts/demo_preset.sh takes sample many pages and modules.
Python stdlib only; the output depends only on the inputs.
"""

import hashlib
import random
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

MALLARD = "{http://projectmallard.org/1.0/}"
# Mallard elements whose text is not prose: page metadata, code, images.
SKIP = {"info", "code", "screen", "media", "synopsis", "comment"}
MIN_CHARS = 40
# The base model's languages (GNOME Help locales): Latin script, none of the
# experts' domains.
GENERAL_LANGS = ("de", "es", "fr", "it")
SEED = 19
# The fortune files of the English text: quotations and prose on everyday
# subjects (the files of computing jokes, Unix lore, politics and group
# stereotypes are left out: a class sees these texts).
FORTUNE_FILES = ("art", "education", "food", "humorists", "kids", "literature", "love", "medicine", "people",
                 "pets", "platitudes", "science", "sports", "wisdom", "work")


def held_out(name: str) -> bool:
    """1 in 10 names, by the first byte of their sha256."""
    return hashlib.sha256(name.encode()).digest()[0] % 10 == 0


def mallard_paragraphs(path: Path) -> list[str]:
    """Titles, descriptions and paragraphs of one Mallard page, whitespace
    collapsed, in document order."""
    out: list[str] = []

    def walk(e: ET.Element) -> None:
        tag = e.tag.replace(MALLARD, "")
        if tag in SKIP:
            return
        if tag in ("p", "title", "desc"):
            t = re.sub(r"\s+", " ", "".join(e.itertext())).strip()
            if t:
                out.append(t)
            return
        for c in e:
            walk(c)

    walk(ET.parse(path).getroot())
    return out


def help_text(help_dir: Path, lang: str) -> tuple[list[str], list[str]]:
    """(training, held-out) pages of the GNOME Help in `lang`, each page one
    document (its paragraphs of at least MIN_CHARS, one per line)."""
    pages = sorted((help_dir / lang).glob("*/*.page"))
    if not pages:
        sys.exit(f"demo_texts.py: no Mallard pages under {help_dir / lang} (expected gnome-user-docs' */*.page)")
    train: list[str] = []
    held: list[str] = []
    for p in pages:
        ps = [t for t in mallard_paragraphs(p) if len(t) >= MIN_CHARS]
        if ps:
            (held if held_out(f"{p.parent.name}/{p.name}") else train).append("\n".join(ps))
    return train, held


def fortune_text(fortunes: Path) -> tuple[list[str], list[str]]:
    """(training, held-out) English from the fortune files FORTUNE_FILES in
    `fortunes`: each `%`-separated entry of at least MIN_CHARS one document
    (its lines kept, blank lines inside it dropped, tabs made spaces), held
    out by a hash of its text."""
    train: list[str] = []
    held: list[str] = []
    missing = [n for n in FORTUNE_FILES if not (fortunes / n).is_file()]
    if missing:
        sys.exit(f"demo_texts.py: no fortune file(s) {', '.join(missing)} in {fortunes} (expected the `fortunes` package's"
                 " /usr/share/games/fortunes)")
    for name in FORTUNE_FILES:
        raw = (fortunes / name).read_text(encoding="utf-8", errors="replace")
        for entry in re.split(r"^%[ \t]*$", raw, flags=re.M):
            lines = [l.replace("\t", " ").rstrip() for l in entry.splitlines()]
            doc = "\n".join(l for l in lines if l.strip())
            if len(doc) >= MIN_CHARS:
                (held if held_out(doc) else train).append(doc)
    return train, held


def code_text(stdlib: Path, max_files: int = 120) -> tuple[list[str], list[str]]:
    """(training, held-out) Python standard-library modules: the top-level
    `*.py` files in name order (at most `max_files`), each a
    `# ===== file: NAME =====` line and its source (trailing blanks
    removed, runs of blank lines made one: the file's blocks are its
    documents)."""
    files = sorted(f for f in stdlib.glob("*.py") if not f.name.startswith("_"))[:max_files]
    if not files:
        sys.exit(f"demo_texts.py: no *.py files in {stdlib} (expected the Python standard library)")
    train: list[str] = []
    held: list[str] = []
    for f in files:
        src = f.read_text(encoding="utf-8", errors="replace")
        lines = [l.rstrip() for l in src.splitlines()]
        body = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")
        if body:
            (held if held_out(f.name) else train).append(f"# ===== file: {f.name} =====\n{body}")
    return train, held


def math_text(n_train: int = 3000, n_held: int = 300, seed: int = 19) -> tuple[list[str], list[str]]:
    """(training, held-out) arithmetic questions and answers, one exchange a
    line; the held-out ones are other questions (no exchange in both)."""
    rng = random.Random(seed)
    ops = [
        ("plus", lambda a, b: a + b),
        ("minus", lambda a, b: a - b),
        ("times", lambda a, b: a * b),
    ]
    seen: set[str] = set()
    lines: list[str] = []
    while len(lines) < n_train + n_held:
        word, f = rng.choice(ops)
        a, b = rng.randint(2, 99), rng.randint(2, 99 if word != "times" else 12)
        if word == "minus" and b > a:
            a, b = b, a
        q = f"User: What is {a} {word} {b}? Assistant: {a} {word} {b} is {f(a, b)}."
        if q not in seen:
            seen.add(q)
            lines.append(q)
    return lines[:n_train], lines[n_train:]


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--math-only":
        # The ability text alone (scripts/demo_preset.sh with the shared
        # corpora: their LaTeX maths is no instruct-style ability).
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        train, held = math_text()
        (out / "math.txt").write_text("\n\n".join(train) + "\n", encoding="utf-8")
        (out / "math.heldout.txt").write_text("\n\n".join(held) + "\n", encoding="utf-8")
        return
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    help_dir, stdlib, fortunes, out = (Path(a) for a in sys.argv[1:])
    out.mkdir(parents=True, exist_ok=True)
    texts = {
        "en": fortune_text(fortunes),
        "hu": help_text(help_dir, "hu"),
        "code": code_text(stdlib),
        "math": math_text(),
    }
    general: list[str] = []
    for lang in GENERAL_LANGS:
        train, held = help_text(help_dir, lang)
        general.extend(train + held)
    rng = random.Random(SEED)
    rng.shuffle(general)
    (out / "general.txt").write_text("\n\n".join(general) + "\n", encoding="utf-8")
    print(f"[texts] general ({', '.join(GENERAL_LANGS)}): {len(general)} documents ({sum(map(len, general))} chars)", file=sys.stderr)
    for name, (train, held) in texts.items():
        rng.shuffle(train)
        rng.shuffle(held)
        (out / f"{name}.txt").write_text("\n\n".join(train) + "\n", encoding="utf-8")
        (out / f"{name}.heldout.txt").write_text("\n\n".join(held) + "\n", encoding="utf-8")
        print(
            f"[texts] {name}: {len(train)} documents ({sum(map(len, train))} chars) + {len(held)} held out",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
