# Shared helpers of the experiment scripts (sourced, not run): the binary, the command log, and
# resumable steps. Each script sets SMOKE, WORK and TOK (the `--tokenizer` array, may be empty)
# before calling these.

# Evaluation stride of every script's `eval` (WINDOW is the script's window): default the window,
# non-overlapping windows — half the cost of stride WINDOW/2 on this 2-core machine.
STRIDE=${STRIDE:-$WINDOW}

# Sets BIN: the given one (MOE_STUDIO_BIN, the name every script of the project reads, or BIN), else a
# cargo build (release; smoke: debug, which CI has built); exports it as MOE_STUDIO_BIN for the
# reports' figures.
# analysis_seeds [PARTS_ON_PUBLISHED]: SEEDS, PUBLISHED_SEEDS, PARTS_SEEDS and PARTS checked before
# any work. An empty SEEDS runs only analyses (PARTS) of published seeds, so it needs PUBLISHED_SEEDS,
# PARTS_SEEDS and PARTS; each PARTS_SEEDS seed is run here or published (the report pairs its
# analyses with that seed's headline rows); on a seed only published, only the parts named in
# PARTS_ON_PUBLISHED may run (all of them when it is not given).
analysis_seeds() {
    local allowed=${1-} pub=${PUBLISHED_SEEDS:-} s part
    if [ -z "${SEEDS// /}" ] && { [ -z "${pub// /}" ] || [ -z "${PARTS_SEEDS// /}" ] || [ -z "${PARTS// /}" ]; }; then
        echo "SEEDS is empty: name the seeds to run, or PUBLISHED_SEEDS, PARTS_SEEDS and PARTS to run only analyses of published seeds" >&2
        exit 1
    fi
    for s in $PARTS_SEEDS; do
        case " $SEEDS " in *" $s "*) continue ;; esac
        case " $pub " in
        *" $s "*) ;;
        *) echo "PARTS_SEEDS has seed $s, which is neither in SEEDS nor in PUBLISHED_SEEDS" >&2; exit 1 ;;
        esac
        [ -n "$allowed" ] || continue
        for part in $PARTS; do
            case " $allowed " in
            *" $part "*) ;;
            *)
                echo "PARTS=$part of published seed $s: it starts from that seed's headline models, which are not run here (only $allowed runs on a published seed; add $s to SEEDS to rerun it whole)" >&2
                exit 1
                ;;
            esac
        done
    done
}
exp_bin() {
    BIN=${MOE_STUDIO_BIN:-${BIN:-}}
    if [ -z "$BIN" ]; then
        if [ "$SMOKE" = 1 ]; then
            cargo build -q -p moe-studio >&2
            BIN=$CARGO_TARGET_DIR/debug/moe-studio
        else
            cargo build -q --release -p moe-studio >&2
            BIN=$CARGO_TARGET_DIR/release/moe-studio
        fi
    fi
    # The reports draw their figures with `$BIN plot` (experiments/report_common.py).
    export MOE_STUDIO_BIN=$BIN
}

# Runs a command, appending it and its wall time to $WORK/commands.log.
run() {
    local t0
    t0=$(date +%s)
    echo "+ $*" | tee -a "$WORK/commands.log" >&2
    "$@"
    echo "  ($(($(date +%s) - t0)) s)" >>"$WORK/commands.log"
}

# report FILE CMD...: runs CMD (stdout: a JSON report) into FILE, written only when CMD succeeds;
# skipped when FILE exists.
report() {
    local file=$1
    shift
    [ -f "$file" ] && return 0
    run "$@" >"$file.tmp"
    mv "$file.tmp" "$file"
}

# make_dir DIR CMD...: runs CMD (which writes the model directory DIR) unless DIR/config.json
# exists; a half-written DIR from an interrupted run is removed first.
make_dir() {
    local dir=$1
    shift
    [ -f "$dir/config.json" ] && return 0
    rm -rf "$dir"
    run "$@" >/dev/null
}

# train_run DIR ARGS...: `moe-studio train ARGS --out DIR` unless DIR/final exists; resumes from
# the last checkpoint when there is one, and deletes it once DIR/final is written. Writes the
# training wall seconds to DIR.seconds.
train_run() {
    local dir=$1
    shift
    [ -f "$dir/final/config.json" ] && return 0
    local resume=() t0
    ls -d "$dir"/checkpoint-* >/dev/null 2>&1 && resume=(--resume)
    t0=$(date +%s)
    run "$BIN" train "$@" "${TOK[@]}" --save-every 20 --keep 1 --json --out "$dir" "${resume[@]}" >/dev/null
    echo $(($(date +%s) - t0)) >>"$dir.seconds"
    # The checkpoint only serves resuming; a finished run keeps final/ (a MoE's is ~5 GB with AdamW).
    rm -rf "$dir"/checkpoint-*
}

# task_report FILE MODEL [LANG...]: multiple-choice accuracy (`eval --task`, lm-eval's acc / acc_norm)
# of MODEL on the next-paragraph tasks of the given corpora (names of tests/reference/make_tasks.py:
# en hu el tr docs code math; default all) into FILE, read by report_common.task_acc / acc_cell.
# The tasks are made once per run under $WORK/tasks (TASK_ITEMS items each, default 100); skipped
# when FILE exists. TASK_BIN (default $BIN): the binary that scores them, so a run trained by an
# older binary without `eval --task` can be scored afterwards by a newer one. TASK_ITEMS=0 skips
# task accuracy (a sitting too short for it: on this 2-core machine 50 items of 4 tasks took over
# 20 min for the dense 135M model beside a build); a later run with items scores what is saved.
task_report() {
    local file=$1 model=$2
    shift 2
    [ "${TASK_ITEMS:-100}" != 0 ] || return 0
    local names=("$@") args=() root
    [ ${#names[@]} -gt 0 ] || names=(en hu el tr docs code math)
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    [ -f "$WORK/tasks/tasks.json" ] || run python3 "$root/tests/reference/make_tasks.py" \
        --data "$MOE_STUDIO_DATA" --out "$WORK/tasks" --items "${TASK_ITEMS:-100}" >/dev/null
    for n in "${names[@]}"; do args+=(--task "$n=$WORK/tasks/$n.jsonl"); done
    report "$file" "${TASK_BIN:-$BIN}" eval "$model" "${args[@]}" --target-delimiter '' "${TOK[@]}" --json
}
