#!/usr/bin/env python3
"""Table and figures of experiments/upcycling.sh (docs/methods.md "Upcycling variants"; issue 35's
protocol): Hungarian / English held-out perplexity, the expert load balance and the training time of
each upcycling variant after the same stage-1 budget, beside the dense model and the dense model
trained on the same tokens (`dense-ffn`: its FFNs only, `dense-cpt`: every weight); mean ± std over
seeds, and each variant's change against naive copies and against both dense runs paired per seed
(same tokens, same data order: checked from each training's saved data state); expert 0's share of
the routed load per row and seed (`expert0_share`); noise and drop before training
(`before_training`); task accuracy when scored. Figures: held-out
loss (ln perplexity) per row and text, and the training curves of one seed. Standard library
only (the figures are drawn by `moe-studio plot`).

Usage: upcycling_report.py WORK OUT SMOKE MODEL "SEEDS" "VARIANTS" "DENSE" BUDGET
       upcycling_report.py --check-published OUT "SEEDS" "VARIANTS" "DENSE" BUDGET MODEL
(DENSE: the dense baselines this run trains, "ffn cpt" or fewer.) Writes OUT/results.json, OUT/README.md
and the figures. With PUBLISHED_SEEDS (an earlier sitting's seeds, its run directories gone) their
records come from OUT/results.json, checked to be the same budget and evaluation token streams
(report_common.published_results / merge_published), pooled row by row: a published row this run
does not train is carried as it was, and a later sitting may add a row to a published seed (the row
trained on that seed's published streams); a published (row, seed) neither carried nor run again, or
both, is refused (refuse_per_row).
--check-published: the same PUBLISHED_SEEDS checks before any training, and that the published results
were made from the same model (file name) and with the same TASK_ITEMS; exit 1 naming what is wrong.
"""
import json
import os
import re
import statistics
import sys

from report_common import (TASK_SCORING, acc_cells, task_items, curve, figure, fmt, load, merge_published, nll, open_report, paired_tasks,
                           paired_tasks_markdown, pooled_tasks, pooling_note, ppl, published_results, refuse_pooled, seeds_with,
                           stream_hashes, unfinished_note, write_commands)

# Rows trained in each seed: the dense model on the same tokens, then the upcycling variants.
DENSE_ROWS = ["dense-ffn", "dense-cpt"]
TEXTS = ("hu", "en")
# Copies of the FFN per layer (experiments/upcycling.sh: --experts 4; granular splits each into G).
COPIES = 4
# The variants experiments/upcycling.sh knows, in the order of its tables.
ALL_VARIANTS = ("naive", "noise", "drop", "granular")


def rows_run(dense, variants):
    """The rows this sitting trains: the dense baselines named in DENSE ("ffn cpt" by default;
    experiments/upcycling.sh) and the VARIANTS."""
    return [f"dense-{d}" for d in dense.split()] + variants.split()


def refuse_per_row(prior, published, again):
    """Pooling row by row (a later sitting may add a variant to published seeds, e.g. the one an
    earlier sitting's machine did not finish): report_common.refuse_pooled for every published row,
    `again` {row: seeds run here}; a published row this report does not know is refused too (it
    would be dropped)."""
    for r, recs in (prior or {}).get("rows", {}).items():
        if r not in DENSE_ROWS + list(ALL_VARIANTS):
            sys.exit(f"PUBLISHED_SEEDS: the published results have a row `{r}` this report does not know (expected one"
                     f" of {DENSE_ROWS + list(ALL_VARIANTS)}): it would be dropped")
        refuse_pooled("row", r, [x["seed"] for x in recs], published, again.get(r, []), "SEEDS, or VARIANTS/DENSE")


def refuse_other_model(prior, model):
    """Exits when the published results were made from another model (compared by file name: the
    path differs between machines)."""
    if prior is not None and os.path.basename(prior.get("model", "")) != os.path.basename(model):
        sys.exit(f"PUBLISHED_SEEDS: the published results are of model `{prior.get('model')}`, this run's is `{model}`")


