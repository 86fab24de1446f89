"""Helpers shared by the experiment reports (dume_report.py, deltamoe_report.py,
neuronmoe_report.py, upcycling_report.py): reading `moe-studio eval --json` output (perplexity, and task accuracy from
`eval --task ... --json`), mean ± std formatting and the commands footer. Standard library only."""
import json
import os
import statistics
import sys


def load(path):
    """The JSON document at `path`."""
    with open(path) as f:
        return json.load(f)


def published_results(out, budget, seeds, per_row=False):
    """The results.json an earlier sitting published in `out`, when the environment names seeds it
    ran (`PUBLISHED_SEEDS`, e.g. "1": that sitting's machine and run directories are gone), so that
    a report keeps their numbers beside this run's `seeds`; None when PUBLISHED_SEEDS is unset.
    Exits with a message naming the file when it is missing, was made with another `budget` string
    (another experiment; None: not checked, for a check before the budget is known), lacks one of the published seeds, or when a published seed is also one of
    this run's, or when it holds a seed that is neither published nor this run's (it would be
    dropped) — unless `per_row`: a report that pools row by row (NeuronMoE's allocations, the upcycling
    rows) lets a
    later sitting run published seeds of rows the earlier one did not run, and refuses a (row,
    seed) that both have, and a dropped one, itself. Returns (published seed list, results dict)."""
    published = os.environ.get("PUBLISHED_SEEDS", "").split()
    if not published:
        return [], None
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        sys.exit(f"PUBLISHED_SEEDS={' '.join(published)}: {path} does not exist")
    prior = load(path)
    if budget is not None and prior.get("budget") != budget:
        sys.exit(f"PUBLISHED_SEEDS: {path} was made with budget `{prior.get('budget')}`, this run's is `{budget}`")
    if any(s not in prior.get("seeds", []) for s in published) or (set(published) & set(seeds) and not per_row):
        sys.exit(f"PUBLISHED_SEEDS={' '.join(published)}: {path} holds seeds {prior.get('seeds')}; the published"
                 f" seeds must be among them and not among this run's SEEDS ({' '.join(seeds)})")
    # A published seed neither carried nor run again would vanish from the only copy of the results
    # when the report overwrites it (a per-row report checks this row by row itself).
    lost = [s for s in prior.get("seeds", []) if s not in published and s not in seeds]
    if lost and not per_row:
        sys.exit(f"PUBLISHED_SEEDS={' '.join(published)}: {path} also holds seed(s) {' '.join(lost)}, which this run"
                 f" neither carries (add them to PUBLISHED_SEEDS) nor runs again (SEEDS {' '.join(seeds)})")
    return published, prior


def merge_published(results, prior, published, seeds):
    """Adds an earlier sitting's seeds to `results` (its `seeds`, `published_seeds`) and its
    evaluation streams to `results["eval_streams"]`, after checking that every dataset both runs
    scored is the same token stream; exits naming the dataset when one differs. No-op without
    `prior`."""
    if prior is None:
        return
    for name, hashes in prior.get("eval_streams", {}).items():
        if name in results["eval_streams"] and results["eval_streams"][name] != hashes:
            sys.exit(f"PUBLISHED_SEEDS: the published results scored `{name}` as token stream(s) {hashes}, this run"
                     f" as {results['eval_streams'][name]}: not the same evaluation text")
        results["eval_streams"].setdefault(name, hashes)
    results["seeds"] = published + [s for s in seeds if s not in published]
    results["published_seeds"] = published


def published_note(published):
    """The README paragraph saying which seeds are carried from the published results.json."""
    if not published:
        return ""
    return (f"Seed(s) {', '.join(published)} are carried from the published results.json, made by an earlier run of"
            " this report (which machine, and when: the run notes in docs/experiments/README.md; checked here to be"
            " the same budget, rows and evaluation token streams, `eval_streams`); their commands and wall times:"
            " the command log below where this run directory ran them, else that version of this README in the"
            " git history. The command log below is this run directory's (every sitting that used it, on this"
            " machine).\n\n")


