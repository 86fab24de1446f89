#!/usr/bin/env python3
"""Tables of experiments/neuronmoe.sh (issue 35 item 5): experts added and parameters per
allocation (NeuronMoE; uniform, shuffled, inverted and LayerMoE-placed with exactly its total;
LayerMoE-style) next to per-language perplexity after the same stage-1 + stage-2 training; mean ±
std over seeds; the paired per-seed differences against NeuronMoE. Standard library only.

With the post-training analysis (methods.md §3.7) of the seeds in ANALYSE: where the trained
models' language-specific neurons sit, per trainable expert and layer, against the dense model's.

Usage: neuronmoe_report.py WORK OUT SMOKE MODEL "SEEDS" "ALLOCS" "ANALYSE" "BUDGET"
       neuronmoe_report.py --check-published OUT "SEEDS" "ALLOCS" "BUDGET"
Writes OUT/results.json and OUT/README.md (and copies the allocation comparison figure).
--check-published: before any training, the PUBLISHED_SEEDS checks the report would make at the
end, assuming every (allocation, seed) of this run finishes: the same budget, no (allocation, seed)
both published and run here, no published seed neither carried nor run again. Exit 1 naming it.
"""
import json
import math
import os
import shutil
import statistics
import sys

from report_common import (TASK_SCORING, acc_cells, task_items, figure, fmt, load, mean_or_none, merge_published, paired_tasks, paired_tasks_markdown, pooled_tasks, ppl, pooling_note, refuse_pooled,
                           published_results, reproduced, rerun_seeds, seeds_with, stream_hashes, unfinished_note, write_commands)



if sys.argv[1:2] == ["--check-published"]:
    out, seeds, allocs, budget = sys.argv[2:]
    seeds, allocs = seeds.split(), allocs.split()
    published, prior = published_results(out, budget, seeds, per_row=True)
    rerun = rerun_seeds()
    if any(s not in published or s not in seeds for s in rerun):
        sys.exit(f"RERUN_SEEDS={' '.join(rerun)}: each must be in PUBLISHED_SEEDS and in SEEDS")
    for a, p in (prior or {}).get("allocations", {}).items():
        refuse_pooled("allocation", a, p["seeds"], published, seeds if a in allocs else [], "SEEDS or ALLOCS", rerun)
    sys.exit(0)

work, out, smoke, model, seeds, allocs, analyse, budget = sys.argv[1:]
seeds, allocs, analyse = seeds.split(), allocs.split(), analyse.split()
LANGS = ["en", "hu", "el", "tr"]

# Seeds published by an earlier sitting on another machine (report_common.published_results),
# pooled allocation by allocation: a later sitting may run published seeds of allocations the
# earlier one did not run (ALLOCS naming only those); the published allocations it does not run
# keep their rows.
published, prior = published_results(out, budget, seeds, per_row=True)
run_allocs = allocs
allocs = [a for a in (prior or {}).get("allocations", {}) if a not in run_allocs] + run_allocs
if prior is not None:
    order = list(prior["allocations"])
    allocs.sort(key=lambda a: order.index(a) if a in order else len(order))


RERUN = rerun_seeds()
reruns = {}  # "allocation s<seed>" -> largest relative difference from the published perplexities


def published_entries(a, per_layer, have, stages):
    """(seeds, {stage: [per-language ppl]}) of allocation `a` from the published results.json,
    without the seeds this run trained again on purpose (RERUN_SEEDS): those must reproduce the
    published perplexities (report_common.reproduced), and this run's entries replace them."""
    if prior is None or a not in prior["allocations"]:
        return [], {"s1": [], "s2": []}
    p = prior["allocations"][a]
    if p["new_experts_per_layer"] != per_layer:
        sys.exit(f"PUBLISHED_SEEDS: allocation `{a}` was {p['new_experts_per_layer']} in the published results,"
                 f" {per_layer} in this run: not the same experiment")
    # Every seed the published row holds is carried (PUBLISHED_SEEDS) or run again here, not both
    # (but for RERUN_SEEDS, checked here).
    refuse_pooled("allocation", a, p["seeds"], published, have, "SEEDS or ALLOCS", RERUN)
    for s in RERUN:
        if s in have and s in p["seeds"] and s in published:
            i, j = p["seeds"].index(s), have.index(s)
            reruns[f"{a} s{s}"] = reproduced(a, s, [p["s1"][i], p["s2"][i]], [stages["s1"][j], stages["s2"][j]])
    idx = [i for i, s in enumerate(p["seeds"]) if s in published and s not in have]
    return [p["seeds"][i] for i in idx], {st: [p[st][i] for i in idx] for st in ("s1", "s2")}


