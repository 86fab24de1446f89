#!/usr/bin/env python3
"""Tables of experiments/deltamoe.sh (issue 35): retention of the base's English, Hungarian gain and
the grafted ability for the MoE (stage 1, stage 2, each + Δ) against dense CPT at equal tokens, at
equal FLOPs and with the stage-2 replay (each + Δ) and linear averaging; mean ± std over seeds; the
2x2, learning-rate, token and expert-count analyses when they ran. Standard library only.

Usage: deltamoe_report.py [--check-published|--pair-only] WORK OUT SMOKE MODEL "SEEDS" "PARTS_SEEDS" "BUDGET"
                          ["PARTS" [TOKEN_STEPS]]
Writes OUT/results.json and OUT/README.md; --pair-only runs only the published-pair check (below)
and writes nothing, so that deltamoe.sh can stop before the seeds' training when it fails;
--check-published, before anything is trained, only the PUBLISHED_SEEDS checks that need no run
(no published seed dropped, no published analysis with another result here; the budget is checked
by --pair-only, once the pair is trained). PARTS (default all four)
are the analyses this run was asked for: only their rows count as unfinished or repeated. With PUBLISHED_SEEDS (e.g. "1") the headline rows keep
those seeds' numbers from OUT/results.json (report_common.published_results), after checking that
this run's base/post pair and instruct model score what the published ones did.
"""
import math
import os
import re
import statistics
import sys

from report_common import (TASK_SCORING, acc_cells, task_items, curve, figure, fmt, load, mean_or_none, merge_published, open_report,
                           paired_tasks, paired_tasks_markdown, pooled_tasks, ppl, published_note, published_results,
                           seeds_with, stream_hashes, unfinished_note, write_commands)

pair_only = sys.argv[1:2] == ["--pair-only"]
check_only = sys.argv[1:2] == ["--check-published"]
args = sys.argv[2:] if pair_only or check_only else sys.argv[1:]
work, out, smoke, model, seeds, parts_seeds, budget = args[:7]
parts_asked = (args[7] if len(args) > 7 else "2x2 lr tokens ablation").split()
token_steps = args[8] if len(args) > 8 else None
seeds, parts_seeds = seeds.split(), parts_seeds.split()
TEXTS = ["en", "hu", "math"]
# Seeds published by an earlier sitting (their run directories are gone): their per-seed
# perplexities come from the published results.json.
published, prior = published_results(out, None if check_only else budget, seeds)
# A published seed may be among PARTS_SEEDS: its analyses run in a later sitting and are paired with
# its published headline rows (collect() refuses a row that both sittings have for the same seed).
# The pair is trained once, with seed 0, so a later sitting retrains the same base and post; the
# published seeds are relative to the published pair, so this run's must score the same (relative
# difference at most PAIR_TOLERANCE on every text), or mixing the seeds would compare two pairs.
# 1e-3 is the precision of the retention columns (0.1 %); another CPU's kernels can move the
# retrained pair by less than that, an other pair moves it by far more.
PAIR_TOLERANCE = 1e-3

HEADLINE = [
    ("cpt", "dense CPT on hu (stage-1 tokens)"),
    ("cpt+delta", "dense CPT + Δ (the paper's dense delta merging)"),
    ("cpt-flops", "dense CPT at the MoE stage 1's training FLOPs"),
    ("cpt-flops+delta", "dense CPT at matched FLOPs + Δ"),
    ("cpt-replay", "cpt + the stage-2 budget on hu + en replay (dense, the MoE's stage-2 data)"),
    ("cpt-replay+delta", "cpt-replay + Δ"),
    ("average", "linear average of cpt and post"),
    ("moe-4-s1", "MoE 4 experts (3 trainable) top-2, stage 1 on hu"),
    ("moe-4-s1+delta", "stage 1 + Δ (the paper's main pipeline)"),
    ("moe-4-s2", "+ stage 2: router tuning with en replay + prior (the paper's ablation)"),
    ("moe-4-s2+delta", "stage 2 + Δ"),
]
PARTS = [
    ("cpt-ffn", "2x2: dense, FFN-only trainable (`--stage ffn`)"),
    ("cpt-ffn+delta", "2x2: dense FFN-only + Δ"),
    ("moe-4-all", "2x2: MoE, all but expert 0 trainable (`--stage all`)"),
    ("moe-4-all+delta", "2x2: MoE all-trainable + Δ"),
]
# deltamoe.sh's lr part trains these (the two lists must agree); the headline's lr is LR (1e-4),
# read from the budget line ("stage 1 and cpt: ... tokens, lr LR; ..."). A sweep lr equal to the
# headline's (the smoke's 1e-3) is the headline's own runs: deltamoe.sh skips it, and so does this.
_lr = re.search(r" tokens, lr ([^;]+);", budget)
LR_HEAD = _lr[1] if _lr else None