def refuse_pooled(noun, row, in_published, published, again, leave_out, rerun=()):
    """The checks of a report pooled row by row (NeuronMoE's allocations, the upcycling rows), for
    one published row: exits naming it when one of its seeds in the published results
    (`in_published`) would vanish from the only copy of them — neither carried (`published`,
    PUBLISHED_SEEDS) nor run again here (`again`: the seeds this run trains before training, the
    seeds it finished in the report) — or is both carried and run again (two results of one
    training). `noun` names a row ("allocation"), `leave_out` the settings that choose what runs
    ("SEEDS or ALLOCS"), `rerun` the seeds that may be both (RERUN_SEEDS, for a report that checks
    them with reproduced())."""
    lost = [s for s in in_published if s not in published and s not in again]
    if lost:
        sys.exit(f"PUBLISHED_SEEDS: {noun} `{row}` has seed(s) {', '.join(lost)} in the published results, which"
                 " this run neither carries (add them to PUBLISHED_SEEDS) nor has run again (finished)")
    both = [s for s in in_published if s in published and s in again and s not in rerun]
    if both:
        sys.exit(f"PUBLISHED_SEEDS: {noun} `{row}` seed(s) {', '.join(both)} are both published and run here: leave"
                 f" them out of {leave_out}, or out of PUBLISHED_SEEDS")


# How far a published seed trained again (RERUN_SEEDS) may score from its published numbers: the
# precision of the tables; another CPU's kernels move a retrained model by less, another training
# by far more. reproduced() and check_pooled.py both use it.
RERUN_RTOL = 1e-3


def rerun_seeds():
    """RERUN_SEEDS (e.g. "1"): published seeds a report pooled row by row trains again on purpose,
    in the rows it runs (a post-training analysis or task scores of a model whose run directory went
    with its machine). refuse_pooled then lets such a (row, seed) be both carried and run here, and
    the report replaces the published entry with this run's after reproduced() found the same
    numbers."""
    return os.environ.get("RERUN_SEEDS", "").split()


def reproduced(row, seed, published, mine, rtol=RERUN_RTOL):
    """Largest relative difference between a published seed's numbers and the same seed trained
    again here (RERUN_SEEDS): `published` and `mine` are equal-shaped lists of {name: value} dicts
    (e.g. per-language perplexity after stage 1 and 2). Exits naming the row, seed and value when
    one differs by more than `rtol` (RERUN_RTOL)."""
    worst = 0.0
    for p, m in zip(published, mine):
        for k, v in p.items():
            d = abs(m[k] - v) / abs(v)
            if d > rtol:
                sys.exit(f"RERUN_SEEDS: `{row}` seed {seed} trained again scores {k} {m[k]:.6g}, the published"
                         f" {v:.6g} (relative {d:.1e} > {rtol:g}): not the same training; leave it out of RERUN_SEEDS")
            worst = max(worst, d)
    return worst


def pooling_note(published, seeds, provenance, noun, checked):
    """The README paragraph saying where the seeds came from: per_row_note when this run added
    seeds to published ones row by row (a published seed also among this run's, with some row run
    here), else published_note."""
    if published and set(published) & set(seeds) and any(p[1] for p in provenance.values()):
        return per_row_note(provenance, noun, checked)
    return published_note(published)


def per_row_note(provenance, noun, checked):
    """The README paragraph of a report pooled row by row (NeuronMoE's allocations, the upcycling
    rows): which seeds of which row were carried from the published results.json and which this run
    directory ran and this report evaluated. `provenance` is {row: (published seeds carried, seeds run here)}; `noun` names a
    row ("allocation"), `checked` what the pooling checked besides the budget and the evaluation
    streams ("allocations")."""
    def group(i):
        by = {}
        for a, p in provenance.items():
            if p[i]:
                by.setdefault(", ".join(p[i]), []).append(f"`{a}`")
        return "; ".join(f"seed(s) {k} of {', '.join(v)}" for k, v in by.items())
    return (f"Pooled {noun} by {noun}. Carried from the published results.json (an earlier run of this report,"
            f" in this run directory or another): {group(0)} — checked here to be the same budget, {checked} and"
            " evaluation token streams (`eval_streams`); which machine, and when: the run notes in"
            " docs/experiments/README.md; their commands and wall times: the command log below where this run"
            " directory trained them, else that version of this README in the git history. Run here and"
            f" evaluated by this report: {group(1)}; the command log below is this run directory's (every sitting"
            " that used it, on this machine).\n\n")


