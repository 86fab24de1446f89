#!/usr/bin/env bash
# Opt-in: candle-transformers (mixtral, qwen2_moe) loads moe-studio's MoE
# exports and computes the studio's logits (compat/candle, its own workspace
# and lock so that CI never builds candle). Writes one JSON line per case to
# $MOE_STUDIO_COMPAT_OUT when set (scripts/compat_matrix.sh collects them).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo test --manifest-path compat/candle/Cargo.toml -- --nocapture
