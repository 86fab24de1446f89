#!/usr/bin/env bash
# DUME on SmolLM2-135M (issue 35 item 4; docs/methods.md §2): three dense domain experts
# (`train --stage dense` on domain/{code,math,docs}), MoErged (`moerge`), routed by the closed-form
# ridge router (`route`, top-1 and top-2, lambda sweeps), against the baselines of DUME's CLM section.
# Text is read as documents separated by blank lines, each followed by <|endoftext|> (methods.md
# §7), the same token stream in `train`, `route` and `eval`; the ridge statistics cover every
# training token of each domain (the reference code's statistics pass; STAT_TOKENS caps them).
#   expert-D     each dense domain expert (its own domain is the reference of the retention)
#   average      uniform weight averaging of the three experts (`merge linear`)
#   random       the MoErged model with seeded random routers (`eval --routing random`)
#   dume-top1/2  the ridge router, statistics from each domain's train text (top-2 re-solves
#                top-1's statistics: `route --stats`)
#   dume-ood     the ridge router, statistics from out-of-distribution text of each domain (below)
#   dume-plus    DUME+: the top-2 ridge router (dume-top2) fine-tuned (`train --stage router`)
#   btx          BTX-style: a random top-2 router (std 0.02) trained the same way, top-2 as in BTX
#                (Sukhbaatar et al. 2024); both with the same load-balancing coefficient
#                (ALPHA, default 0.01)
#                Both train top-2 routers with renormalised weights: the next-token gradient reaches
#                the router through the two weights. (A top-1 router with renormalised weights gets
#                none, and `--norm-topk false` at top-1 — Switch's form — scales every MoErged FFN
#                by its softmax probability, ~1/3 here: the first full run did that and the loss
#                started at 10.3 nats against 2.5, ppl ~140 after 50 steps; see the DUME README.)
#   oracle       every token of domain i sent to expert i (`eval --routing oracle`)
# Retention of a model on domain D = ppl(expert-D on D) / ppl(model on D), as in DUME (§2.6),
# and the loss ratio NLL(expert-D on D) / NLL(model on D) beside it.
# PARTS (default "ffn ood incremental"; PARTS_SEEDS, default all seeds, "" none):
#   ffn          the same with FFN-only domain experts (`train --stage ffn`: attention, norms and
#                embeddings stay the base's, so MoErging averages nothing that moved and the oracle
#                is the dense experts exactly): what is left is the router
#   ood          out-of-distribution statistics (below)
#   incremental  incremental DUME (§2.4): a fourth expert (a Hungarian fine-tune, lang/hu) added with
# `route --add-expert`: the shared tensors become the mean of four models and the old domains'
# saved statistics are reused as they are (the old data is not revisited), so they were collected
# on the three-model mean. Compared with re-collecting every domain's statistics on the grown
# model (`dume-scratch4`): the router difference is what the stale statistics cost. (That a
# re-solve on saved + new statistics equals one solve on the same statistics is exact by
# construction and tested in shared/tests/integration/route.rs.) And its effect on the first
# three domains.
#
# Out-of-distribution statistics ("dume-ood"): each domain here has a single source, so OOD is a
# register or language shift inside the domain, never the test text's distribution:
#   code  only the comment lines of the Python files (natural language about code),
#   math  only the prose lines of the LaTeX book (no `\` and no `$` in the line),
#   docs  the Hungarian translation of the help pages (lang/hu/train.txt).
#
# Usage: experiments/dume.sh [--smoke]
#   --smoke      stories260K, 2 steps of 2 x 32 tokens per training: checks the pipeline (CI runs
#                it); the numbers mean nothing
#   MOE_STUDIO_BIN=...  (or BIN) the moe-studio binary (default: cargo builds it; release, smoke: debug)
#   WORK=...     run directory (default $MOE_STUDIO_CACHE/experiments/dume[-smoke]); kept between sittings
#   OUT=...      where the tables go (default docs/experiments/dume, smoke: $WORK/report)
#   SEEDS="1 2 3"  seeds (dense fine-tune data order, random routers, router training); "" with
#                  PUBLISHED_SEEDS and PARTS_SEEDS runs only the `ffn` part of published seeds
#   PUBLISHED_SEEDS  seeds an earlier sitting published in OUT/results.json (its run directories
#                  gone with its machine): the report keeps their records beside this run's SEEDS,
#                  after checking the budget and the evaluation streams are the same
#   STEPS/SEQ/BATCH/LR             the dense fine-tune budget (full: 100 x 4 x 256 = 102,400 tokens, 1e-4)
#   ROUTER_STEPS/ROUTER_LR         DUME+ / BTX router training (full: 50 x 4 x 256 = 51,200 tokens, 1e-3)
#   STAT_TOKENS/EVAL_TOKENS        a cap on the ridge statistics per domain (default: none, every
#                                  training token) / evaluation tokens per domain
#   LAMBDAS="1e-4,1e-3,1e-1,1"     the extra lambdas `route` reports held-out routing accuracy for
#   REL_LAMBDAS="1e-8,1e-6,1e-4,1e-2,1"  the same relative to each layer's tr(A)/p
#   STRIDE=...                     evaluation stride (default: the window; experiments/lib.sh)
#
# Resumable: a finished step (its config.json or JSON report) is skipped; an interrupted training
# continues from its last checkpoint. Re-running after everything finished only rewrites the tables.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh

SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
D="$MOE_STUDIO_DATA"
DOMAINS="code math docs"
for dom in $DOMAINS; do
    for split in train valid; do
        f="$D/corpora/domain/$dom/$split.txt"
        [ -f "$f" ] || { echo "missing $f (set MOE_STUDIO_DATA)" >&2; exit 1; }
    done
done
HU_TRAIN="$D/corpora/lang/hu/train.txt"
HU_VALID="$D/corpora/lang/hu/valid.txt"

if [ "$SMOKE" = 1 ]; then
    MODEL="$D/models/stories260K/stories260K.bin"
    TOK=(--tokenizer "$D/models/stories260K/tok512.bin")
    STEPS=${STEPS:-2} SEQ=${SEQ:-32} BATCH=${BATCH:-2} LR=${LR:-1e-3}
    ROUTER_STEPS=${ROUTER_STEPS:-2} ROUTER_LR=${ROUTER_LR:-1e-2}
    STAT_TOKENS=${STAT_TOKENS:-512} EVAL_TOKENS=${EVAL_TOKENS:-256} CONTEXT=64 WINDOW=64
    SEEDS=${SEEDS-1} PARTS=${PARTS-"ffn ood incremental"}
    export TASK_ITEMS=${TASK_ITEMS:-5}
    WORK=${WORK:-$MOE_STUDIO_CACHE/experiments/dume-smoke}
    OUT=${OUT:-$WORK/report}
else
    MODEL=$(bash tests/reference/fetch_smollm2.sh)
    TOK=()
    STEPS=${STEPS:-100} SEQ=${SEQ:-256} BATCH=${BATCH:-4} LR=${LR:-1e-4}
    ROUTER_STEPS=${ROUTER_STEPS:-50} ROUTER_LR=${ROUTER_LR:-1e-3}
    STAT_TOKENS=${STAT_TOKENS:-} EVAL_TOKENS=${EVAL_TOKENS:-10000} CONTEXT=512 WINDOW=512
    SEEDS=${SEEDS-"1 2 3"} PARTS=${PARTS-"ffn ood incremental"}
    WORK=${WORK:-$MOE_STUDIO_CACHE/experiments/dume-v2}
    OUT=${OUT:-docs/experiments/dume}