def ppl(ev, name):
    """Perplexity of dataset `name` in an `eval --json` report."""
    return next(d["ppl"] for d in ev["datasets"] if d["name"] == name)


def nll(ev, name):
    """Mean negative log-likelihood (nats/token) of dataset `name` in an `eval --json` report."""
    return next(d["nll"] for d in ev["datasets"] if d["name"] == name)


def task_acc(ev, name, metric="acc_norm"):
    """Accuracy (0-1) of task `name` in an `eval --task ... --json` report (lm-eval's metric names:
    `acc`, `acc_norm` per character, `acc_bytes` per byte); None when the report has no such task,
    so a report column can stay empty for runs made before the tasks were scored."""
    return next((t.get(metric) for t in ev.get("tasks", []) if t["name"] == name), None)


def acc_cell(evs, name, metric="acc_norm"):
    """A report's accuracy column: `mean ± std` over the seeds' `eval --task` reports `evs`, in
    percent (`-` when none has task `name`). With one report, its standard error instead
    (lm-eval's `<metric>_stderr`, the sample standard deviation over items / sqrt(items)),
    written `45.0% (s.e. 5.0)`: one run of 100 items is a measurement with that uncertainty."""
    xs = [task_acc(ev, name, metric) for ev in evs]
    if len([x for x in xs if x is not None]) == 1:
        se = next(task_acc(ev, name, f"{metric}_stderr") for ev, x in zip(evs, xs) if x is not None)
        if se is not None:
            return f"{fmt(xs, digits=1, pct=True)} (s.e. {se * 100:.1f})"
    return fmt(xs, digits=1, pct=True)


TASK_KEYS = ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "items")


# How `eval --task` scores the reports' multiple-choice tasks (the sentence every report's task
# section gives).
TASK_SCORING = ("scored by `eval --task` as lm-evaluation-harness scores a `multiple_choice` task (acc_norm:"
                " log-likelihood per character; parity with lm-eval 0.4.13 in docs/methods.md §8)")


def task_items(reports):
    """The items-per-task counts of the `eval --task` reports `reports`, as the text "100" or "50, 100"."""
    return ", ".join(map(str, sorted({t.get("items") for ev in reports for t in ev.get("tasks", [])} - {None})))


def acc_cells(evs, names):
    """A task table's cells for the reports `evs`: acc_norm of each task in `names`, then acc."""
    return " | ".join(acc_cell(evs, t) for t in names) + " | " + " | ".join(acc_cell(evs, t, "acc") for t in names)


def task_entry(ev, seed):
    """results.json's record of one `eval --task --json` report `ev`: each task's scores and
    standard errors (TASK_KEYS, no per-item samples) and the `seed` that trained the model (None
    for a model made once per run, e.g. the base)."""
    e = {t["name"]: {k: t[k] for k in TASK_KEYS if k in t} for t in ev.get("tasks", [])}
    e["seed"] = seed
    return e


def pooled_tasks(work, seeds, prior, published, name, rel, rerun=()):
    """The task reports of model `name`, pooled across sittings: (reports for acc_cell, records for
    results.json's `task_accuracy[name]`). This run's: `work/s<seed>/<rel>` for each of `seeds` that
    has it, or `work/<rel>` with `seeds` None (a model made once per run). The earlier sitting's
    (PUBLISHED_SEEDS, `prior` its results.json): its records of the published seeds, and for a
    once-per-run model its record when this run scored none. A published record is carried as it
    was (a report rebuilt from it has no per-item samples, so it is not paired again). A seed in
    `rerun` (RERUN_SEEDS, trained again and checked by reproduced()) that this run scored replaces
    its published record."""
    if seeds is None:
        path = os.path.join(work, rel)
        mine = [(None, load(path))] if os.path.exists(path) else []
    else:
        mine = [(s, load(os.path.join(work, f"s{s}", rel))) for s in seeds_with(work, seeds, rel)]
    old = (prior or {}).get("task_accuracy", {}).get(name, [])
    replaced = set()  # rerun seeds scored again here: their records replace the published ones, in place
    if seeds is None:
        old = [] if mine else [e for e in old if e.get("seed") is None][:1]
    else:
        old = [e for e in old if e.get("seed") in published]
        replaced = {e.get("seed") for e in old} & {s for s, _ in mine} & set(rerun)
        both = sorted({e.get("seed") for e in old} & {s for s, _ in mine} - replaced)
        if both:
            sys.exit(f"PUBLISHED_SEEDS: `{name}` seed(s) {', '.join(both)} are both published and scored by this run")
    # Pooled seeds must have scored the same tasks: a sitting run with another TASK_ITEMS is another
    # measurement (mean ± std over both would hide it).
    items = lambda e: {n: v.get("items") for n, v in e.items() if n != "seed"}
    for e in old:
        for s, ev in mine:
            if items(e) != items(task_entry(ev, s)):
                sys.exit(f"PUBLISHED_SEEDS: `{name}` seed {e.get('seed')} was scored on {items(e)} items per task,"
                         f" seed {s} of this run on {items(task_entry(ev, s))}: set TASK_ITEMS as the published run did")
    by_seed = dict(mine)
    reports, records = [], []
    for e in old:
        if e.get("seed") in replaced:
            reports.append(by_seed[e["seed"]])
            records.append(task_entry(by_seed[e["seed"]], e["seed"]))
        else:
            reports.append({"tasks": [{"name": n, **v} for n, v in e.items() if n != "seed"]})
            records.append(e)
    for s, ev in mine:
        if s not in replaced:
            reports.append(ev)
            records.append(task_entry(ev, s))
    return reports, records


