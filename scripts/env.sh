# Sourced by the scripts: persistent caches outside the clone.
#   MOE_STUDIO_CACHE  models, Python reference venv   (~/.cache/moe-studio)
#   CARGO_TARGET_DIR  cargo build output, kept between CI runs; Burn's
#                     autotune cache lives under it too
#   MOE_STUDIO_DATA   shared real models and corpora  (../shared/data)
export MOE_STUDIO_CACHE="${MOE_STUDIO_CACHE:-$HOME/.cache/moe-studio}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$MOE_STUDIO_CACHE/target}"
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MOE_STUDIO_DATA="${MOE_STUDIO_DATA:-$_root/../shared/data}"
mkdir -p "$MOE_STUDIO_CACHE" "$CARGO_TARGET_DIR"