def seed_key(s):
    """Sort key of a seed: numbers in numeric order ("2" before "10"), then any other name."""
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


def allocation_of(a):
    """Experts per layer of allocation `a`: this run's `allocate` output, or the published row's
    for an allocation this run did not train."""
    path = os.path.join(work, f"alloc-{a.removesuffix('-drop')}.json")  # ALLOC-drop: ALLOC's, Drop-Upcycled
    if os.path.exists(path) or a in run_allocs:
        return load(path)["new_experts_per_layer"]
    return prior["allocations"][a]["new_experts_per_layer"]


base = load(os.path.join(work, "base.eval.json"))
base_params = load(os.path.join(work, "base.inspect.json"))["parameters"]
results = {"model": model, "seeds": seeds, "budget": budget, "base_parameters": base_params, "allocations": {}}
rows = [["`base`", "-", "-", "0", "-"] + [f"{ppl(base, l):.2f}" for l in LANGS] + ["-"]]
missing = []  # (allocation, seeds without its stage-2 evaluation): a run spread over sittings
provenance = {}  # allocation -> (seeds from the published results.json, seeds of this run)
for a in allocs:
    per_layer = allocation_of(a)
    have = seeds_with(work, seeds, f"{a}-s2.eval.json") if a in run_allocs else []
    if a in run_allocs and len(have) < len(seeds):
        missing.append((a, [s for s in seeds if s not in have]))
    inspect = os.path.join(work, f"s{seeds[0]}", f"{a}.inspect.json")
    params = load(inspect)["parameters"] if os.path.exists(inspect) else None
    stages = {}
    for st in ("s1", "s2"):
        stages[st] = [{l: ppl(load(os.path.join(work, f"s{s}", f"{a}-{st}.eval.json")), l) for l in LANGS} for s in have]
    old_seeds, old_stages = published_entries(a, per_layer, have, stages)
    order = sorted(range(len(old_seeds) + len(have)), key=lambda i: seed_key((old_seeds + have)[i]))
    stages = {st: [(old_stages[st] + stages[st])[i] for i in order] for st in stages}
    provenance[a] = (old_seeds, have)
    have = [(old_seeds + have)[i] for i in order]
    if params is None and prior is not None and a in prior["allocations"]:
        params = prior["allocations"][a]["parameters"]
    results["allocations"][a] = {"new_experts_per_layer": per_layer, "parameters": params, "seeds": have, **stages}
    new_langs = [math.exp(statistics.mean(math.log(x[l]) for l in LANGS[1:])) for x in stages["s2"]]
    added = f"{(params - base_params) / 1e6:.2f} M" if params is not None else "-"
    rows.append([f"`{a}`", " ".join(map(str, per_layer)), str(sum(per_layer)), added,
                 ", ".join(have) if have else "not run"]
                + [fmt([x[l] for x in stages["s2"]]) for l in LANGS] + [fmt(new_langs)])

# Placement at equal budget: per seed, each control's geometric-mean perplexity on the new languages
# relative to NeuronMoE's on the same seed (negative: the control is better).
def geo(x):
    return math.exp(statistics.mean(math.log(x[l]) for l in LANGS[1:]))


paired = {}
if "neuronmoe" in results["allocations"]:
    nm = dict(zip(results["allocations"]["neuronmoe"]["seeds"], results["allocations"]["neuronmoe"]["s2"]))
    for a in allocs:
        if a == "neuronmoe":
            continue
        al = results["allocations"][a]
        both = sorted(((s, x) for s, x in zip(al["seeds"], al["s2"]) if s in nm), key=lambda sx: seed_key(sx[0]))
        d = [geo(x) / geo(nm[s]) - 1 for s, x in both]
        if d:
            paired[a] = {"seeds": [s for s, _ in both], "relative_geo_ppl": d,
                         "same_total": sum(al["new_experts_per_layer"]) == sum(results["allocations"]["neuronmoe"]["new_experts_per_layer"])}
results["paired_vs_neuronmoe"] = paired
hu_only = os.path.join(work, "alloc-hu-only.json")
if os.path.exists(hu_only):
    results["hu_only_new_experts_per_layer"] = load(hu_only)["new_experts_per_layer"]