fi
LAMBDAS=${LAMBDAS:-"1e-4,1e-3,1e-1,1"} REL_LAMBDAS=${REL_LAMBDAS:-"1e-8,1e-6,1e-4,1e-2,1"}
ALPHA=${ALPHA:-0.01} PARTS_SEEDS=${PARTS_SEEDS-$SEEDS}
# No SEEDS: the analyses of published seeds only (their headline rows from OUT/results.json). Only
# `ffn` stands on its own (its own experts, MoErge and routers); `ood` and `incremental` start from
# the seed's headline MoErge and router, which a published seed's run directory no longer holds.
for part in $PARTS; do
    case $part in
    ffn | ood | incremental) ;;
    *) echo "unknown part $part (expected ffn, ood, incremental)" >&2; exit 1 ;;
    esac
done
source experiments/lib.sh
analysis_seeds ffn
mkdir -p "$WORK" "$OUT"
exp_bin
# The report's budget line (results.json `budget`: a later sitting pools only with the same).
budget() {
    echo "steps=$STEPS seq=$SEQ batch=$BATCH lr=$LR router_steps=$ROUTER_STEPS router_lr=$ROUTER_LR alpha=$ALPHA (DUME+ and BTX) stat_tokens=${STAT_TOKENS:-all} context=$CONTEXT eval_tokens=$EVAL_TOKENS window=$WINDOW stride=$STRIDE; --docs blank"
}
# A PUBLISHED_SEEDS the report would refuse at the end (a published seed neither carried nor run
# again, one run twice, another budget; the FFN-only part of a published seed already published,
# or published with another result than this run directory's) is refused now, before any training.
if [ -n "${PUBLISHED_SEEDS:-}" ]; then
    python3 experiments/dume_report.py --check-published "$WORK" "$OUT" "$SMOKE" "$MODEL" "$SEEDS" "$PARTS_SEEDS" \
        "$(budget)" "$PARTS"
fi

# The out-of-distribution statistics texts (see the header): each selected line one document
# (a blank line after each).
OOD="$WORK/ood"
mkdir -p "$OOD"
[ -s "$OOD/code.txt" ] || grep -E '^\s*#' "$D/corpora/domain/code/train.txt" | grep -v '^# =====' | sed 's/$/\n/' >"$OOD/code.txt"
[ -s "$OOD/math.txt" ] || grep -v -E '[\\$]' "$D/corpora/domain/math/train.txt" | grep -E '[[:alpha:]]{3}' | sed 's/$/\n/' >"$OOD/math.txt"
[ -s "$OOD/docs.txt" ] || cp "$HU_TRAIN" "$OOD/docs.txt"

EVAL=(--window "$WINDOW" --stride "$STRIDE" --max-tokens "$EVAL_TOKENS" --json)
for dom in $DOMAINS; do EVAL+=(--data "$dom=$D/corpora/domain/$dom/valid.txt"); done
EVAL4=("${EVAL[@]}" --data "hu=$HU_VALID")
MIX=()
for dom in $DOMAINS; do MIX+=(--data "$dom=$D/corpora/domain/$dom/train.txt"); done
ROUTE_DOMAINS=()
for dom in $DOMAINS; do ROUTE_DOMAINS+=(--domain "$dom=$D/corpora/domain/$dom/train.txt"); done
ROUTE=(--context "$CONTEXT" --eval-tokens "$EVAL_TOKENS" --json)
[ -n "$STAT_TOKENS" ] && ROUTE+=(--max-tokens "$STAT_TOKENS")
SWEEP=(--lambda-sweep "$LAMBDAS" --lambda-sweep-relative "$REL_LAMBDAS")

report "$WORK/base.eval.json" "$BIN" eval "$MODEL" "${TOK[@]}" "${EVAL4[@]}"
# Task accuracy (issue 36): next-paragraph multiple choice on each domain's held-out text
# (tests/reference/make_tasks.py; lm-eval's acc / acc_norm) for the headline models.
read -r -a TASKS <<<"$DOMAINS"
task_report "$WORK/base.tasks.json" "$MODEL" "${TASKS[@]}"

