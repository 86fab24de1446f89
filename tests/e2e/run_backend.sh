#!/usr/bin/env bash
# End-to-end test of the Jobs page against `moe-studio serve` (issue 8):
#  1. builds the frontend (scripts/build_web.sh) and the CLI;
#  2. makes a small Hungarian corpus (a few hundred lines of
#     corpora/lang/hu/train.txt);
#  3. starts `moe-studio serve` on a free loopback port with a fresh data
#     dir and the built frontend, reads the token it generated;
#  4. drives chromium (backend.spec.mjs): chunked upload of stories260K with
#     an interruption + reload + resume, checkpoint registration, corpus
#     upload, upcycle job, `experts`-stage training job followed live,
#     artefact download, "Open in studio", cancel + resume; then the other
#     kinds from the form: a dense fine-tune, moerge (after an invalid
#     top_k whose 422 is shown next to the field), graft, eval (perplexity
#     on the page = result.json).
# The server is killed on exit. Exits non-zero on any failure.
# UPDATE_SCREENSHOTS=1 writes docs/screenshots/jobs.png (else tests/e2e/out/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=/dev/null
source "$root/scripts/env.sh"
here="$root/tests/e2e"
out="$here/out/backend"
demo="$MOE_STUDIO_DATA/models/stories260K"
corpus_src="$MOE_STUDIO_DATA/corpora/lang/hu/train.txt"
for f in "$demo/stories260K.bin" "$demo/tok512.bin" "$corpus_src"; do
  [ -f "$f" ] || { echo "missing input $f (MOE_STUDIO_DATA=$MOE_STUDIO_DATA)"; exit 1; }
done
rm -rf "$out"
mkdir -p "$out"
work="$(mktemp -d "${TMPDIR:-/tmp}/moe-studio-e2e-backend.XXXXXX")"
data="$work/data"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  cp "$work/server.log" "$out/server.log" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# shellcheck source=/dev/null
source "$here/lib.sh"

if [ -z "${E2E_SKIP_BUILD:-}" ]; then
  step "frontend: scripts/build_web.sh"
  bash "$root/scripts/build_web.sh" "$root/frontend/dist"
fi
dist="$root/frontend/dist"
[ -f "$dist/index.html" ] || { echo "no $dist/index.html"; exit 1; }
mkdir -p "$dist/demo"
cp "$demo/stories260K.bin" "$demo/tok512.bin" "$dist/demo/"

cli="$(cli_binary)"

step "inputs: corpus"
head -n "${E2E_CORPUS_LINES:-300}" "$corpus_src" > "$work/hu.txt"

step "server: moe-studio serve"
mkdir -p "$data"
"$cli" serve --addr 127.0.0.1:0 --data-dir "$data" --static-dir "$dist" > "$work/server.log" 2>&1 &
server_pid=$!
url=""
for _ in $(seq 1 300); do
  url="$(sed -n 's#^listening on \(http://[0-9.:]*\).*#\1#p' "$work/server.log" | head -n 1)"
  [ -n "$url" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log"; echo "server exited"; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { cat "$work/server.log"; echo "server did not start"; exit 1; }
[ -s "$data/token" ] || { echo "no token in $data"; exit 1; }
echo "   $url (data dir $data)"

step "browser: playwright-core + chromium"
cd "$here"
[ -d node_modules/playwright-core ] || npm ci --no-audit --no-fund
E2E_URL="$url/" E2E_TOKEN_FILE="$data/token" E2E_DATA_DIR="$data" E2E_MODEL_DIR="$demo" E2E_CORPUS="$work/hu.txt" \
  E2E_OUT="$out" E2E_SHOTS="$root/docs/screenshots" E2E_TMP="$work" node backend.spec.mjs
