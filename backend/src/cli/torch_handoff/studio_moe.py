"""moe-studio's MoE FFN in PyTorch, for the models only the studio layout
(``model_type: moe_studio``) holds: per-layer expert counts and widths
(NeuronMoE's allocation, granular experts), dense layers beside MoE ones,
a router bias (DUME's ridge router), a router temperature, the aux-loss-free
selection bias (DeepSeek-V3 §2.1.2), any number of shared experts, gated or
not, and renormalised or un-normalised top-k weights. Written by
``moe-studio train ... --engine torch --emit DIR`` beside ``train.py``.

It is the PyTorch twin of shared/src/model/moe.rs (``MoeLayer``) and
computes what that computes (docs/methods.md §0 "Top-k routing", §5):

- router logits ``r(x) = (W_r x + b_r) / T``, ``W_r: [E, d]``;
- the ``k`` experts with the highest ``r(x) + s`` (``s`` the selection bias,
  zero without one), ties to the LOWER expert index (a stable sort, as the
  studio's ``top_k_lowest_index_first``);
- their weights from ``r(x)`` alone: a softmax over the ``k`` chosen logits
  (``norm_topk_prob``), else each one's probability in the softmax over all
  ``E``;
- ``y = sum_j w_j expert_j(x) + sum_i g_i(x) shared_i(x)`` with
  ``g_i = sigmoid(G_i x)`` for gated shared experts, else 1; each expert a
  gated FFN ``w2(act(w1 x) * w3 x)`` (SwiGLU, or GeGLU for Gemma).

The dense rest of the model (embeddings, attention, norms, LM head) is the
transformers class of the base family; :func:`build` swaps the FFN of each
MoE layer for a :class:`StudioMoeBlock`, and :func:`canonical_name` /
:func:`module_name` map the studio layout's tensor names
(shared/src/layout/names.rs) to and from the module's.
"""