if sys.argv[1:2] == ["--check-published"]:
    out, seeds, variants, dense, budget, model = sys.argv[2:]
    published, prior = published_results(out, budget, seeds.split(), per_row=True)
    refuse_per_row(prior, published, {r: seeds.split() for r in rows_run(dense, variants)})
    refuse_other_model(prior, model)
    # Task scores pool only at the same items per task (report_common.pooled_tasks checks again at the
    # end); TASK_ITEMS=0 scores nothing here and keeps the published scores.
    items = os.environ.get("TASK_ITEMS", "100")
    published_items = {v.get("items") for recs in (prior or {}).get("task_accuracy", {}).values() for e in recs
                       for k, v in e.items() if k != "seed"}
    if items != "0" and published_items and published_items != {int(items)}:
        sys.exit(f"PUBLISHED_SEEDS: the published task scores use {sorted(published_items)} items per task,"
                 f" this run's TASK_ITEMS is {items}: set TASK_ITEMS as the published run did (or 0)")
    sys.exit(0)

work, out, smoke, model, seeds, variants, dense_run, budget = sys.argv[1:]
RUN = rows_run(dense_run, variants)
seeds = seeds.split()


def balance(ev):
    """Expert load balance on the Hungarian text: per MoE layer, the largest share of the routed
    load (token slots of the top-k) any FFN copy gets over the mean share (1 = balanced; at most
    COPIES / 2 = 2 under top-2 of 4 copies, where one copy is in every token's top-k), expert 0
    included; a granular model's G slices of a copy are summed first, so every variant is measured
    over the same 4 copies; mean over layers. None for a dense model."""
    d = next(d for d in ev["datasets"] if d["name"] == "hu")
    ratios = []
    for l in d.get("load_per_layer") or []:
        if not l or len(l) % COPIES:
            continue
        g = len(l) // COPIES
        per_copy = [sum(l[c * g:(c + 1) * g]) for c in range(COPIES)]
        ratios.append(max(per_copy) / (sum(per_copy) / COPIES))
    return statistics.mean(ratios) if ratios else None


