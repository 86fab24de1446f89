#!/usr/bin/env bash
# NeuronMoE on SmolLM2-135M (issue 35 item 5; docs/methods.md §3): experts per layer from
# language-specific neurons, against allocations with exactly the same number of experts (so only
# the placement differs) and LayerMoE-style, at equal training.
#
#   neurons       `neurons` on English and the new languages hu, el, tr, each paragraph one text
#                 (`--docs line`). English is domain/docs — GNOME help pages, the same kind of text
#                 as the hu/el/tr help pages — not lang/en (1961 Brown prose), so that the specific
#                 neurons and the similarities separate languages, not genres; the English replay
#                 of stage 2 and the English evaluation use the same help text
#   allocations   `allocate` → neuronmoe.json; the budget-exact controls with NeuronMoE's total:
#                 `--baseline uniform` (spread evenly), `shuffled` (its counts permuted at random),
#                 `inverted` (its counts in the reverse order of the specific-neuron counts),
#                 `layermoe-placed` (its counts in LayerMoE's order); and `layermoe`
#                 (LayerMoE-style, its own total); alloc-hu-only.json: the allocation from
#                 Hungarian's specific neurons alone (the paper allocates per language), written
#                 beside the union's for comparison
#   per allocation: `upcycle --allocation` (expert 0 frozen, top-2), stage 1 (`train --stage
#                 experts` on the mixture of hu, el, tr), stage 2 (`train --stage router` with
#                 English replay and the language prior), per-language perplexity, and the
#                 parameters each allocation adds (`inspect --json`).
# The paper's framing is equal quality with fewer experts: the table puts the experts added next
# to the perplexities.
#
#   post-training analysis (methods.md §3.7): `neurons` on the trained MoE of the seeds in ANALYSE,
#                 every expert's neurons included: where the new experts' language-specific
#                 neurons sit, per trainable expert, against the dense model's
#
# Usage: experiments/neuronmoe.sh [--smoke]
#   --smoke        stories260K, 2 steps per training, 20 texts per language (CI runs it)
#   MOE_STUDIO_BIN, WORK, OUT, SEEDS  as in experiments/dume.sh (default WORK $MOE_STUDIO_CACHE/experiments/neuronmoe)
#   TEXTS          texts per language for `neurons` (full 200); TOP_N specific neurons per language
#   STEPS/SEQ/BATCH/LR, ROUTER_STEPS/ROUTER_LR, EVAL_TOKENS  as in experiments/deltamoe.sh
#   A row named ALLOC-drop (e.g. neuronmoe-drop, not in the default) is ALLOC's allocation with its
#                 new experts Drop-Upcycled (`--drop-ratio 0.5`: half of each new expert's units drawn
#                 afresh, Nakamura et al. 2025), so the post-training analysis can tell neurons the new
#                 experts acquired from neurons they inherited as copies of expert 0
#   ALLOCS         allocations to train (default "neuronmoe uniform shuffled inverted layermoe
#                  layermoe-placed": the headline pair first; a short sitting can run "neuronmoe
#                  uniform" and add the rest later)
#   PUBLISHED_SEEDS  seeds an earlier sitting published in OUT/results.json (its run directories
#                  gone with its machine): the report keeps their numbers beside this run's SEEDS,
#                  after checking the allocations, budget and evaluation streams are the same
#                  (the budget, and that no published seed is dropped or run twice, are checked
#                  before any training)
#   RERUN_SEEDS    published seeds this run trains again on purpose in the ALLOCS it runs (the
#                  post-training analysis or task scores of a model whose run directory is gone):
#                  each must be in PUBLISHED_SEEDS and SEEDS; the report checks that the retrained
#                  model scores the published perplexities (1e-3 relative) and replaces the entry
#   ANALYSE        seeds whose trained models (every allocation) get the post-training analysis
#                  (default: the first of SEEDS; "" skips it; ≈ 20–30 min per model here)
# Resumable like the other scripts.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh

SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
D="$MOE_STUDIO_DATA"
NEW="hu el tr"
EN_TRAIN="$D/corpora/domain/docs/train.txt" EN_VALID="$D/corpora/domain/docs/valid.txt"
for f in "$EN_TRAIN" "$EN_VALID"; do [ -f "$f" ] || { echo "missing $f (set MOE_STUDIO_DATA)" >&2; exit 1; }; done
for l in $NEW; do
    for split in train valid; do
        f="$D/corpora/lang/$l/$split.txt"
        [ -f "$f" ] || { echo "missing $f (set MOE_STUDIO_DATA)" >&2; exit 1; }
    done
done

if [ "$SMOKE" = 1 ]; then
    MODEL="$D/models/stories260K/stories260K.bin"
    TOK=(--tokenizer "$D/models/stories260K/tok512.bin")
    TEXTS=${TEXTS:-20} TOP_N=${TOP_N:-20}
    STEPS=${STEPS:-2} SEQ=${SEQ:-32} BATCH=${BATCH:-2} LR=${LR:-1e-3}
    ROUTER_STEPS=${ROUTER_STEPS:-2} ROUTER_LR=${ROUTER_LR:-1e-2} EVAL_TOKENS=${EVAL_TOKENS:-256} WINDOW=64
    SEEDS=${SEEDS:-1}
    export TASK_ITEMS=${TASK_ITEMS:-5}
    WORK=${WORK:-$MOE_STUDIO_CACHE/experiments/neuronmoe-smoke}
    OUT=${OUT:-$WORK/report}
else
    MODEL=$(bash tests/reference/fetch_smollm2.sh)
    TOK=()
    TEXTS=${TEXTS:-200} TOP_N=${TOP_N:-1000}
    STEPS=${STEPS:-100} SEQ=${SEQ:-256} BATCH=${BATCH:-4} LR=${LR:-1e-4}
    ROUTER_STEPS=${ROUTER_STEPS:-50} ROUTER_LR=${ROUTER_LR:-1e-3} EVAL_TOKENS=${EVAL_TOKENS:-10000} WINDOW=512
    SEEDS=${SEEDS:-"1 2 3"}
    WORK=${WORK:-$MOE_STUDIO_CACHE/experiments/neuronmoe-v2}
    OUT=${OUT:-docs/experiments/neuronmoe}
fi
mkdir -p "$WORK" "$OUT"
source experiments/lib.sh
exp_bin
ALLOCS=${ALLOCS:-"neuronmoe uniform shuffled inverted layermoe layermoe-placed"}
# The report's budget line (results.json `budget`: a later sitting pools only with the same).
BUDGET="texts=$TEXTS paragraphs per language (--docs line; English: domain/docs) top_n=$TOP_N; stage 1: $STEPS x $BATCH x $SEQ tokens lr $LR; stage 2: $ROUTER_STEPS steps lr $ROUTER_LR; eval_tokens=$EVAL_TOKENS window=$WINDOW stride=$STRIDE"
# A PUBLISHED_SEEDS the report would refuse at the end is refused now, before hours of training.
if [ -n "${PUBLISHED_SEEDS:-}" ]; then
    python3 experiments/neuronmoe_report.py --check-published "$OUT" "$SEEDS" "$ALLOCS" "$BUDGET"
fi

# Neurons (the `neurons` command reads a model with a tokenizer beside it or given).
langs=(--lang "en=$EN_TRAIN" --docs line)
for l in $NEW; do langs+=(--lang "$l=$D/corpora/lang/$l/train.txt"); done
if [ ! -f "$WORK/neurons/neurons.json" ]; then
    rm -rf "$WORK/neurons"
    run "$BIN" neurons "$MODEL" "${langs[@]}" --new "${NEW// /,}" --max-texts "$TEXTS" \
        --top-n "$TOP_N" --out "$WORK/neurons" >/dev/null
fi
for a in $(for x in $ALLOCS; do echo "${x%-drop}"; done | sort -u); do
    [ -f "$WORK/alloc-$a.json" ] && continue
    base=()
    [ "$a" != neuronmoe ] && base=(--baseline "$a")
    run "$BIN" allocate --neurons "$WORK/neurons" "${base[@]}" --out "$WORK/alloc-$a.json" >/dev/null