def paired_acc(ev_a, ev_b, name, metric="acc_norm"):
    """Model a minus model b on the SAME items of task `name` (two `eval --task --json` reports of
    the same task file): (mean difference, its standard error, items), the difference and s.e. as
    fractions. The s.e. is the sample standard deviation of the per-item differences / sqrt(items),
    the paired counterpart of lm-eval's `acc_stderr`; it is below the unpaired sqrt(se_a² + se_b²)
    when the two models tend to get the same items right. None when either report lacks the task or
    the two did not score the same items (same lines with the same gold answers)."""
    def samples(ev):
        return next((t.get("samples") for t in ev.get("tasks", []) if t["name"] == name), None)
    sa, sb = samples(ev_a), samples(ev_b)
    if not sa or not sb or [(x["line"], x["gold"]) for x in sa] != [(x["line"], x["gold"]) for x in sb]:
        return None
    d = [x[metric] - y[metric] for x, y in zip(sa, sb)]
    n = len(d)
    se = statistics.stdev(d) / n ** 0.5 if n > 1 else float("nan")
    return statistics.mean(d), se, n


def stream_hashes(evs):
    """{dataset name: [the distinct `stream_sha256` values the reports `evs` give it]}: one value per
    name when every evaluation read the same token stream (reports without the field are skipped)."""
    seen = {}
    for ev in evs:
        for d in ev["datasets"]:
            if d.get("stream_sha256"):
                seen.setdefault(d["name"], [])
                if d["stream_sha256"] not in seen[d["name"]]:
                    seen[d["name"]].append(d["stream_sha256"])
    return seen