import contextlib
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = {
    "silu": F.silu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class Expert(nn.Module):
    """A gated FFN with the studio's (Mixtral's) names: ``w1`` gate
    ``[f, d]``, ``w3`` up ``[f, d]``, ``w2`` down ``[d, f]``, no biases."""

    def __init__(self, d, f, act):
        super().__init__()
        self.w1 = nn.Linear(d, f, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.act = ACTIVATIONS[act]

    def forward(self, x):
        return self.w2(self.act(self.w1(x)) * self.w3(x))


class StudioMoeBlock(nn.Module):
    """One MoE FFN as ``moe_layers[l]`` of a studio ``config.json`` describes it
    (shared/src/config/moe.rs ``MoeLayerSpec``): ``x [batch, seq, d] -> [batch, seq, d]``.

    After each forward pass ``self.logits`` holds the router logits
    ``[tokens, E]`` (temperature applied, selection bias not; differentiable)
    and ``self.counts`` the routed token slots per expert ``[E]`` (int64), for
    the training losses and the aux-free update.
    """

    def __init__(self, d, dense_f, spec, act):
        super().__init__()
        e = spec["num_experts"]
        f = spec.get("expert_intermediate_size") or dense_f
        self.num_experts = e
        self.top_k = min(spec["top_k"], e)
        self.temperature = float(spec.get("temperature", 1.0))
        self.norm_topk_prob = bool(spec.get("norm_topk_prob", True))
        self.gate = nn.Linear(d, e, bias=bool(spec.get("router_bias", False)))
        if spec.get("selection_bias", False):
            # A buffer, not a parameter: it moves the choice, never the weights.
            self.gate.register_buffer("e_score_correction_bias", torch.zeros(e))
        self.experts = nn.ModuleList(Expert(d, f, act) for _ in range(e))
        n_shared = spec.get("shared_experts", 0)
        self.shared_experts = nn.ModuleList(Expert(d, dense_f, act) for _ in range(n_shared))
        self.shared_expert_gate = (
            nn.Linear(d, n_shared, bias=False) if n_shared and spec.get("shared_expert_gate", False) else None
        )
        self.logits = None
        self.counts = None

    def selection_bias(self):
        return getattr(self.gate, "e_score_correction_bias", None)

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        logits = self.gate(flat)
        if self.temperature != 1.0:
            logits = logits / self.temperature
        scores = logits.detach()
        bias = self.selection_bias()
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        k = self.top_k
        # Highest first; a stable sort keeps equal scores in ascending index order.
        idx = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
        if self.norm_topk_prob:
            w = torch.softmax(logits.gather(1, idx), dim=-1)
        else:
            w = torch.softmax(logits, dim=-1).gather(1, idx)
        flat_idx = idx.reshape(-1)
        counts = torch.bincount(flat_idx, minlength=self.num_experts)
        # Slots grouped by expert (stable), as the studio's dispatch plan.
        order = torch.sort(flat_idx, stable=True).indices
        rows = order // k
        ws = w.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros_like(flat)
        offset = 0
        for e, m in enumerate(counts.tolist()):
            # An expert no token chose still runs on zero rows: every rank then
            # holds a (zero) gradient for every expert, as FSDP's reduce-scatter
            # needs; train.py drops it when no rank routed a token there.
            r = rows[offset : offset + m]
            y = self.experts[e](flat.index_select(0, r)) * ws[offset : offset + m].to(flat.dtype)
            out = out.index_add(0, r, y)
            offset += m
        shared = None
        if len(self.shared_experts):
            g = torch.sigmoid(self.shared_expert_gate(flat)) if self.shared_expert_gate is not None else None
            for i, ex in enumerate(self.shared_experts):
                y = ex(flat)
                if g is not None:
                    y = y * g[:, i : i + 1]
                shared = y if shared is None else shared + y
        if shared is not None:
            out = out + shared
        self.logits = logits
        self.counts = counts
        return out.reshape(shape)


def moe_layers(config_json):
    """The per-layer MoE specs of a studio ``config.json`` (``None``: dense)."""
    layers = config_json.get("moe_layers")
    if not isinstance(layers, list):
        raise ValueError("config.json: `moe_layers` (one entry per layer) is missing: not a moe_studio checkpoint")
    return layers


def build(base_config, config_json, act, dtype=torch.float32):
    """The transformers model of the dense base ``base_config`` (a dense
    ``config.json`` as a dict) with every MoE layer's FFN replaced by a
    :class:`StudioMoeBlock`. The weights are left uninitialised: load them
    with :func:`load_state`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(base_config)
    model_type = cfg.pop("model_type")
    hf = AutoConfig.for_model(model_type, **cfg)
    layers = moe_layers(config_json)
    if len(layers) != hf.num_hidden_layers:
        raise ValueError(f"config.json: {len(layers)} moe_layers for {hf.num_hidden_layers} layers")
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: initialise, then overwrite
        no_init_weights = contextlib.nullcontext
    # Every parameter is loaded next (load_state checks it): skip the random init.
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype)
        d, f = hf.hidden_size, hf.intermediate_size
        for l, spec in enumerate(layers):
            if spec is not None:
                model.model.layers[l].mlp = StudioMoeBlock(d, f, spec, act).to(dtype)
    return model


MOE = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.(.*)$")
MLP = re.compile(r"^model\.layers\.(\d+)\.mlp\.(.*)$")


def module_name(canonical, moe_set):
    """The module's name of a studio-layout tensor: ``block_sparse_moe.`` is
    the swapped ``mlp.`` of MoE layer ``l``; every other name is the dense one."""
    m = MOE.match(canonical)
    if m and int(m.group(1)) in moe_set:
        return f"model.layers.{m.group(1)}.mlp.{m.group(2)}"
    return canonical


def canonical_name(name, moe_set):
    """Inverse of :func:`module_name`."""
    m = MLP.match(name)
    if m and int(m.group(1)) in moe_set:
        return f"model.layers.{m.group(1)}.block_sparse_moe.{m.group(2)}"
    return name


def moe_block_list(model):
    """``[(layer, StudioMoeBlock)]`` in layer order."""
    return [(l, layer.mlp) for l, layer in enumerate(model.model.layers) if isinstance(layer.mlp, StudioMoeBlock)]


def load_state(model, tensors, tied):
    """Loads the studio-layout ``tensors`` ({canonical name: tensor}) into
    ``model`` exactly (every parameter and buffer; a tied LM head is the
    embedding). Raises ``ValueError`` naming what is missing or extra."""
    moe_set = {l for l, _ in moe_block_list(model)}
    sd = {module_name(k, moe_set): v for k, v in tensors.items()}
    want = set(model.state_dict().keys())
    if tied:
        want.discard("lm_head.weight")
    missing, extra = sorted(want - set(sd)), sorted(set(sd) - want)
    if missing or extra:
        raise ValueError(f"model/ does not match the model: missing {missing[:8]}, unexpected {extra[:8]}")
    for k, v in sd.items():
        ref = model.state_dict()[k]
        if tuple(ref.shape) != tuple(v.shape):
            raise ValueError(f"{canonical_name(k, moe_set)}: shape {tuple(v.shape)}, the model has {tuple(ref.shape)}")
    model.load_state_dict(sd, strict=False)
    if tied:
        model.tie_weights()
