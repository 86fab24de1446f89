#!/usr/bin/env bash
# Load test of `moe-studio serve` on loopback (bounded: 20 uploads of 50 MB,
# 100 clients, a 10 minute cap): prints one LOAD line with the throughput,
# the error count and the server's peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
exec cargo test -p moe-studio --test server -- --ignored load_test --nocapture
