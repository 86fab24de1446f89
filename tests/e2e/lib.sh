# Sourced by the e2e scripts (run.sh, run_backend.sh, run_smollm2.sh).
# step TEXT        prints a step header
# ms               milliseconds since the epoch
# build_frontend D scripts/build_web.sh into D (a private folder:
#                  frontend/dist may be rebuilt by someone else)
# cli_binary       builds the moe-studio CLI (debug) and prints its path;
#                  MOE_STUDIO_BIN=path uses an already built binary instead
#                  (MOE_STUDIO_CLI, its former name, is still read)
step() { echo "== $*"; }
ms() { date +%s%3N; }
build_frontend() {
  step "frontend: scripts/build_web.sh"
  bash "$root/scripts/build_web.sh" "$1"
}
cli_binary() {
  if [ -n "${MOE_STUDIO_BIN:-${MOE_STUDIO_CLI:-}}" ]; then
    echo "${MOE_STUDIO_BIN:-$MOE_STUDIO_CLI}"
    return
  fi
  step "CLI: cargo build -p moe-studio" >&2
  cargo build -q -p moe-studio >&2
  echo "$CARGO_TARGET_DIR/debug/moe-studio"
}
