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

Packed experts (transformers 5's `experts.gate_up_proj` / `experts.down_proj`,
`--experts-format packed`): a section of its own, each public layout's
packed upcycle loaded by transformers (logits vs moe-studio, and vs
transformers' logits of the per-expert export of the same upcycle), the
committed packed fixtures (transformers' packed Qwen3-MoE, mergekit-moe
0.1.5's packed Mixtral) read by moe-studio, and with `--real` mergekit-moe
0.1.5 on SmolLM2-135M (4 experts, `gate_mode: random`, Mixtral) read by
every command (`--mergekit-python`). `--packed-only` runs only this section
and rewrites only it in `--out` (between its markers), keeping the rest.

Cases: the tiny fixtures (always; seconds) and, with `--real`, SmolLM2-135M
(llama: Mixtral) and Qwen2.5-Coder-0.5B (qwen2: Qwen2-MoE) upcycled to 4
experts top-2 — the Qwen2.5 one with a zero router and no noise, so that
transformers' logits of the Qwen2-MoE export must equal those of the dense
model (the upcycled == dense invariant through the export).

    python tests/reference/compat_matrix.py --bin BIN [--real] [--llamacpp-python PY]
        [--candle-rows FILE] [--mergekit-python PY] [--packed-only] [--work DIR] [--out docs/compatibility.md]
"""

import argparse
import json
import os
import platform
import shutil
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


def refusal(binary, model, layout, out, args=("--experts", "4")):
    r = subprocess.run([binary, "--backend", "ndarray", "upcycle", model, *args, "--layout", layout, "--out", out],
                       capture_output=True, text=True)
    assert r.returncode != 0 and not Path(out).exists(), f"--layout {layout} was not refused"
    return r.stderr.strip().splitlines()[-1].removeprefix("Error: ").removeprefix("error: ")


def transformers_rows(binary, work, rows):
    cases = [
        ("mixtral", "tiny-llama3 (Llama 3 RoPE scaling, untied, head_dim 16) 4x top-2", "tiny-llama3",
         ["--experts", "4", "--top-k", "2", *ROUTED, "--layout", "mixtral"], None),
        ("mixtral", "tiny-mistral 3x top-1", "tiny-mistral", ["--experts", "3", "--top-k", "1", *ROUTED], None),
        ("qwen2_moe", "tiny-qwen2 (q/k/v bias, tied) 4x top-2", "tiny-qwen2",
         ["--experts", "4", "--top-k", "2", *ROUTED, "--layout", "qwen2_moe"], None),
        ("qwen2_moe", "tiny-llama3, layer 1 dense (mlp_only_layers, qkv_bias false)", "tiny-llama3",
         ["--top-k", "2", *ROUTED], {"experts_per_layer": [4, None]}),
        ("qwen2_moe", "tiny-mistral 4x top-2, norm_topk_prob false (zero shared expert)", "tiny-mistral",
         ["--experts", "4", "--top-k", "2", "--norm-topk", "false", *ROUTED, "--layout", "qwen2_moe"], None),
        ("qwen3_moe", "tiny-qwen3 (q/k norm) 4x top-2", "tiny-qwen3",
         ["--experts", "4", "--top-k", "2", *ROUTED, "--layout", "qwen3_moe"], None),
        ("moe_studio", "tiny-mistral, per-layer experts [2, 3]", "tiny-mistral", ["--top-k", "1", *ROUTED],
         {"experts_per_layer": [2, 3]}),
    ]
    for layout, case, fixture, args, alloc in cases:
        out = work / f"tf-{fixture}-{layout}-{len(rows)}"
        shutil.rmtree(out, ignore_errors=True)
        rep = upcycle(binary, REPO / "tests" / "fixtures" / fixture, out, args, alloc)
        assert rep["layout"] == layout, (case, rep["layout"])
        _, ours = ours_logits(binary, out, ids=IDS)
        theirs, cls, why = hf_logits(out, IDS)
        row = {"layout": layout, "loader": "transformers", "case": case, "class": cls, "loads": theirs is not None and why is None}
        if layout == "moe_studio" and theirs is None:
            why = "the studio layout is read by moe-studio only (transformers: unknown model_type `moe_studio`)"
        if theirs is not None:
            row["max_abs_diff"] = float(np.abs(theirs - ours).max())
        if why:
            row["why"] = why
        rows.append(row)
        log(row)
    # DeepSeek-MoE: the safetensors layout is refused (no Hugging Face loader here); its form goes to
    # llama.cpp's `deepseek` GGUF (llama.cpp rows below)
    why = refusal(binary, REPO / "tests" / "fixtures" / "tiny-mistral", "deepseek_moe", work / "refused-deepseek_moe",
                  ("--experts", "4", "--norm-topk", "false", "--shared-experts", "1"))
    rows.append({"layout": "deepseek_moe", "loader": "transformers", "case": "tiny-mistral, 1 ungated shared expert, "
                 "norm_topk_prob false", "loads": False, "written": False, "why": why})
    rows.append({"layout": "deepseek_moe", "loader": "candle", "case": "—", "loads": False, "written": False,
                 "why": "candle-transformers 0.11.1 has `deepseek2` (MLA attention) only, no DeepSeek-MoE v1"})
    rows.append({"layout": "qwen3_moe", "loader": "candle", "case": "—", "loads": False,
                 "why": "candle-transformers 0.11.1 `qwen3_moe` runs its experts through `candle_nn::moe::moe_gemm`, "
                        "implemented for CUDA f16/bf16 only (this machine has no GPU)"})
    rows.append({"layout": "qwen3_moe", "loader": "llama.cpp", "case": "—", "loads": False, "written": False,
                 "why": "`convert --to gguf` writes llama.cpp's `llama` and `deepseek` (Llama blocks): the q/k norms "
                        "of qwen3 are refused by name; llama.cpp's `qwen3moe` writer is not written (no qwen3 "
                        "checkpoint with a tokenizer from a registry package to check it on)"})


def llamacpp_rows(binary, py, moe_dir, layout, case, text, work, rows, window=256, stride=128, max_tokens=1024,
                  dtypes=("f32", "f16", "q8_0")):
    ppl_f32, f32_gguf = None, None
    for dtype in dtypes:
        g = work / f"{Path(moe_dir).name}-{dtype}.gguf"
        arch, warn = "?", []
        if g.exists():
            g.unlink()
        r = subprocess.run([binary, "convert", moe_dir, "--to", "gguf", "--dtype", dtype, "--out", g, "--json"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            rows.append({"layout": layout, "loader": "llama.cpp", "case": f"{case}, GGUF {dtype.upper()}",
                         "loads": False, "written": False, "why": r.stderr.strip().splitlines()[-1][:300]})
            log(rows[-1])
            continue
        rep = json.loads(r.stdout)
        arch = rep["architecture"]
        warn = [w for w in rep["warnings"] if "power of two" in w]
        try:
            ref = ["--ref-gguf", f32_gguf] if f32_gguf and dtype != "f32" else []
            c = json.loads(sh([py, HERE / "check_llamacpp.py", g, "--text", text, "--bin", binary, "--window", window,
                               "--stride", stride, "--max-tokens", max_tokens, *ref]).strip().splitlines()[-1])
            row = {"layout": layout, "loader": "llama.cpp", "case": f"{case}, GGUF `{arch}` {dtype.upper()}",
                   "loads": True, "max_abs_diff": c["logits_max_abs_diff"], "ppl_ours": c["ppl_moe_studio"],
                   "ppl_llama_cpp": c["ppl_llama_cpp"], "ppl_rel_diff": c["ppl_rel_diff"],
                   "top1_agreement": c["top1_agreement"], "tokens_identical": c["tokens_identical"],
                   "scored_tokens": c["scored_tokens"], "class": f"llama-cpp-python {c['llama_cpp_python']}"}
        except subprocess.CalledProcessError as e:
            row = {"layout": layout, "loader": "llama.cpp", "case": f"{case}, GGUF `{arch}` {dtype.upper()}",
                   "loads": False, "why": (e.stderr or str(e)).strip().splitlines()[-1][:300]}
        if warn:
            row["warning"] = warn[0]
        if row.get("loads") and dtype == "f32":
            ppl_f32, f32_gguf = row["ppl_ours"], g
        elif row.get("loads") and ppl_f32:
            # what the type alone does, inside moe-studio and inside llama.cpp, for scale
            row["ppl_ours_vs_f32"] = row["ppl_ours"] / ppl_f32 - 1
            row["llama_cpp_vs_f32"] = c.get("llama_cpp_vs_ref_max_abs_diff")
        rows.append(row)
        log(row)
        if g != f32_gguf:
            g.unlink(missing_ok=True)
    if f32_gguf:
        f32_gguf.unlink(missing_ok=True)


def real_rows(binary, py, work, rows, text):
    smol = sh(["bash", REPO / "tests/reference/fetch_smollm2.sh"]).strip()
    qwen = sh(["bash", REPO / "tests/reference/fetch_qwen25.sh"]).strip()
    noisy = ["--router-init", "random", "--router-std", "0.5", "--noise", "0.05", "--seed", "7", "--dtype", "f32"]
    # SmolLM2 -> Mixtral: transformers + llama.cpp (`llama`)
    smol_moe = work / "smollm2-mixtral"
    if not smol_moe.exists():
        upcycle(binary, smol, smol_moe, ["--experts", "4", "--top-k", "2", *noisy])
    ids, ours = ours_logits(binary, smol_moe, text=text, max_tokens=32)
    theirs, cls, why = hf_logits(smol_moe, ids)
    rows.append({"layout": "mixtral", "loader": "transformers", "case": "SmolLM2-135M 4x top-2 (random router, noise)",
                 "class": cls, "loads": why is None, "max_abs_diff": float(np.abs(theirs - ours).max())})
    log(rows[-1])
    if py:
        llamacpp_rows(binary, py, smol_moe, "mixtral", "SmolLM2-135M 4x top-2 (random router, noise)", text, work,
                      rows)
        # an expert count llama.cpp's backends handle badly: a warning, and llama.cpp's CPU backend reads it
        smol3 = work / "smollm2-mixtral-3"
        if not smol3.exists():
            upcycle(binary, smol, smol3, ["--experts", "3", "--top-k", "1", *noisy])
        llamacpp_rows(binary, py, smol3, "mixtral", "SmolLM2-135M 3x top-1 (expert count warned)", text, work, rows,
                      dtypes=("f32",))
        # DeepSeek-MoE form -> llama.cpp `deepseek`: layer 0 dense, 1 ungated shared expert, softmax over all
        # experts without renormalising the top-k
        smol_ds = work / "smollm2-deepseek"
        if not smol_ds.exists():
            n_layers = 30
            upcycle(binary, smol, smol_ds, ["--top-k", "2", "--norm-topk", "false", "--shared-experts", "1",
                                            "--shared-init", "copy", *noisy],
                    alloc={"experts_per_layer": [None] + [4] * (n_layers - 1)})
        llamacpp_rows(binary, py, smol_ds, "deepseek_moe",
                      "SmolLM2-135M, layer 0 dense, 4x top-2 + 1 shared, norm_topk_prob false", text, work, rows)
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
            upcycle(binary, dense, q_mix, ["--experts", "4", "--top-k", "2", *noisy])
        llamacpp_rows(binary, py, q_mix, "qwen2_moe", "Qwen2.5-Coder-0.5B 4x top-2 (random router, noise; q/k/v bias)",
                      text, work, rows, max_tokens=512)


PACKED_BEGIN = "<!-- packed experts: begin (compat_matrix.py --packed-only rewrites this section) -->"
PACKED_END = "<!-- packed experts: end -->"
PACKED_CASES = [
    ("mixtral", "tiny-llama3 4x top-2", "tiny-llama3", ["--experts", "4", "--top-k", "2", *ROUTED, "--layout", "mixtral"],
     None),
    ("qwen2_moe", "tiny-qwen2 (q/k/v bias) 4x top-2, zero shared expert", "tiny-qwen2",
     ["--experts", "4", "--top-k", "2", *ROUTED, "--layout", "qwen2_moe"], None),
    ("qwen2_moe", "tiny-llama3, layer 1 dense", "tiny-llama3", ["--top-k", "2", *ROUTED], {"experts_per_layer": [4, None]}),
    ("qwen2_moe", "tiny-qwen2 4x top-2 + its own gated shared expert", "tiny-qwen2",
     ["--experts", "4", "--top-k", "2", *ROUTED, "--shared-experts", "1", "--shared-gate", "--shared-init", "copy",
      "--layout", "qwen2_moe"], None),
    ("qwen3_moe", "tiny-qwen3 (q/k norm) 4x top-2", "tiny-qwen3",
     ["--experts", "4", "--top-k", "2", *ROUTED, "--layout", "qwen3_moe"], None),
]


def safetensors_names(d):
    from safetensors import safe_open
    names = []
    for f in sorted(Path(d).glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            names += list(st.keys())
    return names


def packed_rows(binary, work, rows):
    """Each public layout's packed upcycle in transformers, and the packed fixtures in moe-studio."""
    for layout, case, fixture, args, alloc in PACKED_CASES:
        outs = {}
        for fmt_ in ("per-expert", "packed"):
            out = work / f"packed-{fixture}-{layout}-{fmt_}-{len(rows)}"
            shutil.rmtree(out, ignore_errors=True)
            rep = upcycle(binary, REPO / "tests" / "fixtures" / fixture, out, [*args, "--experts-format", fmt_], alloc)
            assert rep["layout"] == layout, (case, rep["layout"])
            outs[fmt_] = out
        names = safetensors_names(outs["packed"])
        assert any(n.endswith("experts.gate_up_proj") for n in names), names
        assert not any(".experts.0." in n for n in names), names
        _, ours = ours_logits(binary, outs["packed"], ids=IDS)
        theirs, cls, why = hf_logits(outs["packed"], IDS)
        per_expert, _, _ = hf_logits(outs["per-expert"], IDS)
        row = {"layout": layout, "loader": "transformers", "case": case, "class": cls, "loads": why is None,
               "written_by": "moe-studio upcycle --experts-format packed"}
        if theirs is not None:
            row["max_abs_diff"] = float(np.abs(theirs - ours).max())
            row["vs_per_expert"] = float(np.abs(theirs - per_expert).max())
        if why:
            row["why"] = why
        rows.append(row)
        log(row)
    # files the studio did not write: transformers' own packed save, mergekit-moe's output
    golden = json.loads((HERE / "golden" / "packed_experts.json").read_text())
    for name, layout, case in [
        ("tiny-qwen3-moe-packed", "qwen3_moe", "tiny-qwen3-moe saved by transformers with save_original_format=False"),
        ("tiny-mergekit-moe", "mixtral", "mergekit-moe 0.1.5 output (tiny Llama x 4 experts, gate_mode random)"),
    ]:
        d = REPO / "tests" / "fixtures" / name
        _, ours = ours_logits(binary, d, ids=IDS)
        theirs, cls, why = hf_logits(d, IDS)
        g = np.array(golden[name]["logits"], dtype=np.float32)
        row = {"layout": layout, "loader": "moe-studio", "case": case, "class": cls, "loads": True,
               "written_by": "transformers" if "qwen3" in name else "mergekit-moe 0.1.5",
               "max_abs_diff": float(np.abs(theirs - ours).max()), "vs_golden": float(np.abs(g - ours).max())}
        rows.append(row)
        log(row)


def mergekit_smollm2_rows(binary, mergekit_py, work, rows, text):
    """mergekit-moe 0.1.5 on SmolLM2-135M (Mixtral, 4 experts, gate_mode random): every command reads it;
    logits vs transformers on the same directory."""
    gguf = sh(["bash", REPO / "tests/reference/fetch_smollm2.sh"]).strip()
    dense = work / "smollm2-f32"
    if not dense.exists():
        sh([binary, "convert", gguf, "--out", dense, "--dtype", "f32"])
    moe = work / "smollm2-mergekit-moe"
    if not moe.exists():
        cfg = work / "smollm2-mergekit-moe.yml"
        cfg.write_text("\n".join([f"base_model: {dense}", "gate_mode: random", "dtype: float32",
                                   "experts_per_token: 2", "experts:",
                                   *[f"  - source_model: {dense}\n    noise_scale: 0.01" for _ in range(4)], ""]))
        sh([mergekit_py, "-m", "mergekit.scripts.moe", cfg, moe, "--i-understand-this-is-not-useful-without-training"])
    names = safetensors_names(moe)
    assert "model.layers.0.mlp.experts.gate_up_proj" in names, names[:20]
    ids, ours = ours_logits(binary, moe, text=text, max_tokens=64)
    theirs, cls, why = hf_logits(moe, ids)
    row = {"layout": "mixtral", "loader": "moe-studio", "case": "mergekit-moe 0.1.5 output: SmolLM2-135M x 4 "
           "(noise_scale 0.01 each), gate_mode random, f32", "class": cls, "loads": why is None,
           "written_by": "mergekit-moe 0.1.5", "max_abs_diff": float(np.abs(theirs - ours).max()),
           "logit_scale": float(np.abs(theirs).max()), "tokens": len(ids)}
    # every command on it: inspect, perplexity, generate, eval, convert (both formats, GGUF), route, graft
    b = [binary, "--backend", "ndarray"]
    insp = json.loads(sh([*b, "inspect", moe, "--json"]))
    assert insp["moe"]["experts_format"] == "packed" and insp["moe"]["layout"] == "mixtral", insp["moe"]
    sh([*b, "generate", moe, "--prompt", "The capital of France is", "--max-new-tokens", "8"])
    ppl = json.loads(sh([*b, "perplexity", moe, "--text", text, "--max-tokens", "512", "--json"]))
    row["perplexity"] = ppl.get("perplexity", ppl.get("ppl"))
    held = work / "mk-heldout.txt"
    data = Path(text).read_text()
    held.write_text(data[:20000])
    sh([*b, "eval", moe, "--data", f"en={held}", "--json"])
    done = ["inspect", "generate", "perplexity", "eval"]
    for fmt_ in ("per-expert", "packed"):
        out = work / f"mk-convert-{fmt_}"
        shutil.rmtree(out, ignore_errors=True)
        sh([*b, "convert", moe, "--out", out, "--experts-format", fmt_])
        _, conv = ours_logits(binary, out, ids=ids)
        row[f"convert_{fmt_}_vs_input"] = float(np.abs(conv - ours).max())
    g = work / "mk.gguf"
    g.unlink(missing_ok=True)
    sh([*b, "convert", moe, "--to", "gguf", "--dtype", "f32", "--out", g])
    done.append("convert (per-expert, packed, gguf)")
    corpora = Path(text).parents[2]
    domains = [corpora / "lang" / l / "train.txt" for l in ("en", "hu", "el", "tr")]
    routed = work / "mk-routed"
    shutil.rmtree(routed, ignore_errors=True)
    r = json.loads(sh([*b, "route", moe, *sum([["--domain", f"{d.parent.name}={d}"] for d in domains], []),
                       "--max-tokens", "2000", "--context", "128", "--no-bias", "--out", routed, "--json"]))
    row["route_mean_accuracy"] = r["mean_accuracy_per_domain"]
    done.append("route")
    grafted = work / "mk-grafted"
    shutil.rmtree(grafted, ignore_errors=True)
    sh([*b, "graft", moe, "--base", dense, "--instruct", dense, "--out", grafted])
    _, gl = ours_logits(binary, grafted, ids=ids)
    row["graft_zero_delta_vs_input"] = float(np.abs(gl - ours).max())
    done.append("graft")
    row["commands"] = done
    rows.append(row)
    log(row)
    # an upcycle of the same model written packed loads in transformers with the per-expert export's logits
    outs = {}
    for fmt_ in ("per-expert", "packed"):
        out = work / f"smollm2-upcycle-{fmt_}"
        if not out.exists():
            upcycle(binary, dense, out, ["--experts", "4", "--top-k", "2", "--router-init", "random", "--router-std",
                                         "0.5", "--noise", "0.05", "--seed", "7", "--experts-format", fmt_])
        outs[fmt_] = out
    _, ours_p = ours_logits(binary, outs["packed"], ids=ids)
    tp, cls, why = hf_logits(outs["packed"], ids)
    te, _, _ = hf_logits(outs["per-expert"], ids)
    rows.append({"layout": "mixtral", "loader": "transformers", "case": "SmolLM2-135M 4x top-2 (random router, noise)",
                 "class": cls, "loads": why is None, "written_by": "moe-studio upcycle --experts-format packed",
                 "max_abs_diff": float(np.abs(tp - ours_p).max()), "vs_per_expert": float(np.abs(tp - te).max()),
                 "logit_scale": float(np.abs(tp).max()), "tokens": len(ids)})
    log(rows[-1])


def packed_md(rows, meta):
    lines = [
        PACKED_BEGIN,
        "## Packed experts (transformers 5's layout)",
        "",
        f"Run: {meta['date']} — moe-studio {meta['moe_studio']}, transformers {meta['transformers']}, torch "
        f"{meta['torch']}{', mergekit ' + meta['mergekit'] if meta.get('mergekit') else ''}"
        f"{' (REAL=1)' if meta.get('real') else ''}.",
        "",
        "`--experts-format packed` (upcycle, moerge, route, graft, convert) writes each MoE layer's routed experts as",
        "`experts.gate_up_proj [E, 2f, d]` (gate rows, then up rows) and `experts.down_proj [E, d, f]`, the layout",
        "transformers 5 holds in memory (`save_pretrained(save_original_format=False)`, mergekit-moe 0.1.5); every",
        "reader of the studio reads both forms (docs/methods.md §4.2). *vs per-expert* is transformers' logits of",
        "the packed export against its logits of the per-expert export of the same upcycle; for files the studio",
        "read but did not write, *max |Δlogit|* is moe-studio against transformers on the same directory.",
        "",
        "| layout | read by | written by | case | loads | max \\|Δlogit\\| | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        notes = []
        if r.get("class"):
            notes.append(f"`{r['class']}`")
        if r.get("vs_per_expert") is not None:
            notes.append(f"vs per-expert: {fmt(r['vs_per_expert'])}")
        if r.get("vs_golden") is not None:
            notes.append(f"vs the committed golden: {fmt(r['vs_golden'])}")
        if r.get("logit_scale") is not None:
            notes.append(f"logit scale {r['logit_scale']:.1f} over {r.get('tokens', len(IDS))} tokens")
        if r.get("commands"):
            notes.append("ran: " + ", ".join(r["commands"]))
        for k, what in [("convert_per-expert_vs_input", "convert per-expert vs input"),
                        ("convert_packed_vs_input", "convert packed vs input"),
                        ("graft_zero_delta_vs_input", "graft with a zero delta vs input")]:
            if r.get(k) is not None:
                notes.append(f"{what}: {fmt(r[k])}")
        if r.get("route_mean_accuracy") is not None:
            notes.append("route mean held-out accuracy " + "/".join(f"{x:.2f}" for x in r["route_mean_accuracy"]))
        if r.get("why"):
            notes.append(r["why"].replace("|", "\\|"))
        lines.append(f"| {r['layout']} | {r['loader']} | {r['written_by']} | {r['case']} | "
                     f"{'yes' if r.get('loads') else 'no'} | {fmt(r.get('max_abs_diff'))} | " + "; ".join(notes) + " |")
    lines += ["", "Checked on every CI run: `shared/tests/integration/packed.rs` (the packed Qwen3-MoE fixture equals",
              "its per-expert twin bit for bit, tensors and logits; mergekit's packed Mixtral against transformers'",
              "golden logits; every layout written packed and per expert reads back bit for bit; packed tensors",
              "that disagree with `config.json` refused by name) and `backend/tests/interop_cli.rs` (every command",
              "on the mergekit output, `--experts-format packed` outputs equal to the per-expert ones, model cards).",
              PACKED_END, ""]
    return lines


def fmt(x, digits=2):
    return "—" if x is None else f"{x:.{digits}e}"


def write_md(rows, meta, out):
    lines = [
        "# Compatibility matrix",
        "",
        "Produced by `bash scripts/compat_matrix.sh` (tests/reference/compat_matrix.py); do not edit by hand.",
        f"Run: {meta['date']} on {meta['machine']} — moe-studio {meta['moe_studio']}, transformers "
        f"{meta['transformers']}, torch {meta['torch']}, candle-transformers 0.11.1, llama-cpp-python "
        f"{meta.get('llama_cpp', 'not run')} (llama.cpp built here from its vendored source, CPU), Python "
        f"{meta['python']}; text: `{meta['text']}`{' (REAL=1)' if meta.get('real') else ''}.",
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
        if r.get("top1_agreement") is not None:
            notes.append(f"top-1 agreement {100 * r['top1_agreement']:.1f}%")
        if r.get("ppl_ours_vs_f32") is not None:
            notes.append(f"the type alone: moe-studio's perplexity {100 * r['ppl_ours_vs_f32']:+.3f}% vs its F32"
                         + (f", llama.cpp's logits {fmt(r['llama_cpp_vs_f32'])} from its F32"
                            if r.get("llama_cpp_vs_f32") is not None else ""))
        if r.get("warning"):
            notes.append("warned: " + r["warning"].split(":")[0])
        if r.get("why"):
            notes.append(r["why"].replace("|", "\\|"))
        loads = ("yes" if r.get("loads") else ("not written" if r.get("written") is False else
                 ("see below" if r.get("loads", False) is None else "no")))
        lines.append(f"| {r['layout']} | {r['loader']} | {r['case']} | {loads} | {fmt(r.get('max_abs_diff'))} | {ppl} | "
                     + "; ".join(notes) + " |")
    lines += [""] + packed_md(meta["packed_rows"], meta)
    lines += ["## Known limits of the loaders", "",
              "- candle-transformers 0.11.1: `mixtral::Config` needs `use_flash_attn` and a numeric `sliding_window`",
              "  (the test adds them); `mixtral` and `qwen2_moe` read `lm_head.weight` (no tied embeddings: the",
              "  candle test unties the tiny Qwen2 first, exactly), use `head_dim = hidden / heads` and the default",
              "  RoPE; `qwen2_moe` has no `mlp_only_layers` (dense layers) and always reads q/k/v biases;",
              "  `qwen3_moe` runs on CUDA in f16/bf16 only.",
              "- llama.cpp (`convert --to gguf`): the first architecture whose graph computes the model exactly.",
              "  `llama`: every layer MoE, one expert count, top-k and expert width, softmax top-k renormalised (as",
              "  Mixtral), no router bias, no shared experts; q/k/v biases read when present, so Qwen2 bases fit.",
              "  `deepseek` (DeepSeek-MoE v1): leading dense layers, ungated shared experts (a zero one when the model",
              "  has none), softmax over all experts not renormalised (`norm_topk_prob: false`), Llama attention",
              "  with queries `hidden_size` wide and no per-frequency RoPE factors. Anything else is refused, naming",
              "  each architecture's reason. llama.cpp's `qwen2moe` graph does not renormalise the top-k and gates",
              "  its shared expert, so the Qwen2-MoE layout goes to `llama` (no shared expert) or `deepseek`.",
              "  For F16/Q8_0 files llama.cpp's CPU backend rounds each matmul's activations to the weights' dot",
              "  type (F16, Q8_0 blocks) while moe-studio multiplies the same dequantized weights in f32, so with a",
              "  random router a few tokens whose top-k choice flips dominate max |Δlogit| (more so with un-normalised",
              "  top-k weights, whose sum moves with the choice); the notes give what the type alone does inside each",
              "  (llama.cpp's logits of the file vs its logits of the F32 file), and the perplexity on the same",
              "  windows (within 0.5%) is the comparison.",
              "  Expert counts that are not a power of two are written with a warning (llama.cpp's CUDA fused top-k",
              "  kernel takes powers of two only; mergekit warns the same); the CPU backend reads them (row above).",
              "- DeepSeek-MoE as safetensors (`--layout deepseek_moe`) is refused: transformers reads DeepSeek-MoE v1",
              "  only through the checkpoint's remote code, and its native `deepseek_v2`/`v3` use MLA attention",
              "  (a compressed, RMS-normalised key/value latent and decoupled RoPE shared across heads), which cannot",
              "  hold a Llama/Qwen2 attention exactly. Its exact form is llama.cpp's `deepseek` GGUF (rows above).",
              "- the studio layout (`moe_studio`) loads only in moe-studio: it is the fallback for per-layer expert",
              "  counts, per-layer top-k, router biases, gated shared experts beyond one, the aux-loss-free selection",
              "  bias and non-Llama blocks, which no public layout can express.",
              "",
              "## Checked on every CI run (no Python, no llama.cpp)",
              "",
              "- `shared/tests/integration/layouts.rs`: the studio's logits on every public layout export against",
              "  transformers' golden logits (`tests/reference/make_layout_golden.py`, which also checks that",
              "  transformers loads each export with no missing/unexpected keys); the refusals (q/k/v bias, per-layer",
              "  counts, router bias into a named layout: field named, layouts that can listed, nothing written);",
              "  layout conversions bit for bit; the GGUF exports (`llama` and `deepseek`, F32/F16/Q8_0) read back to",
              "  the same configuration and logits; expert counts llama.cpp handles badly warned, not refused.",
              "- `backend/tests/layout_cli.rs`: the same refusals through the CLI (`upcycle`, `route`, `convert`),",
              "  including un-normalised top-k into Mixtral and the aux-loss-free selection bias into every public",
              "  layout, and the expert-count warning on stderr.",
              "- `shared/src/layout/*.rs` unit tests: each layout's blockers by field.",
              ""]
    Path(out).write_text("\n".join(lines))
    Path(out).with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n")
    log(f"wrote {out}")


def machine():
    cpu = "?"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, no GPU"


def studio_version(binary):
    v = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    return f"{v.removeprefix('moe-studio ')} ({rev})" if rev else v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--llamacpp-python")
    ap.add_argument("--candle-rows")
    data = Path(os.environ.get("MOE_STUDIO_DATA", REPO.parent / "shared/data"))
    ap.add_argument("--text", default=str(data / "corpora/lang/en"),
                    help="text file (or directory: its first .txt) for perplexity; default $MOE_STUDIO_DATA/corpora/lang/en")
    ap.add_argument("--mergekit-python", default=str(Path.home() / ".cache/moe-studio/mergekit-venv/bin/python"),
                    help="python with mergekit 0.1.5 (tests/reference/requirements-mergekit.txt), for --real")
    ap.add_argument("--packed-only", action="store_true",
                    help="run only the packed-experts section and rewrite only it in --out")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=str(REPO / "docs" / "compatibility.md"))
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="compat-"))
    work.mkdir(parents=True, exist_ok=True)
    text = a.text
    if Path(text).is_dir():
        text = str(sorted(p for p in Path(text).rglob("*.txt"))[0])
    if a.real and not Path(text).is_file():
        sys.exit(f"--text {text}: not a file (set MOE_STUDIO_DATA or pass --text)")
    rows = []
    meta = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "text": "/".join(Path(text).parts[-4:]), "real": a.real,
            "machine": machine(), "moe_studio": studio_version(a.bin)}
    packed = []
    packed_rows(a.bin, work, packed)
    if a.real:
        meta["mergekit"] = sh([a.mergekit_python, "-c", "import importlib.metadata as m; print(m.version('mergekit'))"]
                              ).strip()
        mergekit_smollm2_rows(a.bin, a.mergekit_python, work, packed, text)
    meta["packed_rows"] = packed
    if a.packed_only:
        doc = Path(a.out).read_text()
        section = "\n".join(packed_md(packed, meta))
        if PACKED_BEGIN in doc:
            head, rest = doc.split(PACKED_BEGIN, 1)
            doc = head + section + rest.split(PACKED_END + "\n", 1)[1]
        else:
            doc = doc.replace("## Known limits of the loaders", section + "\n## Known limits of the loaders", 1)
        Path(a.out).write_text(doc)
        log(f"rewrote the packed-experts section of {a.out}")
        return
    transformers_rows(a.bin, work, rows)
    if a.candle_rows and Path(a.candle_rows).exists():
        rows += [json.loads(l) for l in Path(a.candle_rows).read_text().splitlines() if l.strip()]
    if a.llamacpp_python:
        meta["llama_cpp"] = sh([a.llamacpp_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"]).strip()
    if a.real:
        real_rows(a.bin, a.llamacpp_python, work, rows, text)
    order = {"mixtral": 0, "qwen2_moe": 1, "qwen3_moe": 2, "deepseek_moe": 3, "moe_studio": 4}
    rows.sort(key=lambda r: (order.get(r["layout"], 9), r["loader"]))
    write_md(rows, meta, a.out)


if __name__ == "__main__":
    main()
