#!/usr/bin/env bash
# DeltaMoE on SmolLM2-135M (issue 14 item 2; docs/methods.md §1): language expansion to Hungarian
# by upcycling, two training stages and a delta graft, against the dense baselines of §1.6.
#
# The alignment delta: SmolLM2 has no public base/post-trained pair here, so one is built the
# paper's way in miniature: "post" = the dense model fine-tuned on a distinct ability, LaTeX
# mathematics (domain/math; not domain/docs, whose Hungarian translation is the training data),
# and Δ = post − base. The ability is measured as perplexity on domain/math/valid.txt.
#
#   base          the dense model (SmolLM2-135M-Instruct)
#   post          base fine-tuned on domain/math (the source of Δ)
#   cpt           dense continued pre-training on Hungarian, the MoE's stage-1 tokens
#   cpt2x         dense CPT with twice the tokens (the paper's equal-FLOPs baseline: top-2 of
#                 4 experts runs about twice the FFN FLOPs per token)
#   cpt+Δ         dense delta merging: `graft` Δ onto cpt (the paper's dense baseline)
#   average       linear averaging of cpt and post (`merge linear`, equal weights)
#   moe-E-s1      upcycled to E experts (expert 0 frozen) top-2, stage 1 (`train --stage experts`) on hu
#   moe-E-s2      stage 2 (`train --stage router`): hu + English replay with the language prior
#   moe-E-s2+Δ    `graft` Δ onto every expert and the shared tensors of moe-E-s2
# E = 4 is the headline (3 trainable experts); EXPERTS_LIST="2 3" adds the ablation of 1 and 2
# trainable experts. English retention = ppl(base, en) / ppl(model, en); Hungarian gain =
# ppl(base, hu) / ppl(model, hu); ability = ppl on domain/math.
#
# Usage: experiments/deltamoe.sh [--smoke]
#   --smoke        stories260K, 2 steps per training: checks the pipeline (CI runs it)
#   MOE_STUDIO_BIN, WORK, OUT, SEEDS  as in experiments/dume.sh (default WORK $MOE_STUDIO_CACHE/experiments/deltamoe)
#   STEPS/SEQ/BATCH/LR     stage 1 and the dense CPT (full: 100 x 4 x 256 = 102,400 tokens, 1e-4)
#   ROUTER_STEPS/ROUTER_LR stage 2 (full: 50 x 4 x 256, 1e-3); POST_STEPS the Δ fine-tune (100)
#   EXPERTS_LIST="4 2 3"   expert counts (full default "4 2 3": the headline and the ablation)
#   EVAL_TOKENS            evaluation tokens per text (full 10000)
# Resumable like the other scripts: finished steps are skipped, interrupted training resumes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh

SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
D="$MOE_STUDIO_DATA"
HU_TRAIN="$D/corpora/lang/hu/train.txt" HU_VALID="$D/corpora/lang/hu/valid.txt"
EN_TRAIN="$D/corpora/lang/en/train.txt" EN_VALID="$D/corpora/lang/en/valid.txt"
MATH_TRAIN="$D/corpora/domain/math/train.txt" MATH_VALID="$D/corpora/domain/math/valid.txt"
for f in "$HU_TRAIN" "$HU_VALID" "$EN_TRAIN" "$EN_VALID" "$MATH_TRAIN" "$MATH_VALID"; do
    [ -f "$f" ] || { echo "missing $f (set MOE_STUDIO_DATA)" >&2; exit 1; }
done

if [ "$SMOKE" = 1 ]; then
    MODEL="$D/models/stories260K/stories260K.bin"
    TOK=(--tokenizer "$D/models/stories260K/tok512.bin")
    STEPS=${STEPS:-2} SEQ=${SEQ:-32} BATCH=${BATCH:-2} LR=${LR:-1e-3} POST_STEPS=${POST_STEPS:-2}
    ROUTER_STEPS=${ROUTER_STEPS:-2} ROUTER_LR=${ROUTER_LR:-1e-2} EVAL_TOKENS=${EVAL_TOKENS:-256} WINDOW=64
    SEEDS=${SEEDS:-1} EXPERTS_LIST=${EXPERTS_LIST:-"4 2"}
    WORK=${WORK:-$MOE_STUDIO_CACHE/experiments/deltamoe-smoke}
    OUT=${OUT:-$WORK/report}
