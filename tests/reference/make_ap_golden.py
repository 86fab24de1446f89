#!/usr/bin/env python3
"""Golden Average Precision values from scikit-learn for the NeuronMoE
neuron analysis (shared/src/methods/neurons/ap.rs).

Writes tests/reference/golden/average_precision.json with

* ``random``: seeded score vectors (continuous, heavy ties, all tied,
  binary scores, signed zeros, tiny inputs) with binary labels and
  ``sklearn.metrics.average_precision_score``;
* ``real``: pooled activations of SmolLM2-135M-Instruct dumped by our Rust
  code (mean and max pooling, a few neurons over texts of several
  languages), each neuron scored for every language as positives, plus the
  same scores rounded to 2 decimals (many exact ties).

All scores are float32 values (the dtype the Rust code ranks), written as the
shortest decimal that round-trips each float32 (read as f64 and cast to f32
it is the same float32), and ranked by scikit-learn as float32 arrays.

Real activations come from the ignored Rust test that dumps them:

    MOE_STUDIO_DUMP=/tmp/ap_real_scores.json \\
        cargo test -p moe-studio-shared --test neurons dump_real_scores -- --ignored
    python tests/reference/make_ap_golden.py /tmp/ap_real_scores.json

Without the argument only the random cases are written. Requirements:
tests/reference/requirements.txt (numpy, scikit-learn).
"""

import json
import sys
from pathlib import Path

import numpy as np
import sklearn
from sklearn.metrics import average_precision_score

OUT = Path(__file__).resolve().parent / "golden" / "average_precision.json"


def f32_list(x):
    # The shortest decimal that round-trips each float32 (via float64 too).
    out = [float(str(v)) for v in np.asarray(x, dtype=np.float32)]
    assert np.array_equal(np.asarray(out, dtype=np.float32), np.asarray(x, dtype=np.float32))
    return out


def case(name, scores, labels):
    s = np.asarray(f32_list(scores), dtype=np.float32)
    y = np.asarray(labels, dtype=np.int64)
    assert y.sum() > 0, name
    return {
        "name": name,
        "scores": f32_list(s),
        "labels": [int(v) for v in y],
        "ap": float(average_precision_score(y, s)),
    }


def random_cases():
    rng = np.random.default_rng(20260601)
    out = []
    n = 60
    y = (rng.random(n) < 0.3).astype(int)
    y[0] = 1
    out.append(case("normal_60", rng.normal(size=n), y))
    n = 300
    y = (rng.random(n) < 0.2).astype(int)
    y[0] = 1
    out.append(case("ties_5_levels_300", rng.integers(0, 5, size=n), y))
    out.append(case("ties_rounded_300", np.round(rng.normal(size=n), 1), y))
    out.append(case("all_tied_40", np.full(40, 0.5), (np.arange(40) % 4 == 0).astype(int)))
    out.append(case("binary_scores_80", rng.integers(0, 2, size=80), (rng.random(80) < 0.5).astype(int) | (np.arange(80) == 3)))
    s = np.array([-0.0, 0.0, 0.0, -0.0, 1.0, -1.0, 0.0, 2.0], dtype=np.float32)
    out.append(case("signed_zeros_8", s, [1, 0, 1, 0, 0, 1, 0, 1]))
    out.append(case("two_texts", [0.3, 0.3], [1, 0]))
    out.append(case("three_texts_reversed", [3.0, 2.0, 1.0], [0, 0, 1]))
    n = 1000
    y = (rng.random(n) < 1 / 6).astype(int)
    y[0] = 1
    # Heavy-tailed with a cluster of exact ties at zero (like ReLU-ish maxima).
    s = rng.standard_t(2, size=n)
    s[rng.random(n) < 0.3] = 0.0
    out.append(case("heavy_tail_zero_cluster_1000", s, y))
    return out


def real_cases(path):
    d = json.loads(Path(path).read_text())
    langs = d["languages"]
    labels = np.asarray(d["labels"], dtype=np.int64)
    out = []
    for pooling, block in d["pooling"].items():
        for neuron, scores in zip(block["neurons"], block["scores"]):
            s = np.asarray(f32_list(scores), dtype=np.float32)
            for variant, vals in (("raw", s), ("round2", np.round(s, 2).astype(np.float32))):
                out.append(
                    {
                        "name": f"{pooling}_{variant}_{neuron['layer']}_{neuron['component']}_{neuron['unit']}",
                        "pooling": pooling,
                        "variant": variant,
                        "neuron": neuron,
                        "scores": f32_list(vals),
                        "distinct_scores": int(len(np.unique(vals))),
                        "ap": [float(average_precision_score((labels == c).astype(int), vals)) for c in range(len(langs))],
                    }
                )
    return {"model": d.get("model"), "languages": langs, "labels": [int(v) for v in labels], "cases": out}


def main():
    golden = {
        "source": "sklearn.metrics.average_precision_score",
        "sklearn_version": sklearn.__version__,
        "numpy_version": np.__version__,
        "random": random_cases(),
    }
    if len(sys.argv) > 1:
        golden["real"] = real_cases(sys.argv[1])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    n_real = len(golden.get("real", {}).get("cases", []))
    print(f"wrote {OUT} ({len(golden['random'])} random cases, {n_real} real cases)")


if __name__ == "__main__":
    main()
