#!/usr/bin/env bash
# The scripted attack run on `moe-studio serve` (loopback only, bounded
# loops; a few minutes): reads without the token, a 100 MB hostile GGUF,
# 3,000 half-open connections under 256 file descriptors, 200
# create-then-cancel races, kill -9 during registration; then the load test
# (20 concurrent uploads, 100 SSE/status clients). Prints ATTACK and LOAD
# lines with the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo test -p moe-studio --test attack -- --ignored attack_run --nocapture --test-threads 1
cargo test -p moe-studio --test server -- --ignored load_test --nocapture
