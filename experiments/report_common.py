"""Helpers shared by the experiment reports (dume_report.py, deltamoe_report.py,
neuronmoe_report.py): reading `moe-studio eval --json` output, mean ± std formatting and the
commands footer. Standard library only."""
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


def write_commands(f, work, script, smoke):
    """Appends the run's command log (WORK/commands.log) to the README being written to `f`."""
    with open(os.path.join(work, "commands.log")) as log:
        body = log.read()
    f.write(f"\nCommands (from `experiments/{script}.sh`" + (" --smoke" if smoke == "1" else "") + "):\n\n```\n")
    f.write(body)
    f.write("```\n")