evs = [load(os.path.join(work, f"s{s}", f"{a}-{st}.eval.json")) for a in run_allocs for s in seeds for st in ("s1", "s2")
       if os.path.exists(os.path.join(work, f"s{s}", f"{a}-{st}.eval.json"))]
results["eval_streams"] = stream_hashes(evs + [base])
merge_published(results, prior, published, seeds)
if reruns:
    results["reproduced"] = reruns

# The dense model's analysis: specific neurons per layer (union over the new languages), and the
# share that falls in the first and last quarter of the layers (the paper's "early and late
# layers" observation, made here on the model before upcycling).
neurons_path = os.path.join(work, "neurons", "neurons.json")
if os.path.exists(neurons_path):
    counts = [c["total"] for c in load(neurons_path)["union_counts"]]
    q = max(1, len(counts) // 4)
    total = sum(counts) or 1.0
    results["specific_neurons_per_layer"] = counts
    results["specific_neurons_share"] = {"first_quarter": sum(counts[:q]) / total,
                                         "middle_half": sum(counts[q:-q]) / total,
                                         "last_quarter": sum(counts[-q:]) / total}



def shares(values):
    """Share of the sum in the first quarter, the middle half and the last quarter of the layers."""
    q = max(1, len(values) // 4)
    total = sum(values) or 1.0
    return {"first_quarter": sum(values[:q]) / total, "middle_half": sum(values[q:-q]) / total,
            "last_quarter": sum(values[-q:]) / total}


def pearson(a, b):
    ma, mb = statistics.mean(a), statistics.mean(b)
    num = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    den = math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))
    return num / den if den else None


def expert_profile(report):
    """Per layer, from a `neurons` report of an MoE: the union's specific neurons per trainable
    routed expert, per frozen routed expert, in attention; and the totals of each kind."""
    layout, counts = report["layout"], report["union_counts"]
    frozen = layout.get("frozen_experts") or [[] for _ in layout["layers"]]
    per = {"trainable": [], "frozen": [], "attention": []}
    totals = {"trainable": 0.0, "frozen": 0.0, "attention": 0.0, "shared": 0.0}
    for l, (comps, c) in enumerate(zip(layout["layers"], counts)):
        sums = {"trainable": {}, "frozen": {}}
        att = 0.0
        for comp, n in zip(comps, c["per_component"]):
            name = comp["component"]
            parts = name.split(".")
            if len(parts) == 3 and parts[0] == "experts":
                e = int(parts[1])
                kind = "frozen" if e in frozen[l] else "trainable"
                sums[kind][e] = sums[kind].get(e, 0.0) + n
            elif len(parts) == 3:
                totals["shared"] += n
            elif name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                att += n
        for kind in ("trainable", "frozen"):
            v = list(sums[kind].values())
            per[kind].append(sum(v) / len(v) if v else 0.0)
            totals[kind] += sum(v)
        per["attention"].append(att)
        totals["attention"] += att
    return per, totals


def twins(out_dir, new_langs):
    """Of the trainable experts' specific neurons (union over the new languages: a neuron counts
    with its largest tie weight), how many have their twin — the same unit of the frozen expert
    they were copied from — specific too, and how many do not (an upper bound on the
    specialisation of their own: a neuron at the cut-off can flip with a tiny drift). The studio
    freezes copy 0: experts 0..G with granularity G, and expert e was copied from expert e mod G.
    Layers whose frozen experts are not 0..G are left out."""
    import csv
    frozen = load(os.path.join(out_dir, "neurons.json"))["layout"].get("frozen_experts") or []
    weight = {}
    with open(os.path.join(out_dir, "top_neurons.csv")) as f:
        for r in csv.DictReader(f):
            if r["kind"] == "top" and r["language"] in new_langs:
                k = (int(r["layer"]), r["component"], int(r["unit"]))
                weight[k] = max(weight.get(k, 0.0), float(r["weight"]))
    inherited = own = 0.0
    for (layer, comp, unit), w in weight.items():
        parts = comp.split(".")
        if len(parts) != 3 or parts[0] != "experts" or layer >= len(frozen):
            continue
        g, e = len(frozen[layer]), int(parts[1])
        if g == 0 or sorted(frozen[layer]) != list(range(g)) or e < g:
            continue
        if (layer, f"experts.{e % g}.{parts[2]}", unit) in weight:
            inherited += w
        else:
            own += w
    return {"with_specific_twin": inherited, "without": own}


BEFORE = " before training"


