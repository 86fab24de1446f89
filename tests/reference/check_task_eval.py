#!/usr/bin/env python3
"""`moe-studio eval --task` against lm-evaluation-harness on the same model
directory and the same JSONL tasks.

Each task runs through lm-eval's Python API (`lm_eval.simple_evaluate`,
model `hf`, float32 on the CPU) with a local task YAML written here:

    dataset_path: json, dataset_kwargs.data_files.test: <the .jsonl>
    output_type: multiple_choice
    doc_to_text: context, doc_to_choice: choices, doc_to_target: gold
    target_delimiter: <--target-delimiter>, num_fewshot: 0
    metric_list: acc, acc_norm, acc_bytes

and through `moe-studio --backend cpu eval MODEL --task NAME=FILE --json`.
The check asserts, per task: the same prediction for every item (`pred`,
`pred_norm`, `pred_bytes`, from lm-eval's logged log-likelihoods), equal
`acc`, `acc_norm`, `acc_bytes` and standard errors, and reports the largest
log-likelihood difference and the smallest gap between an item's best two
choices (how close a tie came). Exit status 1 on any mismatch.

With --golden FILE it writes lm-eval's per-item numbers instead (the golden
file of `shared/tests/integration/task_eval.rs`) and runs no studio binary.

    ~/.cache/moe-studio/lmeval-venv/bin/python tests/reference/check_task_eval.py MODEL_DIR \\
        --task en=/tmp/tasks/en.jsonl --target-delimiter '' --bin target/release/moe-studio

Requirements: tests/reference/requirements-lmeval.txt (lm-eval 0.4.13 with
torch and transformers as in requirements.txt). `scripts/task_eval_parity.sh`
runs the whole check (SmolLM2 and an upcycled MoE on the corpora tasks).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def write_yaml(dirname, task, path, delimiter):
    """A local lm-eval task (its YAML) reading `path`."""
    body = "\n".join([
        f"task: {task}",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        f"    test: {json.dumps(os.path.abspath(path))}",
        "test_split: test",
        "output_type: multiple_choice",
        "doc_to_text: context",
        "doc_to_choice: choices",
        "doc_to_target: gold",
        f"target_delimiter: {json.dumps(delimiter)}",
        "num_fewshot: 0",
        "metric_list:",
        "  - metric: acc",
        "    aggregation: mean",
        "    higher_is_better: true",
        "  - metric: acc_norm",
        "    aggregation: mean",
        "    higher_is_better: true",
        "  - metric: acc_bytes",
        "    aggregation: mean",
        "    higher_is_better: true",
        "",
    ])
    with open(os.path.join(dirname, f"{task}.yaml"), "w", encoding="utf-8") as f:
        f.write(body)


def argmax(xs):
    """np.argmax: the first of equal maxima."""
    best = 0
    for i, x in enumerate(xs):
        if x > xs[best]:
            best = i
    return best


def prefix_token_id(model_dir):
    """The config's `bos_token_id` (else `eos_token_id`) when the directory
    has no tokenizer_config.json naming them: lm-eval's prefix token (its
    `has_bos_prefix` check decodes it) is the tokenizer's BOS, else EOS, and
    a bare tokenizer.json gives transformers neither."""
    if os.path.exists(os.path.join(model_dir, "tokenizer_config.json")):
        return None
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    for k in ("bos_token_id", "eos_token_id"):
        v = cfg.get(k)
        if isinstance(v, list):
            v = v[0] if v else None
        if v is not None:
            return v
    return None


def run_lm_eval(model_dir, tasks, delimiter, batch_size, limit):
    import lm_eval
    from lm_eval.tasks import TaskManager

    p = prefix_token_id(model_dir)
    with tempfile.TemporaryDirectory() as d:
        names = {}
        for name, path in tasks:
            t = f"studio_{name}"
            names[name] = t
            write_yaml(d, t, path, delimiter)
        tm = TaskManager(include_path=d)
        res = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={model_dir},dtype=float32" + (f",prefix_token_id={p}" if p is not None else ""),
            tasks=list(names.values()),
            task_manager=tm,
            batch_size=batch_size,
            device="cpu",
            log_samples=True,
            limit=limit,
        )
    out = {}
    for name, path in tasks:
        t = names[name]
        r = res["results"][t]
        na = lambda v: None if v == "N/A" else v  # noqa: E731
        samples = sorted(res["samples"][t], key=lambda s: s["doc_id"])
        rows = []
        for s in samples:
            resps = [x[0] for x in s["resps"]]  # one (ll, is_greedy) per choice
            lls = [float(x[0]) for x in resps]
            greedy = [bool(x[1]) for x in resps]
            choices = s["doc"]["choices"]
            rows.append({
                "doc_id": s["doc_id"], "gold": s["doc"]["gold"], "loglikelihoods": lls, "greedy": greedy,
                "pred": argmax(lls),
                "pred_norm": argmax([l / len(c) for l, c in zip(lls, choices)]),
                "pred_bytes": argmax([l / len(c.encode("utf-8")) for l, c in zip(lls, choices)]),
                "acc": s["acc"], "acc_norm": s["acc_norm"], "acc_bytes": s["acc_bytes"],
            })
        out[name] = {
            "file": path, "target_delimiter": delimiter, "items": len(rows),
            "acc": r["acc,none"], "acc_stderr": na(r["acc_stderr,none"]),
            "acc_norm": r["acc_norm,none"], "acc_norm_stderr": na(r["acc_norm_stderr,none"]),
            "acc_bytes": r["acc_bytes,none"], "acc_bytes_stderr": na(r["acc_bytes_stderr,none"]),
            "samples": rows,
        }
    return out


def run_studio(binary, model_dir, tasks, delimiter, limit):
    argv = [binary, "--backend", "cpu", "eval", model_dir, "--json", f"--target-delimiter={delimiter}"]
    for name, path in tasks:
        argv.append(f"--task={name}={path}")
    if limit is not None:
        argv.append(f"--limit={limit}")
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{p.stderr}")
    return {t["name"]: t for t in json.loads(p.stdout)["tasks"]}


def close(a, b, tol=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tol


def compare(name, ref, got):
    """Prints one row per task; returns whether everything agrees."""
    ok = ref["items"] == got["items"]
    mism = []
    dll, gap = 0.0, math.inf
    for r, g in zip(ref["samples"], got["samples"]):
        for k in ("pred", "pred_norm", "pred_bytes"):
            if r[k] != g[k]:
                mism.append((r["doc_id"], k, r[k], g[k]))
        dll = max(dll, max(abs(a - b) for a, b in zip(r["loglikelihoods"], g["loglikelihoods"])))
        s = sorted(r["loglikelihoods"], reverse=True)
        gap = min(gap, s[0] - s[1])
        if r["greedy"] != g["greedy"]:
            mism.append((r["doc_id"], "greedy", r["greedy"], g["greedy"]))
    for k in ("acc", "acc_norm", "acc_bytes"):
        ok &= close(ref[k], got[k]) and close(ref[f"{k}_stderr"], got[f"{k}_stderr"])
    ok &= not mism
    print(f"{name:<10} {ref['items']:>5}  lm-eval acc {ref['acc']:.4f} ± {ref['acc_stderr'] or 0:.4f}  "
          f"acc_norm {ref['acc_norm']:.4f} ± {ref['acc_norm_stderr'] or 0:.4f} | studio acc {got['acc']:.4f}  "
          f"acc_norm {got['acc_norm']:.4f} | preds differ {len(mism)}  max|dll| {dll:.2e}  "
          f"min top-2 gap {gap:.2e}  {'OK' if ok else 'MISMATCH'}")
    for m in mism[:10]:
        print(f"    doc {m[0]}: {m[1]} lm-eval {m[2]} studio {m[3]}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Hugging Face model directory (e.g. from `moe-studio convert`)")
    ap.add_argument("--task", action="append", required=True, help="NAME=FILE.jsonl (repeat)")
    ap.add_argument("--target-delimiter", default=" ")
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/moe-studio"))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--golden", help="write lm-eval's numbers into this JSON file as run --key (no studio run; "
                    "other runs already in the file are kept)")
    ap.add_argument("--key", default="run", help="with --golden: the run's name")
    ap.add_argument("--describe", default="", help="with --golden: how the model was made")
    ap.add_argument("--out", help="also write both sides' numbers to this JSON file")
    ap.add_argument("--lm-eval-json", help="lm-eval's numbers: read from this file when it exists (same model, "
                    "tasks and options), else computed and written there")
    ap.add_argument("--lm-eval-only", action="store_true", help="stop after lm-eval (with --lm-eval-json: fill it)")
    args = ap.parse_args()
    tasks = [tuple(t.split("=", 1)) for t in args.task]
    if args.lm_eval_json and os.path.exists(args.lm_eval_json):
        with open(args.lm_eval_json, encoding="utf-8") as f:
            ref = json.load(f)
    else:
        ref = run_lm_eval(args.model, tasks, args.target_delimiter, args.batch_size, args.limit)
        if args.lm_eval_json:
            with open(args.lm_eval_json, "w", encoding="utf-8") as f:
                json.dump(ref, f)
    if args.lm_eval_only:
        return
    if args.golden:
        import lm_eval, torch, transformers  # noqa: E401
        for t in ref.values():
            t["file"] = os.path.relpath(os.path.abspath(t["file"]), REPO)
        body = {"generator": "tests/reference/check_task_eval.py --golden (tests/reference/make_task_golden.sh)",
                "lm_eval": lm_eval.__version__, "transformers": transformers.__version__,
                "torch": torch.__version__, "runs": {}}
        if os.path.exists(args.golden):
            with open(args.golden, encoding="utf-8") as f:
                body["runs"] = json.load(f).get("runs", {})
        body["runs"][args.key] = {"model": args.describe, "target_delimiter": args.target_delimiter, "tasks": ref}
        with open(args.golden, "w", encoding="utf-8") as f:
            json.dump(body, f, indent=None, separators=(",", ":"), ensure_ascii=False)
            f.write("\n")
        print(f"wrote run {args.key} into {args.golden}")
        return
    got = run_studio(args.bin, args.model, tasks, args.target_delimiter, args.limit)
    oks = [compare(name, ref[name], got[name]) for name, _ in tasks]  # every row, not the first failure
    ok = all(oks)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"lm_eval": ref, "studio": got}, f)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
