#!/usr/bin/env bash
# Opt-in check of the PyTorch hand-off (issues 17 and 39; not in .ci/run: it
# needs torch + transformers, ~8 min on 2 cores). For every method in
# tests/reference/torch_handoff_cases.json (DeltaMoE in the Mixtral layout,
# NeuronMoE's per-layer allocation stage 1 and 2, DUME+ router training,
# aux-free balancing, two shared experts with granular experts), on the CPU:
#   1. build the input from stories260K (upcycle, or dense fine-tunes +
#      moerge + route);
#   2. train the stage for STEPS steps with moe-studio's Burn trainer on one
#      device, 4 sequences per micro-step, 2 micro-steps;
#   3. emit the same stage as a PyTorch job (`train --engine torch --emit`)
#      and run it with `torchrun --nproc-per-node 2` (gloo, FSDP2, 2
#      sequences per rank);
#   4. tests/reference/torch_handoff_check.py: per-step losses within 1e-5,
#      frozen tensors bit-identical, trained weights within 1e-4 except the
#      few elements whose first gradient is within Adam's eps of 0 (their
#      tensor's first Burn step, read off Burn's checkpoint of every step,
#      moved them < 0.5 lr: rounding decides it) within 2 lr, logits of the
#      read-back model with those elements set to Burn's within 1e-4 of the
#      Burn-trained one, the job's
#      structure equal to tests/reference/golden/torch_handoff.json; for
#      aux-free and mixtral-experts, a run killed after step 12 and resumed
#      from its sharded checkpoint logs the same losses as the
#      uninterrupted one.
# Before the cases: train.py's BurnAdamW bit-identical to Burn's AdamW
# arithmetic (shared/src/train/adamw.rs) transcribed in numpy f32.
# Usage: bash scripts/torch_handoff_check.sh [--keep DIR] [--cases a,b] [--update-golden]
#   PYTHON (default ~/.cache/moe-studio/pyref-venv/bin/python, tests/reference/requirements.txt),
#   BIN (default: cargo build -p moe-studio, debug), MOE_STUDIO_DATA, STEPS (default 20).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
PY=${PYTHON:-$MOE_STUDIO_CACHE/pyref-venv/bin/python}
TORCHRUN="$(dirname "$PY")/torchrun"
STEPS=${STEPS:-20}
D=$MOE_STUDIO_DATA
[ -f "$D/models/stories260K/stories260K.bin" ] || { echo "error: $D/models/stories260K/stories260K.bin not found (set MOE_STUDIO_DATA)" >&2; exit 1; }
"$PY" -c "import torch, transformers" || { echo "error: $PY lacks torch/transformers (tests/reference/requirements.txt)" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
  (cd "$ROOT" && cargo build -q -p moe-studio)
  BIN=$CARGO_TARGET_DIR/debug/moe-studio
fi
W="" EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) W=$2; shift 2 ;;
    --cases) EXTRA+=(--cases "$2"); shift 2 ;;
    --update-golden) EXTRA+=(--update-golden); shift ;;
    *) echo "error: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -n "$W" ]; then rm -rf "$W"; mkdir -p "$W"; else W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; fi
"$PY" "$ROOT/tests/reference/torch_handoff_check.py" --bin "$BIN" --torchrun "$TORCHRUN" --data "$D" \
  --work "$W" --steps "$STEPS" "${EXTRA[@]}"