done
[ -f "$WORK/alloc-hu-only.json" ] ||
    run "$BIN" allocate --neurons "$WORK/neurons" --new hu --out "$WORK/alloc-hu-only.json" >/dev/null

EVAL=(--data "en=$EN_VALID" --max-tokens "$EVAL_TOKENS" --window "$WINDOW" --stride "$STRIDE" --json)
MIX=()
for l in $NEW; do
    EVAL+=(--data "$l=$D/corpora/lang/$l/valid.txt")
    MIX+=(--data "$l=$D/corpora/lang/$l/train.txt")
done
report "$WORK/base.eval.json" "$BIN" eval "$MODEL" "${TOK[@]}" "${EVAL[@]}"
# Task accuracy (issue 36): next-paragraph multiple choice on the held-out text of English (docs,
# the text the perplexities use) and each new language (tests/reference/make_tasks.py).
TASKS=(docs $NEW)
task_report "$WORK/base.tasks.json" "$MODEL" "${TASKS[@]}"
report "$WORK/base.inspect.json" "$BIN" inspect "$MODEL" --json

for seed in $SEEDS; do
    S="$WORK/s$seed"
    mkdir -p "$S"
    for a in $ALLOCS; do
        M="$S/$a"
        init=()
        [ "$a" != "${a%-drop}" ] && init=(--drop-ratio 0.5)
        make_dir "$M-init" "$BIN" upcycle "$MODEL" --allocation "$WORK/alloc-${a%-drop}.json" "${init[@]}" --top-k 2 --frozen 0 \
            --router-init random --router-std 0.02 --seed "$seed" --out "$M-init"
        report "$M.inspect.json" "$BIN" inspect "$M-init" --json
        train_run "$M-s1" "$M-init" --stage experts "${MIX[@]}" --steps "$STEPS" --lr "$LR" --seq-len "$SEQ" \
            --batch "$BATCH" --warmup $((STEPS / 10)) --seed "$seed"
        train_run "$M-s2" "$M-s1/final" --stage router "${MIX[@]}" --data "en=$EN_TRAIN:1:orig" \
            --steps "$ROUTER_STEPS" --lr "$ROUTER_LR" --seq-len "$SEQ" --batch "$BATCH" \
            --warmup $((ROUTER_STEPS / 10)) --seed "$seed"
        report "$M-s1.eval.json" "$BIN" eval "$M-s1/final" "${TOK[@]}" "${EVAL[@]}"
        report "$M-s2.eval.json" "$BIN" eval "$M-s2/final" "${TOK[@]}" "${EVAL[@]}"
        task_report "$M-s2.tasks.json" "$M-s2/final" "${TASKS[@]}"
    done
done

# Post-training analysis: the same `neurons` run on each trained model (stage 2), experts included;
# for a Drop-Upcycled row also on its model before training (units drawn afresh can be
# language-selective by chance: what training added is the difference).
ANALYSE=${ANALYSE-${SEEDS%% *}}
for seed in $ANALYSE; do
    for a in $ALLOCS; do
        M="$WORK/s$seed/$a"
        models=("$M-s2/final:$M-s2.neurons")
        [ "$a" != "${a%-drop}" ] && models+=("$M-init:$M-init.neurons")
        for mo in "${models[@]}"; do
            src=${mo%%:*} dst=${mo#*:}
            [ -f "$dst/neurons.json" ] && continue
            rm -rf "$dst" "$dst.tmp"
            run "$BIN" neurons "$src" "${TOK[@]}" "${langs[@]}" --new "${NEW// /,}" --max-texts "$TEXTS" \
                --top-n "$TOP_N" --out "$dst.tmp" >/dev/null
            mv "$dst.tmp" "$dst"
        done
    done
done

python3 experiments/neuronmoe_report.py "$WORK" "$OUT" "$SMOKE" "$MODEL" "$SEEDS" "$ALLOCS" "$ANALYSE" "$BUDGET"
