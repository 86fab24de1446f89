#!/usr/bin/env bash
# Opt-in: regenerates docs/compatibility.md (layout x loader -> loads / logits
# difference / why not). Needs the reference venv (tests/reference/requirements.txt),
# builds the llama.cpp venv when missing (scripts/llamacpp_venv.sh, ~30 min
# once) and runs the candle crate. REAL=1 adds the real models (SmolLM2-135M
# and Qwen2.5-Coder-0.5B from PyPI, and mergekit-moe 0.1.5 on SmolLM2 with the
# mergekit venv of tests/reference/requirements-mergekit.txt; ~20 GB of
# scratch in $WORK, ~8 GB RAM, an hour on 2 cores). PACKED_ONLY=1 runs only
# the packed-experts section (no llama.cpp, no candle; minutes, or ~15 min
# with REAL=1) and rewrites only that section. Run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
CACHE="${MOE_STUDIO_CACHE:-$HOME/.cache/moe-studio}"
PY="${PYREF:-$CACHE/pyref-venv/bin/python}"
MERGEKIT_PY="${MERGEKIT_PYTHON:-$CACHE/mergekit-venv/bin/python}"
WORK="${WORK:-$CACHE/compat-work}"
mkdir -p "$WORK"
cargo build --release -p moe-studio
BIN="$CARGO_TARGET_DIR/release/moe-studio"
extra=(--mergekit-python "$MERGEKIT_PY")
if [ "${REAL:-0}" = 1 ]; then extra+=(--real); fi
if [ "${PACKED_ONLY:-0}" = 1 ]; then
    "$PY" tests/reference/compat_matrix.py --bin "$BIN" --work "$WORK" --packed-only "${extra[@]}"
    exit 0
fi
LLAMA_PY="$(bash scripts/llamacpp_venv.sh)/bin/python"
rm -f "$WORK/candle.jsonl"
MOE_STUDIO_COMPAT_OUT="$WORK/candle.jsonl" bash scripts/compat_candle.sh
"$PY" tests/reference/compat_matrix.py --bin "$BIN" --llamacpp-python "$LLAMA_PY" \
    --candle-rows "$WORK/candle.jsonl" --work "$WORK" "${extra[@]}"
