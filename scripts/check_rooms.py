#!/usr/bin/env python3
"""Checks that the top-level modules ("rooms") of each crate import each
other without a circle (issue 37): every `crate::ROOM` path in code (comments
and doc links are ignored) is an edge from the room of the file it is in to
ROOM; a strongly connected component of more than one room is a circle and is
printed with the lines that make it. Exit status 1 when a circle exists.

Usage: python3 scripts/check_rooms.py [CRATE_SRC_DIR ...]
       python3 scripts/check_rooms.py --self-test   (finds a planted circle)
       (default: shared/src, the crate whose rooms CI keeps free of circles;
       backend/src and frontend/src can be checked by naming them)
"""
import collections
import os
import re
import sys

PATH = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def room_of(rel):
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def edges_of(src):
    """{from_room: {to_room: [file:line, ...]}} for one crate's src dir."""
    edges = collections.defaultdict(lambda: collections.defaultdict(list))
    for dirpath, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src)
            room = room_of(rel)
            if room in ("lib", "main"):
                continue
            with open(path, encoding="utf-8") as f:
                for no, line in enumerate(f, 1):
                    code = line.split("//", 1)[0]
                    for m in PATH.finditer(code):
                        if m.group(1) != room:
                            edges[room][m.group(1)].append(f"{rel}:{no}")
    return edges


def circles(edges):
    """Strongly connected components with more than one room (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    rooms = set(edges) | {t for e in edges.values() for t in e}

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(rooms):
        if v not in index:
            visit(v)
    return out


def self_test():
    """Plants a three-room circle (a -> b -> c -> a, with a doc link and a
    comment that must not count) and a clean crate; the check must flag the
    first only."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        files = {
            "bad/a/mod.rs": "use crate::b::X;\n",
            "bad/b.rs": "pub fn f() { crate::c::g() }\n",
            "bad/c/x.rs": "use crate::a;\n",
            "good/a.rs": "use crate::b::X; // crate::c\n/// [`crate::c::Y`]\n",
            "good/b.rs": "use crate::c::Y;\n",
            "good/c.rs": "pub struct Y;\n",
        }
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)
        bad = circles(edges_of(os.path.join(d, "bad")))
        good = circles(edges_of(os.path.join(d, "good")))
    if bad != [["a", "b", "c"]] or good:
        print(f"self-test failed: planted circle found as {bad}, clean crate gave {good}")
        return 1
    print("self-test: the planted circle a -> b -> c -> a is found; comments and doc links do not count")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = argv or ["shared/src"]
    bad = 0
    for d in dirs:
        src = d if os.path.isabs(d) else os.path.join(root, d)
        edges = edges_of(src)
        found = circles(edges)
        n_edges = sum(len(t) for t in edges.values())
        if not found:
            print(f"{d}: {len(edges)} rooms, {n_edges} room-to-room imports, no circle")
        for comp in found:
            bad += 1
            print(f"{d}: circle between {', '.join(comp)}:")
            for a in comp:
                for b in comp:
                    if b in edges.get(a, {}):
                        refs = edges[a][b]
                        print(f"  {a} -> {b}: {', '.join(refs[:4])}{' ...' if len(refs) > 4 else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
