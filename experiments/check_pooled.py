#!/usr/bin/env python3
"""Checks that a report pooled an earlier sitting's seeds faithfully (issue 35; CI's experiment
smoke step): FIRST is the results.json a run of seed(s) P published, SECOND the results.json of a
later run of other seeds with PUBLISHED_SEEDS=P over the same OUT. SECOND must list P then the new
seeds (neuronmoe, pooled per allocation: or at least one allocation with a new seed; upcycling,
pooled per row: or at least one row with a new seed; deltamoe: or
at least one row with a new seed, the analyses of a published seed; dume: or at least one
method with a new seed, the FFN-only part of a published seed), mark P as published, and carry every number P had in FIRST unchanged (deltamoe: every row's
per-seed perplexities, the expert-0 shares and the analyses' seeds; dume: every method's per-seed
records; neuronmoe: every allocation's per-stage perplexities, but for a seed trained again on purpose
(`reproduced`, RERUN_SEEDS: within report_common.RERUN_RTOL relative); every report: the task accuracy records and
paired differences of the published seeds; upcycling: every row's per-seed records, expert-0 shares and before-training perplexities). Exit status 1
with the first difference named.

Usage: check_pooled.py deltamoe|dume|neuronmoe|upcycling FIRST SECOND
"""
import json
import sys

from report_common import RERUN_RTOL

kind, first_path, second_path = sys.argv[1:]
first, second = json.load(open(first_path)), json.load(open(second_path))
published = first["seeds"]


def fail(msg):
    sys.exit(f"check_pooled {kind}: {msg} ({first_path} -> {second_path})")


# NeuronMoE pools allocation by allocation: a later sitting may run published seeds of allocations
# the earlier one did not run, so its new results can be new (allocation, seed) pairs only.
# The upcycling report pools row by row the same way (a later sitting may add a variant to a
# published seed).
per_row = kind in ("neuronmoe", "upcycling")
# DeltaMoE and DUME: a later sitting may run only the analyses (PARTS_SEEDS) of a published seed.
if kind == "deltamoe":
    parts_gained = any(set(second["seeds_per_method"].get(m, [])) - set(first["seeds_per_method"].get(m, []))
                       for m in second.get("seeds_per_method", {}))
else:
    def seeds_of(r, m):
        return {x.get("seed") for x in r.get("methods", {}).get(m, []) if isinstance(x, dict)}
    # only the analyses' rows (the FFN-only part) may gain a published seed
    parts_gained = kind == "dume" and any(seeds_of(second, m) - seeds_of(first, m) for m in second.get("methods", {})
                                          if m.startswith("ffn-"))
    if kind == "dume" and not set(first.get("parts_seeds", [])) <= set(second.get("parts_seeds", [])):
        fail(f"parts_seeds {second.get('parts_seeds')} lost published {first.get('parts_seeds')}")
if second.get("published_seeds") != published or second["seeds"][:len(published)] != published \
        or (len(second["seeds"]) <= len(published) and not per_row and not parts_gained):
    fail(f"seeds {second['seeds']} / published {second.get('published_seeds')}, expected {published} then new ones")
# NeuronMoE may also train a published seed again on purpose (RERUN_SEEDS, `reproduced`: its
# analysis or task scores): that (allocation, seed) may move by what reproduced() allowed.
rerun = second.get("reproduced", {}) if kind == "neuronmoe" else {}
if kind == "neuronmoe" and not rerun and not any(len(v["seeds"]) > len(first["allocations"].get(a, {"seeds": []})["seeds"])
                                                 for a, v in second["allocations"].items()):
    fail("no allocation gained a seed")
if kind == "upcycling" and not any(len(v) > len(first["rows"].get(r, [])) for r, v in second["rows"].items()):
    fail("no row gained a seed")

checked = 0
if kind == "deltamoe":
    for m, runs in first["methods"].items():
        old = dict(zip(first["seeds_per_method"][m], runs))
        new = dict(zip(second["seeds_per_method"].get(m, []), second["methods"].get(m, [])))
        for s in old:
            if new.get(s) != old[s]:
                fail(f"row `{m}` seed {s}: {new.get(s)} != published {old[s]}")
            checked += 1
    for m, shares in first.get("expert0_share", {}).items():
        for s, v in shares.items():
            got = second.get("expert0_share", {}).get(m, {}).get(s)
            if got != v:
                fail(f"expert-0 share of `{m}` seed {s}: {got} != published {v}")
            checked += 1
    lost = [s for s in first.get("parts_seeds", []) if s not in second.get("parts_seeds", [])]
    if lost:
        fail(f"parts_seeds {second.get('parts_seeds')} lost the published {lost}")
