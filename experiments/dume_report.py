#!/usr/bin/env python3
"""Tables of experiments/dume.sh (issue 35 item 4): per-domain perplexity and retention (perplexity
ratio and loss ratio) of every method (mean ± std over seeds), the same with FFN-only domain
experts, ridge routing accuracy (mean over layers and in every layer), lambda sweeps, and the
incremental-DUME check.

Standard library only (CI runs the smoke mode without the Python reference environment).
Usage: dume_report.py [--check-published] WORK OUT SMOKE MODEL "SEEDS" "PARTS_SEEDS" "BUDGET" ["PARTS"]
Writes OUT/results.json and OUT/README.md. With --check-published (dume.sh, before any training)
it only checks PUBLISHED_SEEDS against OUT/results.json (no published seed dropped or run twice,
the same budget; the FFN-only part of a published seed not published already, or published with
the very result this run directory holds) and exits.
"""
import glob
import json
import os
import statistics
import struct
import sys

from report_common import (TASK_SCORING, acc_cells, task_items, curve, figure, fmt, load, mean_or_none, merge_published, nll, open_report,
                           paired_tasks, paired_tasks_markdown, pooled_tasks, ppl, published_note, published_results,
                           seeds_with, stream_hashes, write_commands)

check_only = sys.argv[1:2] == ["--check-published"]
args = sys.argv[2:] if check_only else sys.argv[1:]
work, out, smoke, model, seeds, parts_seeds, budget = args[:7]
parts = (args[7] if len(args) > 7 else "ffn ood incremental").split()
seeds, parts_seeds = seeds.split(), parts_seeds.split()
# Seeds published by an earlier sitting on another machine (report_common.published_results): their
# per-seed records (perplexity, retention, routing reports, incremental step) are kept from
# OUT/results.json beside this run's seeds.
published, prior = published_results(out, budget, seeds)


def published_records(key):
    """The published seeds' records of results["methods"][key] (or of a top-level list `key`)."""
    if prior is None:
        return []
    recs = prior["methods"].get(key, prior.get(key) if isinstance(prior.get(key), list) else [])
    return [x for x in recs if isinstance(x, dict) and x.get("seed") in published]
# The files one seed's tables read. A run spanning several sittings may have finished only some of
# them for a seed: each table uses the seeds that have its results (a `seeds` column says which),
# and the README names what each unfinished seed still lacks.
SEED_FILES = ([f"{m}.eval.json" for m in ("expert-code", "expert-math", "expert-docs", "average", "random", "oracle",
                                           "dume-top1", "dume-top2", "dume-plus", "btx")]
              + [f"{m}.route.json" for m in ("dume-top1", "dume-top2")])


def have(seed, name):
    """Whether seed `seed`'s run has written `name` (relative to WORK/s<seed>)."""
    return os.path.exists(os.path.join(work, f"s{seed}", name))


unfinished = {s: [f for f in SEED_FILES if not have(s, f)] for s in seeds}
unfinished = {s: v for s, v in unfinished.items() if v}
# Retention needs the seed's three dense experts.
seeds = [s for s in seeds if all(have(s, f"expert-{d}.eval.json") for d in ("code", "math", "docs"))]
if not seeds and not published and not check_only:
    sys.exit("dume_report.py: no seed has its three dense experts evaluated yet: rerun experiments/dume.sh")
DOMAINS = ["code", "math", "docs"]
METHODS = [
    ("base", "the dense model itself"),
    ("expert-code", "dense expert, code"),
    ("expert-math", "dense expert, math"),
    ("expert-docs", "dense expert, docs"),
    ("average", "weight averaging (merge linear)"),
    ("random", "MoErged, random routers"),
    ("dume-top1", "DUME ridge router, top-1"),
    ("dume-top2", "DUME ridge router, top-2"),
    ("dume-ood", "DUME, out-of-distribution statistics, top-1"),
    ("dume-plus", "DUME+ (top-2 ridge router fine-tuned)"),
    ("btx", "BTX-style (random top-2 router trained, same α)"),
    ("oracle", "oracle routing"),
]
# The same with FFN-only domain experts (`train --stage ffn`), each method against its own experts.
FFN_METHODS = [("ffn-" + m, "FFN-only experts: " + label) for m, label in METHODS
               if m in ("expert-code", "expert-math", "expert-docs", "average", "random", "dume-top1", "dume-top2",
                        "oracle")]






def eval_path(seed, method):
    if method == "base":
        return os.path.join(work, "base.eval.json")
    return os.path.join(work, f"s{seed}", f"{method}.eval.json")