else
    MODEL=$(bash tests/reference/fetch_smollm2.sh)
    TOK=()
    STEPS=${STEPS:-100} SEQ=${SEQ:-256} BATCH=${BATCH:-4} LR=${LR:-1e-4} POST_STEPS=${POST_STEPS:-100}
    ROUTER_STEPS=${ROUTER_STEPS:-50} ROUTER_LR=${ROUTER_LR:-1e-3} EVAL_TOKENS=${EVAL_TOKENS:-10000} WINDOW=512
    SEEDS=${SEEDS:-"1 2"} EXPERTS_LIST=${EXPERTS_LIST:-"4 2 3"}
    WORK=${WORK:-$MOE_STUDIO_CACHE/experiments/deltamoe}
    OUT=${OUT:-docs/experiments/deltamoe}
fi
mkdir -p "$WORK" "$OUT"
source experiments/lib.sh
exp_bin

EVAL=(--data "en=$EN_VALID" --data "hu=$HU_VALID" --data "math=$MATH_VALID" --max-tokens "$EVAL_TOKENS"
    --window "$WINDOW" --stride "$STRIDE" --json)
COMMON=(--seq-len "$SEQ" --batch "$BATCH" --warmup $((STEPS / 10)))

report "$WORK/base.eval.json" "$BIN" eval "$MODEL" "${TOK[@]}" "${EVAL[@]}"

for seed in $SEEDS; do
    S="$WORK/s$seed"
    mkdir -p "$S"
    # Δ = post − base.
    train_run "$S/post" "$MODEL" --stage dense --data "math=$MATH_TRAIN" --steps "$POST_STEPS" --lr "$LR" \
        "${COMMON[@]}" --seed "$seed"
    POST="$S/post/final"
    report "$S/post.eval.json" "$BIN" eval "$POST" "${TOK[@]}" "${EVAL[@]}"

    # Dense baselines.
    train_run "$S/cpt" "$MODEL" --stage dense --data "hu=$HU_TRAIN" --steps "$STEPS" --lr "$LR" "${COMMON[@]}" --seed "$seed"
    make_dir "$S/cpt+delta" "$BIN" graft "$S/cpt/final" --base "$MODEL" --instruct "$POST" --out "$S/cpt+delta"
    make_dir "$S/average" "$BIN" merge linear "$S/cpt/final" "$POST" --out "$S/average"
    for m in cpt/final cpt+delta average; do
        report "$S/${m%/final}.eval.json" "$BIN" eval "$S/$m" "${TOK[@]}" "${EVAL[@]}"
    done

    # The MoE: upcycle, stage 1, stage 2, graft.
    for E in $EXPERTS_LIST; do
        M="$S/moe-$E"
        make_dir "$M-init" "$BIN" upcycle "$MODEL" --experts "$E" --top-k 2 --frozen 0 \
            --router-init random --router-std 0.02 --seed "$seed" --out "$M-init"
        train_run "$M-s1" "$M-init" --stage experts --data "hu=$HU_TRAIN" --steps "$STEPS" --lr "$LR" \
            "${COMMON[@]}" --seed "$seed"
        train_run "$M-s2" "$M-s1/final" --stage router --data "hu=$HU_TRAIN" --data "en=$EN_TRAIN:1:orig" \
            --steps "$ROUTER_STEPS" --lr "$ROUTER_LR" --seq-len "$SEQ" --batch "$BATCH" \
            --warmup $((ROUTER_STEPS / 10)) --seed "$seed"
        make_dir "$M-s2+delta" "$BIN" graft "$M-s2/final" --base "$MODEL" --instruct "$POST" --out "$M-s2+delta"
        report "$M-s1.eval.json" "$BIN" eval "$M-s1/final" "${TOK[@]}" "${EVAL[@]}"
        report "$M-s2.eval.json" "$BIN" eval "$M-s2/final" "${TOK[@]}" "${EVAL[@]}"
        report "$M-s2+delta.eval.json" "$BIN" eval "$M-s2+delta" "${TOK[@]}" "${EVAL[@]}"
    done

    # The equal-FLOPs dense baseline last: it is the longest single training (2x the tokens), and
    # the headline comparisons (stage 2 vs base, MoE + Δ vs CPT + Δ) do not need it.
    train_run "$S/cpt2x" "$MODEL" --stage dense --data "hu=$HU_TRAIN" --steps $((2 * STEPS)) --lr "$LR" \
        "${COMMON[@]}" --seed "$seed"
    report "$S/cpt2x.eval.json" "$BIN" eval "$S/cpt2x/final" "${TOK[@]}" "${EVAL[@]}"
done

python3 experiments/deltamoe_report.py "$WORK" "$OUT" "$SMOKE" "$MODEL" "$SEEDS" "$EXPERTS_LIST" \
    "steps=$STEPS x $BATCH x $SEQ tokens (stage 1 and cpt; cpt2x twice), lr=$LR, router_steps=$ROUTER_STEPS lr=$ROUTER_LR, post_steps=$POST_STEPS, eval_tokens=$EVAL_TOKENS window=$WINDOW stride=$STRIDE"