elif kind == "dume":
    for m, recs in first["methods"].items():
        new = {r.get("seed"): r for r in second["methods"].get(m, []) if isinstance(r, dict)}
        for r in recs:
            if isinstance(r, dict) and r.get("seed") in published:
                if new.get(r["seed"]) != r:
                    fail(f"method `{m}` seed {r['seed']}: {new.get(r['seed'])} != published {r}")
                checked += 1
elif kind == "neuronmoe":
    for a, old in first["allocations"].items():
        new = second["allocations"].get(a)
        if new is None:
            fail(f"allocation `{a}` dropped")
        for stage in ("s1", "s2"):
            for i, s in enumerate(old["seeds"]):
                if s in published:
                    if s not in new["seeds"]:
                        fail(f"allocation `{a}` lost published seed {s} (seeds {new['seeds']})")
                    j = new["seeds"].index(s)
                    if f"{a} s{s}" in rerun:
                        moved = max(abs(new[stage][j][l] / v - 1) for l, v in old[stage][i].items())
                        if moved > RERUN_RTOL:
                            fail(f"allocation `{a}` {stage} seed {s} trained again: moved {moved:.1e} > {RERUN_RTOL:g}")
                    elif new[stage][j] != old[stage][i]:
                        fail(f"allocation `{a}` {stage} seed {s}: {new[stage][j]} != published {old[stage][i]}")
                    checked += 1
    for name, entry in first.get("post_training", {}).items():
        key = name.removesuffix(" before training")  # (a Drop-Upcycled row's model before training)
        if key.rsplit(" s", 1)[-1] in published and key not in rerun:
            if second.get("post_training", {}).get(name) != entry:
                fail(f"post-training analysis `{name}` changed or dropped")
            checked += 1
elif kind == "upcycling":
    for r, recs in first["rows"].items():
        new = {x["seed"]: x for x in second["rows"].get(r, [])}
        for x in recs:
            if x["seed"] in published:
                if new.get(x["seed"]) != x:
                    fail(f"row `{r}` seed {x['seed']}: {new.get(x['seed'])} != published {x}")
                checked += 1
    for key, what in (("expert0_share", "expert-0 share"), ("before_training", "before-training perplexity")):
        for r, per_seed in first.get(key, {}).items():
            for s, v in per_seed.items():
                got = second.get(key, {}).get(r, {}).get(s)
                if got != v:
                    fail(f"{what} of `{r}` seed {s}: {got} != published {v}")
                checked += 1
else:
    fail("unknown report kind (expected deltamoe, dume, neuronmoe or upcycling)")
# Every report: the published seeds' task accuracy records and paired differences.
for m, recs in first.get("task_accuracy", {}).items():
    old = [r for r in recs if r.get("seed") in published]
    # (a per-row pooling may add a published seed to a row that lacked it: compare the old seeds)
    keep = {o.get("seed") for o in old} if per_row else set(published)
    new = [r for r in second.get("task_accuracy", {}).get(m, []) if r.get("seed") in keep]
    if new != old:
        fail(f"task accuracy of `{m}`: {new} != published {old}")
    checked += len(old)
pairs = [p for p in first.get("task_accuracy_paired", []) if p.get("seed") in published]
got = [p for p in second.get("task_accuracy_paired", []) if p.get("seed") in published]
if per_row:
    # (a row added to a published seed may bring its own pair: every published pair kept, unchanged)
    key = lambda p: (p.get("a"), p.get("b"), p.get("seed"))
    got = [p for p in got if key(p) in {key(q) for q in pairs}]
if got != pairs:
    fail(f"paired task accuracy: {got} != published {pairs}")
checked += len(pairs)
if checked == 0:
    fail("no published number to compare")
print(f"check_pooled {kind}: seeds {second['seeds']} (published {published}); {checked} published entries unchanged")
