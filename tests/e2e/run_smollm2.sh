#!/usr/bin/env bash
# Opt-in end-to-end run of the studio on SmolLM2-135M (too slow for CI):
#   E2E_SMOLLM2=/path/SmolLM2-135M-Instruct.Q4_1.gguf bash tests/e2e/run_smollm2.sh
# 1. builds the frontend (scripts/build_web.sh, private dist) unless E2E_DIST names a built
#    one, and the CLI unless MOE_STUDIO_BIN names one;
# 2. inputs: the first 200 lines of the en and hu corpora;
# 3. the CLI on them, timed: upcycle --experts 2, route --max-tokens 1024
#    per domain (report as JSON: routing accuracy), graft (base = instruct =
#    the GGUF);
# 4. a fresh chromium per heavy step (smollm2.spec.mjs): upcycle + download
#    sha256 vs the CLI; upcycle + ridge router (1024 tokens per domain);
#    upcycle + graft; then upcycle + router + graft in one tab (the memory
#    guard must answer with a message, or the graft must work).
# Numbers: tests/e2e/out/smollm2.json (browser and CLI side by side).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=/dev/null
source "$root/scripts/env.sh"
: "${E2E_SMOLLM2:?set E2E_SMOLLM2 to a SmolLM2-135M GGUF}"
here="$root/tests/e2e"
work="$here/work-smollm2"
out="$here/out"
tokens="${E2E_SMOLLM2_TOKENS:-1024}"
rm -rf "$work"
mkdir -p "$work/cli" "$out"
# shellcheck source=/dev/null
source "$here/lib.sh"

dist="${E2E_DIST:-}"
if [ -z "$dist" ]; then
  dist="$work/dist"
  build_frontend "$dist"
fi
cli="$(cli_binary)"

step "inputs: 200 lines of en and hu"
head -n 200 "$MOE_STUDIO_DATA/corpora/lang/en/train.txt" > "$work/en.txt"
head -n 200 "$MOE_STUDIO_DATA/corpora/lang/hu/train.txt" > "$work/hu.txt"

step "native forward of SmolLM2 (printed beside the tab's)"
"$cli" bench prefill "$E2E_SMOLLM2" --tokens 128 --repeat 3 --json > "$work/native_forward.json"

step "CLI on SmolLM2 (timed; $tokens tokens per domain)"
s0=$(ms)
"$cli" upcycle "$E2E_SMOLLM2" --experts 2 --out "$work/cli/upcycled" > /dev/null
s1=$(ms)
"$cli" route "$work/cli/upcycled" --domain "en=$work/en.txt" --domain "hu=$work/hu.txt" \
  --max-tokens "$tokens" --json --out "$work/cli/routed" > "$work/cli/route.json" 2> "$work/cli/route.log"
s2=$(ms)
"$cli" graft "$work/cli/upcycled" --base "$E2E_SMOLLM2" --instruct "$E2E_SMOLLM2" --out "$work/cli/grafted" > /dev/null
s3=$(ms)
sha256sum "$work/cli/upcycled/model.safetensors" "$work/cli/grafted/model.safetensors" | tee "$work/cli/sha256.txt"
rm -rf "$work/cli/routed"/*.safetensors "$work/cli/grafted"
printf '{"upcycle_ms": %d, "route_ms": %d, "graft_ms": %d, "tokens_per_domain": %d}\n' \
  $((s1 - s0)) $((s2 - s1)) $((s3 - s2)) "$tokens" | tee "$out/cli_timings_smollm2.json"
[ "${E2E_SMOLLM2_CLI_ONLY:-}" = "1" ] && exit 0

step "browser: playwright-core + chromium (a fresh browser per heavy step)"
cd "$here"
[ -d node_modules/playwright-core ] || npm ci --no-audit --no-fund
E2E_DIST="$dist" E2E_WORK="$work" E2E_OUT="$out" E2E_TOKENS="$tokens" node run_smollm2.mjs
