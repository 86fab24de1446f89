#!/usr/bin/env bash
# Regenerates tests/reference/golden/task_eval.json: lm-evaluation-harness
# 0.4.13's per-item log-likelihoods, predictions and acc / acc_norm /
# acc_bytes (with standard errors) on the hand-written task
# tests/reference/tasks/tiny_stories_mc.jsonl, for the models that
# shared/tests/integration/task_eval.rs rebuilds and scores:
#   dense_space / dense_none  stories260K as `moe-studio convert` exports it
#                             (target_delimiter " " and "")
#   moe_space                 stories260K upcycled to 4 experts (top-2, random
#                             router std 0.5, x0.3 noise, seed 7, T 0.5: the
#                             options of stories260k_mixtral.json), Mixtral layout
#   tiny_bpe_space            init-random of tests/reference/tasks/tiny_llama_config.json
#                             (std 0.2, seed 3) with SmolLM2's tokenizer.json
# Usage: bash tests/reference/make_task_golden.sh
#   PYTHON (default ~/.cache/moe-studio/lmeval-venv/bin/python, tests/reference/requirements-lmeval.txt),
#   BIN (default: cargo build -p moe-studio, debug), MOE_STUDIO_DATA.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/env.sh"
PY=${PYTHON:-$MOE_STUDIO_CACHE/lmeval-venv/bin/python}
D=$MOE_STUDIO_DATA
S=$D/models/stories260K/stories260K.bin
[ -f "$S" ] || { echo "error: $S not found (set MOE_STUDIO_DATA)" >&2; exit 1; }
"$PY" -c "import lm_eval, torch, transformers" || { echo "error: $PY lacks lm_eval (tests/reference/requirements-lmeval.txt)" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
  (cd "$ROOT" && cargo build -q -p moe-studio)
  BIN=$CARGO_TARGET_DIR/debug/moe-studio
fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
UP=(--experts 4 --top-k 2 --router-init random --router-std 0.5 --noise 0.3 --noise-kind mul --seed 7
  --temperature 0.5 --dtype f32)
"$BIN" --backend cpu convert "$S" --out "$W/dense" --dtype f32 >/dev/null
"$BIN" --backend cpu upcycle "$S" "${UP[@]}" --out "$W/moe" >/dev/null
"$BIN" --backend cpu init-random --config "$ROOT/tests/reference/tasks/tiny_llama_config.json" --std 0.2 --seed 3 \
  --tokenizer "$D/models/smollm2-135m-instruct/tokenizer.json" --out "$W/tiny" >/dev/null
OUT=$ROOT/tests/reference/golden/task_eval.json
rm -f "$OUT"
TASK=(--task "tiny=$ROOT/tests/reference/tasks/tiny_stories_mc.jsonl" --golden "$OUT")
cd "$ROOT"
"$PY" tests/reference/check_task_eval.py "$W/dense" "${TASK[@]}" --key dense_space \
  --describe "moe-studio convert stories260K.bin --dtype f32"
"$PY" tests/reference/check_task_eval.py "$W/dense" "${TASK[@]}" --key dense_none --target-delimiter '' \
  --describe "moe-studio convert stories260K.bin --dtype f32"
"$PY" tests/reference/check_task_eval.py "$W/moe" "${TASK[@]}" --key moe_space \
  --describe "moe-studio upcycle stories260K.bin ${UP[*]}"
"$PY" tests/reference/check_task_eval.py "$W/tiny" "${TASK[@]}" --key tiny_bpe_space \
  --describe "moe-studio init-random --config tests/reference/tasks/tiny_llama_config.json --std 0.2 --seed 3 --tokenizer smollm2-135m-instruct/tokenizer.json"
ls -l "$OUT"