def fmt(xs, digits=2, pct=False):
    """`mean ± std` of the non-None values (just the mean for one value; `-` for none);
    `pct`: as a percentage."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    k = 100.0 if pct else 1.0
    s = f"{statistics.mean(xs) * k:.{digits}f}"
    if len(xs) > 1:
        s += f" ± {statistics.stdev(xs) * k:.{digits}f}"
    return s + ("%" if pct else "")


def paired_tasks(work, seeds, prior, published, pairs, names, rel="{}.tasks.json"):
    """`a` minus `b` on the same items (paired_acc, acc_norm) for each (a, b) in `pairs` and each of
    `seeds` whose run directory scored both (`rel` formatted with the model name), each task in
    `names`; the published seeds' pairs from `prior` first, as they were (their per-item samples
    are not in results.json); a pair this run scores again (a seed trained again on purpose,
    RERUN_SEEDS) replaces the published record of the same (a, b, seed), in place. Records for results.json's
    `task_accuracy_paired`."""
    out = [p for p in (prior or {}).get("task_accuracy_paired", []) if p.get("seed") in published]
    key = lambda p: (p["a"], p["b"], p["seed"])
    for a, b in pairs:
        for s in seeds_with(work, seeds, rel.format(a)):
            pb = os.path.join(work, f"s{s}", rel.format(b))
            if os.path.exists(pb):
                ea, eb = load(os.path.join(work, f"s{s}", rel.format(a))), load(pb)
                rec = {"a": a, "b": b, "seed": s, "acc_norm": {
                    t: (None if (r := paired_acc(ea, eb, t)) is None else {"diff": r[0], "se": r[1], "items": r[2]})
                    for t in names}}
                at = [i for i, p in enumerate(out) if key(p) == (a, b, s)]
                if at:
                    out[at[0]] = rec  # in place: the published order is kept
                else:
                    out.append(rec)
    return out


def paired_tasks_markdown(pairs):
    """The README lines of `paired_tasks` records (empty without any)."""
    lines = []
    for p in pairs:
        cells = [f"{t} -" if r is None else f"{t} {r['diff'] * 100:+.1f} (s.e. {r['se'] * 100:.1f})"
                 for t, r in p["acc_norm"].items()]
        lines.append(f"- `{p['a']}` − `{p['b']}`, seed {p['seed']}: " + ", ".join(cells) + "\n")
    if not lines:
        return ""
    return ("\nPaired on the same items (acc_norm points; s.e. of the per-item differences, so a"
            " difference within about two s.e. of 0 is not a finding):\n\n" + "".join(lines))


def seeds_with(work, seeds, name):
    """The seeds whose run directory WORK/s{seed} holds the result file `name` (a run spanning
    several sittings may have finished it for only some seeds)."""
    return [s for s in seeds if os.path.exists(os.path.join(work, f"s{s}", name))]


def unfinished_note(missing):
    """The README line naming what an unfinished run lacks; `missing` is [(row name, [seeds])];
    empty when nothing is missing."""
    if not missing:
        return ""
    return ("**Unfinished run**: " + "; ".join(f"`{m}` lacks seed(s) {', '.join(x)}" for m, x in missing)
            + ". Each row uses the seeds that have its results (`seeds` column).\n\n")


def write_commands(f, work, script, smoke):
    """Appends the run's command log (WORK/commands.log) to the README being written to `f`."""
    with open(os.path.join(work, "commands.log")) as log:
        body = log.read()
    f.write(f"\nCommands (from `experiments/{script}.sh`" + (" --smoke" if smoke == "1" else "") + "):\n\n```\n")
    f.write(body)
    f.write("```\n")


def figure(out, stem, spec):
    """Draws one figure with `moe-studio plot` (the binary in $MOE_STUDIO_BIN, set by
    experiments/lib.sh) into OUT/STEM.svg and OUT/STEM.png and returns the Markdown that shows it
    (empty when no binary is known or drawing failed; the failure is printed). `spec` is the
    `plot` command's JSON spec (backend/src/cli/plot.rs): kind "lines" with series[].points, or
    "bars" with categories and series[].values (None draws nothing)."""
    import subprocess
    import tempfile

    binary = os.environ.get("MOE_STUDIO_BIN")
    if not binary:
        return ""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        path = f.name
    try:
        r = subprocess.run([binary, "plot", path, "--out", os.path.join(out, stem)], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        print(f"figure {stem}: {r.stderr.strip()}")
        return ""
    return f"\n![{spec.get('title', stem)}]({stem}.png)\n"


def mean_or_none(xs):
    """Mean of the non-None values, None when there are none."""
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def curve(metrics_path, key="ce_loss", every=1):
    """`[[step, value], ...]` from a trainer's metrics.jsonl (every `every`-th step and the last);
    an empty list when the file is missing."""
    if not os.path.exists(metrics_path):
        return []
    rows = []
    with open(metrics_path) as f:
        for line in f:
            line = line.strip()
            if line:
                m = json.loads(line)
                if key in m and m[key] is not None:
                    rows.append([m["step"], m[key]])
    return [r for i, r in enumerate(rows) if i % every == 0 or i == len(rows) - 1]


def open_report(out, results, title, smoke):
    """Writes `results` to OUT/results.json and opens OUT/README.md with its `# title` and, for a
    smoke run (`smoke == "1"`), the banner saying the numbers mean nothing; returns the open file."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    f = open(os.path.join(out, "README.md"), "w")
    f.write(f"# {title}\n\n")
    if smoke == "1":
        f.write("**Smoke run** (stories260K, a few steps): checks the pipeline; the numbers mean nothing.\n\n")
    return f