def expert0_share(ev):
    """{text: share} of the routed load (top-k token slots, mean over MoE layers) that goes to
    expert 0, the original FFN kept frozen (a granular model's G slices of copy 0 summed), as
    deltamoe_report.py's `load_mean[0]`: 0.25 is an even spread over the 4 copies, 0.5 (top-2)
    puts the original FFN in every token's top-k. None for a dense model."""
    out = {}
    for d in ev["datasets"]:
        shares = [sum(l[:len(l) // COPIES]) / sum(l) for l in d.get("load_per_layer") or []
                  if l and not len(l) % COPIES and sum(l) > 0]
        if shares:
            out[d["name"]] = statistics.mean(shares)
    return out or None


def train_state(seed, row):
    """(the training sources' sha256 list, the data sampler's final state) of one training, from its
    final/trainer_state.json; None when the model directory is gone (a published seed)."""
    path = os.path.join(work, f"s{seed}", row, "final", "trainer_state.json")
    if not os.path.exists(path):
        return None
    t = load(path)
    return [x["sha256"] for x in t["sources"]], t["data"]


def seconds(path):
    """Training wall seconds (train_run's DIR.seconds: one line per attempt, summed); None if absent."""
    try:
        return sum(int(x) for x in open(path).read().split())
    except OSError:
        return None


def record(ev, seed, secs):
    """results.json's record of one seed of one row."""
    r = {"seed": seed}
    for t in TEXTS:
        r[t], r[f"{t}_nll"] = ppl(ev, t), nll(ev, t)
    r["balance"], r["train_seconds"] = balance(ev), secs
    return r


# Pooled row by row (refuse_per_row): the rows this sitting runs, and the published rows it carries.
published, prior = published_results(out, budget, seeds, per_row=True)
# (here against the seeds each row finished: one this run did not finish is not a result yet)
finished = {r: seeds_with(work, seeds, f"{r}.eval.json") for r in RUN}
refuse_per_row(prior, published, finished)
refuse_other_model(prior, model)
carried = set((prior or {}).get("rows", {}))
ROWS = [r for r in DENSE_ROWS + list(ALL_VARIANTS) if r in RUN or r in carried]
variants = [r for r in ROWS if r not in DENSE_ROWS]
dense = load(os.path.join(work, "dense.eval.json"))
evs = [dense]
rows, missing = {}, []
provenance = {}  # row -> (seeds from the published results.json, seeds of this run)
for r in ROWS:
    recs = [x for x in (prior or {}).get("rows", {}).get(r, []) if x["seed"] in published]
    have = finished.get(r, [])
    provenance[r] = ([x["seed"] for x in recs], have)
    for s in have:
        ev = load(os.path.join(work, f"s{s}", f"{r}.eval.json"))
        evs.append(ev)
        recs.append(record(ev, s, seconds(os.path.join(work, f"s{s}", f"{r}.seconds"))))
    done = {x["seed"] for x in recs}
    # (a row this sitting does not run lacks its seeds too)
    lacking = list(dict.fromkeys(s for s in published + seeds if s not in done))
    if lacking:
        missing.append((r, lacking))
    rows[r] = recs

# Expert 0's share of the routed load per row and seed (results.json `expert0_share`, as the DeltaMoE
# report's): the published seeds' from the published results.json; this run's from its evaluations;
# a carried seed published without it (every seed published before 171b01b, 2026-12-07) from this run
# directory's evaluation of it when that evaluation is the published one (the same perplexities to
# the last bit); kept only with a share for every text, as the DeltaMoE report keeps them.
expert0 = {}
for r in ROWS:
    if r in DENSE_ROWS:
        continue
    shares = {s: v for s, v in (prior or {}).get("expert0_share", {}).get(r, {}).items() if s in published}
    for x in rows[r]:
        path = os.path.join(work, f"s{x['seed']}", f"{r}.eval.json")
        if x["seed"] in shares or not os.path.exists(path):
            continue
        ev = load(path)
        share = expert0_share(ev)
        if share and set(share) >= set(TEXTS) and all(ppl(ev, t) == x[t] for t in TEXTS):
            shares[x["seed"]] = {t: share[t] for t in TEXTS}
    if shares:
        expert0[r] = dict(sorted(shares.items(), key=lambda kv: int(kv[0])))

# Held-out perplexity before training of the variants that do not start as the dense model (noise,
# drop: experiments/upcycling.sh evaluates `$v-init` before training it), per row and seed
# (results.json `before_training`): the published seeds' from the published results.json, the others
# from this run directory (any seed of a row this report shows).
START_ROWS = ("noise", "drop")


def vocab_size():
    """The vocabulary size from any trained model's config.json in the run directory (None without one)."""
    import glob
    for c in sorted(glob.glob(os.path.join(work, "s*", "*", "final", "config.json"))):
        v = load(c).get("vocab_size")
        if v:
            return v
    return None


VOCAB = vocab_size()
before = {}
for r in [r for r in ROWS if r in START_ROWS]:
    got = {s: v for s, v in (prior or {}).get("before_training", {}).get(r, {}).items() if s in published}
    for x in rows[r]:
        path = os.path.join(work, f"s{x['seed']}", f"{r}-init.eval.json")
        if x["seed"] not in got and os.path.exists(path):
            ev = load(path)
            evs.append(ev)
            got[x["seed"]] = {t: ppl(ev, t) for t in TEXTS}
    if got:
        before[r] = dict(sorted(got.items(), key=lambda kv: int(kv[0])))

# Every evaluation read the same token stream per text (the protocol; an earlier sitting's too).
streams = stream_hashes(evs)
for name, hashes in streams.items():
    if len(hashes) != 1:
        sys.exit(f"`{name}` was evaluated as {len(hashes)} different token streams {hashes}: not the same text")
# Same tokens in the same order in every row of a seed: the same training streams (sha256) and the
# same final data-sampler state (its draws follow from the seed alone); and the same training text
# in every seed, the published ones included (their records carried from the published results).
train_streams = {s: v for s, v in (prior or {}).get("train_streams", {}).items() if s in published}
train_data = {s: v for s, v in (prior or {}).get("train_data", {}).items() if s in published}
for s in seeds:
    states = {r: st for r in RUN if (st := train_state(s, r)) is not None}
    if len({json.dumps(v, sort_keys=True) for v in states.values()}) > 1:
        sys.exit(f"seed {s}: the rows trained on different token streams or data orders: {states}")
    if states:
        mine, data = next(iter(states.values()))
        # A row added to a published seed trained on that seed's published streams, with the same final
        # data-sampler state where the published results have it (`train_data`; results.json from
        # before 2026-12-07 lacks it).
        if s in train_streams and train_streams[s] != mine:
            sys.exit(f"seed {s}: this run's rows trained on streams {mine}, the published rows of that seed on"
                     f" {train_streams[s]}: not the same text")
        if s in train_data and train_data[s] != data:
            sys.exit(f"seed {s}: this run's rows ended with data-sampler state {data}, the published rows of that"
                     f" seed with {train_data[s]}: not the same data order")
        train_streams[s], train_data[s] = mine, data
if len({json.dumps(v) for v in train_streams.values()}) > 1:
    sys.exit(f"the seeds trained on different texts (training streams' sha256): {train_streams}")
flops = {}
if os.path.exists(os.path.join(work, "flops.txt")):
    for line in open(os.path.join(work, "flops.txt")):
        k, v = line.split()
        flops[k] = float(v)
elif prior is not None:
    flops = prior.get("flops", {})

results = {"model": model, "seeds": seeds, "budget": budget, "eval_streams": streams,
           "train_streams": train_streams, "train_data": train_data, "flops": flops,
           "dense": {k: v for k, v in record(dense, None, None).items() if k in ("hu", "en", "hu_nll", "en_nll")},
           "rows": rows}
merge_published(results, prior, published, seeds)


def paired(a, b):
    """{seed: {text: a/b − 1}} over the seeds where both rows have a record (same seed = same
    tokens in the same order)."""
    ra, rb = {x["seed"]: x for x in rows.get(a, [])}, {x["seed"]: x for x in rows.get(b, [])}
    return {s: {t: ra[s][t] / rb[s][t] - 1 for t in TEXTS} for s in ra if s in rb}


results["paired_vs_naive"] = {v: paired(v, "naive") for v in ROWS if v != "naive" and "naive" in rows}
# Task accuracy (issue 36): `eval --task` reports of the dense model and of every row, pooled with the
# published seeds' records (report_common.pooled_tasks); each variant against naive on the same items.
task_rows = [("dense", *pooled_tasks(work, None, prior, published, "dense", "dense.tasks.json"))]
task_rows += [(r, *pooled_tasks(work, seeds if r in RUN else [], prior, published, r, f"{r}.tasks.json"))
              for r in ROWS]
task_rows = [(r, evs, recs) for r, evs, recs in task_rows if evs]
results["task_accuracy"] = {r: recs for r, _, recs in task_rows}
# (only pairs with a row this sitting ran: a pair of two carried rows is the published one. A row added
# to a published seed has no pair against naive unless naive's items were scored in this run directory:
# results.json keeps no per-item samples.)
results["task_accuracy_paired"] = paired_tasks(work, seeds, prior, published,
                                               [(v, "naive") for v in ROWS if v != "naive" and (v in RUN or "naive" in RUN)],
                                               list(TEXTS))
results["paired_vs_dense_ffn"] = {v: paired(v, "dense-ffn") for v in variants}
results["paired_vs_dense_cpt"] = {v: paired(v, "dense-cpt") for v in variants}
results["expert0_share"] = expert0
results["before_training"] = before


def pct_cell(pairs, t):
    """`mean ± std` of the paired changes in percent, with the seed count; `-` without a pair. Two
    decimals where the change is under 1 %, so a small spread does not print as `± 0.0`."""
    xs = [p[t] for p in pairs.values()]
    small = xs and abs(statistics.mean(xs)) < 0.01
    return fmt(xs, 2 if small else 1, pct=True) + (f" (n={len(xs)})" if xs else "")


def flops_key(r):
    return {"dense-cpt": "dense", "dense-ffn": "ffn"}.get(r, "experts")


def gflop_cell(r):
    return f"{flops[flops_key(r)]:.3g}" if flops.get(flops_key(r)) else "-"


# Training tokens per run, from the budget string experiments/upcycling.sh writes ("STEPS x BATCH x SEQ").
steps, batch, seq = (int(x) for x in re.search(r"(\d+) x (\d+) x (\d+) tokens", budget).groups())
tokens = steps * batch * seq


os.makedirs(out, exist_ok=True)
means = {r: {t: statistics.mean([x[t] for x in rows[r]]) if rows[r] else None for t in TEXTS} for r in ROWS}
# The figure draws held-out loss (ln perplexity, mean over seeds), not perplexity: on a linear
# perplexity axis Drop-Upcycling's English bar (~770) flattens every other row to the floor.
loss_means = {r: {t: statistics.mean([x[f"{t}_nll"] for x in rows[r]]) if rows[r] else None for t in TEXTS}
              for r in ROWS}
for stale in ("ppl.svg", "ppl.png"):
    if os.path.exists(os.path.join(out, stale)):
        os.remove(os.path.join(out, stale))
fig_ppl = figure(out, "heldout_loss", {
    "kind": "bars",
    "title": f"Upcycling variants on {os.path.basename(model)}: held-out loss after stage 1 (mean over seeds)",
    "y": "cross-entropy (nats/token): ln of the geometric-mean perplexity", "categories": list(TEXTS),
    "series": [{"name": "dense (no training)", "values": [nll(dense, t) for t in TEXTS]}]
    + [{"name": r, "values": [loss_means[r][t] for t in TEXTS]} for r in ROWS if rows[r]],
})
# The training curves of the first seed with the most of its rows' metrics in this run directory
# (a sitting that added a row to a published seed has only that row's); stale figures go.
# (finished rows only: a training still running has metrics but no evaluation yet)
have_curves = {s: [r for r in ROWS if os.path.exists(os.path.join(work, f"s{s}", r, "metrics.jsonl"))
                   and os.path.exists(os.path.join(work, f"s{s}", f"{r}.eval.json"))] for s in seeds}
first = max(seeds, key=lambda s: len(have_curves[s]), default=None)
if first is None or not have_curves[first]:
    fig_curves = ""
    for ext in ("svg", "png"):
        if os.path.exists(os.path.join(out, f"training.{ext}")):
            os.remove(os.path.join(out, f"training.{ext}"))
else:
    some = "" if len(have_curves[first]) == len(ROWS) else f"; its rows trained in this run directory: {', '.join(have_curves[first])}"
    fig_curves = figure(out, "training", {
        "kind": "lines", "title": f"Training on Hungarian (seed {first}{some}): next-token loss per step", "x": "step",
        "y": "cross-entropy (nats/token)",
        "series": [{"name": r, "points": curve(os.path.join(work, f"s{first}", r, "metrics.jsonl"))}
                   for r in have_curves[first]],
    })

with open_report(out, results, "Upcycling variants at one stage-1 budget", smoke) as f:
    f.write(f"Model `{os.path.basename(model)}` upcycled to 4 experts, top-2, expert 0 (the original FFN) frozen,"
            " then stage 1 (`train --stage experts`: the three trainable experts and the router) on"
            " `lang/hu/train.txt`. Dense baselines on the same tokens in the same order: `dense-ffn` trains the"
            " FFNs only (the kind of weights stage 1 trains, without experts), `dense-cpt` every weight."
            f" Budget: {budget}. Seeds: {', '.join(results['seeds'])} (mean ± std over seeds)."
            " Held-out perplexity on `lang/hu/valid.txt` and `lang/en/valid.txt` (English: what the new"
            " experts may cost the original language). Load balance: per layer, the largest FFN copy's share of"
            " the routed load (top-k token slots) on the Hungarian text over the mean share (1 = balanced, 2 = one"
            " copy is in every token's top-2; expert 0 included; granular's two slices of a copy summed), mean over"
            " layers. A change"
            " is this row's perplexity over the other's on the same seed, minus 1: positive is worse. Documents"
            " are separated by blank lines, each followed by `<|endoftext|>` (docs/methods.md §7); every"
            " evaluation read the same token streams (`eval_streams` in results.json), and every row of a seed"
            " trained on the same streams (`train_streams`) with the same final data-sampler state (`train_data`:"
            " compared between the rows of one run directory, and against a published seed's where its results.json"
            " has it, which those published before 2026-12-07 do not).\n\n")
    f.write(pooling_note(published, seeds, provenance, "row", "rows"))
    f.write(unfinished_note(missing))
    f.write("| row | seeds | train GFLOP/token | hu ppl | en ppl | hu vs naive | en vs naive | load max/mean"
            " | train wall s |\n|---|---|---|---|---|---|---|---|---|\n")
    f.write(f"| dense (no training) | - | - | {ppl(dense, 'hu'):.2f} | {ppl(dense, 'en'):.2f} | | | - | - |\n")
    for r in ROWS:
        recs = rows[r]
        pv = results["paired_vs_naive"].get(r, {})
        f.write(f"| {r} | {len(recs)} | {gflop_cell(r)} | {fmt([x['hu'] for x in recs])} | {fmt([x['en'] for x in recs])}"
                f" | {pct_cell(pv, 'hu') if r != 'naive' else ''} | {pct_cell(pv, 'en') if r != 'naive' else ''}"
                f" | {fmt([x['balance'] for x in recs])} | {fmt([x['train_seconds'] for x in recs], 0)} |\n")
    for base in DENSE_ROWS:
        f.write(f"\nEach variant against `{base}`, paired per seed:\n\n")
        for v in variants:
            p = results[f"paired_vs_{base.replace('-', '_')}"].get(v, {})
            f.write(f"- `{v}`: hu {pct_cell(p, 'hu')}, en {pct_cell(p, 'en')}\n")
    if before:
        f.write("\nBefore training: held-out perplexity of the upcycled model as `upcycle` made it, for the"
                " variants that do not start as the dense model (naive and granular compute its function"
                f" exactly: {ppl(dense, 'hu'):.2f} / {ppl(dense, 'en'):.2f})."
                + (f" The vocabulary has {VOCAB:,} tokens: a uniform guess scores {VOCAB:,}." if VOCAB else "")
                + "\n\n"
                "| row | seeds | hu ppl | en ppl |\n|---|---|---|---|\n")
        for r, per_seed in before.items():
            f.write(f"| {r} | {', '.join(per_seed)} | "
                    + " | ".join(fmt([x[t] for x in per_seed.values()]) for t in TEXTS) + " |\n")
    if expert0:
        f.write("\nShare of the routed load (top-k token slots, mean over layers) that goes to expert 0, the"
                " original FFN kept frozen (`load_mean[0]` of `eval --json`, granular's two slices of it summed;"
                " 25 % is an even spread over the 4 copies, 50 % puts it in every token's top-2). Seeds: those with a"
                " recorded share (this run's evaluations, or carried from the published results.json; a seed"
                " published before the shares were recorded has one only where its evaluation is still in this"
                " run directory).\n\n"
                "| row | seeds | hu | en |\n|---|---|---|---|\n")
        for r, per_seed in expert0.items():
            f.write(f"| {r} | {', '.join(per_seed)} | "
                    + " | ".join(fmt([x.get(t) for x in per_seed.values()], 1, True) for t in TEXTS) + " |\n")
    f.write("\n**Reading the tables.** Mean ± sample standard deviation s (n − 1) over seeds. A row with one seed"
            " carries no measured spread, so a few percent between two variants there is not yet a finding. With"
            " 2 or 3 seeds a paired change counts only when it is much larger than its spread and has the same"
            " sign on every seed: the 95 % t-interval of a mean over n = 2 paired seeds is ± 9.0 × s (± 2.5 × s for"
            " n = 3), so a change of +0.2 ± 0.1 % over 2 seeds is not told apart from none. The wall times come"
            " from different machines and loads (the run notes in docs/experiments/README.md); they are not a"
            " cost comparison: the GFLOP column is. ")
    if all(flops.get(k) for k in ("experts", "ffn", "dense")):
        more = "more" if flops["experts"] > flops["dense"] else "no more"
        f.write(f"Stage 1 costs {flops['experts']:.3g} GFLOP per training token against {flops['ffn']:.3g} for"
                f" `dense-ffn` and {flops['dense']:.3g} for `dense-cpt` (experiments/flops.py, balanced routing"
                f" assumed): the rows are matched in tokens, not FLOPs, and every MoE row spends {more} compute"
                " per token than `dense-cpt`. ")
    done = sorted((v for v in variants if means[v]["hu"] is not None), key=lambda v: means[v]["hu"])
    if len(done) < len(ALL_VARIANTS):
        lead = f" (not yet decided here: {', '.join(f'`{v}`' for v in ALL_VARIANTS if v not in done)} still to run)"
    else:
        two = set(done[:2]) == {"naive", "noise"}
        a, b = done[:2]
        n = lambda v: len(rows[v])  # noqa: E731
        apart = ""
        if "naive" in (a, b):
            other = b if a == "naive" else a
            apart = f"; the paired change of `{other}` against `naive` above says whether the two are told apart"
        lead = (f" (here {'they do' if two else 'they do not'}: the two lowest mean Hungarian perplexities among"
                f" the variants are `{a}`'s and `{b}`'s, {means[a]['hu']:.2f} ({n(a)} seeds) and"
                f" {means[b]['hu']:.2f} ({n(b)} seeds){apart})")
    f.write(f"What a critic checks first: the budget. {tokens:,} tokens per run is a short continued pre-training."
            " Drop-Upcycling (Nakamura et al. 2025) reports that naive copies stay alike and so improve slowly"
            " over long training, while re-initialised units start from a higher loss and overtake them later, at"
            " scales of billions of tokens; at this budget the variants that keep the copies' knowledge (naive,"
            f" noise) are expected to lead{lead}. With expert 0 frozen (the DeltaMoE setting) Drop-Upcycling leaves the"
            " original FFN whole and re-initialises units of the trainable copies only; the English column shows"
            " what routing English tokens to them costs. Granular upcycling freezes both slices of the original"
            " FFN, but their router rows train apart and each slice's output is scaled to keep the function at"
            " the start, so after training the two frozen slices need not compute the original FFN together:"
            " its English column is not a frozen-expert reading like the other variants' (how often the two"
            " slices are still chosen together is not measured here).\n\n"
            f"**Where this setup differs from the papers.** (1) The base is `{os.path.basename(model)}`"
            + (", a quantised GGUF dequantised to f32, so the copies, and Drop-Upcycling's per-projection mean and"
               " standard deviation, are those of quantised weights" if model.endswith(".gguf") else "")
            + ". (2) Expert 0 is the original FFN, frozen and never re-initialised (the"
            " DeltaMoE setting), and stage 1 trains the three new experts and the router only; Komatsuzaki et al."
            " (2023) train every weight of the upcycled model, and Drop-Upcycling's public code re-initialises"
            " every expert. What the frozen weights cost is measured beside DeltaMoE: its 2x2 (deltamoe/README.md,"
            " \"Scale or recipe\", seed 1) puts the MoE's Hungarian gap to every-weight dense training on the"
            " recipe (dense FFN-only against dense all: +15.4 %), with the MoE within 1 % of dense when both train"
            " the same weights. (3) Drop-Upcycling draws one set of units per expert for `w1`, `w3` and `w2` (the"
            " paper's Eq. 3; its code draws one per projection), r = 0.5, 4 experts top-2. (4) Granular: G = 2"
            f" only. (5) The budget: {tokens:,} tokens per run, against the papers' billions.\n")
    if task_rows:
        items = task_items([ev for _, evs, _ in task_rows for ev in evs])
        f.write("\n## Task accuracy\n\nNext-paragraph multiple choice on the held-out text"
                f" (`tests/reference/make_tasks.py`, {items} items per task, 4 choices: chance"
                f" 25 %), {TASK_SCORING}. Mean ± std over"
                " the seeds; a single run shows its standard error over the items (s.e.).\n\n"
                "| row | runs | acc_norm hu | acc_norm en | acc hu | acc en |\n|---|---|---|---|---|---|\n")
        for r, evs, _ in task_rows:
            f.write(f"| {r} | {len(evs)} | {acc_cells(evs, TEXTS)} |\n")
        f.write(paired_tasks_markdown(results["task_accuracy_paired"]))
    f.write(fig_ppl)
    f.write(fig_curves)
    write_commands(f, work, "upcycling", smoke)
print(open(os.path.join(out, "README.md")).read())
