#!/usr/bin/env python3
"""Tables of experiments/deltamoe.sh (issue 14 item 2): English retention, Hungarian gain and the
grafted ability of the MoE (stage 1, stage 2, + Δ) against dense CPT, dense CPT with twice the
tokens, dense CPT + Δ and linear averaging; mean ± std over seeds. Standard library only.

Usage: deltamoe_report.py WORK OUT SMOKE MODEL "SEEDS" "EXPERTS_LIST" "BUDGET"
Writes OUT/results.json and OUT/README.md.
"""
import os
import statistics
import sys

from report_common import (curve, figure, fmt, load, mean_or_none, open_report, ppl, seeds_with, unfinished_note,
                           write_commands)

work, out, smoke, model, seeds, experts, budget = sys.argv[1:]
seeds, experts = seeds.split(), experts.split()
TEXTS = ["en", "hu", "math"]

methods = [("base", "the dense model"), ("post", "base fine-tuned on math (Δ = post − base)"),
           ("cpt", "dense CPT on hu, stage-1 tokens"), ("cpt2x", "dense CPT, twice the tokens"),
           ("cpt+delta", "dense CPT + Δ (dense delta merging)"), ("average", "linear average of cpt and post")]
for e in experts:
    t = int(e) - 1
    methods += [(f"moe-{e}-s1", f"MoE {e} experts ({t} trainable), stage 1"),
                (f"moe-{e}-s2", f"MoE {e} experts, stage 2 (router, en replay + prior)"),
                (f"moe-{e}-s2+delta", f"MoE {e} experts, stage 2 + Δ grafted")]

base = load(os.path.join(work, "base.eval.json"))
bp = {t: ppl(base, t) for t in TEXTS}
results = {"model": model, "seeds": seeds, "budget": budget, "base": bp, "methods": {}}
rows = []
missing = []  # (method, seeds without its evaluation): a run spread over several sittings
evals = {}  # method -> {seed: its `eval --json` report}
for m, label in methods:
    have = seeds if m == "base" else seeds_with(work, seeds, f"{m}.eval.json")
    if len(have) < len(seeds):
        missing.append((m, [s for s in seeds if s not in have]))
    evs = [base] * len(seeds) if m == "base" else [load(os.path.join(work, f"s{s}", f"{m}.eval.json")) for s in have]
    evals[m] = dict(zip(have, evs))
    p = [{t: ppl(ev, t) for t in TEXTS} for ev in evs]
    results["methods"][m] = p
    results.setdefault("seeds_per_method", {})[m] = have
    rows.append([f"`{m}`", label, ", ".join(have) if have else "not run"] + [fmt([x[t] for x in p]) for t in TEXTS]
                + [fmt([bp["en"] / x["en"] for x in p], 1, True), fmt([bp["hu"] / x["hu"] for x in p], 1, True),
                   fmt([x["en"] / bp["en"] - 1 for x in p], 1, True)])

def mean_of(m, t):
    return statistics.mean(x[t] for x in results["methods"][m])

def ran(*ms):
    return all(results["methods"][m] for m in ms)

head = experts[0]
claims = []  # a claim whose models have not run yet is left out
s2 = f"moe-{head}-s2"
if ran(s2):
    en_change = mean_of(s2, "en") / bp["en"] - 1
    claims.append((f"`{s2}` English ppl at most 2% above the original while Hungarian improves",
                   en_change <= 0.02 and mean_of(s2, "hu") < bp["hu"],
                   f"en {en_change * 100:+.1f}%, hu {mean_of(s2, 'hu'):.2f} vs {bp['hu']:.2f}"))
g = f"moe-{head}-s2+delta"
if ran(g, "cpt+delta"):
    claims.append((f"`{g}` retains English better than `cpt+delta`",
                   mean_of(g, "en") < mean_of("cpt+delta", "en"),
                   f"en ppl {mean_of(g, 'en'):.2f} vs {mean_of('cpt+delta', 'en'):.2f}; "
                   f"hu ppl {mean_of(g, 'hu'):.2f} vs {mean_of('cpt+delta', 'hu'):.2f}"))
if ran(g):
    claims.append((f"`{g}` keeps the grafted ability (math ppl below base)",
                   mean_of(g, "math") < bp["math"], f"math ppl {mean_of(g, 'math'):.2f} vs base {bp['math']:.2f}"))
if ran(s2, "cpt2x"):
    claims.append((f"`{s2}` learns Hungarian at least as well as dense CPT with twice the tokens (equal FFN FLOPs)"
                   " while keeping English better",
                   mean_of(s2, "hu") <= mean_of("cpt2x", "hu") and mean_of(s2, "en") < mean_of("cpt2x", "en"),
                   f"hu ppl {mean_of(s2, 'hu'):.2f} vs {mean_of('cpt2x', 'hu'):.2f}; "
                   f"en ppl {mean_of(s2, 'en'):.2f} vs {mean_of('cpt2x', 'en'):.2f}"))
results["claims"] = [{"claim": c, "holds": ok, "numbers": n} for c, ok, n in claims]

# How much of each text the frozen expert 0 (the original FFN) still serves: its share of the top-k
# assignments (`load_mean[0]` of `eval --json`), per MoE model, on the seeds whose evaluation holds
# the routing load (a seed carried over from an earlier machine keeps only perplexities).
expert0 = {}
for m, _ in methods:
    if not m.startswith("moe-"):
        continue
    per_seed = {}
    for s, ev in evals[m].items():
        loads = {d["name"]: d["load_mean"][0] for d in ev["datasets"] if d.get("load_mean")}
        if len(loads) == len(TEXTS):
            per_seed[s] = loads
    if per_seed:
        expert0[m] = per_seed