if check_only:
    # The FFN-only part of a published seed: not trained again when published (dume.sh would train
    # it again for nothing), unless this run directory holds that very run; a different result
    # here would be a second copy of it. Checked before any training.
    bad = []
    for s in [s for s in parts_seeds if s in published and "ffn" in parts]:
        for m in [m for m, _ in FFN_METHODS] + ["ffn-dume-top1.route", "ffn-dume-top2.route"]:
            rec = next((x for x in published_records(m) if x.get("seed") == s), None)
            if rec is None:
                continue
            route = m.endswith(".route")
            path = os.path.join(work, f"s{s}", f"{m}.json") if route else eval_path(s, m)
            if not os.path.exists(path):
                bad.append(f"`{m}` of seed {s} is published; not trained again (drop the seed from PARTS_SEEDS)")
            elif (load(path).get("mean_accuracy_per_domain") != rec.get("mean_accuracy_per_domain") if route
                  else {d: ppl(load(path), d) for d in DOMAINS} != rec.get("ppl")):
                bad.append(f"`{m}` of seed {s}: {path} has another result than the published one (a second copy)")
    if bad:
        sys.exit("PARTS=ffn of published seed(s): the published results already have it:\n  " + "\n  ".join(bad))
    sys.exit(0)




def safetensors_index(directory):
    """name -> (memory map, byte range, dtype) over every *.safetensors file of a model directory
    (the ridge statistics file excluded). Memory-mapped: a real model's tensors are compared without
    reading them into memory (decoding a 300M-parameter model into Python floats takes ~24 GB)."""
    import mmap
    index = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        if os.path.basename(path) == "ridge_stats.safetensors":
            continue
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        for name, meta in header.items():
            if name != "__metadata__":
                a, b = meta["data_offsets"]
                if not 0 <= a <= b or 8 + n + b > len(m):
                    sys.exit(f"{path}: tensor {name} has data_offsets [{a}, {b}], past the {len(m) - 8 - n} data"
                             " bytes of the file (truncated or corrupt)")
                index[name] = (m, 8 + n + a, 8 + n + b, meta["dtype"])
    return index


def decode(raw, dtype):
    """The floats of a little-endian F32 / F16 / BF16 tensor's bytes (None for other dtypes)."""
    if dtype == "F32":
        return struct.unpack(f"<{len(raw) // 4}f", raw)
    if dtype == "F16":
        return struct.unpack(f"<{len(raw) // 2}e", raw)
    if dtype == "BF16":
        return struct.unpack(f"<{len(raw) // 2}f", b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2)))
    return None


def compare_models(dir_a, dir_b):
    """(max abs difference, names of tensors whose bytes differ, names in only one model) of two
    model directories; only tensors whose bytes differ are decoded (here: the routers)."""
    a, b = safetensors_index(dir_a), safetensors_index(dir_b)
    names = sorted(set(a) | set(b))
    missing = [n for n in names if n not in a or n not in b]
    differing, diff = [], 0.0
    for n in (n for n in names if n in a and n in b):
        (ma, sa, ea, da), (mb, sb, eb, db) = a[n], b[n]
        ra, rb = ma[sa:ea], mb[sb:eb]
        if ra == rb and da == db:
            continue
        differing.append(n)
        xa, xb = decode(ra, da), decode(rb, db)
        if xa is not None and xb is not None and len(xa) == len(xb):
            diff = max(diff, max((abs(x - y) for x, y in zip(xa, xb)), default=0.0))
        else:
            diff = float("inf")
    return diff, differing, missing


# Perplexity and retention per method: the perplexity ratio (DUME's retention) and the loss ratio.
results = {"model": model, "seeds": seeds, "parts_seeds": parts_seeds, "unfinished_seeds": unfinished, "budget": budget,
           "methods": {}}


