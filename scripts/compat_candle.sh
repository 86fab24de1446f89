#!/usr/bin/env bash
# Opt-in: candle-transformers (mixtral, qwen2_moe) loads moe-studio's MoE
# exports and computes the studio's logits (compat/candle, its own workspace
# and lock so that CI never builds candle). Writes one JSON line per case to
# $MOE_STUDIO_COMPAT_OUT when set (scripts/compat_matrix.sh collects them).
# Builds in its own target directory ($CANDLE_TARGET_DIR, default
# $MOE_STUDIO_CACHE/target-candle): its lock pins other versions than the
# main workspace's, so sharing the main target directory would only make the
# two rebuild each other's artifacts and wait on each other's lock.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
export CARGO_TARGET_DIR="${CANDLE_TARGET_DIR:-$MOE_STUDIO_CACHE/target-candle}"
cargo test --manifest-path compat/candle/Cargo.toml -- --nocapture
