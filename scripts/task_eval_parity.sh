#!/usr/bin/env bash
# Opt-in parity check of `moe-studio eval --task` against lm-evaluation-harness
# 0.4.13 (not in .ci/run: it needs torch + transformers + lm-eval and SmolLM2;
# CI compares with the committed golden file instead,
# shared/tests/integration/task_eval.rs). On the CPU:
#   1. SmolLM2-135M-Instruct (tests/reference/fetch_smollm2.sh, Q4_1 GGUF)
#      exported by `moe-studio convert --dtype f32` to Hugging Face safetensors;
#   2. that export upcycled to 4 experts (top-2, random router std 0.5, x0.05
#      multiplicative noise on the copies, seed 1: routing changes the scores);
#   3. the next-paragraph tasks of tests/reference/make_tasks.py (valid.txt of
#      lang/en, hu, el, tr and domain/docs, code, math; ITEMS items each, seed 0);
#   4. tests/reference/check_task_eval.py on each model: lm-eval's `hf` model
#      (float32) through a local task YAML vs `moe-studio eval --task --json`:
#      the same prediction for every item, equal acc / acc_norm / acc_bytes and
#      standard errors (exit 1 otherwise).
# Usage: bash scripts/task_eval_parity.sh [--keep DIR]
#   PYTHON (default ~/.cache/moe-studio/lmeval-venv/bin/python, tests/reference/requirements-lmeval.txt),
#   BIN (default: cargo build -p moe-studio, debug), MOE_STUDIO_DATA, ITEMS (default 100),
#   LIMIT (score only the first LIMIT items of each task, lm-eval's --limit; default all),
#   DELIMITER (default '': the tasks' contexts end in a newline), MODELS (default "smollm2 moe").
# With --keep DIR, lm-eval's numbers are kept in DIR/lmeval-MODEL-KEY.json (KEY: a hash of the tasks'
# manifest, the delimiter and LIMIT) and reused by a later run on the same tasks: lm-eval takes
# ~40 min for 30 items x 7 tasks on SmolLM2 on 2 shared CPU cores.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
PY=${PYTHON:-$MOE_STUDIO_CACHE/lmeval-venv/bin/python}
ITEMS=${ITEMS:-100}
LIMIT=${LIMIT:-}
DELIMITER=${DELIMITER-}
MODELS=${MODELS:-smollm2 moe}
"$PY" -c "import lm_eval, torch, transformers" || { echo "error: $PY lacks lm_eval (tests/reference/requirements-lmeval.txt)" >&2; exit 1; }
[ -d "$MOE_STUDIO_DATA/corpora" ] || { echo "error: $MOE_STUDIO_DATA/corpora not found (set MOE_STUDIO_DATA)" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
  (cd "$ROOT" && cargo build -q -p moe-studio)
  BIN=$CARGO_TARGET_DIR/debug/moe-studio
fi
if [ "${1:-}" = "--keep" ]; then W=$2; mkdir -p "$W"; else W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
GGUF=$(bash "$ROOT/tests/reference/fetch_smollm2.sh")
[ -f "$W/smollm2/config.json" ] || "$BIN" --backend cpu convert "$GGUF" --out "$W/smollm2" --dtype f32 >/dev/null
[ -f "$W/moe/config.json" ] || "$BIN" --backend cpu upcycle "$W/smollm2" --experts 4 --top-k 2 --router-init random \
  --router-std 0.5 --noise 0.05 --seed 1 --dtype f32 --out "$W/moe" >/dev/null
python3 "$ROOT/tests/reference/make_tasks.py" --data "$MOE_STUDIO_DATA" --out "$W/tasks" --items "$ITEMS" >/dev/null
TASKS=()
for t in en hu el tr docs code math; do TASKS+=(--task "$t=$W/tasks/$t.jsonl"); done
LIM=()
[ -z "$LIMIT" ] || LIM=(--limit "$LIMIT")
KEY=$( (sha256sum <"$W/tasks/tasks.json"; printf '%s|%s' "$DELIMITER" "$LIMIT") | sha256sum | cut -c1-12)
status=0
for m in $MODELS; do
  echo "== $m ($W/$m), target_delimiter $(printf %q "$DELIMITER"), $ITEMS items per task${LIMIT:+, first $LIMIT scored}"
  "$PY" "$ROOT/tests/reference/check_task_eval.py" "$W/$m" "${TASKS[@]}" --target-delimiter "$DELIMITER" "${LIM[@]}" \
    --lm-eval-json "$W/lmeval-$m-$KEY.json" --bin "$BIN" --out "$W/parity-$m.json" || status=1
done
exit $status