def table(methods, prefix, its_seeds):
    """Rows of the retention table of `methods`, each against the dense experts PREFIX expert-D."""
    rows = []
    for method, label in methods:
        per_seed = []
        for s in its_seeds:
            refs = [eval_path(s, f"{prefix}expert-{d}") for d in DOMAINS]
            if not os.path.exists(eval_path(s, method)) or not all(os.path.exists(r) for r in refs):
                continue
            ref = {d: load(eval_path(s, f"{prefix}expert-{d}")) for d in DOMAINS}
            ev = load(eval_path(s, method))
            p = {d: ppl(ev, d) for d in DOMAINS}
            r = {d: ppl(ref[d], d) / p[d] for d in DOMAINS}
            lr = {d: nll(ref[d], d) / nll(ev, d) for d in DOMAINS}
            per_seed.append({"seed": s, "ppl": p, "retention": r, "mean_retention": statistics.mean(r.values()),
                             "loss_retention": lr, "mean_loss_retention": statistics.mean(lr.values()),
                             "best_retention": max(r.values())})
        # A published record of the same (method, seed) wins when this run's is the same result (the
        # run directory kept from the sitting that published it); another result would be a second copy.
        old = published_records(method)
        for x in [x for x in per_seed if any(o["seed"] == x["seed"] for o in old)]:
            o = next(o for o in old if o["seed"] == x["seed"])
            if o.get("ppl") != x["ppl"]:
                sys.exit(f"dume_report.py: `{method}` of seed {x['seed']} is published with other perplexities"
                         f" ({o.get('ppl')}) than this run's ({x['ppl']}): not mixed; drop the seed from"
                         " PARTS_SEEDS or from PUBLISHED_SEEDS")
            per_seed.remove(x)
        per_seed = old + per_seed
        results["methods"][method] = per_seed
        rows.append(
            [f"`{method}`", label, ", ".join(x["seed"] for x in per_seed) or "-"]
            + [fmt([x["ppl"][d] for x in per_seed]) for d in DOMAINS]
            + [fmt([x["retention"][d] for x in per_seed], 1, True) for d in DOMAINS]
            + [fmt([x["mean_retention"] for x in per_seed], 1, True), fmt([x["best_retention"] for x in per_seed], 1, True),
               fmt([x["mean_loss_retention"] for x in per_seed], 1, True)]
        )
    return rows


rows = table(METHODS, "", seeds)
ffn_rows = [r for r in table(FFN_METHODS, "ffn-", parts_seeds) if r[2] != "-"]
# The paper's ordering on mean retention, over the seeds that have all five methods (and per seed).
# DUME+ starts from the top-2 ridge router, so "DUME+ ≥ DUME" compares it with that router; the
# top-1 ridge router is checked against averaging separately below.
order = ["oracle", "dume-plus", "dume-top2", "average", "random"]
order_seeds = [s for s in published
               if all(any(x["seed"] == s for x in results["methods"][m]) for m in order)]
order_seeds += [s for s in seeds if all(have(s, f"{m}.eval.json") for m in order)]


def mean_ret_of(method, on_seeds):
    return statistics.mean(x["mean_retention"] for x in results["methods"][method] if x["seed"] in on_seeds)


def ordering(on_seeds):
    mr = {m: mean_ret_of(m, on_seeds) for m in order}
    return mr, [(a, b, mr[a] >= mr[b] if i < 2 else mr[a] > mr[b]) for i, (a, b) in enumerate(zip(order, order[1:]))]


mean_ret, checks = ordering(order_seeds) if order_seeds else ({}, [])
per_seed_order = {s: all(ok for _, _, ok in ordering([s])[1]) for s in order_seeds}
results["ordering"] = {"seeds": order_seeds, "checks": [{"higher": a, "lower": b, "holds": ok} for a, b, ok in checks],
                       "holds_per_seed": per_seed_order}

# Routing accuracy of the ridge routers (held-out tokens): mean over MoE layers, and the fraction
# of tokens routed to their domain's expert in every MoE layer.
acc_rows = []
for method in ("dume-top1", "dume-top2", "dume-ood", "ffn-dume-top1", "ffn-dume-top2"):
    rseeds = [s for s in (parts_seeds if method in ("dume-ood", "ffn-dume-top1", "ffn-dume-top2") else seeds)
              if have(s, f"{method}.route.json")]
    # Each report keeps its seed, so that a later sitting can carry it (PUBLISHED_SEEDS).
    reps = [dict(load(os.path.join(work, f"s{s}", f"{method}.route.json")), seed=s) for s in rseeds]
    old = published_records(method + ".route")
    if prior is not None and len(prior["seeds"]) == 1 and not old:
        # Reports published before they carried their seed: one published seed, so they are its.
        old = [dict(r, seed=prior["seeds"][0]) for r in prior["methods"].get(method + ".route", [])
               if prior["seeds"][0] in published]
    # A published seed's report found again here (the run directory kept) is the published one.
    for r in [r for r in reps if any(o["seed"] == r["seed"] for o in old)]:
        o = next(o for o in old if o["seed"] == r["seed"])
        if o.get("mean_accuracy_per_domain") != r.get("mean_accuracy_per_domain"):
            sys.exit(f"dume_report.py: `{method}` routing of seed {r['seed']} is published with other accuracies"
                     " than this run's: not mixed; drop the seed from PARTS_SEEDS or from PUBLISHED_SEEDS")
        reps.remove(r)
    reps = old + reps
    rseeds = [r["seed"] for r in reps]
    if not reps:
        continue
    acc = [[r["mean_accuracy_per_domain"][i] for r in reps] for i in range(len(DOMAINS))]
    every = [[r.get("all_layers_accuracy_per_domain", [None] * len(DOMAINS))[i] for r in reps] for i in range(len(DOMAINS))]
    acc_rows.append([f"`{method}`", ", ".join(rseeds)] + [f"{fmt(a, 1, True)} / {fmt(e, 1, True)}" for a, e in zip(acc, every)]
                    + [fmt([r["random_routing_accuracy"] for r in reps], 1, True),
                       fmt([sum(r["tokens_per_domain"]) for r in reps], 0)])
    results["methods"].setdefault(method + ".route", reps)
