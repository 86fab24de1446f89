#!/usr/bin/env bash
# The test command (README): set-up when missing, then formatting, lints,
# the wasm32 build of the portable crates, every Rust test, then the
# Playwright end-to-end suite in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh

step() { echo; echo "=== $* ($(date +%H:%M:%S))"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (deny warnings)"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p moe-studio-frontend -p moe-studio-kernels --target wasm32-unknown-unknown -- -D warnings

step "wasm32 build of the portable crates"
cargo build --target wasm32-unknown-unknown -p moe-studio-shared -p moe-studio-kernels -p moe-studio-frontend

step "cargo test"
cargo test --workspace --no-fail-fast

step "browser end-to-end (trunk build + playwright-core + chromium)"
bash tests/e2e/run.sh

step "server end-to-end (moe-studio serve + Jobs page: upload/resume, train over SSE, download)"
bash tests/e2e/run_backend.sh
