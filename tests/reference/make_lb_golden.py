"""Golden values of the Mixtral load-balancing loss (transformers'
`load_balancing_loss_func`) on fixed router logits, for
shared/tests/train_lb_golden.rs.

Run: /root/.cache/moe-studio/pyref-venv/bin/python tests/reference/make_lb_golden.py
Writes tests/reference/golden/lb_loss.json (small; committed).
"""

import json
import math
import pathlib

import torch
import transformers
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

E, K, T, L = 4, 2, 7, 3
BIAS = [1.0, 0.4, 0.0, -0.6]  # skews the routing so the loss is not trivially k


def logits(layer: int) -> list[float]:
    # Deterministic, tie-free values.
    return [round(2.0 * math.sin(1.37 * i + 0.9 * layer * layer + 0.1) + BIAS[i % E] * (layer + 1) / 2, 6) for i in range(T * E)]


layers = [logits(l) for l in range(L)]
tensors = tuple(torch.tensor(v, dtype=torch.float64).reshape(T, E) for v in layers)
single = float(load_balancing_loss_func((tensors[0],), E, K))
pooled = float(load_balancing_loss_func(tensors, E, K))
out = {
    "transformers": transformers.__version__,
    "num_experts": E,
    "top_k": K,
    "tokens": T,
    "layers": layers,
    "hf_single_layer": single,
    "hf_all_layers": pooled,
}
path = pathlib.Path(__file__).parent / "golden" / "lb_loss.json"
path.write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps({"hf_single_layer": single, "hf_all_layers": pooled}))