# The lambda sweep of this run's first seed's top-1 router; with no seed run here (only analyses of
# published seeds), the first published seed's, from its record.
_reps = results["methods"].get("dume-top1.route", [])
# The seed the figures and the sweep were drawn from: this run's first, else as published (reports
# published before this was recorded: the last published seed, the one that sitting ran).
_shown = seeds[0] if seeds else (prior or {}).get("figure_seed") or (published[-1] if published else None)
_top1 = next((r for r in _reps if r.get("seed") == _shown), next(iter(_reps), {}))
results["figure_seed"] = _shown
sweep, sweep_seed = _top1.get("lambda_sweep") or [], _top1.get("seed", "-")
results["eval_streams"] = stream_hashes([load(p) for p in glob.glob(os.path.join(work, "s*", "*.eval.json"))]
                                        + [load(os.path.join(work, "base.eval.json"))])
INC_FILES = ("dume-add.eval.json", "dume-scratch4.eval.json", "dume-top1.eval.json", "expert-hu.eval.json",
             "dume-add.route.json", "dume-scratch4.route.json")
merge_published(results, prior, published, seeds)
# The analyses' seeds, pooled across sittings: every seed with a result of a part (the FFN-only
# experts, the OOD router, the incremental step), published or this run's.
_part_keys = [m for m, _ in FFN_METHODS] + ["dume-ood", "dume-ood.route", "ffn-dume-top1.route", "ffn-dume-top2.route"]
_part_seeds = {x.get("seed") for k in _part_keys for x in results["methods"].get(k, [])}
_part_seeds |= {x.get("seed") for x in published_records("incremental")}
_part_seeds |= {s for s in seeds if all(have(s, f) for f in INC_FILES)}
results["parts_seeds"] = sorted((s for s in _part_seeds if s), key=int)
ffn_seeds = [x["seed"] for x in results["methods"].get("ffn-oracle", [])]


def plural(word, items):
    return word if len(items) == 1 else word + "s"


def seeds_having(methods, candidates):
    """The seeds of `candidates` that every method of `methods` has a record for."""
    return [s for s in candidates if all(any(x["seed"] == s for x in results["methods"].get(m, [])) for m in methods)]


def gap_share(on_seeds, average, oracle, routers):
    """Mean retention over `on_seeds`: the share of averaging's gap to the oracle each router
    recovers, (R_router - R_average) / (R_oracle - R_average); {} when the oracle is not above."""
    r = {m: mean_ret_of(m, on_seeds) for m in (average, oracle, *routers)}
    if r[oracle] <= r[average]:
        return {}
    return {m: (r[m] - r[average]) / (r[oracle] - r[average]) for m in routers}


# FFN-only: the share each ridge router recovers, over the seeds that have all of them (the oracle
# is the experts exactly here, so the gap is routing); and the same for the headline (fully
# fine-tuned experts) per seed, so the FFN-only seed is compared with its own seed's headline.
_ffn_all = ["ffn-average", "ffn-random", "ffn-oracle", "ffn-dume-top1", "ffn-dume-top2"]
_ffn_common = seeds_having(_ffn_all, ffn_seeds)
mean_ret_ffn = {m: mean_ret_of(m, _ffn_common) for m in _ffn_all} if _ffn_common else {}
ffn_gap = gap_share(_ffn_common, "ffn-average", "ffn-oracle", ("ffn-dume-top1", "ffn-dume-top2")) if _ffn_common else {}
results["ffn_gap_recovered"] = {"seeds": _ffn_common, **ffn_gap}
head_gap = {s: g for s in seeds_having(["average", "oracle", "dume-top1", "dume-top2"], results["seeds"])
            if (g := gap_share([s], "average", "oracle", ("dume-top1", "dume-top2")))}