def analysed_seed(name):
    """(`allocation s<seed>`, seed) of a post-training analysis entry's name (`neuronmoe s1`, or
    `neuronmoe-drop s1 before training` for a Drop-Upcycled row's model before training)."""
    key = name.removesuffix(BEFORE)
    return key, key.rsplit(" s", 1)[-1]


analysis = {}
for a, sd, stage, suffix in [(a, sd, st, sf) for a in run_allocs for sd in analyse for st, sf in (("s2", ""), ("init", BEFORE))]:
    # (a Drop-Upcycled row's model before training too: its fresh units' chance selectivity)
    path = os.path.join(work, f"s{sd}", f"{a}-{stage}.neurons", "neurons.json")
    if not os.path.exists(path):
        continue
    per, totals = expert_profile(load(path))
    entry = {"per_layer": per, "totals": totals, "trainable_shares": shares(per["trainable"]),
             "frozen_shares": shares(per["frozen"]),
             # At initialisation every new expert is a copy of the frozen expert 0 and has its
             # neurons (same AP), so this ratio is 1; training moves it.
             "trainable_to_frozen_per_expert": (sum(per["trainable"]) / sum(per["frozen"])
                                                if sum(per["frozen"]) else None)}
    entry["twins"] = twins(os.path.dirname(path), LANGS[1:])
    if "specific_neurons_per_layer" in results:
        entry["pearson_trainable_vs_dense"] = pearson(per["trainable"], results["specific_neurons_per_layer"])
        entry["pearson_frozen_vs_dense"] = pearson(per["frozen"], results["specific_neurons_per_layer"])
    analysis[f"{a} s{sd}{suffix}"] = entry
# The published seeds' analyses come through (pooling one allocation at a time would otherwise drop
# them); one this run made again is refused, as a row's seed is, unless it was trained again on
# purpose and reproduced (RERUN_SEEDS: this run's analysis replaces it).
for name, entry in ((prior or {}).get("post_training") or {}).items():
    key, seed = analysed_seed(name)
    if seed in published:
        if name in analysis and key in reruns:
            continue
        if name in analysis:
            sys.exit(f"PUBLISHED_SEEDS: the post-training analysis `{name}` is both published and made by this run")
        analysis[name] = entry
if analysis:
    results["post_training"] = analysis

os.makedirs(out, exist_ok=True)
# Task accuracy (issue 36): `eval --task` reports of the base and of every allocation after stage 2.
# With the published seeds' records (report_common.pooled_tasks).
task_rows = [("base", *pooled_tasks(work, None, prior, published, "base", "base.tasks.json"))]
task_rows += [(a, *pooled_tasks(work, seeds if a in run_allocs else [], prior, published, a, f"{a}-s2.tasks.json", RERUN))
              for a in allocs]
task_rows = [(a, evs, recs) for a, evs, recs in task_rows if evs]
results["task_accuracy"] = {a: recs for a, _, recs in task_rows}
# Each control against NeuronMoE on the same items, per seed of this run that scored both (the
# models differ in placement only, so the paired s.e. is what tells a difference from none). Both
# must be this run's allocations: a model on disk that this run did not check is not paired.
TASKS = ["docs"] + LANGS[1:]
task_pairs = paired_tasks(work, seeds, prior, published,
                          [(a, "neuronmoe") for a in run_allocs if a != "neuronmoe" and "neuronmoe" in run_allocs],
                          TASKS, rel="{}-s2.tasks.json")
if task_pairs:
    results["task_accuracy_paired"] = task_pairs

with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
fig_ppl = figure(out, "ppl", {
    "kind": "bars", "title": f"NeuronMoE on {os.path.basename(model)}: perplexity after stage 2 by allocation",
    "y": "perplexity", "categories": LANGS,
    "series": [{"name": "base", "values": [ppl(base, l) for l in LANGS]}]
    + [{"name": f"{a} (+{sum(results['allocations'][a]['new_experts_per_layer'])} experts)",
        "values": [mean_or_none([x[l] for x in results["allocations"][a]["s2"]]) for l in LANGS]}
               for a in allocs if results["allocations"][a]["s2"]],
})
fig = os.path.join(work, "alloc-neuronmoe.comparison.png")
if os.path.exists(fig):
    shutil.copy(fig, os.path.join(out, "allocations.png"))