# moerged_set PREFIX STAGE: dense experts (`train --stage STAGE`) of every domain, their average,
# the MoErge, random and oracle routing, and DUME top-1 (all statistics; the relative lambda sweep)
# and top-2 (top-1's statistics re-solved), under the names PREFIX{expert-D,average,moe,...}.
moerged_set() {
    local p=$1 stage=$2 experts=() dom
    for dom in $DOMAINS; do
        train_run "$S/${p}expert-$dom" "$MODEL" --stage "$stage" --data "$dom=$D/corpora/domain/$dom/train.txt" \
            --steps "$STEPS" --seq-len "$SEQ" --batch "$BATCH" --lr "$LR" --warmup $((STEPS / 10)) --seed "$seed"
        report "$S/${p}expert-$dom.eval.json" "$BIN" eval "$S/${p}expert-$dom/final" "${TOK[@]}" "${EVAL4[@]}"
        [ -n "$p" ] || task_report "$S/expert-$dom.tasks.json" "$S/expert-$dom/final" "${TASKS[@]}"
        experts+=("$S/${p}expert-$dom/final")
    done
    make_dir "$S/${p}average" "$BIN" merge linear "${experts[@]}" --out "$S/${p}average"
    report "$S/${p}average.eval.json" "$BIN" eval "$S/${p}average" "${TOK[@]}" "${EVAL[@]}"
    [ -n "$p" ] || task_report "$S/average.tasks.json" "$S/average" "${TASKS[@]}"
    make_dir "$S/${p}moe" "$BIN" moerge "${experts[@]}" --out "$S/${p}moe"
    report "$S/${p}random.eval.json" "$BIN" eval "$S/${p}moe" "${TOK[@]}" "${EVAL[@]}" --routing random --seed "$seed"
    report "$S/${p}oracle.eval.json" "$BIN" eval "$S/${p}moe" "${TOK[@]}" "${EVAL[@]}" --routing oracle
    if [ ! -f "$S/${p}dume-top1.route.json" ]; then
        rm -rf "$S/${p}dume-top1"
        report "$S/${p}dume-top1.route.json" "$BIN" route "$S/${p}moe" "${ROUTE_DOMAINS[@]}" --top-k 1 \
            "${ROUTE[@]}" "${SWEEP[@]}" --out "$S/${p}dume-top1"
    fi
    if [ ! -f "$S/${p}dume-top2.route.json" ]; then
        rm -rf "$S/${p}dume-top2"
        report "$S/${p}dume-top2.route.json" "$BIN" route "$S/${p}moe" "${ROUTE_DOMAINS[@]}" --top-k 2 \
            "${ROUTE[@]}" --stats "$S/${p}dume-top1/ridge_stats.safetensors" --out "$S/${p}dume-top2"
    fi
    for k in 1 2; do
        report "$S/${p}dume-top$k.eval.json" "$BIN" eval "$S/${p}dume-top$k" "${TOK[@]}" "${EVAL[@]}"
        [ -n "$p" ] || task_report "$S/dume-top$k.tasks.json" "$S/dume-top$k" "${TASKS[@]}"
    done
}

