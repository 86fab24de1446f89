#!/usr/bin/env bash
# Opt-in check of the PyTorch hand-off (issue 17 item 3; not in .ci/run: it
# needs torch + transformers, ~3 min on 2 cores). On the CPU:
#   1. upcycle stories260K to 4 experts (top-2, random router, Mixtral layout);
#   2. train stage experts (then stage router) for STEPS steps with moe-studio's
#      Burn trainer on one device, 4 sequences per micro-step, 2 micro-steps;
#   3. emit the same stage as a PyTorch job (`train --engine torch --emit`) and
#      run it with `torchrun --nproc_per_node 2` (gloo, FSDP2, 2 sequences per rank);
#   4. tests/reference/torch_handoff_compare.py: |loss_torch - loss_burn| <= 1e-4
#      at every step (the table), frozen tensors bit-identical, the trained
#      ones changed, and the result read back by moe-studio (inspect, logits
#      equal transformers' on the same file to 1e-4, eval).
# Usage: bash scripts/torch_handoff_check.sh [--keep DIR]
#   PYTHON (default ~/.cache/moe-studio/pyref-venv/bin/python, tests/reference/requirements.txt),
#   BIN (default: cargo build -p moe-studio, debug), MOE_STUDIO_DATA, STEPS (default 20).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
PY=${PYTHON:-$MOE_STUDIO_CACHE/pyref-venv/bin/python}
TORCHRUN="$(dirname "$PY")/torchrun"
STEPS=${STEPS:-20}
D=$MOE_STUDIO_DATA
M=$D/models/stories260K
[ -f "$M/stories260K.bin" ] || { echo "error: $M/stories260K.bin not found (set MOE_STUDIO_DATA)" >&2; exit 1; }
"$PY" -c "import torch, transformers" || { echo "error: $PY lacks torch/transformers (tests/reference/requirements.txt)" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
  (cd "$ROOT" && cargo build -q -p moe-studio)
  BIN=$CARGO_TARGET_DIR/debug/moe-studio
fi
if [ "${1:-}" = "--keep" ]; then W=$2; rm -rf "$W"; mkdir -p "$W"; else W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; fi
TOK=$M/tok512.bin
EN=$D/corpora/lang/en/valid.txt HU=$D/corpora/lang/hu/valid.txt

"$BIN" --backend cpu upcycle "$M/stories260K.bin" --experts 4 --top-k 2 --router-init random --router-std 0.5 \
  --seed 1 --dtype f32 --layout mixtral --out "$W/moe" >/dev/null
COMMON=(--tokenizer "$TOK" --data "en=$EN:orig" --data "hu=$HU:2" --steps "$STEPS" --seq-len 32 --batch 4
  --grad-accum 2 --warmup 3 --weight-decay 0.01 --z-loss 0.001 --save-every 10 --seed 3)
for stage in experts router; do
  if [ $stage = experts ]; then IN=$W/moe LR=2e-3; else IN=$W/torch-experts/out/final LR=1e-2; fi
  echo "== stage $stage: Burn (1 device x 4 sequences) vs torchrun --nproc_per_node 2 (FSDP2, gloo, 2 x 2)"
  "$BIN" --backend cpu train "$IN" --stage $stage --lr $LR "${COMMON[@]}" --json --out "$W/burn-$stage" >/dev/null
  "$BIN" --backend cpu train "$IN" --stage $stage --lr $LR "${COMMON[@]}" --engine torch --emit "$W/torch-$stage"
  OMP_NUM_THREADS=1 "$TORCHRUN" --standalone --nproc_per_node 2 "$W/torch-$stage/train.py" --device cpu \
    2>&1 | grep -E "^(step|stage|done|error)" | sed -n '1p;$p'
  "$PY" "$ROOT/tests/reference/torch_handoff_compare.py" --bin "$BIN" --stage $stage \
    --burn "$W/burn-$stage" --job "$W/torch-$stage" --eval "en=$EN" --tokenizer "$TOK"
done
echo "torch hand-off check: OK"