results["headline_gap_recovered"] = head_gap

# Incremental DUME: added onto the saved statistics vs solved from scratch on all four domains.
inc = published_records("incremental")
for s in [s for s in seeds if all(have(s, f) for f in INC_FILES)]:
    diff, differing, missing = compare_models(os.path.join(work, f"s{s}", "dume-add"),
                                              os.path.join(work, f"s{s}", "dume-scratch4"))
    ev_add = load(os.path.join(work, f"s{s}", "dume-add.eval.json"))
    ev_scr = load(os.path.join(work, f"s{s}", "dume-scratch4.eval.json"))
    ev_3 = load(os.path.join(work, f"s{s}", "dume-top1.eval.json"))
    inc.append({
        "seed": s, "max_abs_diff": diff, "tensors_differing": differing, "tensors_missing": missing,
        "ppl_added": {d: ppl(ev_add, d) for d in DOMAINS + ["hu"]},
        "ppl_scratch": {d: ppl(ev_scr, d) for d in DOMAINS + ["hu"]},
        "ppl_three_experts": {d: ppl(ev_3, d) for d in DOMAINS},
        "ppl_hu_expert": ppl(load(os.path.join(work, f"s{s}", "expert-hu.eval.json")), "hu"),
        # `route` wall time: the added expert's statistics alone vs all four domains' re-collected.
        "seconds_added": load(os.path.join(work, f"s{s}", "dume-add.route.json")).get("seconds"),
        "seconds_scratch": load(os.path.join(work, f"s{s}", "dume-scratch4.route.json")).get("seconds"),
    })
results["incremental"] = inc

os.makedirs(out, exist_ok=True)
# Figures: retention per domain and method; routing accuracy per layer; the routers' training curves.
FIG_METHODS = ["average", "random", "dume-top1", "dume-top2", "dume-ood", "dume-plus", "btx", "oracle"]
fig_retention = figure(out, "retention", {
    "kind": "bars", "title": f"DUME on {os.path.basename(model)}: retention (dense expert ppl / model ppl)",
    "y": "retention", "categories": DOMAINS + ["mean"],
    "series": [{"name": m, "values": [mean_or_none([x["retention"][d] for x in results["methods"][m]]) for d in DOMAINS]
                + [mean_or_none([x["mean_retention"] for x in results["methods"][m]])]} for m in FIG_METHODS],
})


def kept_figure(stem, alt):
    """The Markdown of OUT/STEM.png as an earlier sitting drew it (a run of only analyses of
    published seeds has none of the headline's logs to draw it again), with the seed it shows as
    published (`figure_seeds`; else `figure_seed`); empty when there is none."""
    shown = ((prior or {}).get("figure_seeds") or {}).get(stem) or _shown
    results.setdefault("figure_seeds", {})[stem] = shown
    return (f"\n![{alt} (seed {shown}; drawn by the sitting that trained the headline)]({stem}.png)\n"
            if os.path.exists(os.path.join(out, f"{stem}.png")) else "")


acc_series = []
for method in ("dume-top1", "dume-ood") if seeds else ():
    if not have(seeds[0], f"{method}.route.json"):
        continue
    rep = load(os.path.join(work, f"s{seeds[0]}", f"{method}.route.json"))
    for i, d in enumerate(DOMAINS):
        layers = rep["accuracy_per_domain_per_layer"][i]
        acc_series.append({"name": f"{method} {d}", "points": [[l, a] for l, a in enumerate(layers)]})
