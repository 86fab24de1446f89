#!/usr/bin/env python3
"""The compatibility matrix (docs/compatibility.md): each MoE layout the
studio writes x each loader -> loads? / max |logit difference| vs moe-studio
on the same file / why not. Driven by scripts/compat_matrix.sh.

Loaders:
- transformers (this venv): `AutoModelForCausalLM.from_pretrained` of the
  export (must load with no missing/unexpected/mismatched keys), logits vs
  `moe-studio logits` of the same directory;
- candle: JSON lines written by the opt-in crate compat/candle
  (`MOE_STUDIO_COMPAT_OUT`, scripts/compat_candle.sh), passed with
  `--candle-rows`;
- llama.cpp: tests/reference/check_llamacpp.py in the llama.cpp venv on the
  GGUF of `moe-studio convert --to gguf` (F32, F16, Q8_0): logits and
  perplexity vs moe-studio on the same GGUF and token windows.

Cases: the tiny fixtures (always; seconds) and, with `--real`, SmolLM2-135M
(llama: Mixtral) and Qwen2.5-Coder-0.5B (qwen2: Qwen2-MoE) upcycled to 4
experts top-2 — the Qwen2.5 one with a zero router and no noise, so that
transformers' logits of the Qwen2-MoE export must equal those of the dense
model (the upcycled == dense invariant through the export).

    python tests/reference/compat_matrix.py --bin BIN [--real] [--llamacpp-python PY]
        [--candle-rows FILE] [--work DIR] [--out docs/compatibility.md]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
IDS = [1, 5, 17, 42, 3, 88, 60, 7, 19, 2, 33, 71]
ROUTED = ["--router-init", "random", "--router-std", "0.5", "--noise", "0.3", "--noise-kind", "mul", "--seed", "7",
          "--temperature", "0.5", "--dtype", "f32"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    log("$", " ".join(map(str, cmd)))
    return subprocess.run(list(map(str, cmd)), check=True, capture_output=True, text=True, **kw).stdout


def ours_logits(binary, model, ids=None, text=None, max_tokens=64):
    tmp = tempfile.NamedTemporaryFile(suffix=".f32", delete=False).name
    args = ["--ids", ",".join(map(str, ids))] if ids is not None else ["--text", text, "--max-tokens", max_tokens]
    out = json.loads(sh([binary, "--backend", "ndarray", "logits", model, *args, "--out", tmp]).strip().splitlines()[-1])
    v = np.fromfile(tmp, dtype="<f4").reshape(len(out["ids"]), out["vocab"])
    os.unlink(tmp)
    return out["ids"], v


def hf_logits(path, ids):
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
        )
    except Exception as e:  # noqa: BLE001 - the reason goes into the matrix
        return None, None, str(e).splitlines()[0][:200]
    bad = {k: sorted(map(str, v))[:5] for k, v in info.items() if v}
    with torch.no_grad():
        lg = model(torch.tensor([ids])).logits[0].float().numpy()
    cls = type(model).__name__
    del model
    return lg, cls, (f"loading info {bad}" if bad else None)


def upcycle(binary, model, out, args, alloc=None):
    cmd = [binary, "--backend", "ndarray", "upcycle", model, *args, "--out", out, "--json"]
    if alloc is not None:
        af = str(out) + ".alloc.json"
        Path(af).write_text(json.dumps(alloc))
        cmd += ["--allocation", af]
    return json.loads(sh(cmd))


def refusal(binary, model, layout, out):
    r = subprocess.run([binary, "--backend", "ndarray", "upcycle", model, "--experts", "4", "--layout", layout,
                        "--out", out], capture_output=True, text=True)
    assert r.returncode != 0 and not Path(out).exists(), f"--layout {layout} was not refused"
    return r.stderr.strip().splitlines()[-1].removeprefix("Error: ")


def transformers_rows(binary, work, rows):
    cases = [
        ("mixtral", "tiny-llama3 (Llama 3 RoPE scaling, untied, head_dim 16) 4x top-2", "tiny-llama3",
         ["--experts", "4", "--top-k", "2", *ROUTED, "--layout", "mixtral"], None),
        ("mixtral", "tiny-mistral 3x top-1", "tiny-mistral", ["--experts", "3", "--top-k", "1", *ROUTED], None),
        ("qwen2_moe", "tiny-qwen2 (q/k/v bias, tied) 4x top-2", "tiny-qwen2",
         ["--experts", "4", "--top-k", "2", *ROUTED, "--layout", "qwen2_moe"], None),
        ("qwen2_moe", "tiny-llama3, layer 1 dense (mlp_only_layers, qkv_bias false)", "tiny-llama3",
         ["--top-k", "2", *ROUTED], {"experts_per_layer": [4, None]}),
        ("moe_studio", "tiny-mistral, per-layer experts [2, 3]", "tiny-mistral", ["--top-k", "1", *ROUTED],
         {"experts_per_layer": [2, 3]}),
    ]
    for layout, case, fixture, args, alloc in cases:
        out = work / f"tf-{fixture}-{layout}-{len(rows)}"
        rep = upcycle(binary, REPO / "tests" / "fixtures" / fixture, out, args, alloc)
        assert rep["layout"] == layout, (case, rep["layout"])
        _, ours = ours_logits(binary, out, ids=IDS)
        theirs, cls, why = hf_logits(out, IDS)
        row = {"layout": layout, "loader": "transformers", "case": case, "class": cls, "loads": theirs is not None and why is None}
        if theirs is not None:
            row["max_abs_diff"] = float(np.abs(theirs - ours).max())
        if why:
            row["why"] = why
        rows.append(row)
        log(row)
    for layout in ["qwen3_moe", "deepseek_moe"]:
        why = refusal(binary, REPO / "tests" / "fixtures" / "tiny-qwen2", layout, work / f"refused-{layout}")
        for loader in ["transformers", "candle", "llama.cpp"]:
            rows.append({"layout": layout, "loader": loader, "case": "tiny-qwen2", "loads": False, "written": False,
                         "why": why})


def llamacpp_rows(binary, py, moe_dir, case, text, work, rows, window=256, stride=128, max_tokens=1024):
    for dtype in ["f32", "f16", "q8_0"]:
        g = work / f"{Path(moe_dir).name}-{dtype}.gguf"
        if not g.exists():
            sh([binary, "convert", moe_dir, "--to", "gguf", "--dtype", dtype, "--out", g])
        try:
            r = json.loads(sh([py, HERE / "check_llamacpp.py", g, "--text", text, "--bin", binary, "--window", window,
                               "--stride", stride, "--max-tokens", max_tokens]).strip().splitlines()[-1])
            row = {"layout": "gguf (llama.cpp `llama` MoE)", "loader": "llama.cpp", "case": f"{case}, GGUF {dtype.upper()}",
                   "loads": True, "max_abs_diff": r["logits_max_abs_diff"], "ppl_ours": r["ppl_moe_studio"],
                   "ppl_llama_cpp": r["ppl_llama_cpp"], "ppl_rel_diff": r["ppl_rel_diff"],
                   "tokens_identical": r["tokens_identical"], "scored_tokens": r["scored_tokens"],
                   "class": f"llama-cpp-python {r['llama_cpp_python']}"}
        except subprocess.CalledProcessError as e:
            row = {"layout": "gguf (llama.cpp `llama` MoE)", "loader": "llama.cpp", "case": f"{case}, GGUF {dtype}",
                   "loads": False, "why": (e.stderr or "").strip().splitlines()[-1:][0][:200] if e.stderr else str(e)}
        rows.append(row)
        log(row)


def real_rows(binary, py, work, rows, text):
    smol = sh(["bash", REPO / "tests/reference/fetch_smollm2.sh"]).strip()
    qwen = sh(["bash", REPO / "tests/reference/fetch_qwen25.sh"]).strip()
    # SmolLM2 -> Mixtral: transformers + llama.cpp
    smol_moe = work / "smollm2-mixtral"
    if not smol_moe.exists():
        upcycle(binary, smol, smol_moe, ["--experts", "4", "--top-k", "2", "--router-init", "random", "--router-std",
                                         "0.5", "--noise", "0.05", "--seed", "7", "--dtype", "f32"])
    ids, ours = ours_logits(binary, smol_moe, text=text, max_tokens=32)
    theirs, cls, why = hf_logits(smol_moe, ids)
    rows.append({"layout": "mixtral", "loader": "transformers", "case": "SmolLM2-135M 4x top-2 (random router, noise)",
                 "class": cls, "loads": why is None, "max_abs_diff": float(np.abs(theirs - ours).max())})
    log(rows[-1])
    if py:
        llamacpp_rows(binary, py, smol_moe, "SmolLM2-135M 4x top-2 (random router, noise)", text, work, rows)
    # Qwen2.5 -> dense f32 directory -> Qwen2-MoE (zero router, no noise)
    dense = work / "qwen25-dense"
    if not dense.exists():
        sh([binary, "convert", qwen, "--out", dense, "--dtype", "f32"])
    q_moe = work / "qwen25-qwen2moe"
    if not q_moe.exists():
        upcycle(binary, dense, q_moe, ["--experts", "4", "--top-k", "2", "--dtype", "f32"])
    ids, ours = ours_logits(binary, q_moe, text=text, max_tokens=32)
    theirs, cls, why = hf_logits(q_moe, ids)
    dense_l, _, _ = hf_logits(dense, ids)
    rows.append({"layout": "qwen2_moe", "loader": "transformers", "case": "Qwen2.5-Coder-0.5B 4x top-2 (zero router)",
                 "class": cls, "loads": why is None, "max_abs_diff": float(np.abs(theirs - ours).max()),
                 "vs_dense_transformers": float(np.abs(theirs - dense_l).max())})
    log(rows[-1])
    if py:
        q_mix = work / "qwen25-noise"
        if not q_mix.exists():
            upcycle(binary, dense, q_mix, ["--experts", "4", "--top-k", "2", "--router-init", "random", "--router-std",
                                           "0.5", "--noise", "0.05", "--seed", "7", "--dtype", "f32"])
        llamacpp_rows(binary, py, q_mix, "Qwen2.5-Coder-0.5B 4x top-2 (random router, noise; q/k/v bias)", text, work,
                      rows, max_tokens=512)


def fmt(x, digits=2):
    return "—" if x is None else f"{x:.{digits}e}"


def write_md(rows, meta, out):
    lines = [
        "# Compatibility matrix",
        "",
        "Produced by `bash scripts/compat_matrix.sh` (tests/reference/compat_matrix.py); do not edit by hand.",
        f"Run: {meta['date']} — transformers {meta['transformers']}, torch {meta['torch']}, "
        f"candle-transformers 0.11.1, llama-cpp-python {meta.get('llama_cpp', 'not run')}.",
        "",
        "Each row: one export written by moe-studio, one loader. *max |Δlogit|* is the largest difference between",
        "the loader's float32 logits and moe-studio's on the same file and token ids; for llama.cpp also the",
        "perplexity of both on the same token windows (moe-studio reading the same GGUF).",
        "",
        "| layout | loader | case | loads | max \\|Δlogit\\| | perplexity (ours / loader, rel. diff) | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ppl = "—"
        if "ppl_ours" in r:
            ppl = f"{r['ppl_ours']:.4f} / {r['ppl_llama_cpp']:.4f} ({100 * r['ppl_rel_diff']:.3f}%)"
        notes = []
        if r.get("class"):
            notes.append(f"`{r['class']}`")
        if r.get("vs_dense_transformers") is not None:
            notes.append(f"vs the dense model in transformers: {fmt(r['vs_dense_transformers'])}")
        if r.get("tokens_identical") is not None:
            notes.append("same tokenization" if r["tokens_identical"] else "tokenization differs")
        if r.get("why"):
            notes.append(r["why"].replace("|", "\\|"))
        loads = "yes" if r.get("loads") else ("not written" if r.get("written") is False else "no")
        lines.append(f"| {r['layout']} | {r['loader']} | {r['case']} | {loads} | {fmt(r.get('max_abs_diff'))} | {ppl} | "
                     + "; ".join(notes) + " |")
    lines += ["", "## Known limits of the loaders", "",
              "- candle-transformers 0.11.1: `mixtral::Config` needs `use_flash_attn` and a numeric `sliding_window`",
              "  (the test adds them); `mixtral` and `qwen2_moe` read `lm_head.weight` (no tied embeddings: the",
              "  candle test unties the tiny Qwen2 first, exactly), use `head_dim = hidden / heads` and the default",
              "  RoPE; `qwen2_moe` has no `mlp_only_layers` (dense layers) and always reads q/k/v biases.",
              "- llama.cpp: the GGUF is the `llama` architecture (softmax top-k renormalised, as the studio routes;",
              "  q/k/v biases read when present, so Qwen2 bases fit); it needs every layer MoE with one expert count",
              "  and top-k and no router bias (`convert --to gguf` refuses others); `qwen2moe`/`deepseek` GGUF",
              "  architectures do not renormalise the top-k weights, so they are not used.",
              "- the studio layout (`moe_studio`) loads only in moe-studio: it is the fallback for per-layer expert",
              "  counts, per-layer top-k and router biases, which no public layout can express.",
              ""]
    Path(out).write_text("\n".join(lines))
    Path(out).with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    log(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--llamacpp-python")
    ap.add_argument("--candle-rows")
    ap.add_argument("--text", default=str(REPO.parent / "shared/data/corpora/lang/en"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=str(REPO / "docs" / "compatibility.md"))
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="compat-"))
    work.mkdir(parents=True, exist_ok=True)
    text = a.text
    if Path(text).is_dir():
        text = str(sorted(p for p in Path(text).rglob("*.txt"))[0])
    rows = []
    meta = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "text": os.path.relpath(text, REPO.parent)}
    transformers_rows(a.bin, work, rows)
    if a.candle_rows and Path(a.candle_rows).exists():
        rows += [json.loads(l) for l in Path(a.candle_rows).read_text().splitlines() if l.strip()]
    if a.llamacpp_python:
        meta["llama_cpp"] = sh([a.llamacpp_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"]).strip()
    if a.real:
        real_rows(a.bin, a.llamacpp_python, work, rows, text)
    rows.sort(key=lambda r: (r["layout"], r["loader"]))
    write_md(rows, meta, a.out)


if __name__ == "__main__":
    main()