with open(os.path.join(out, "README.md"), "w") as f:
    f.write("# NeuronMoE on a real model: experts per layer from language-specific neurons\n\n")
    if smoke == "1":
        f.write("**Smoke run** (stories260K, a few steps): checks the pipeline; the numbers mean nothing.\n\n")
    f.write(f"Model `{os.path.basename(model)}`; new languages hu, el, tr (en original); seeds {', '.join(results['seeds'])}"
            f" (mean ± std); {budget}. Perplexity after stage 2 on `lang/<code>/valid.txt` and, for English,"
            " `domain/docs/valid.txt`.\n\n"
            "**Protocol (issue 35, 2026-12-03).** English is GNOME help text (`domain/docs`), the same kind of text"
            " as the Hungarian, Greek and Turkish help pages, so that the neuron scores and the LayerMoE"
            " similarities compare languages, not genres (the tables before used 1961 Brown prose for English);"
            " the neuron analysis takes each paragraph as one text (`neurons --docs line`); training and"
            " evaluation read documents separated by blank lines, each followed by `<|endoftext|>`"
            " (docs/methods.md §7). The controls `uniform`, `shuffled`, `inverted` and `layermoe-placed` add"
            " exactly as many experts as NeuronMoE (the earlier uniform baseline added 60 against 51), so they"
            " differ from it only in where the experts go: NeuronMoE's claim is about placement. LayerMoE-style"
            " (`layermoe`) keeps its own total."
            + (" `neuronmoe-drop` is NeuronMoE's allocation with its new experts Drop-Upcycled (half of each"
               " new expert's units drawn afresh, `--drop-ratio 0.5`), so that the post-training analysis can"
               " separate neurons the new experts acquired from neurons they inherited as copies of expert 0."
               if any(a.endswith("-drop") for a in allocs) else "")
            + "\n\n")
    f.write(pooling_note(published, seeds, provenance, "allocation", "allocations"))
    if reruns:
        f.write("Trained again here on purpose (`RERUN_SEEDS`, for what its published run directory no longer"
                " holds: the post-training analysis, task scores) and checked against the published perplexities"
                " after stage 1 and stage 2 in every language (tolerance 1e-3 relative): "
                + "; ".join(f"`{k}` largest relative difference {v:.1e}" for k, v in reruns.items())
                + ". This run's entries replace the published ones.\n\n")
    f.write(unfinished_note(missing))
    f.write("| allocation | new experts per layer | experts added | parameters added | seeds | ppl en | ppl hu |"
            " ppl el | ppl tr | geometric mean ppl, new languages |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        f.write("| " + " | ".join(r) + " |\n")
    f.write(fig_ppl)
    if task_rows:
        items = task_items([ev for _, evs, _ in task_rows for ev in evs])
        f.write("\n## Task accuracy after stage 2\n\n"
                "Next-paragraph multiple choice on the held-out text (`tests/reference/make_tasks.py`,"
                f" {items} items per task, 4 choices: chance 25 %; English = `domain/docs`, the"
                f" text of the English perplexity), {TASK_SCORING}. The paper reports benchmark accuracy per language; this is its small-scale"
                " stand-in. Mean ± std over the runs (the seeds that ran); a single run shows its standard error over the items (s.e., lm-eval's `acc_stderr`).\n\n"
                "| allocation | runs | acc_norm en | acc_norm hu | acc_norm el | acc_norm tr | acc en | acc hu | acc el |"
                " acc tr |\n|---|---|---|---|---|---|---|---|---|---|\n")
        for a, evs, _ in task_rows:
            f.write(f"| `{a}` | {len(evs)} | {acc_cells(evs, TASKS)} |\n")
        f.write(paired_tasks_markdown(task_pairs))
    if paired:
        f.write("\n## Placement at equal budget: each allocation against NeuronMoE, paired by seed\n\n"
                "Geometric-mean perplexity over hu, el, tr after stage 2, relative to NeuronMoE's on the same seed"
                " (negative: the control does better than NeuronMoE).\n\n| allocation | same total as NeuronMoE |"
                " seeds | relative geometric-mean ppl |\n|---|---|---|---|\n")
        for a, x in paired.items():
            f.write(f"| `{a}` | {'yes' if x['same_total'] else 'no'} | {', '.join(x['seeds'])} |"
                    f" {fmt(x['relative_geo_ppl'], 2, True)} |\n")
    if "hu_only_new_experts_per_layer" in results:
        f.write("\nPer-language allocation (the paper allocates for each language): from Hungarian's specific"
                " neurons alone: " + " ".join(map(str, results["hu_only_new_experts_per_layer"]))
                + f" (total {sum(results['hu_only_new_experts_per_layer'])}), against the union's above.\n")
    if os.path.exists(fig):
        f.write("\n![allocations](allocations.png)\n")
    if "specific_neurons_per_layer" in results:
        sh = results["specific_neurons_share"]
        c = results["specific_neurons_per_layer"]
        f.write("\n## Where the language-specific neurons are (the dense model)\n\n"
                f"Specific neurons per layer (union over {', '.join(LANGS[1:])}, top-N by average precision,"
                f" tie-weighted): {' '.join(f'{x:.0f}' for x in c)}. Share in the first quarter of the layers"
                f" {sh['first_quarter'] * 100:.1f} %, the middle half {sh['middle_half'] * 100:.1f} %, the last"
                f" quarter {sh['last_quarter'] * 100:.1f} % (a uniform spread would give 25 / 50 / 25 %).\n")
    if analysis:
        f.write("\n## After training: where the new experts' language-specific neurons are\n\n"
                "`neurons` on each trained model (stage 2), every expert's gate/up/down units included (each"
                " expert evaluated on every token; methods.md §3.7), the same texts and top-N as on the dense"
                " model. Per layer, the specific neurons of the union over the new languages per trainable"
                " (new) expert, so layers with more experts do not count more; the frozen expert 0 is the"
                " original FFN. Each new expert starts as a copy of expert 0, with the same neurons and"
                " the same average precision, so at initialisation a new expert and expert 0 count alike"
                " in every layer (ratio 1 in the table); what training changed is the difference between"
                " them (a `-drop` row's new experts start with half their units drawn afresh, so for them"
                " neither holds at initialisation; a unit drawn afresh can be language-selective by chance, so"
                " the row `… before training` is the same analysis of that model before training, and what"
                " training added is the difference). The last column counts the new experts' specific neurons whose twin (the same"
                " unit of expert 0) is not specific: at most what the new expert acquired on its own (a"
                " neuron at the cut-off can flip with a tiny drift).\n\n"
                "| model | specific neurons in trainable / frozen experts / attention | per trainable expert:"
                " first quarter / middle half / last quarter | correlation with the dense model's S_l:"
                " trainable / frozen | per expert, trainable : frozen (1 at initialisation) |"
                " trainable experts' specific neurons without a specific twin in expert 0 |"
                "\n|---|---|---|---|---|---|\n")
        for name, e in analysis.items():
            t, sh = e["totals"], e["trainable_shares"]
            corr = "-"
            if "pearson_trainable_vs_dense" in e:
                corr = " / ".join("-" if x is None else f"{x:.2f}"
                                  for x in (e["pearson_trainable_vs_dense"], e["pearson_frozen_vs_dense"]))
            ratio = e["trainable_to_frozen_per_expert"]
            own, tw = e["twins"]["without"], e["twins"]["with_specific_twin"]
            f.write(f"| `{name}` | {t['trainable']:.0f} / {t['frozen']:.0f} / {t['attention']:.0f} |"
                    f" {sh['first_quarter'] * 100:.1f} / {sh['middle_half'] * 100:.1f} /"
                    f" {sh['last_quarter'] * 100:.1f} % | {corr} | {'-' if ratio is None else f'{ratio:.3f}'} |"
                    f" {own:.0f} of {own + tw:.0f} ({100 * own / max(own + tw, 1e-9):.1f} %) |\n")
        for name, e in analysis.items():
            for kind in ("trainable", "frozen"):
                f.write(f"\n`{name}`, per {kind} expert by layer: "
                        + " ".join(f"{x:.0f}" for x in e["per_layer"][kind]) + "\n")
        series = []
        if "specific_neurons_per_layer" in results:
            c = results["specific_neurons_per_layer"]
            series.append({"name": "dense model: all of a layer", "points": [[i, x] for i, x in enumerate(c)]})
        for name, e in analysis.items():
            for kind, label in (("trainable", "per trainable expert"), ("frozen", "per frozen expert")):
                series.append({"name": f"{name}: {label}",
                               "points": [[i, x] for i, x in enumerate(e["per_layer"][kind])]})
        f.write(figure(out, "post_training", {
            "kind": "lines", "title": "Specific neurons (union of hu, el, tr) per layer after training",
            "x": "layer", "y": "specific neurons", "series": series}))
    write_commands(f, work, "neuronmoe", smoke)
print(open(os.path.join(out, "README.md")).read())