fig_accuracy = kept_figure("routing_accuracy", "Ridge router, top-1: held-out routing accuracy per layer") if not seeds else figure(out, "routing_accuracy", {
    "kind": "lines", "title": f"Ridge router: held-out routing accuracy per layer (seed {seeds[0]}, top-1)",
    "x": "layer", "y": "accuracy", "series": acc_series,
})
# The curves of the first seed whose run directory still holds the figure's training logs (a seed
# carried over from an earlier machine keeps only its evaluation and router reports, and one
# retrained in part may have the experts' logs but not DUME+'s).
curve_seed = (seeds_with(work, seeds, "expert-code/metrics.jsonl") or seeds or [None])[0]
router_seed = next((s for s in seeds if have(s, "dume-plus/metrics.jsonl") and have(s, "btx/metrics.jsonl")), curve_seed)
fig_curves = kept_figure("router_training", "Router training: next-token loss per step") if not seeds else figure(out, "router_training", {
    "kind": "lines", "title": f"Router training (seed {router_seed}): next-token loss per step", "x": "step",
    "y": "cross-entropy (nats/token)",
    "series": [{"name": m, "points": curve(os.path.join(work, f"s{router_seed}", m, "metrics.jsonl"))}
               for m in ("dume-plus", "btx")],
})
fig_experts = kept_figure("expert_training", "Dense domain experts: next-token loss per step") if not seeds else figure(out, "expert_training", {
    "kind": "lines", "title": f"Dense domain experts (seed {curve_seed}): next-token loss per step", "x": "step",
    "y": "cross-entropy (nats/token)",
    "series": [{"name": f"expert-{d}", "points": curve(os.path.join(work, f"s{curve_seed}", f"expert-{d}", "metrics.jsonl"))}
               for d in DOMAINS + ["hu"]],
})
if seeds:
    results["figure_seeds"] = {"routing_accuracy": seeds[0], "router_training": router_seed,
                               "expert_training": curve_seed}
# A superseded first attempt kept for the record (see experiments/dume.sh: top-1 routers trained
# with un-normalised weights).
attempt = [(s, m, load(os.path.join(work, f"s{s}", "attempt-top1-unnormalised", f"{m}.eval.json")))
           for s in seeds for m in ("dume-plus", "btx")
           if os.path.exists(os.path.join(work, f"s{s}", "attempt-top1-unnormalised", f"{m}.eval.json"))]
results["superseded_top1_unnormalised"] = [{"seed": s, "method": m, "ppl": {d: ppl(ev, d) for d in DOMAINS}}
                                          for s, m, ev in attempt]
# Task accuracy (issue 36): `eval --task` reports of the headline models, when run.
TASK_MODELS = [("expert-" + d, f"the {d} expert (dense)") for d in DOMAINS] + [
    ("average", "linear average of the experts"), ("dume-top1", "DUME, ridge router, top-1"),
    ("dume-top2", "DUME, ridge router, top-2"), ("dume-plus", "DUME+ (the ridge router trained)"),
    ("btx", "BTX (a random router trained)")]
# With the published seeds' records (report_common.pooled_tasks).
task_rows = [("base", "the dense base", *pooled_tasks(work, None, prior, published, "base", "base.tasks.json"))]
task_rows += [(m, label, *pooled_tasks(work, seeds, prior, published, m, f"{m}.tasks.json")) for m, label in TASK_MODELS]
# Headline models with perplexities but no task score yet (in any seed): named under the table, so
# a reader sees what is missing rather than a shorter table.
task_missing = [m for m, _ in TASK_MODELS if results["methods"].get(m) and not any(r[0] == m and r[2] for r in task_rows)]
task_rows = [r for r in task_rows if r[2]]
results["task_accuracy"] = {m: recs for m, _, _, recs in task_rows}
# DUME top-1 against averaging on the same items (report_common.paired_tasks), per seed that scored
# both; a published seed's pairs come through as they were.
task_pairs = paired_tasks(work, seeds, prior, published,
                          [("dume-top1", "average"), ("dume-top1", "dume-top2"), ("dume-plus", "btx")], DOMAINS)
results["task_accuracy_paired"] = task_pairs