def same_lr(a, b):
    """Whether two learning rates written as text are the same number ("1e-3" and "0.001")."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


SWEEP_LRS = [lr for lr in ("3e-4", "1e-3") if not same_lr(lr, LR_HEAD)]
for lr in SWEEP_LRS:
    PARTS += [(f"cpt-lr{lr}", f"lr sweep: dense CPT at lr {lr}"),
              (f"cpt-lr{lr}+delta", f"lr sweep: dense CPT at lr {lr} + Δ"),
              (f"moe-4-s1-lr{lr}", f"lr sweep: MoE stage 1 at lr {lr}"),
              (f"moe-4-s1-lr{lr}+delta", f"lr sweep: MoE stage 1 at lr {lr} + Δ")]
steps_rows = sorted({f.split(".eval.json")[0] for s in parts_seeds if os.path.isdir(os.path.join(work, f"s{s}"))
                     for f in os.listdir(os.path.join(work, f"s{s}")) if "-steps" in f and f.endswith(".eval.json")}
                    | {m for m in (prior or {}).get("seeds_per_method", {}) if "-steps" in m})
if "tokens" in parts_asked and token_steps is not None:
    steps_rows = sorted(set(steps_rows) | {f"{m}-steps{token_steps}{d}" for m in ("cpt", "moe-4-s1") for d in ("", "+delta")})
PARTS += [(m, "token sweep: " + m) for m in steps_rows]
# deltamoe.sh's ablation part trains these expert counts (the two lists must agree); 4 is the headline.
ABLATION_EXPERTS = ("2", "3", "5")
for e in ABLATION_EXPERTS:
    PARTS += [(f"moe-{e}-s1", f"ablation: {e} experts ({int(e) - 1} trainable), stage 1"),
              (f"moe-{e}-s1+delta", f"ablation: {e} experts, stage 1 + Δ"),
              (f"moe-{e}-s2", f"ablation: {e} experts, stage 2"),
              (f"moe-{e}-s2+delta", f"ablation: {e} experts, stage 2 + Δ")]


def part_of(m):
    """The PARTS analysis that makes row `m` (None for a headline row)."""
    if m.startswith(("cpt-ffn", "moe-4-all")):
        return "2x2"
    if "-lr" in m:
        return "lr"
    if "-steps" in m:
        return "tokens"
    if m.startswith(tuple(f"moe-{e}-" for e in ABLATION_EXPERTS)):
        return "ablation"
    return None


def asked(m):
    """Whether this run was asked for row `m` (the token sweep: at its TOKEN_STEPS, when given)."""
    p = part_of(m)
    if p is None:
        return True
    if p == "tokens" and token_steps is not None:
        return p in parts_asked and m.split("-steps")[1].split("+")[0] == token_steps
    return p in parts_asked


def published_value(m, s):
    """Row `m`'s published perplexities of seed `s` ({text: ppl}), or None."""
    pm = (prior or {}).get("seeds_per_method", {})
    return dict(zip(pm.get(m, []), (prior or {}).get("methods", {}).get(m, []))).get(s) if s in published else None


def same_run(m, s):
    """Whether this run's result of row `m`, seed `s` is the published one itself (the run directory
    kept from the sitting that published it, e.g. a part published while another part of the same
    analysis still trained): the same perplexities on every text, to the bit."""
    path = os.path.join(work, f"s{s}", f"{m}.eval.json")
    if not os.path.exists(path):
        return False
    ev = load(path)
    return published_value(m, s) == {t: ppl(ev, t) for t in TEXTS}


# deltamoe.sh does not train an analysis row the published results have (PUBLISHED_ROWS); one whose
# result here differs from the published one would be two copies of it: refused before training.
if prior is not None:
    again = [(m, s) for m, _ in PARTS if asked(m) for s in parts_seeds
             if published_value(m, s) is not None
             and os.path.exists(os.path.join(work, f"s{s}", f"{m}.eval.json")) and not same_run(m, s)]
    if again:
        sys.exit("PUBLISHED_SEEDS: the published results.json already has "
                 + ", ".join(f"row {m} of seed {s}" for m, s in again)
                 + f", and {work} has another result of it: one of the two would be dropped (move that"
                 " run directory away, or leave those parts or seeds out)")
if check_only:
    # The published analysis rows ("row@seed"): deltamoe.sh does not train them again.
    pm = (prior or {}).get("seeds_per_method", {})
    print(" ".join(f"{m}@{s}" for m, have in pm.items() if part_of(m) for s in have if s in published))
    sys.exit(0)

base = load(os.path.join(work, "base.eval.json"))
post = load(os.path.join(work, "post.eval.json"))
instruct = load(os.path.join(work, "instruct.eval.json"))
bp = {t: ppl(base, t) for t in TEXTS}
flops = {}
if os.path.exists(os.path.join(work, "flops.txt")):
    for line in open(os.path.join(work, "flops.txt")):
        k, v = line.split()
        flops[k] = float(v)

results = {"model": model, "seeds": seeds, "parts_seeds": parts_seeds, "budget": budget, "flops": flops,
           "instruct": {t: ppl(instruct, t) for t in TEXTS}, "base": bp, "post": {t: ppl(post, t) for t in TEXTS},
           "methods": {}, "seeds_per_method": {}}
if prior is not None:
    worst = 0.0
    for which in ("instruct", "base", "post"):
        for t in TEXTS:
            was, now = prior[which][t], results[which][t]
            rel = abs(now / was - 1) if math.isfinite(now) and math.isfinite(was) and was > 0 else math.inf
            worst = max(worst, rel)
            if not rel <= PAIR_TOLERANCE:
                sys.exit(f"PUBLISHED_SEEDS: `{which}` scores ppl {now:.6g} on {t} in this run and {was:.6g} in the"
                         f" published {os.path.join(out, 'results.json')} (relative difference {rel:.2e} >"
                         f" {PAIR_TOLERANCE:g}): not the same pair, so the seeds cannot be pooled; run every seed"
                         f" here instead (SEEDS=\"1 2 3\" without PUBLISHED_SEEDS, OUT a copy)")
    results["pair_vs_published"] = worst
if pair_only:
    if prior is not None:
        print(f"published pair reproduced: relative difference {results['pair_vs_published']:.1e}"
              f" <= {PAIR_TOLERANCE:g}")
    sys.exit(0)
missing = []
# {method: {seed: {text: ppl}}}, the published seeds first; the per-text NLL is ln(ppl) (eval's
# ppl is exp of its mean NLL).
per_seed = {}
# {(method, seed): this run's `eval --json` report}, read once by collect().
this_run = {}