results["expert0_share"] = expert0

# The ablation over the number of trainable experts (E - 1; expert 0 stays frozen): stage 2 and
# stage 2 + Δ of every expert count that has run, on the seeds they all have (equal seeds, so a
# difference between rows is not a difference between seeds).
def on_seeds(m, common):
    return {t: statistics.mean(ppl(evals[m][s], t) for s in common) for t in TEXTS}

counts = [e for e in sorted(experts, key=int) if ran(f"moe-{e}-s2+delta")]
common = [s for s in seeds if all(s in evals[f"moe-{e}-{stage}"] for e in counts for stage in ("s2", "s2+delta"))]
ablation = [{"experts": int(e), "trainable": int(e) - 1, "seeds": common,
             "stage2": on_seeds(f"moe-{e}-s2", common), "graft": on_seeds(f"moe-{e}-s2+delta", common)}
            for e in counts] if common else []
results["ablation"] = ablation

os.makedirs(out, exist_ok=True)
# Figures: perplexity change vs the base model per text; the training curves of the first seed.
fig_models = [m for m, _ in methods if m != "base" and results["methods"][m]]
fig_ppl = figure(out, "ppl_change", {
    "kind": "bars", "title": f"DeltaMoE on {os.path.basename(model)}: perplexity relative to the base model (lower is better)",
    "y": "ppl / base ppl", "categories": TEXTS,
    "series": [{"name": m, "values": [mean_or_none([x[t] / bp[t] for x in results["methods"][m]]) for t in TEXTS]}
               for m in fig_models],
})
# The curves of the first seed whose run directory still holds its training logs (a seed carried
# over from an earlier machine keeps only its evaluations).
curve_seed = (seeds_with(work, seeds, "cpt/metrics.jsonl") or seeds)[0]
S0 = os.path.join(work, f"s{curve_seed}")
fig_curves = figure(out, "training", {
    "kind": "lines", "title": f"Training (seed {curve_seed}): next-token loss per step", "x": "step",
    "y": "cross-entropy (nats/token)",
    "series": [{"name": n, "points": curve(os.path.join(S0, d, "metrics.jsonl"))} for n, d in
               [("dense CPT (hu)", "cpt"), ("dense CPT 2x (hu)", "cpt2x"), ("post (math)", "post")]
               + [(f"MoE {e} stage 1 (hu)", f"moe-{e}-s1") for e in experts]
               + [(f"MoE {e} stage 2 (router)", f"moe-{e}-s2") for e in experts]],
})
with open_report(out, results, "DeltaMoE on a real model: Hungarian by upcycling, two stages and a delta graft", smoke) as f:
    f.write(f"Model `{os.path.basename(model)}`; seeds {', '.join(seeds)} (mean ± std); {budget}. Perplexity on"
            " `lang/en/valid.txt`, `lang/hu/valid.txt` and `domain/math/valid.txt` (the ability Δ carries);"
            " retention = ppl(base, en) / ppl(model, en), gain = ppl(base, hu) / ppl(model, hu).\n\n")
    f.write(unfinished_note(missing))
    f.write("| model | what | seeds | ppl en | ppl hu | ppl math | en retention | hu gain | en ppl change |\n")
    f.write("|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        f.write("| " + " | ".join(r) + " |\n")
    f.write(fig_ppl)
    f.write(fig_curves)
    if len(ablation) > 1:
        f.write("\n## Ablation: number of trainable experts\n\n"
                "Expert 0 (the original FFN) stays frozen; the paper reports that more than 3 trainable experts"
                " add little (methods.md §1.2). Same stage-1 and stage-2 budget for each count; mean over the"
                f" seeds every count has run ({'seed' if len(ablation[0]['seeds']) == 1 else 'seeds'}"
                f" {', '.join(ablation[0]['seeds'])}). With 2 experts and top-2 every token"
                " uses both (the router only weighs the frozen original against the new expert).\n\n"
                "| experts (trainable) | stage 2: ppl en | ppl hu | + Δ: ppl en | ppl hu | ppl math |\n"
                "|---|---|---|---|---|---|\n")
        for a in ablation:
            f.write(f"| {a['experts']} ({a['trainable']}) | {a['stage2']['en']:.2f} | {a['stage2']['hu']:.2f} | "
                    + " | ".join(f"{a['graft'][t]:.2f}" for t in TEXTS) + " |\n")
    if expert0:
        f.write("\n## Share of the top-k assignments served by the frozen expert 0\n\n"
                "Per MoE model and text, the fraction of the top-k (token, expert) assignments that go to expert 0,"
                " the original FFN (`load_mean[0]` of `eval --json`, a share of all assignments: uniform routing gives 1 / E, and with top-2 a share of 50 % means every token has expert 0 among its two).\n\n"
                "| model | seeds | " + " | ".join(TEXTS) + " |\n|---|---|" + "---|" * len(TEXTS) + "\n")
        for m, per_seed in expert0.items():
            f.write(f"| `{m}` | {', '.join(per_seed)} | "
                    + " | ".join(fmt([x[t] for x in per_seed.values()], 1, True) for t in TEXTS) + " |\n")
    f.write("\n## The paper's claims\n\n")
    for c, ok, n in claims:
        f.write(f"- {c}: **{'holds' if ok else 'does not hold'}** ({n})\n")
    write_commands(f, work, "deltamoe", smoke)
print(open(os.path.join(out, "README.md")).read())
