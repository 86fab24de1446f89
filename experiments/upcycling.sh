#!/usr/bin/env bash
# Upcycling variants at one stage-1 budget (docs/methods.md "Upcycling variants"; issue 35's protocol):
# SmolLM2-135M-Instruct -> 4 experts top-2 (expert 0 frozen, the DeltaMoE setting), stage 1
# (`train --stage experts`) on Hungarian, the same tokens in every run, then Hungarian and English
# held-out perplexity and the expert load balance:
#   naive      plain copies (random router, std 0.02)
#   noise      copies with 1% multiplicative noise on the non-frozen experts
#   drop       Drop-Upcycling, r = 0.5 (Nakamura et al. 2025; expert 0, frozen, keeps every unit)
#   granular   G = 2 (8 experts of f/2, top-4, the frozen copy's two slices frozen; Megatron-Core
#              --moe-upcycling-granularity): the same active and trained FFN FLOPs as naive
# and the dense baselines on the same Hungarian tokens (same steps, lr, warmup and data order):
#   dense      the model itself (no training)
#   dense-ffn  the dense model with only its FFNs trained (`train --stage ffn`): stage 1 trains only
#              FFN weights (the new experts) and the router, so this is the same kind of trainable
#              set without experts
#   dense-cpt  every weight trained (`train --stage dense`): the usual continued pre-training
# Both are matched in tokens, not FLOPs: their training FLOPs per token are fewer than stage 1's
# (experiments/flops.py; all three in the report). DeltaMoE's table (experiments/deltamoe.sh) has
# the dense run at the MoE's training FLOPs.
# Text is read as documents separated by blank lines, each followed by <|endoftext|> (methods.md
# §7), the same token stream in `train` and `eval` (their sha256 in the report).
#
# Usage: experiments/upcycling.sh [--smoke]
#   --smoke      stories260K, 3 steps of 2 x 32 tokens: checks the pipeline (CI runs it), numbers mean nothing
#   MOE_STUDIO_BIN=...  (or BIN) the moe-studio binary (default: cargo builds it; release, smoke: debug)
#   WORK=...     run directory (default $MOE_STUDIO_CACHE/experiments/upcycling-v2[-smoke]); kept between sittings
#   OUT=...      where the table goes (default docs/experiments/upcycling, smoke: $WORK/report)
#   SEEDS="1 2 3"  seeds (upcycle + data order); default "1 2 3" (full), "1" (smoke)
#   PUBLISHED_SEEDS  seeds an earlier sitting published in OUT/results.json (its run directories
#                  gone with its machine): the report keeps their numbers beside this run's SEEDS,
#                  after checking the budget and evaluation streams are the same; pooled row by row:
#                  a published (row, seed) neither carried nor run again, or both, is refused before
#                  any training (the training stream of a row added to a published seed is checked at
#                  the end, by the report)
#   VARIANTS="..."  which variants to train (default "naive noise drop granular"; the tables keep that order)
#   DENSE="..."  which dense baselines to train (default "ffn cpt"; "" for a sitting that adds a
#                variant to published seeds, e.g. PUBLISHED_SEEDS="1" SEEDS="1" DENSE="" VARIANTS="granular":
#                the report pools row by row, each new row paired with the published rows of its seed)
#   STEPS/SEQ/BATCH/LR  the stage-1 budget (full: 100 x 4 x 256 = 102,400 tokens per run, lr 1e-4)
#   TASK_ITEMS   next-paragraph multiple-choice items per task for the task accuracy of every model on
#                Hungarian and English (experiments/lib.sh task_report; default 100, about 20 min per
#                model here; 0 skips it, and a later run with items scores the saved models)
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
    SEEDS=${SEEDS-1} WINDOW=64
    export TASK_ITEMS=${TASK_ITEMS:-5}
    WORK=${WORK:-$MOE_STUDIO_CACHE/experiments/upcycling-v2-smoke}
    OUT=${OUT:-$WORK/report}
else
    MODEL=$(bash tests/reference/fetch_smollm2.sh)
    TOK=()
    STEPS=${STEPS:-100} SEQ=${SEQ:-256} BATCH=${BATCH:-4} LR=${LR:-1e-4} EVAL_TOKENS=${EVAL_TOKENS:-20000}
    SEEDS=${SEEDS-"1 2 3"} WINDOW=512
    WORK=${WORK:-$MOE_STUDIO_CACHE/experiments/upcycling-v2}
    OUT=${OUT:-docs/experiments/upcycling}
fi
if [ -z "${SEEDS// /}" ]; then
    echo "SEEDS is empty: name the seeds to run" >&2
    exit 1
fi
source experiments/lib.sh
VARIANTS=${VARIANTS-"naive noise drop granular"}
DENSE=${DENSE-"ffn cpt"}
for d in $DENSE; do
    case $d in
    ffn | cpt) ;;
    *) echo "unknown dense baseline $d in DENSE (expected ffn, cpt)" >&2; exit 1 ;;
    esac
done
for v in $VARIANTS; do
    case $v in
    naive | noise | drop | granular) ;;
    *) echo "unknown variant $v (expected naive, noise, drop, granular)" >&2; exit 1 ;;
    esac
