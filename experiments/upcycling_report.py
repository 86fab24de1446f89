#!/usr/bin/env python3
"""Table and figures of experiments/upcycling.sh (issue 15 item 5): Hungarian / English perplexity,
expert load balance and training time of each upcycling variant after the same stage-1 budget;
mean ± std over seeds. Standard library only (the figures are drawn by `moe-studio plot`).

Usage: upcycling_report.py WORK OUT SMOKE STEPS SEQ BATCH LR MODEL "SEEDS" "VARIANTS"
Writes OUT/results.json, OUT/README.md and the figures.
"""
import os
import statistics
import sys

from report_common import curve, figure, fmt, load, mean_or_none, open_report, ppl, write_commands

work, out, smoke, steps, seq, batch, lr, model, seeds, variants = sys.argv[1:]
seeds, variants = seeds.split(), variants.split()
tokens = int(steps) * int(seq) * int(batch)


def balance(ev):
    """max/min expert load on the Hungarian text, mean over MoE layers (1 = balanced)."""
    d = next(d for d in ev["datasets"] if d["name"] == "hu")
    ratios = [max(l) / min(l) if min(l) > 0 else float("inf") for l in (d.get("load_per_layer") or []) if l]
    return statistics.mean(ratios) if ratios else None


dense = load(os.path.join(work, "dense.eval.json"))
rows, results = [], {"model": model, "tokens_per_run": tokens, "steps": int(steps), "seq_len": int(seq),
                     "batch": int(batch), "lr": float(lr), "seeds": seeds, "dense": dense, "variants": {}}
rows.append(("dense", f"{ppl(dense, 'hu'):.2f}", f"{ppl(dense, 'en'):.2f}", "-", "-"))
for v in variants:
    evs, secs = [], []
    for s in seeds:
        d = os.path.join(work, f"{v}-s{s}")
        evs.append(load(os.path.join(d, "eval.json")))
        try:
            secs.append(sum(int(x) for x in open(os.path.join(d, "train.seconds")).read().split()))
        except OSError:
            secs.append(None)
    results["variants"][v] = {"evals": evs, "train_seconds": secs}
    rows.append((v, fmt([ppl(e, "hu") for e in evs]), fmt([ppl(e, "en") for e in evs]),
                 fmt([balance(e) for e in evs]), fmt(secs, 0)))

os.makedirs(out, exist_ok=True)
fig_ppl = figure(out, "ppl", {
    "kind": "bars", "title": f"Upcycling variants on {os.path.basename(model)}: perplexity after stage 1 ({tokens:,} hu tokens)",
    "y": "perplexity", "categories": ["hu", "en"],
    "series": [{"name": "dense", "values": [ppl(dense, "hu"), ppl(dense, "en")]}]
    + [{"name": v, "values": [mean_or_none([ppl(e, t) for e in results["variants"][v]["evals"]]) for t in ("hu", "en")]}
       for v in variants],
})
fig_curves = figure(out, "training", {
    "kind": "lines", "title": f"Stage 1 on Hungarian (seed {seeds[0]}): next-token loss per step", "x": "step",
    "y": "cross-entropy (nats/token)",
    "series": [{"name": v, "points": curve(os.path.join(work, f"{v}-s{seeds[0]}", "train", "metrics.jsonl"))}
               for v in variants],
})


with open_report(out, results, "Upcycling variants at one stage-1 budget", smoke) as f:
    f.write(f"Model `{os.path.basename(model)}`, 4 experts top-2 (expert 0 frozen), stage 1 (`train --stage experts`)"
            f" on `lang/hu/train.txt`: {steps} steps x {batch} x {seq} = {tokens:,} tokens per run, lr {lr},"
            f" seeds {', '.join(seeds)} (mean ± std over seeds). Perplexity on `lang/{{hu,en}}/valid.txt`"
            " (first tokens per the command below); load balance = max/min expert load on the Hungarian text,"
            " mean over layers (1 = perfectly balanced).\n\n")
    f.write("| variant | hu ppl | en ppl | load max/min | train s |\n|---|---|---|---|---|\n")
    for r in rows:
        f.write("| " + " | ".join(r) + " |\n")
    f.write(fig_ppl)
    f.write(fig_curves)
    write_commands(f, work, "upcycling", smoke)
print(open(os.path.join(out, "README.md")).read())
