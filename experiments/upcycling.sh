#!/usr/bin/env bash
# Upcycling variants at one stage-1 budget (issue 15 item 5; docs/methods.md "Upcycling variants"):
# SmolLM2-135M-Instruct -> 4 experts top-2 (expert 0 frozen), stage 1 (`train --stage experts`) on
# Hungarian with the same tokens for every variant, then Hungarian and English validation perplexity
# and the expert load balance:
#   naive     plain copies (random router, std 0.02)
#   noise     copies with 1% multiplicative noise on the non-frozen experts
#   drop      Drop-Upcycling, r = 0.5 (Nakamura et al. 2025)
#   granular  G = 2 (8 experts of f/2, top-4; Megatron-Core --moe-upcycling-granularity)
# plus the dense model itself.
#
# Usage: experiments/upcycling.sh [--smoke]
#   --smoke      stories260K, 3 steps of 2 x 32 tokens: checks the pipeline (CI runs it), numbers mean nothing
#   MOE_STUDIO_BIN=...  (or BIN) the moe-studio binary (default: cargo builds it; release, smoke: debug)
#   WORK=...     run directory (default $MOE_STUDIO_CACHE/experiments/upcycling[-smoke]); kept between sittings
#   OUT=...      where the table goes (default docs/experiments/upcycling, smoke: $WORK/report)
#   SEEDS="1 2"  seeds (upcycle + data order); default "1 2" (full), "1" (smoke)
#   VARIANTS="..."  which variants, in this order (default "naive noise drop granular")
#   STEPS/SEQ/BATCH/LR  the stage-1 budget (full: 100 x 4 x 256 = 102,400 tokens per run, lr 1e-4)
#
# Resumable: a finished upcycle (config.json), training (final/) or evaluation (eval.json) is skipped;
# an interrupted training continues from its last checkpoint (--save-every 20, --resume). Re-running
# after everything finished only rewrites the table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh

SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
D="$MOE_STUDIO_DATA"
HU_TRAIN="$D/corpora/lang/hu/train.txt"
HU_VALID="$D/corpora/lang/hu/valid.txt"
EN_VALID="$D/corpora/lang/en/valid.txt"
for f in "$HU_TRAIN" "$HU_VALID" "$EN_VALID"; do
    [ -f "$f" ] || { echo "missing $f (set MOE_STUDIO_DATA)" >&2; exit 1; }
done

if [ "$SMOKE" = 1 ]; then
    MODEL="$D/models/stories260K/stories260K.bin"
    TOK=(--tokenizer "$D/models/stories260K/tok512.bin")
    STEPS=${STEPS:-3} SEQ=${SEQ:-32} BATCH=${BATCH:-2} LR=${LR:-1e-3} EVAL_TOKENS=${EVAL_TOKENS:-512}
    SEEDS=${SEEDS:-1} WINDOW=64
    WORK=${WORK:-$MOE_STUDIO_CACHE/experiments/upcycling-smoke}
    OUT=${OUT:-$WORK/report}
else
    MODEL=$(bash tests/reference/fetch_smollm2.sh)
    TOK=()
    STEPS=${STEPS:-100} SEQ=${SEQ:-256} BATCH=${BATCH:-4} LR=${LR:-1e-4} EVAL_TOKENS=${EVAL_TOKENS:-20000}
    SEEDS=${SEEDS:-"1 2"} WINDOW=512
    WORK=${WORK:-$MOE_STUDIO_CACHE/experiments/upcycling}
    OUT=${OUT:-docs/experiments/upcycling}
fi
mkdir -p "$WORK" "$OUT"
source experiments/lib.sh
exp_bin

variant_args() {
    local common=(--experts 4 --top-k 2 --router-init random --router-std 0.02 --dtype f32)
    case "$1" in
    naive) echo "${common[*]}" ;;
    noise) echo "${common[*]} --noise 0.01 --noise-kind mul" ;;
    drop) echo "${common[*]} --drop-ratio 0.5" ;;
    granular) echo "${common[*]} --granularity 2" ;;
    esac
}

VARIANTS=${VARIANTS:-"naive noise drop granular"}
EVAL=(--data "hu=$HU_VALID" --data "en=$EN_VALID" --max-tokens "$EVAL_TOKENS" --window "$WINDOW" --stride "$STRIDE" --json)

report "$WORK/dense.eval.json" "$BIN" eval "$MODEL" "${TOK[@]}" "${EVAL[@]}"

for seed in $SEEDS; do
    for v in $VARIANTS; do
        dir="$WORK/$v-s$seed"
        # shellcheck disable=SC2046
        make_dir "$dir/moe" "$BIN" upcycle "$MODEL" $(variant_args "$v") --seed "$seed" --out "$dir/moe"
        train_run "$dir/train" "$dir/moe" --stage experts --data "hu=$HU_TRAIN" --steps "$STEPS" \
            --seq-len "$SEQ" --batch "$BATCH" --lr "$LR" --warmup $((STEPS / 10)) --seed "$seed"
        report "$dir/eval.json" "$BIN" eval "$dir/train/final" "${TOK[@]}" "${EVAL[@]}"
    done
done

# The table: mean (and spread over seeds) of Hungarian / English perplexity, the expert load balance
# (max/min expert load, mean over layers, on the Hungarian validation text), tokens and wall time.
python3 experiments/upcycling_report.py "$WORK" "$OUT" "$SMOKE" "$STEPS" "$SEQ" "$BATCH" "$LR" "$MODEL" "$SEEDS" "$VARIANTS"