def collect(m, its_seeds):
    """Row `m`'s per-seed perplexities: the published seeds' (headline and analyses alike) and this
    run's seeds `its_seeds` that have its results. A row this run was not asked for (`asked`)
    takes this run's results only for seeds the published results lack, and is never unfinished."""
    have = seeds_with(work, its_seeds, f"{m}.eval.json")
    runs = {}
    if prior is not None:
        for s, p in zip(prior["seeds_per_method"].get(m, []), prior["methods"].get(m, [])):
            if s in published:
                runs[s] = p
    if not asked(m):
        have = [s for s in have if s not in runs]
    elif len(have) < len(its_seeds):
        missing.append((m, [s for s in its_seeds if s not in have and s not in runs]))
    # The published result itself, from its kept run directory, is the same number: not a second copy.
    have = [s for s in have if not (s in runs and same_run(m, s))]
    both = [s for s in have if s in runs]
    if both:
        sys.exit(f"PUBLISHED_SEEDS: row {m} of seed(s) {' '.join(both)} is in the published results.json and in"
                 f" this run ({work}/s<seed>/{m}.eval.json): one of the two would be dropped")
    for s in have:
        ev = this_run[(m, s)] = load(os.path.join(work, f"s{s}", f"{m}.eval.json"))
        runs[s] = {t: ppl(ev, t) for t in TEXTS}
    per_seed[m] = runs
    results["methods"][m] = list(runs.values())
    results["seeds_per_method"][m] = list(runs)
    return runs


def row(m, label, runs):
    p = list(runs.values())
    return ([f"`{m}`", label, ", ".join(runs) if runs else "not run"] + [fmt([x[t] for x in p]) for t in TEXTS]
            + [fmt([bp["en"] / x["en"] for x in p], 1, True),
               fmt([math.log(bp["en"]) / math.log(x["en"]) for x in p], 1, True),
               fmt([bp["hu"] / x["hu"] for x in p], 2), fmt([results["post"]["math"] / x["math"] for x in p], 1, True)])


fixed = [["`instruct`", "SmolLM2-135M-Instruct as downloaded (what the pair starts from)", "-"]
         + [f"{ppl(instruct, t):.2f}" for t in TEXTS] + ["-"] * 4,
         ["`base`", "instruct adapted on lang/en (the plain-text base; retention is measured against it)", "-"]
         + [f"{bp[t]:.2f}" for t in TEXTS] + ["100.0%", "100.0%", "1.00", "-"],
         ["`post`", "base fine-tuned on domain/math (Δ = post − base)", "-"]
         + [f"{ppl(post, t):.2f}" for t in TEXTS]
         + [f"{bp['en'] / ppl(post, 'en') * 100:.1f}%", f"{math.log(bp['en']) / math.log(ppl(post, 'en')) * 100:.1f}%",
            f"{bp['hu'] / ppl(post, 'hu'):.2f}", "100.0%"]]
head_rows = [row(m, label, collect(m, seeds)) for m, label in HEADLINE]
part_rows = [row(m, label, collect(m, parts_seeds)) for m, label in PARTS]
part_rows = [r for r in part_rows if r[2] != "not run"]
if prior is not None:
    # Every published row must come through: a row this report no longer knows would vanish.
    lost = [m for m, have in prior.get("seeds_per_method", {}).items()
            if set(have) & set(published) and not set(have) & set(per_seed.get(m, {}))]
    if lost:
        sys.exit(f"PUBLISHED_SEEDS: the published results have row(s) {', '.join(lost)} for seed(s)"
                 f" {' '.join(published)}, which this report does not know: they would be dropped")
# A token-sweep or lr-sweep point whose partner (the dense or the MoE run at the same steps or lr)
# has a seed it lacks is unfinished whatever this run was asked for (e.g. a dense point published
# while the MoE trained).
for m in [m for m, _ in PARTS if part_of(m) in ("tokens", "lr")]:
    partner = (m.replace("cpt-", "moe-4-s1-", 1) if m.startswith("cpt-") else m.replace("moe-4-s1-", "cpt-", 1))
    lack = [s for s in results["seeds_per_method"].get(partner, []) if s not in results["seeds_per_method"].get(m, [])]
    if lack and not asked(m):
        missing.append((m, lack))
missing = [(m, s) for m, s in missing if s and (m in dict(HEADLINE) or asked(m) or part_of(m) in ("tokens", "lr"))]


def mean_of(m, t):
    return statistics.mean(x[t] for x in results["methods"][m])


def ran(*ms):
    return all(results["methods"].get(m) for m in ms)


def paired(a, b, t):
    """Per seed both ran: (a - b) / b of text t's perplexity, as a list."""
    common = [s for s in per_seed[a] if s in per_seed[b]]
    return [per_seed[a][s][t] / per_seed[b][s][t] - 1 for s in common], common


claims = []
if ran("moe-4-s1+delta", "cpt+delta"):
    d_en, c = paired("moe-4-s1+delta", "cpt+delta", "en")
    d_hu, _ = paired("moe-4-s1+delta", "cpt+delta", "hu")
    claims.append(("DeltaMoE's main pipeline (MoE stage 1 + Δ) keeps the base's English better than dense CPT + Δ",
                   all(x < 0 for x in d_en),
                   f"en ppl {mean_of('moe-4-s1+delta', 'en'):.2f} vs {mean_of('cpt+delta', 'en'):.2f} "
                   f"({fmt(d_en, 1, True)} per seed, seeds {', '.join(c)}); hu ppl {mean_of('moe-4-s1+delta', 'hu'):.2f} vs "
                   f"{mean_of('cpt+delta', 'hu'):.2f} ({fmt(d_hu, 1, True)})"))