with open_report(out, results, "DUME on a real model: MoErging dense domain experts with a ridge router", smoke) as f:
    f.write(f"Model `{os.path.basename(model)}`; seeds {', '.join(results['seeds'])} (mean ± std over seeds); {budget}.\n"
            "Perplexity on `domain/{code,math,docs}/valid.txt`; retention on domain D = ppl(dense expert D on D) /"
            " ppl(model on D) (docs/methods.md §2.6: the paper's form), its mean over the domains and its best domain;"
            " loss retention = NLL(expert D on D) / NLL(model on D), mean over domains.\n\n"
            "**Protocol (issue 35, 2026-12-03).** Text is read as the corpora define it: documents separated by"
            " blank lines, each followed by `<|endoftext|>` (docs/methods.md §7), the same token stream in training,"
            " in the ridge statistics, in the routing accuracy and in the perplexities (results.json `eval_streams`);"
            " the ridge statistics use every training token of each domain, as the reference code's statistics"
            " pass does (methods.md §2.2); DUME+ and BTX train with the same load-balancing coefficient. The tables"
            " published before (one document per line, 10,000 statistics tokens, DUME+ without the balancing loss)"
            " are replaced; the git history has them.\n\n")
    f.write(published_note(published))
    for s, missing in unfinished.items():
        f.write(f"**Seed {s} has not finished**: it lacks {len(missing)} of its {len(SEED_FILES)} results"
                f" ({', '.join(f'`{m}`' for m in missing)}); each table uses the seeds that have its results"
                " (its `seeds` column); rerun the script to complete it.\n\n")
    HEAD = ("| method | what | seeds | ppl code | ppl math | ppl docs | ret. code | ret. math | ret. docs | mean retention"
            " | best domain | mean loss retention |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    f.write(HEAD)
    for r in rows:
        f.write("| " + " | ".join(r) + " |\n")
    f.write(fig_retention)
    if task_rows:
        items = task_items([ev for _, _, evs, _ in task_rows for ev in evs])
        f.write("\n## Task accuracy\n\n"
                "Next-paragraph multiple choice on each domain's held-out text (`tests/reference/make_tasks.py`,"
                f" {items} items per task, 4 choices: chance 25 %), {TASK_SCORING}. The paper reports downstream accuracy beside"
                " perplexity; this is the small-scale stand-in. Mean ± std over the runs (the seeds that ran; the"
                " base is evaluated once); a single run shows its standard error over the items (s.e., lm-eval's"
                " `acc_stderr`).\n\n"
                "| model | what | runs | " + " | ".join(f"acc_norm {d}" for d in DOMAINS) + " | "
                + " | ".join(f"acc {d}" for d in DOMAINS) + " |\n|---|---|---|" + "---|" * (2 * len(DOMAINS)) + "\n")
        for m, label, evs, _ in task_rows:
            f.write(f"| `{m}` | {label} | {len(evs)} | {acc_cells(evs, DOMAINS)} |\n")
        if task_missing:
            f.write("\nNot yet scored: " + ", ".join(f"`{m}`" for m in task_missing)
                    + " (their perplexities are above). A later run with TASK_ITEMS scores the models its run"
                    " directory still holds; one whose model directory was removed after its perplexities were"
                    " published needs it rebuilt first (for `dume-top2`: delete its `.route.json` and `route`"
                    " re-solves it from the saved statistics).\n")
        f.write(paired_tasks_markdown(task_pairs))
    f.write("\nThe paper's ordering on mean retention (oracle ≥ DUME+ ≥ DUME > averaging > random), over seeds "
            f"{', '.join(order_seeds) or '(none has all five yet)'}"
            + "".join(f"; seed {s}: {'holds' if ok else 'does not hold'} in full" for s, ok in per_seed_order.items())
            + ":\n\n")
    for a, b, ok in checks:
        f.write(f"- `{a}` {'≥' if a in ('oracle', 'dume-plus') else '>'} `{b}`: "
                f"{mean_ret[a] * 100:.1f}% vs {mean_ret[b] * 100:.1f}% — {'holds' if ok else 'does not hold'}\n")
    if checks:
        top1 = mean_ret_of("dume-top1", order_seeds)
        f.write(f"- and the top-1 ridge router (DUME's headline form): `dume-top1` > `average`: {top1 * 100:.1f}% vs"
                f" {mean_ret['average'] * 100:.1f}% — {'holds' if top1 > mean_ret['average'] else 'does not hold'}\n")
    if attempt:
        f.write("\nA first attempt trained DUME+ and BTX as top-1 routers with `--norm-topk false` (Switch's form,"
                " so that a top-1 router gets a next-token gradient). On MoErged experts that scales every FFN"
                " output by the chosen expert's softmax probability (about 1/3 with three experts), which breaks"
                " the model: the router training's loss started at 10.3 nats/token (the ridge-routed model: ~2.5)"
                " and 50 router steps did not recover it. Kept for the record, not in the table above:\n\n")
        for s, m, ev in attempt:
            f.write(f"- seed {s}, `{m}` top-1 un-normalised: ppl " + ", ".join(f"{d} {ppl(ev, d):.1f}" for d in DOMAINS) + "\n")
    if ffn_rows:
        f.write(f"\n## FFN-only domain experts ({plural('seed', ffn_seeds)} {', '.join(ffn_seeds)})\n\nThe experts fine-tune only their FFNs"
                " (`train --stage ffn`), so every shared tensor of the MoErge is the base model's and the oracle is each"
                " dense expert exactly: the gap to the oracle is the router's alone. Retention against these experts.\n\n")
        f.write(HEAD)
        for r in ffn_rows:
            f.write("| " + " | ".join(r) + " |\n")
        if ffn_gap:
            f.write("\nOf the mean retention averaging leaves to the oracle, the routers recover (mean over "
                    f"{plural('seed', ffn_seeds)} {', '.join(ffn_seeds)}): "
                    + "; ".join(f"`{m}` {g * 100:.0f} % ({mean_ret_ffn[m] * 100:.1f}% against averaging"
                                f" {mean_ret_ffn['ffn-average'] * 100:.1f}% and the oracle"
                                f" {mean_ret_ffn['ffn-oracle'] * 100:.1f}%)" for m, g in ffn_gap.items())
                    + ". Random routing: " + f"{mean_ret_ffn['ffn-random'] * 100:.1f}%.")
            if head_gap:
                f.write(" The headline's experts (fully fine-tuned, so each setting against its own experts), per seed: "
                        + "; ".join(f"seed {s_}: top-1 {g['dume-top1'] * 100:.0f} %, top-2 {g['dume-top2'] * 100:.0f} %"
                                    for s_, g in head_gap.items()) + ".")
            f.write("\n")
    f.write("\n## Routing accuracy of the ridge routers (held-out tokens)\n\nEach cell: the mean over the MoE layers of"
            " the fraction of tokens whose top-1 expert is their domain's / the fraction routed to it in **every** MoE"
            " layer.\n\n")
    f.write("| router | seeds | code | math | docs | random routing (per layer) | statistics tokens (all domains) |\n"
            "|---|---|---|---|---|---|---|\n")
    for r in acc_rows:
        f.write("| " + " | ".join(r) + " |\n")
    f.write(fig_accuracy)
    if sweep:
        f.write(f"\nLambda sweeps (seed {sweep_seed}, top-1; the headline uses λ = 1e-2). Absolute λ, and λ relative to each"
                " layer's tr(A)/p (with every training token in the statistics, tr(A)/p is large, so an absolute"
                " λ = 1e-2 barely regularises):\n\n| λ | relative to tr(A)/p | mean accuracy code / math / docs |"
                " in every layer |\n|---|---|---|---|\n")
        for x in sweep:
            lam = x.get("lambda", "-")
            rel = x.get("lambda_relative", "-")
            acc = " / ".join(f"{a * 100:.1f}%" for a in x["mean_accuracy_per_domain"])
            every = " / ".join(f"{a * 100:.1f}%" for a in x.get("all_layers_accuracy_per_domain", [])) or "-"
            f.write(f"| {lam} | {rel} | {acc} | {every} |\n")
    f.write("\n## Training curves\n")
    f.write(fig_experts)
    f.write(fig_curves)
    f.write("\n## Incremental DUME: a fourth (Hungarian) expert\n\n")
    f.write("`route --add-expert` (`dume-add`) makes the shared tensors the mean of four models and re-solves on the"
            " saved statistics of the first three domains (collected on the three-model mean, not revisited) plus the"
            " new domain's; `dume-scratch4` re-collects all four domains' statistics on the grown model. Only the"
            " router tensors may differ; their difference is what the stale statistics cost. (On the same"
            " statistics, adding an expert equals solving from scratch by construction of the summed ridge"
            " statistics, methods.md §2.4; shared/tests/integration/route.rs asserts it.)\n\n")
    f.write("" if inc else "No seed has finished this step yet.\n")
    f.write("| seed | max abs router difference | tensors differing | ppl hu added / scratch (hu expert) | "
            "hu retention added / scratch | ppl code, math, docs: 3 experts → 4 added (4 scratch) | "
            "`route` seconds added / scratch |\n|---|---|---|---|---|---|---|\n" if inc else "")
    for x in inc:
        three = ", ".join(f"{x['ppl_three_experts'][d]:.2f} → {x['ppl_added'][d]:.2f} ({x['ppl_scratch'][d]:.2f})"
                          for d in DOMAINS)
        hu = x["ppl_hu_expert"]
        secs = " / ".join("-" if t is None else f"{t:.0f}" for t in (x["seconds_added"], x["seconds_scratch"]))
        f.write(f"| {x['seed']} | {x['max_abs_diff']:.3g} | {len(x['tensors_differing'])} | "
                f"{x['ppl_added']['hu']:.2f} / {x['ppl_scratch']['hu']:.2f} ({hu:.2f}) | "
                f"{hu / x['ppl_added']['hu'] * 100:.1f}% / {hu / x['ppl_scratch']['hu'] * 100:.1f}% | {three} | {secs} |\n")
    write_commands(f, work, "dume", smoke)
print(open(os.path.join(out, "README.md")).read())
