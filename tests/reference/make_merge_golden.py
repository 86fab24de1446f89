#!/usr/bin/env python3
"""Golden checksums of mergekit merges, for shared/tests/merge.rs.

1. Creates (once) three tiny Llama models -- a base and two "fine-tunes"
   (base + small seeded noise on every tensor) -- with transformers'
   `save_pretrained`, in float32 and in bfloat16, under
   tests/fixtures/merge/{f32,bf16}/{base,m1,m2}/ (config.json +
   model.safetensors, ~100 KB in all). Pass --regenerate-fixtures to rewrite
   them; otherwise the committed fixtures are used as they are, so the golden
   always describes the committed inputs.
2. Runs mergekit (its Python API, `mergekit.merge.run_merge`) on them:
   - linear:          m1 (weight 0.3), m2 (weight 0.7); mergekit's default
                      normalize: true;
   - task_arithmetic: base + m1 (0.5) + m2 (1.0); default normalize: false;
   - ties (f32 only): base + m1 (0.5, density 0.5) + m2 (1.0, density 0.5);
                      defaults (normalize: true, no rescale). bf16 is left
                      out because equal bf16 magnitudes make the top-k
                      choice depend on torch's unspecified argsort order.
   Every merge uses `dtype: float32` (mergekit computes in float32, as the
   studio does) and `out_dtype` = the fixture's dtype (rounded once).
3. Writes per-tensor checksums -- dtype, shape, sum, sum of |x|, sum of
   squares (float64 over the stored values) and the first 8 values -- to
   tests/reference/golden/mergekit_merges.json.

Environment: a venv OUTSIDE the repository with the pins of
tests/reference/requirements-mergekit.txt:

    python3 -m venv ~/.cache/moe-studio/mergekit-venv
    ~/.cache/moe-studio/mergekit-venv/bin/pip install -r tests/reference/requirements-mergekit.txt
    ~/.cache/moe-studio/mergekit-venv/bin/python tests/reference/make_merge_golden.py
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "merge"
GOLDEN = ROOT / "tests" / "reference" / "golden" / "mergekit_merges.json"
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def make_fixtures():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg).eval()
    sd = {k: v.detach().clone() for k, v in base.state_dict().items()}
    # Norm weights start at exactly 1: give them some spread too.
    for k, v in sd.items():
        if v.ndim == 1:
            sd[k] = v + 0.1 * torch.randn_like(v)
    variants = {"base": sd}
    for name, std in (("m1", 0.01), ("m2", 0.02)):
        g = torch.Generator().manual_seed({"m1": 1, "m2": 2}[name])
        variants[name] = {k: v + std * torch.randn(v.shape, generator=g) for k, v in sd.items()}
    if FIX.exists():
        shutil.rmtree(FIX)
    for dname, dt in DTYPES.items():
        for vname, state in variants.items():
            m = LlamaForCausalLM(cfg)
            m.load_state_dict(state)
            out = FIX / dname / vname
            m.to(dt).save_pretrained(out, safe_serialization=True)
            gen = out / "generation_config.json"
            if gen.exists():
                gen.unlink()


def run(method, base, models, out_dtype, out_dir):
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    conf = {
        "merge_method": method,
        "models": [{"model": str(p), "parameters": params} for p, params in models],
        "dtype": "float32",
        "out_dtype": out_dtype,
    }
    if base is not None:
        conf["base_model"] = str(base)
    run_merge(
        MergeConfiguration.model_validate(conf),
        str(out_dir),
        options=MergeOptions(copy_tokenizer=False, write_model_card=False, quiet=True),
    )
    return conf


def checksums(out_dir):
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(Path(out_dir).glob("*.safetensors")):
        tensors.update(load_file(f))
    res = {}
    for name in sorted(tensors):
        t = tensors[name]
        x = t.to(torch.float64).reshape(-1)
        res[name] = {
            "dtype": {torch.float32: "F32", torch.bfloat16: "BF16"}[t.dtype],
            "shape": list(t.shape),
            "sum": float(x.sum()),
            "abs_sum": float(x.abs().sum()),
            "sum_sq": float((x * x).sum()),
            "first8": [float(v) for v in x[:8]],
        }
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--regenerate-fixtures", action="store_true")
    args = ap.parse_args()
    if args.regenerate_fixtures or not (FIX / "f32" / "base" / "model.safetensors").exists():
        make_fixtures()
    import mergekit

    try:
        from importlib.metadata import version

        mk_version = version("mergekit")
    except Exception:  # pragma: no cover
        mk_version = getattr(mergekit, "__version__", "unknown")
    cases = []
    for dname, out_dtype in (("f32", "float32"), ("bf16", "bfloat16")):
        d = FIX / dname
        cases.append((f"linear_{dname}", "linear", None,
                      [(d / "m1", {"weight": 0.3}), (d / "m2", {"weight": 0.7})], out_dtype))
        cases.append((f"task_arithmetic_{dname}", "task_arithmetic", d / "base",
                      [(d / "m1", {"weight": 0.5}), (d / "m2", {"weight": 1.0})], out_dtype))
        if dname == "f32":
            cases.append((f"ties_{dname}", "ties", d / "base",
                          [(d / "m1", {"weight": 0.5, "density": 0.5}),
                           (d / "m2", {"weight": 1.0, "density": 0.5})], out_dtype))
    golden = {
        "generator": "tests/reference/make_merge_golden.py",
        "mergekit": mk_version,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "note": "inputs: tests/fixtures/merge; paths below are relative to the repository root",
        "merges": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for key, method, base, models, out_dtype in cases:
            out = Path(tmp) / key
            run(method, base, models, out_dtype, out)
            rel = lambda p: str(Path(p).resolve().relative_to(ROOT))
            golden["merges"][key] = {
                "method": method,
                "base": rel(base) if base is not None else None,
                "models": [{"path": rel(p), **params} for p, params in models],
                "dtype": "float32",
                "out_dtype": out_dtype,
                "tensors": checksums(out),
            }
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({len(golden['merges'])} merges)")


if __name__ == "__main__":
    main()
