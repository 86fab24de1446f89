"""Helpers shared by the experiment reports (dume_report.py, deltamoe_report.py,
neuronmoe_report.py): reading `moe-studio eval --json` output (perplexity, and task accuracy from
`eval --task ... --json`), mean ± std formatting and the commands footer. Standard library only."""
import json
import os
import statistics


def load(path):
    """The JSON document at `path`."""
    with open(path) as f:
        return json.load(f)


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
    return next((t[metric] for t in ev.get("tasks", []) if t["name"] == name), None)


def acc_cell(evs, name, metric="acc_norm"):
    """A report's accuracy column: `mean ± std` over the seeds' `eval --task` reports `evs`, in
    percent (`-` when none has task `name`)."""
    return fmt([task_acc(ev, name, metric) for ev in evs], digits=1, pct=True)


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