if ran("moe-4-s1+delta", "cpt-flops+delta"):
    d_en, c = paired("moe-4-s1+delta", "cpt-flops+delta", "en")
    d_hu, _ = paired("moe-4-s1+delta", "cpt-flops+delta", "hu")
    claims.append(("at matched training FLOPs the MoE + Δ keeps English better than dense CPT + Δ",
                   all(x < 0 for x in d_en),
                   f"en {fmt(d_en, 1, True)}, hu {fmt(d_hu, 1, True)} (MoE relative to dense, per seed mean ± std; "
                   f"FLOPs/token stage 1 {flops.get('moe-4-experts', 0):.3f} vs dense {flops.get('dense', 0):.3f} GFLOP)"))
if ran("moe-4-s1+delta"):
    claims.append(("the graft carries the ability onto the MoE (math ppl near post's, far below base's)",
                   mean_of("moe-4-s1+delta", "math") < 0.5 * (bp["math"] + results["post"]["math"]),
                   f"math ppl {mean_of('moe-4-s1+delta', 'math'):.2f}; post {results['post']['math']:.2f}, base {bp['math']:.2f}"))
if ran("moe-4-s2", "moe-4-s1"):
    d_en, c = paired("moe-4-s2", "moe-4-s1", "en")
    claims.append(("stage 2 (router tuning with English replay and the language prior) recovers English",
                   all(x < 0 for x in d_en), f"en ppl change from stage 1 {fmt(d_en, 1, True)}"))
if ran("moe-4-s2+delta", "cpt-replay+delta"):
    d_en, c = paired("moe-4-s2+delta", "cpt-replay+delta", "en")
    d_hu, _ = paired("moe-4-s2+delta", "cpt-replay+delta", "hu")
    claims.append(("with the same English replay given to the dense model, the MoE (stage 2 + Δ) still keeps English better",
                   all(x < 0 for x in d_en), f"en {fmt(d_en, 1, True)}, hu {fmt(d_hu, 1, True)} (MoE relative to dense)"))
results["claims"] = [{"claim": c, "holds": ok, "numbers": n} for c, ok, n in claims]


# Scale or recipe (issue 35 item 3): the MoE's edge over dense CPT, each + Δ, split in log space
# into what training the FFNs alone does to the dense model (the recipe: cpt-ffn against cpt) and what
# the MoE adds at that same recipe (moe-4-s1 against cpt-ffn):
#   ln(moe/cpt) = ln(cpt_ffn/cpt) + ln(moe/cpt_ffn)   (per seed, per text)
# and the same gap at the token sweep's longer training (TOKEN_STEPS): does it close with tokens?
def log_gap(a, b, t):
    """Per seed both ran: ln(ppl_a / ppl_b) on text t (from `paired`), and those seeds."""
    if a not in per_seed or b not in per_seed:
        return [], []
    d, common = paired(a, b, t)
    return [math.log1p(x) for x in d], common


def mean_pct(xs):
    """Mean of log ratios as a percentage change of perplexity; None without values."""
    return (math.exp(statistics.mean(xs)) - 1) * 100 if xs else None


scale = {}
if ran("cpt-ffn+delta", "cpt+delta", "moe-4-s1+delta"):
    for t in TEXTS:
        total, c = log_gap("moe-4-s1+delta", "cpt+delta", t)
        recipe, c2 = log_gap("cpt-ffn+delta", "cpt+delta", t)
        moe, c3 = log_gap("moe-4-s1+delta", "cpt-ffn+delta", t)
        both = [s for s in c if s in c2 and s in c3]
        if not both:
            continue
        pick = lambda xs, cs: [x for x, s in zip(xs, cs) if s in both]
        total, recipe, moe = pick(total, c), pick(recipe, c2), pick(moe, c3)
        r_, m_ = statistics.mean(recipe), statistics.mean(moe)
        # The recipe's share of the whole gap, only where both parts go the same way (else a share
        # is negative or above 1 and says nothing).
        share = r_ / (r_ + m_) if r_ * m_ > 0 else None
        entry = {"seeds": both, "moe_vs_dense_pct": mean_pct(total), "recipe_pct": mean_pct(recipe),
                 "moe_at_same_recipe_pct": mean_pct(moe), "recipe_share": share}
        all_gap, c4 = log_gap("moe-4-all+delta", "cpt+delta", t)
        all_gap = [x for x, s in zip(all_gap, c4) if s in both]
        if all_gap:
            entry["moe_all_vs_dense_pct"] = mean_pct(all_gap)
        scale[t] = entry
tokens = {}


def gap_beside_headline(moe, dense, t):
    """(seeds, headline gap %, this gap %) on text t: the headline's MoE stage 1 + Δ against dense
    CPT + Δ, and `moe` against `dense`, both over the seeds that ran the two pairs; None without any."""
    short, c = log_gap("moe-4-s1+delta", "cpt+delta", t)
    other, c2 = log_gap(moe, dense, t)
    both = [s for s in c if s in c2]
    if not both:
        return None
    return (both, mean_pct([x for x, s in zip(short, c) if s in both]),
            mean_pct([x for x, s in zip(other, c2) if s in both]))


for m in steps_rows:
    if not m.startswith("cpt-steps") or m.endswith("+delta"):
        continue
    n = m[len("cpt-steps"):]
    for t in TEXTS:
        g = gap_beside_headline(f"moe-4-s1-steps{n}+delta", f"{m}+delta", t)
        if g:
            tokens.setdefault(n, {})[t] = {"seeds": g[0], "gap_at_stage1_tokens_pct": g[1],
                                           "gap_at_more_tokens_pct": g[2]}
# The lr sweep, like for like: the MoE stage 1 + Δ against dense CPT + Δ trained at the same lr.
lrs = {}
for lr in SWEEP_LRS:
    for t in TEXTS:
        g = gap_beside_headline(f"moe-4-s1-lr{lr}+delta", f"cpt-lr{lr}+delta", t)
        if g:
            lrs.setdefault(lr, {})[t] = {"seeds": g[0], "gap_at_headline_lr_pct": g[1], "gap_at_lr_pct": g[2]}