done
BUDGET="stage 1: $STEPS x $BATCH x $SEQ tokens lr $LR warmup $((STEPS / 10)) on lang/hu; dense-ffn and dense-cpt the same;\
 4 experts top-2 frozen 0 router std 0.02; noise 0.01 mul; drop r 0.5; granular G 2;\
 eval_tokens=$EVAL_TOKENS window=$WINDOW stride=$STRIDE; --docs blank"
# A PUBLISHED_SEEDS the report would refuse at the end is refused now, before hours of training.
if [ -n "${PUBLISHED_SEEDS:-}" ]; then
    python3 experiments/upcycling_report.py --check-published "$OUT" "$SEEDS" "$VARIANTS" "$DENSE" "$BUDGET" "$MODEL"
fi
mkdir -p "$WORK" "$OUT"
exp_bin

variant_args() {
    local common=(--experts 4 --top-k 2 --frozen 0 --router-init random --router-std 0.02 --dtype f32)
    case "$1" in
    naive) echo "${common[*]}" ;;
    noise) echo "${common[*]} --noise 0.01 --noise-kind mul" ;;
    drop) echo "${common[*]} --drop-ratio 0.5" ;;
    granular) echo "${common[*]} --granularity 2" ;;
    esac
}

EVAL=(--data "hu=$HU_VALID" --data "en=$EN_VALID" --max-tokens "$EVAL_TOKENS" --window "$WINDOW" --stride "$STRIDE" --json)
report "$WORK/dense.eval.json" "$BIN" eval "$MODEL" "${TOK[@]}" "${EVAL[@]}"
# Task accuracy (issue 36): next-paragraph multiple choice on the held-out Hungarian and English text.
TASKS=(hu en)
task_report "$WORK/dense.tasks.json" "$MODEL" "${TASKS[@]}"
TRAIN=(--data "hu=$HU_TRAIN" --steps "$STEPS" --seq-len "$SEQ" --batch "$BATCH" --lr "$LR" --warmup $((STEPS / 10)))
for seed in $SEEDS; do
    S="$WORK/s$seed"
    mkdir -p "$S"
    for st in $DENSE; do
        stage=$st
        [ "$st" = cpt ] && stage=dense
        train_run "$S/dense-$st" "$MODEL" --stage "$stage" "${TRAIN[@]}" --seed "$seed"
        report "$S/dense-$st.eval.json" "$BIN" eval "$S/dense-$st/final" "${TOK[@]}" "${EVAL[@]}"
        task_report "$S/dense-$st.tasks.json" "$S/dense-$st/final" "${TASKS[@]}"
        # Nothing trains on from these models: a finished run's optimizer state (~2x the weights) goes.
        rm -f "$S/dense-$st/final/optimizer.bin"
    done
    # Training FLOPs per token (experiments/flops.py) of the dense runs and of stage 1 (4 experts,
    # top-2, 1 frozen; granular's FFN FLOPs are the same), from the dense model's shapes and this
    # run's SEQ (recomputed every run: it is cheap; a failure stops the script).
    # (without a dense-cpt run here the report keeps the published FLOPs)
    c="$S/dense-cpt/final/config.json"
    if [ -f "$c" ]; then
        g_dense=$(python3 experiments/flops.py "$c" dense "$SEQ")
        g_ffn=$(python3 experiments/flops.py "$c" ffn "$SEQ")
        g_experts=$(python3 experiments/flops.py "$c" experts "$SEQ" 4 2 1)
        printf 'dense %s\nffn %s\nexperts %s\n' "$g_dense" "$g_ffn" "$g_experts" >"$WORK/flops.txt.tmp"
        mv "$WORK/flops.txt.tmp" "$WORK/flops.txt"
    fi
    for v in $VARIANTS; do
        # (the upcycled copy is remade only for a training still to run)
        # shellcheck disable=SC2046
        [ -f "$S/$v/final/config.json" ] ||
            make_dir "$S/$v-init" "$BIN" upcycle "$MODEL" $(variant_args "$v") --seed "$seed" --out "$S/$v-init"
        # A variant that does not start as the dense model's function (noise, drop): its held-out
        # scores before training (the report's "before training" table; naive and granular start as
        # the dense model, as shared/tests/integration/upcycle_variants.rs asserts).
        if [ "$v" = noise ] || [ "$v" = drop ]; then
            if [ -f "$S/$v-init/config.json" ]; then
                report "$S/$v-init.eval.json" "$BIN" eval "$S/$v-init" "${TOK[@]}" "${EVAL[@]}"
            fi
        fi
        train_run "$S/$v" "$S/$v-init" --stage experts "${TRAIN[@]}" --seed "$seed"
        report "$S/$v.eval.json" "$BIN" eval "$S/$v/final" "${TOK[@]}" "${EVAL[@]}"
        task_report "$S/$v.tasks.json" "$S/$v/final" "${TASKS[@]}"
        # The upcycled copy only served the training (remade in seconds if needed).
        rm -rf "$S/$v-init" "$S/$v/final/optimizer.bin"
    done
done

python3 experiments/upcycling_report.py "$WORK" "$OUT" "$SMOKE" "$MODEL" "$SEEDS" "$VARIANTS" "$DENSE" "$BUDGET"