for seed in $SEEDS; do
    S="$WORK/s$seed"
    mkdir -p "$S"
    # The headline: fully fine-tuned experts, averaging, random, oracle, DUME top-1/top-2.
    moerged_set "" dense
    # DUME+ (the ridge router trained) and BTX (a random router trained), same router budget and
    # the same load-balancing coefficient.
    train_run "$S/dume-plus" "$S/dume-top2" --stage router "${MIX[@]}" --steps "$ROUTER_STEPS" --seq-len "$SEQ" \
        --batch "$BATCH" --lr "$ROUTER_LR" --warmup $((ROUTER_STEPS / 10)) --alpha "$ALPHA" --seed "$seed"
    report "$S/dume-plus.eval.json" "$BIN" eval "$S/dume-plus/final" "${TOK[@]}" "${EVAL[@]}"
    task_report "$S/dume-plus.tasks.json" "$S/dume-plus/final" "${TASKS[@]}"
    EXPERTS=()
    for dom in $DOMAINS; do EXPERTS+=("$S/expert-$dom/final"); done
    make_dir "$S/btx-init" "$BIN" moerge "${EXPERTS[@]}" --top-k 2 --router-std 0.02 --seed "$seed" --out "$S/btx-init"
    train_run "$S/btx" "$S/btx-init" --stage router "${MIX[@]}" --steps "$ROUTER_STEPS" --seq-len "$SEQ" \
        --batch "$BATCH" --lr "$ROUTER_LR" --warmup $((ROUTER_STEPS / 10)) --alpha "$ALPHA" --seed "$seed"
    report "$S/btx.eval.json" "$BIN" eval "$S/btx/final" "${TOK[@]}" "${EVAL[@]}"
    task_report "$S/btx.tasks.json" "$S/btx/final" "${TASKS[@]}"
done

for seed in $PARTS_SEEDS; do
    S="$WORK/s$seed"
    for part in $PARTS; do
        case $part in
        ffn) moerged_set ffn- ffn ;;
        ood)
            if [ ! -f "$S/dume-ood.route.json" ]; then
                rm -rf "$S/dume-ood"
                ood=()
                for dom in $DOMAINS; do ood+=(--domain "$dom=$OOD/$dom.txt:$D/corpora/domain/$dom/valid.txt"); done
                report "$S/dume-ood.route.json" "$BIN" route "$S/moe" "${ood[@]}" --top-k 1 "${ROUTE[@]}" \
                    --out "$S/dume-ood"
            fi
            report "$S/dume-ood.eval.json" "$BIN" eval "$S/dume-ood" "${TOK[@]}" "${EVAL[@]}"
            ;;
        incremental)
            train_run "$S/expert-hu" "$MODEL" --stage dense --data "hu=$HU_TRAIN" --steps "$STEPS" --seq-len "$SEQ" \
                --batch "$BATCH" --lr "$LR" --warmup $((STEPS / 10)) --seed "$seed"
            report "$S/expert-hu.eval.json" "$BIN" eval "$S/expert-hu/final" "${TOK[@]}" "${EVAL4[@]}"
            # Add the Hungarian expert onto dume-top1's saved statistics, versus re-collecting all
            # four domains' statistics on the grown model itself (dume-add's tensors).
            if [ ! -f "$S/dume-add.route.json" ]; then
                rm -rf "$S/dume-add"
                report "$S/dume-add.route.json" "$BIN" route "$S/dume-top1" \
                    --add-expert "hu=$S/expert-hu/final:$HU_TRAIN" "${ROUTE[@]}" --out "$S/dume-add"
            fi
            if [ ! -f "$S/dume-scratch4.route.json" ]; then
                rm -rf "$S/dume-scratch4"
                report "$S/dume-scratch4.route.json" "$BIN" route "$S/dume-add" "${ROUTE_DOMAINS[@]}" \
                    --domain "hu=$HU_TRAIN" "${ROUTE[@]}" --out "$S/dume-scratch4"
            fi
            report "$S/dume-add.eval.json" "$BIN" eval "$S/dume-add" "${TOK[@]}" "${EVAL4[@]}"
            report "$S/dume-scratch4.eval.json" "$BIN" eval "$S/dume-scratch4" "${TOK[@]}" "${EVAL4[@]}"
            ;;
        *) echo "unknown part $part (expected ffn, ood, incremental)" >&2; exit 1 ;;
        esac
    done
done

python3 experiments/dume_report.py "$WORK" "$OUT" "$SMOKE" "$MODEL" "$SEEDS" "$PARTS_SEEDS" "$(budget)" "$PARTS"
