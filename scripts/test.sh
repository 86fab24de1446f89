#!/usr/bin/env bash
# The test command (README): set-up when missing, then formatting, lints,
# the wasm32 build of the portable crates, every Rust test, then the
# Playwright end-to-end suite in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step header says when it starts and how long the previous one took;
# the last line gives every step's time and the total.
T0=$(date +%s); TS=$T0; LAST=""; TIMES=""
step() {
    local now; now=$(date +%s)
    if [ -n "$LAST" ]; then
        echo "--- $LAST: $((now - TS)) s"
        TIMES="$TIMES\n  $((now - TS)) s  $LAST"
    fi
    TS=$now; LAST="$*"
    echo; echo "=== $* ($(date +%H:%M:%S))"
}
finish() { step "done"; echo -e "step times:$TIMES\n  total $(( $(date +%s) - T0 )) s"; }

step "set-up (what is missing)"
bash scripts/setup.sh
source scripts/env.sh


step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (deny warnings)"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p moe-studio-frontend -p moe-studio-kernels --target wasm32-unknown-unknown -- -D warnings

step "wasm32 build of the portable crates (the browser's profile, reused by scripts/build_web.sh)"
cargo build --profile wasm-release --target wasm32-unknown-unknown -p moe-studio-shared -p moe-studio-kernels -p moe-studio-frontend

step "cargo test"
cargo test --workspace --no-fail-fast
# The later steps run the moe-studio binary that cargo test has just built (the
# backend's integration tests run it, and cargo puts it here). A `cargo build -p moe-studio` of their
# own would resolve a narrower feature set than the workspace's tests and
# rebuild every dependency once more (~20 min on a fresh 2-core machine).
CLI="$CARGO_TARGET_DIR/debug/moe-studio"
[ -x "$CLI" ] || { echo "cargo test built no moe-studio binary" >&2; exit 1; }
echo "moe-studio binary of the remaining steps: $CLI"

step "benchmarks, smoke mode (every workload of scripts/bench.sh runs, tiny sizes)"
MOE_STUDIO_BIN="$CLI" bash scripts/bench.sh --smoke

step "experiments, smoke mode (each paper script on stories260K, a few steps; fresh run directories)"
for exp in upcycling dume deltamoe neuronmoe; do
    work=$(mktemp -d)
    MOE_STUDIO_BIN="$CLI" WORK="$work" bash "experiments/$exp.sh" --smoke >/dev/null
    rm -rf "$work"
done

step "browser end-to-end (scripts/build_web.sh + playwright-core + chromium)"
MOE_STUDIO_BIN="$CLI" bash tests/e2e/run.sh

step "server end-to-end (moe-studio serve + Jobs page: upload/resume, train over SSE, download)"
MOE_STUDIO_BIN="$CLI" bash tests/e2e/run_backend.sh

finish