# Expert count (the paper's ablation: more than 3 trainable experts gains little): each count's
# stage 1 + Δ and stage 2 + Δ (and stage 1's Hungarian before Δ), over the seeds every count present
# ran (the headline's 4 experts only on those), with the change from the next smaller count, log-paired
# per seed. Trainable parameters and training FLOPs per token of each count's stage 1 come from the
# pair's base config (experiments/flops.py), so a critic sees that more experts are more parameters.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flops as flops_py  # noqa: E402

_base_cfg = os.path.join(work, "pair", "base", "final", "config.json")
_sh = re.search(r"stage 1 and cpt: \d+ x \d+ x (\d+) tokens", budget)
_cfg = load(_base_cfg) if os.path.exists(_base_cfg) and _sh else None
expert_count = {}
_counts = sorted({"4", *ABLATION_EXPERTS}, key=int)
for stage in ("s1", "s2"):
    present = [e for e in _counts if per_seed.get(f"moe-{e}-{stage}+delta")]
    if not set(present) & set(ABLATION_EXPERTS):
        continue
    common = sorted(set.intersection(*(set(per_seed[f"moe-{e}-{stage}+delta"]) for e in present)), key=int)
    if not common:
        continue
    for i, e in enumerate(present):
        m = f"moe-{e}-{stage}+delta"
        entry = {"trainable_experts": int(e) - 1, "seeds": common,
                 "ppl": {t: statistics.mean(per_seed[m][s][t] for s in common) for t in TEXTS}}
        if stage == "s1" and all(s in per_seed.get(f"moe-{e}-s1", {}) for s in common):
            entry["hu_before_delta"] = statistics.mean(per_seed[f"moe-{e}-s1"][s]["hu"] for s in common)
        if _cfg is not None:
            d, _, _, _, ffn, _, layers = flops_py.shapes(_cfg)
            entry["trainable_params"] = layers * ((int(e) - 1) * ffn + int(e) * d)
            entry["stage1_gflop_per_token"] = flops_py.gflop(_cfg, "experts", int(_sh[1]), int(e), 2, 1)
        if i > 0:
            prev = f"moe-{present[i - 1]}-{stage}+delta"
            step = {}
            for t in TEXTS:
                d_, c = log_gap(m, prev, t)
                keep = [x for x, s in zip(d_, c) if s in common]
                step[t] = mean_pct(keep)
            entry["change_from"] = {"model": prev, "pct": step}
        expert_count.setdefault(stage, {})[e] = entry
# The noise floor beside a one-seed ablation: the headline's 4 experts over all its seeds.
_h = per_seed.get("moe-4-s1+delta", {})
if expert_count and len(_h) > 1:
    results["expert_count_headline_spread"] = {
        "seeds": sorted(_h, key=int),
        "range_pct": {t: (max(v[t] for v in _h.values()) / min(v[t] for v in _h.values()) - 1) * 100 for t in TEXTS}}
results["expert_count"] = expert_count
# The frontier (beside equal tokens; across the budgets and lrs run, not at matched Hungarian): every
# grafted model of the first analysis seed by (English, Hungarian, ability) perplexity; a model is
# dominated when another is at least as good on every text and better on one.
frontier = {}
_fs = next((s for s in parts_seeds if any(s in per_seed.get(m, {}) for m, _ in PARTS)), None)
if _fs is not None:
    pts = {m: tuple(v[_fs][t] for t in TEXTS) for m, v in per_seed.items()
           if (m.endswith("+delta") or m == "average") and _fs in v
           and not (m.startswith("moe-") and m.split("+")[0].endswith("-s2")) and m != "cpt-replay+delta"}
    for m, p in pts.items():
        by = sorted(n for n, q in pts.items() if n != m and all(b <= a for a, b in zip(p, q)) and q != p)
        frontier[m] = {**dict(zip(TEXTS, p)), "dominated_by": by}
results["frontier"] = {"seed": _fs, "models": frontier}
results["scale_or_recipe"] = {"two_by_two": scale, "tokens": tokens, "lr": lrs}


def epochs_note(n):
    """", E epochs of the Hungarian training text" for the token sweep at n steps, from the trainer
    state of its dense run (the corpus's token count as the trainer read it); "" when absent."""
    for s_ in parts_seeds:
        path = os.path.join(work, f"s{s_}", f"cpt-steps{n}", "final", "trainer_state.json")
        if os.path.exists(path):
            corpus = sum(src["tokens"] for src in load(path)["sources"])
            return f", {int(n) * BATCH_SEQ / corpus:.2f} of an epoch of the {corpus:,}-token text against" \
                   f" {STEPS * BATCH_SEQ / corpus:.2f} at {STEPS} steps"
    return ""


# The stage-1 shape from the budget line ("stage 1 and cpt: STEPS x BATCH x SEQ tokens").
_shape = re.search(r"stage 1 and cpt: (\d+) x (\d+) x (\d+) tokens", budget)
STEPS, BATCH_SEQ = (int(_shape[1]), int(_shape[2]) * int(_shape[3])) if _shape else (0, 0)

# Task accuracy (issue 36): `eval --task` reports of the pair and of every grafted model, when run,
# with the published seeds' records (report_common.pooled_tasks).
task_rows = [(m, *pooled_tasks(work, None, prior, published, m, f"{m}.tasks.json")) for m in ("instruct", "base", "post")]
task_rows += [(m, *pooled_tasks(work, seeds, prior, published, m, f"{m}.tasks.json"))
              for m, _ in HEADLINE if m.endswith("+delta")]
task_rows = [(m, evs, recs) for m, evs, recs in task_rows if evs]
results["task_accuracy"] = {m: recs for m, _, recs in task_rows}
# The headline comparisons paired on the same items (report_common.paired_tasks), per seed that scored
# both; a published seed's pairs come through as they were.
TASK_PAIRS = [("moe-4-s1+delta", "cpt+delta"), ("moe-4-s1+delta", "cpt-flops+delta"),
              ("moe-4-s2+delta", "cpt-replay+delta")]
task_pairs = paired_tasks(work, seeds, prior, published, TASK_PAIRS, TEXTS)
results["task_accuracy_paired"] = task_pairs

# Share of the top-k assignments served by the frozen expert 0 (`load_mean[0]`).
expert0 = {}
for m in [m for m, _ in HEADLINE + PARTS if m.startswith("moe-") and "+delta" not in m]:
    shares = {s: v for s, v in (prior or {}).get("expert0_share", {}).get(m, {}).items()
              if s in published}
    for (m2, s), ev in this_run.items():
        if m2 != m:
            continue
        loads = {d["name"]: d["load_mean"][0] for d in ev["datasets"] if d.get("load_mean")}
        if len(loads) == len(TEXTS):
            shares[s] = loads
    if shares:
        expert0[m] = shares
results["expert0_share"] = expert0
# Every evaluation read the same token streams (the same documents in every command).
results["eval_streams"] = stream_hashes([base, post, instruct] + list(this_run.values()))
merge_published(results, prior, published, seeds)
if prior is not None:
    results["parts_seeds"] = sorted({s for s in prior.get("parts_seeds", []) if s in published} | set(parts_seeds),
                                    key=int)

os.makedirs(out, exist_ok=True)
fig_models = [m for m, _ in HEADLINE if results["methods"].get(m)]
fig_ppl = figure(out, "ppl_change", {
    "kind": "bars", "title": "DeltaMoE on SmolLM2-135M: perplexity relative to the plain-text base (lower is better)",
    "y": "ppl / base ppl", "categories": TEXTS,
    "series": [{"name": m, "values": [mean_or_none([x[t] / bp[t] for x in results["methods"][m]]) for t in TEXTS]}
               for m in fig_models],
})
# The training curves of a seed this run trained the headline of; a run of analyses only keeps the
# published figure.
trained = seeds_with(work, seeds, "cpt/metrics.jsonl")
curve_seed = (trained or seeds or ["1"])[0]
S0 = os.path.join(work, f"s{curve_seed}")
fig_curves = (f"\n![Training: next-token loss per step (from the sitting that trained the headline)](training.png)\n"
              if os.path.exists(os.path.join(out, "training.png")) else "") if not trained else figure(out, "training", {
    "kind": "lines", "title": f"Training (seed {curve_seed}): next-token loss per step", "x": "step",
    "y": "cross-entropy (nats/token)",
    "series": [{"name": n, "points": curve(p)} for n, p in
               [("base (en)", os.path.join(work, "pair/base/metrics.jsonl")),
                ("post (math)", os.path.join(work, "pair/post/metrics.jsonl"))]
               + [(n, os.path.join(S0, d, "metrics.jsonl")) for n, d in
                  [("dense CPT (hu)", "cpt"), ("dense CPT matched FLOPs (hu)", "cpt-flops"),
                   ("MoE stage 1 (hu)", "moe-4-s1"), ("MoE stage 2 (router)", "moe-4-s2"),
                   ("dense replay (hu + en)", "cpt-replay")]]],
})
HEAD = ("| model | what | seeds | ppl en | ppl hu | ppl math | en retention (ppl) | en retention (loss) | hu gain | "
        "math ability kept |\n|---|---|---|---|---|---|---|---|---|---|\n")
with open_report(out, results, "DeltaMoE on a real model: Hungarian by upcycling, then the graft of a delta", smoke) as f:
    f.write(f"Model: SmolLM2-135M-Instruct (`{os.path.basename(model)}`), made into a base/post pair (below); seeds "
            f"{', '.join(results['seeds'])} (mean ± std); {budget}.\n\n"
            "**Protocol (issue 35, 2026-12-03).** Text is read as the corpora define it: documents separated by blank"
            " lines, each followed by `<|endoftext|>` (docs/methods.md §7); every evaluation below read the same token"
            " streams (their SHA-256 in results.json `eval_streams`). The delta is an alignment-style delta in"
            " miniature: `base` = the instruct model adapted on English prose (lang/en), `post` = base fine-tuned on"
            " LaTeX mathematics, Δ = post − base; every model below starts from `base`, so English retention is"
            " measured against the model the MoE was made from, on held-out text of its own distribution"
            " (lang/en/valid.txt), and it can fall below 100 %. Retention (ppl) = ppl(base, en) / ppl(model, en);"
            " retention (loss) = NLL(base, en) / NLL(model, en); hu gain = ppl(base, hu) / ppl(model, hu); math"
            " ability kept = ppl(post, math) / ppl(model, math). The tables published before this protocol (one"
            " document per line, Δ from the instruct model, dense baselines without replay or matched FLOPs) are"
            " replaced; the git history has them.\n\n")
    if flops:
        f.write(f"Training FLOPs per token (`experiments/flops.py`):"
                f" dense {flops.get('dense', 0):.3f} GFLOP, dense FFN-only {flops.get('ffn', 0):.3f},"
                f" MoE stage 1 {flops.get('moe-4-experts', 0):.3f}, stage 2 {flops.get('moe-4-router', 0):.3f},"
                f" MoE all-trainable {flops.get('moe-4-all', 0):.3f}; `cpt-flops` trains {int(flops.get('flops_steps', 0))}"
                f" steps for stage 1's 100 (ratio {flops.get('ratio', 0):.3f}).\n\n")
    f.write(published_note(published))
    if prior is not None:
        f.write(f"This sitting evaluated the instruct model and its base/post pair again (the pair retrained with"
                f" seed 0 unless its run directory was kept): they score the published perplexities to a relative"
                f" {results['pair_vs_published']:.1e} at most (checked: at most {PAIR_TOLERANCE:g}).\n\n")
    f.write(unfinished_note(missing))
    f.write(HEAD)
    for r in fixed + head_rows:
        f.write("| " + " | ".join(r) + " |\n")
    f.write(fig_ppl)
    if task_rows:
        items = task_items([ev for _, evs, _ in task_rows for ev in evs])
        f.write("\n## Task accuracy\n\n"
                "Next-paragraph multiple choice on the held-out text of each corpus (`tests/reference/make_tasks.py`,"
                f" {items} items per task, 4 choices: chance 25 %), {TASK_SCORING}. The paper's metric is benchmark accuracy on the"
                " new language and on the aligned abilities; this is its small-scale stand-in beside the"
                " perplexities above. Mean ± std over the runs (the seeds that ran; the pair is trained once); a single run shows its standard error over the items (s.e., lm-eval's `acc_stderr`).\n\n"
                "| model | runs | acc_norm en | acc_norm hu | acc_norm math | acc en | acc hu | acc math |\n"
                "|---|---|---|---|---|---|---|---|\n")
        for m, evs, _ in task_rows:
            n = len(evs)
            f.write(f"| `{m}` | {n} | {acc_cells(evs, TEXTS)} |\n")
        f.write(paired_tasks_markdown(task_pairs))
    if part_rows:
        f.write(f"\n## Analyses (seed {', '.join(results['parts_seeds'])})\n\n" + HEAD)
        for r in part_rows:
            f.write("| " + " | ".join(r) + " |\n")
    if scale or tokens or lrs:
        f.write("\n## Scale or recipe\n\n"
                "The MoE stage 1 + Δ against dense CPT + Δ (same Hungarian tokens), as a change in perplexity,"
                " split in log space into the recipe (the dense model with attention, embeddings, norms and LM head frozen,"
                " `cpt-ffn`, against `cpt`) and what the MoE adds at that same recipe (`moe-4-s1` against `cpt-ffn`);"
                " the two add up (in log ppl) to the whole gap. Negative: lower perplexity. Paired per seed,"
                " as the geometric mean over the analysis seeds (the claims below average the per-seed"
                " percentages over every seed, so their numbers for the same comparison differ slightly);"
                " a trend, not a 3-seed result."
                + (f" Rows of a published seed's headline (`cpt`, `moe-4-s1`) come from the sitting that"
                   f" published them, the analyses from this one: the retrained pair scores the published"
                   f" one to a relative {results['pair_vs_published']:.1e} in perplexity."
                   if results.get("pair_vs_published") is not None and set(published) & set(parts_seeds) else "")
                + "\n\n")
        if scale:
            f.write("| text | seeds | MoE stage 1 (FFN side) vs dense CPT (all) | recipe: dense FFN-only vs dense all"
                    " | MoE vs dense, both FFN-only | share of the gap from the recipe | MoE all-trainable vs dense all |\n"
                    "|---|---|---|---|---|---|---|\n")
            pc = lambda x: "-" if x is None else f"{x:+.1f}%"
            for t, e in scale.items():
                share = "-" if e["recipe_share"] is None else f"{e['recipe_share'] * 100:.0f}%"
                f.write(f"| {t} | {', '.join(e['seeds'])} | {pc(e['moe_vs_dense_pct'])} | {pc(e['recipe_pct'])} |"
                        f" {pc(e['moe_at_same_recipe_pct'])} | {share} | {pc(e.get('moe_all_vs_dense_pct'))} |\n")
            for t in ("en", "hu"):
                e = scale.get(t)
                if not e:
                    continue
                r, m = e["recipe_pct"], e["moe_at_same_recipe_pct"]
                which = ("the recipe (training the FFNs alone)" if abs(r) >= abs(m)
                         else "the MoE (added experts, expert 0 kept)")
                against = ("; the other part goes the other way" if r * m < 0 else "")
                f.write(f"\n{t}: of the MoE's {pc(e['moe_vs_dense_pct'])} against dense CPT + Δ, freezing all but"
                        f" the dense model's FFNs gives {pc(r)} and the MoE at that recipe {pc(m)}: mostly"
                        f" **{which}**{against} (seeds {', '.join(e['seeds'])}).\n")
        for n, per_text in tokens.items():
            f.write(f"\nToken sweep: the gap MoE stage 1 + Δ against dense CPT + Δ at {STEPS} steps and at {n} steps"
                    f" ({int(n) * BATCH_SEQ} tokens{epochs_note(n)}) of the same data: "
                    + "; ".join(f"{t} {v['gap_at_stage1_tokens_pct']:+.1f}% → {v['gap_at_more_tokens_pct']:+.1f}%"
                                f" (seeds {', '.join(v['seeds'])})" for t, v in per_text.items()) + ".\n")
        if lrs:
            f.write(f"\nLearning rate: the gap MoE stage 1 + Δ against dense CPT + Δ, both trained at the same lr"
                    f" (same tokens), at {LR_HEAD} (the headline) and at " + " and ".join(lrs) + ": "
                    + "; ".join(f"{t} " + " → ".join([f"{lrs[next(iter(lrs))][t]['gap_at_headline_lr_pct']:+.1f}%"]
                                                      + [f"{lrs[lr][t]['gap_at_lr_pct']:+.1f}%" for lr in lrs if t in lrs[lr]])
                                for t in TEXTS if t in lrs[next(iter(lrs))])
                    + f" (seeds {', '.join(sorted({s for v in lrs.values() for e in v.values() for s in e['seeds']}))})."
                    " The same lr is not the same update: it moves every weight of the dense model, and the"
                    " MoE's new experts and router, which are more parameters (three FFN copies) but leave"
                    " attention, embeddings and expert 0 as they were (an equal-lr comparison over the sweep,"
                    " not each arm at its own best lr: the table above has every point).\n")
    if any(len(v) > 1 for v in expert_count.values()):
        _all = sorted({e for v in expert_count.values() for e in v}, key=int)
        f.write("\n## Expert count\n\n"
                "The paper's ablation: more than 3 trainable experts gives negligible gains. The same stage 1 (and"
                f" stage 2) with {', '.join(_all)} experts, expert 0 frozen and top-2 in each, each + Δ; 4 experts"
                " is the headline's run, on the same seeds. The change is from the count in the row above, paired"
                " per seed (negative: lower perplexity). More experts are more trainable parameters at the same"
                f" active ones, tokens ({STEPS * BATCH_SEQ:,}) and top-2; with 2 experts every token uses both (expert 0 among"
                " them: its share is 50 % by construction and the load-balancing loss is constant), so 2 → 3 also"
                " changes whether expert 0 is always on. Stage 2 trains the router only; its rows' trainable"
                " experts are stage 1's.\n\n"
                "| model | experts (trainable) | trainable params | stage-1 GFLOP/token | seeds | "
                + " | ".join(f"ppl {t}" for t in TEXTS) + " | hu before Δ | change from | "
                + " | ".join(f"change {t}" for t in TEXTS) + " |\n|---|---|---|---|---|"
                + "---|" * (2 * len(TEXTS) + 2) + "\n")
        for stage, per_count in expert_count.items():
            for e, v in per_count.items():
                c = v.get("change_from", {})
                f.write(f"| `moe-{e}-{stage}+delta` | {e} ({v['trainable_experts']}) | "
                        + (f"{v['trainable_params'] / 1e6:.1f}M | {v['stage1_gflop_per_token']:.3f} | "
                           if "trainable_params" in v else "- | - | ")
                        + f"{', '.join(v['seeds'])} | " + " | ".join(f"{v['ppl'][t]:.2f}" for t in TEXTS) + " | "
                        + (f"{v['hu_before_delta']:.2f}" if "hu_before_delta" in v else "-") + " | "
                        + (f"`{c['model']}`" if c else "-") + " | "
                        + " | ".join(f"{c['pct'][t]:+.1f}%" if c and c["pct"].get(t) is not None else "-"
                                     for t in TEXTS) + " |\n")
        spread = results.get("expert_count_headline_spread")
        if spread:
            f.write(f"\nThe noise floor: over the headline's seeds {', '.join(spread['seeds'])} the same 4-expert"
                    " model + Δ ranges by " + ", ".join(f"{t} {v:.1f} %" for t, v in spread["range_pct"].items())
                    + " (max / min); a one-seed change smaller than that neither supports nor contradicts the claim.\n")
    if len(frontier) > 2:
        f.write(f"\n## Better on every text: the frontier (seed {results['frontier']['seed']})\n\n"
                "Every grafted model of this seed trained on Hungarian alone (stage 2 and the replay continuation see"
                " English, so they are left out), by perplexity on each text: equal tokens is one comparison, a model"
                " that is better on every text is another. A model is dominated when another is at least as good on"
                " every text (English kept, Hungarian learned, the grafted ability's text) and better on one; the"
                " undominated ones are the frontier. Sorted by Hungarian. This is Pareto dominance across the token"
                " budgets and learning rates run, not a comparison at matched Hungarian perplexity, and only against"
                " the points sampled (no dense run below lr 1e-4 or 100 steps); perplexity of the ability's text is"
                " not task accuracy. `average` (linear averaging of dense CPT and post, no Δ) is the other way to add"
                " the ability.\n\n")
        f.write("| model | " + " | ".join(f"ppl {t}" for t in TEXTS) + " | dominated by |\n|---|"
                + "---|" * len(TEXTS) + "---|\n")
        for m, e in sorted(frontier.items(), key=lambda kv: kv[1]["hu"]):
            f.write(f"| `{m}` | " + " | ".join(f"{e[t]:.2f}" for t in TEXTS) + " | "
                    + (", ".join(f"`{n}`" for n in e["dominated_by"]) or "**frontier**") + " |\n")
        dense = [m for m in frontier if m.startswith(("cpt", "average"))]
        moe = [m for m in frontier if m.startswith("moe")]
        f.write(f"\nOn the frontier: {', '.join(f'`{m}`' for m in frontier if not frontier[m]['dominated_by'])}."
                f" Dense models dominated by a MoE: {sum(any(n.startswith('moe') for n in frontier[m]['dominated_by']) for m in dense)}"
                f" of {len(dense)}; MoE models dominated by a dense one:"
                f" {sum(any(n.startswith(('cpt', 'average')) for n in frontier[m]['dominated_by']) for m in moe)} of {len(moe)}.\n")
    f.write(fig_curves)
    if expert0:
        f.write("\n## Share of the top-k assignments served by the frozen expert 0\n\n"
                "Per MoE model and text, the fraction of the top-k (token, expert) assignments that go to expert 0,"
                " the base's FFN (`load_mean[0]` of `eval --json`; uniform routing gives 1 / E, and with top-2 a share"
                " of 50 % means every token has expert 0 among its two).\n\n"
                "| model | seeds | " + " | ".join(TEXTS) + " |\n|---|---|" + "---|" * len(TEXTS) + "\n")
        for m, per_seed in expert0.items():
            f.write(f"| `{m}` | {', '.join(per_seed)} | "
                    + " | ".join(fmt([x[t] for x in per_seed.values()], 1, True) for t in TEXTS) + " |\n")
    f.write("\n## The paper's claims\n\n")
    for c, ok, n in claims:
        f.write(f"- {c}: **{'holds' if ok else 'does not hold'}** ({n})\n")
    write_commands(f, work, "deltamoe", smoke)
print(open(os.path.join(out, "README.md")).read())
