#!/usr/bin/env bash
# The test command (README): set-up when missing, then formatting, lints,
# the wasm32 build of the portable crates, every Rust test, then the
# Playwright end-to-end suite in headless Chromium.
#
#   scripts/test.sh                 every step (what .ci/run runs); `test`
#                                   includes the wgpu parity test, which
#                                   the `wgpu` step runs alone
#   scripts/test.sh --only STEP...  only the named steps, in the order below:
#       setup fmt rooms clippy wasm cuda test bench experiments e2e e2e-backend wgpu
#   scripts/test.sh --list          the step names
# Steps after `test` run the moe-studio binary `cargo test` builds; with
# --only they build it first when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS_ALL="setup fmt rooms clippy wasm cuda test bench experiments e2e e2e-backend wgpu"
# The Rust tests are built once, with the binary's `wgpu` feature
# (TEST_FEATURES): the wgpu-vs-cpu parity test (backend/tests/wgpu_parity.rs,
# issue 38) then runs in every `cargo test`, and the `wgpu` step is that
# test alone. As a second build beside a feature-less one it cost a second
# dependency tree (17 min 49 s cold on this 2-core machine, 2026-12-05:
# `syn` and everything derived from it rebuilt with other features); as the
# one test build it costs only the crates wgpu adds.
TEST_FEATURES="--features moe-studio/wgpu"
STEPS_DEFAULT="setup fmt rooms clippy wasm cuda test bench experiments e2e e2e-backend"
ONLY=""
case "${1:-}" in
--list)
    echo "$STEPS_ALL"
    exit 0
    ;;
--only)
    shift
    [ $# -gt 0 ] || { echo "--only needs step names: $STEPS_ALL" >&2; exit 2; }
    for s in "$@"; do
        [[ " $STEPS_ALL " == *" $s "* ]] || { echo "unknown step \`$s\` (steps: $STEPS_ALL)" >&2; exit 2; }
    done
    ONLY=" $* "
    ;;
"") ;;
*)
    echo "usage: scripts/test.sh [--only STEP... | --list]" >&2
    exit 2
    ;;
esac
# want STEP: whether this run includes STEP.
want() { if [ -z "$ONLY" ]; then [[ " $STEPS_DEFAULT " == *" $1 "* ]]; else [[ "$ONLY" == *" $1 "* ]]; fi; }
# Each step header says when it starts and how long the previous one took;
# the last line gives every step's time and the total.
T0=$(date +%s); TS=$T0; LAST=""; TIMES=""
step() {
    local now; now=$(date +%s)
    if [ -n "$LAST" ]; then
        echo "--- $LAST: $((now - TS)) s"
        TIMES="$TIMES\n  $((now - TS)) s  $LAST"
    fi
    TS=$now; LAST="$*"
    echo; echo "=== $* ($(date +%H:%M:%S))"
}
finish() { step "done"; echo -e "step times:$TIMES\n  total $(( $(date +%s) - T0 )) s"; }

if want setup; then
    step "set-up (what is missing)"
    bash scripts/setup.sh
fi
source scripts/env.sh

if want fmt; then
    step "cargo fmt --check"
    cargo fmt --all -- --check
fi

if want rooms; then
    step "no import circle between shared's rooms (scripts/check_rooms.py, with its self-test); no source file over 900 lines without a one-concern note"
    python3 scripts/check_rooms.py --self-test
    python3 scripts/check_rooms.py
    python3 scripts/check_long_files.py
    python3 scripts/param_spread.py --self-test
    python3 scripts/param_spread.py
fi

# Clippy rides on the builds the later steps need instead of a check-mode
# build of every dependency beside them (issue 37; ~20 min of a cold run on
# this 2-core machine): the workspace's own crates are compiled by
# clippy-driver with -D warnings (cargo's RUSTC_WORKSPACE_WRAPPER, what
# `cargo clippy` sets for its check build; CLIPPY_ARGS is how it passes the
# flags), the dependencies by rustc as always. Exported for the rest of the
# run, so `cargo test`, the wasm build and build_web.sh find the same
# fingerprints and rebuild nothing; set after set-up, whose `cargo install`
# must not be linted.
if want clippy; then
    step "clippy (deny warnings) on the test build and the wasm build"
    RUSTC_WORKSPACE_WRAPPER="$(command -v clippy-driver)" || { echo "clippy-driver not found (rustup component add clippy)" >&2; exit 1; }
    export RUSTC_WORKSPACE_WRAPPER
    export CLIPPY_ARGS="-Dwarnings__CLIPPY_HACKERY__"
    cargo test --workspace $TEST_FEATURES --no-run
    cargo build --profile wasm-release --target wasm32-unknown-unknown -p moe-studio-shared -p moe-studio-kernels -p moe-studio-frontend
fi

if want wasm; then
    step "wasm32 build of the portable crates (the browser's profile, reused by scripts/build_web.sh)"
    cargo build --profile wasm-release --target wasm32-unknown-unknown -p moe-studio-shared -p moe-studio-kernels -p moe-studio-frontend
fi

# The GPU binary cannot rot unseen (issue 38): `--features cuda` type-checks
# offline (cudarc loads the driver at run time, so no CUDA toolkit is
# needed to build). A check build, not a full one: 5.5 min cold on this
# 2-core machine (measured 2026-12-05), a minute once warm; under the
# clippy step's wrapper it also lints the code behind the feature.
if want cuda; then
    step "cuda build check (cargo check -p moe-studio --features cuda)"
    cargo check -p moe-studio --features cuda
fi

# The later steps run the moe-studio binary that cargo test builds (the
# backend's integration tests run it, and cargo puts it here). A `cargo build -p moe-studio` of their
# own would resolve a narrower feature set than the workspace's tests and
# rebuild every dependency once more (~20 min on a fresh 2-core machine).
CLI="$CARGO_TARGET_DIR/debug/moe-studio"
if want test; then
    step "cargo test"
    cargo test --workspace $TEST_FEATURES --no-fail-fast
    [ -x "$CLI" ] || { echo "cargo test built no moe-studio binary" >&2; exit 1; }
elif want bench || want experiments || want e2e || want e2e-backend; then
    step "the moe-studio binary of the later steps (cargo test --no-run)"
    cargo test --workspace $TEST_FEATURES --no-run
fi
if want bench || want experiments || want e2e || want e2e-backend; then
    echo "moe-studio binary of the remaining steps: $CLI"
fi

if want bench; then
    step "benchmarks, smoke mode (every workload of scripts/bench.sh runs, tiny sizes; scripts/gpu_check.sh on the CPU)"
    MOE_STUDIO_BIN="$CLI" bash scripts/bench.sh --smoke
    # The GPU check's commands stay the CLI's own between GPU loans (issue 38 item 2): the same
    # script on the CPU with a tiny shape (a second; exit 1 when a workload fails).
    BACKEND=cpu SHAPE=tiny OUT="$(mktemp -d)" bash scripts/gpu_check.sh "$CLI"
fi

if want experiments; then
    step "experiments, smoke mode (each paper script on stories260K, a few steps; fresh run directories; a second seed pooled with the first)"
    # expect_refused WHAT PATTERN NOT_MADE VAR=VALUE...: experiments/$exp.sh --smoke on $work with
    # those variables must fail with an error matching PATTERN (grep -E) and leave NOT_MADE unmade
    # (refused before any training); otherwise CI fails naming WHAT.
    expect_refused() {
        local what=$1 pattern=$2 not_made=$3
        shift 3
        if env MOE_STUDIO_BIN="$CLI" WORK="$work" "$@" bash "experiments/$exp.sh" --smoke >/dev/null 2>"$work/refused.log" \
            || ! grep -q -E "$pattern" "$work/refused.log" || [ -e "$not_made" ]; then
            echo "$exp: $what was not refused up front" >&2
            tail -3 "$work/refused.log" >&2
            exit 1
        fi
    }
    for exp in upcycling dume deltamoe neuronmoe; do
        work=$(mktemp -d)
        MOE_STUDIO_BIN="$CLI" WORK="$work" bash "experiments/$exp.sh" --smoke >/dev/null
        # A later sitting pools this one's seed 1 (its run directory gone) with its own seed 2.
        cp "$work/report/results.json" "$work/first.json"
        rm -rf "$work/s1"
        # NeuronMoE pools per allocation: the later sitting trains four of the six, and a third
        # trains seed 2 of a published allocation that lacked it.
        allocs=()
        [ "$exp" = neuronmoe ] && allocs=(ALLOCS="neuronmoe uniform shuffled inverted")
        env MOE_STUDIO_BIN="$CLI" WORK="$work" SEEDS=2 PARTS_SEEDS="" PUBLISHED_SEEDS=1 ${allocs[@]+"${allocs[@]}"} \
            bash "experiments/$exp.sh" --smoke >/dev/null
        python3 experiments/check_pooled.py "$exp" "$work/first.json" "$work/report/results.json"
        if [ "$exp" = deltamoe ]; then
            grep -q "## Scale or recipe" "$work/report/README.md"
            # The expert-count ablation (seed 1, published): 2 to 5 experts, the headline's 4 on
            # the ablation's seed only, each count's change from the next smaller one, paired, for
            # stage 1 and stage 2; one more expert adds the same trainable parameters each time.
            python3 -c "import json, sys; r = json.load(open(sys.argv[1]))
p = lambda m: dict(zip(r['seeds_per_method'][m], r['methods'][m]))['1']
for st in ('s1', 's2'):
    e = r['expert_count'][st]
    assert sorted(e, key=int) == ['2', '3', '4', '5'] and all(v['seeds'] == ['1'] for v in e.values()), e
    steps = {e[b]['trainable_params'] - e[a]['trainable_params'] for a, b in (('2', '3'), ('3', '4'), ('4', '5'))}
    assert len(steps) == 1 and steps.pop() > 0, e
    for a, b in (('3', '2'), ('4', '3'), ('5', '4')):
        c = e[a]['change_from']
        assert c['model'] == f'moe-{b}-{st}+delta' and sorted(c['pct']) == ['en', 'hu', 'math'], c
        for t, v in c['pct'].items():
            want = (p(f'moe-{a}-{st}+delta')[t] / p(f'moe-{b}-{st}+delta')[t] - 1) * 100
            assert abs(v - want) < 1e-9, (st, a, t, v, want)
    assert st == 's2' or all(v['hu_before_delta'] == p(f'moe-{k}-s1')['hu'] for k, v in e.items()), e" "$work/report/results.json"
            grep -q "## Expert count" "$work/report/README.md"
            # A third sitting runs only the 2x2 of the published seed 2 (its run directory gone),
            # paired with seed 2's published headline rows.
            cp "$work/report/results.json" "$work/second.json"
            rm -rf "$work/s2"
            MOE_STUDIO_BIN="$CLI" WORK="$work" SEEDS="" PARTS_SEEDS=2 PARTS=2x2 PUBLISHED_SEEDS="1 2" \
                bash "experiments/$exp.sh" --smoke >/dev/null
            python3 experiments/check_pooled.py "$exp" "$work/second.json" "$work/report/results.json"
            python3 -c "import json, sys; r = json.load(open(sys.argv[1]))
assert r['seeds_per_method']['cpt-ffn'] == ['1', '2'] and r['scale_or_recipe']['two_by_two']['en']['seeds'] == ['1', '2'], r['scale_or_recipe']
# The frontier (seed 2's grafted models): each listed dominator is at least as good on every text
# and better on one, and every other model dominates nobody it is not listed for.
f = r['frontier']; ms = f['models']; T = ('en', 'hu', 'math')
assert f['seed'] == '2' and 'cpt-ffn+delta' in ms and 'moe-4-s1+delta' in ms and not any('-s2' in m for m in ms), f
dom = lambda a, b: all(ms[a][t] <= ms[b][t] for t in T) and any(ms[a][t] < ms[b][t] for t in T)
assert all(sorted(n for n in ms if n != m and dom(n, m)) == e['dominated_by'] for m, e in ms.items()), ms" \
                "$work/report/results.json"
            # The same sitting again with its run directory kept: the published rows are this
            # run's own results, taken as they are (a part published while another trained on).
            cp "$work/report/results.json" "$work/third.json"
            MOE_STUDIO_BIN="$CLI" WORK="$work" SEEDS="" PARTS_SEEDS=2 PARTS=2x2 PUBLISHED_SEEDS="1 2" \
                bash "experiments/$exp.sh" --smoke >/dev/null
            cmp <(python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print(r['methods'], r['seeds_per_method'])" "$work/third.json") \
                <(python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print(r['methods'], r['seeds_per_method'])" "$work/report/results.json")
            # The run directory gone: a published seed neither carried nor run again is refused
            # before any training; the published 2x2 rows are not trained again; a result here
            # that differs from the published one is refused before any training.
            cp "$work/s2/cpt-ffn.eval.json" "$work/cpt-ffn.eval.json"
            rm -rf "$work/s2"
            expect_refused "dropping published seed 1" "neither carries" "$work/s2" \
                SEEDS="" PARTS_SEEDS=2 PARTS=2x2 PUBLISHED_SEEDS=2
            MOE_STUDIO_BIN="$CLI" WORK="$work" SEEDS="" PARTS_SEEDS=2 PARTS=2x2 PUBLISHED_SEEDS="1 2" \
                bash "experiments/$exp.sh" --smoke >/dev/null
            [ ! -e "$work/s2/cpt-ffn" ] || { echo "deltamoe: a published 2x2 row was trained again" >&2; exit 1; }
            python3 experiments/check_pooled.py "$exp" "$work/second.json" "$work/report/results.json"
            mkdir -p "$work/s2"
            python3 -c "import json, sys; e = json.load(open(sys.argv[1])); e['datasets'][0]['ppl'] *= 1.01
json.dump(e, open(sys.argv[2], 'w'))" "$work/cpt-ffn.eval.json" "$work/s2/cpt-ffn.eval.json"
            expect_refused "a published row with another result here" "has another result of it" "$work/s2/moe-4-all" \
                SEEDS="" PARTS_SEEDS=2 PARTS=2x2 PUBLISHED_SEEDS="1 2"
        fi
        if [ "$exp" = dume ]; then
            # A third sitting runs only the FFN-only part of the published seed 2 (its run
            # directory gone); again with the run directory kept (the same results); then, gone,
            # the published part is refused up front, as is a part that needs seed 2's headline.
            cp "$work/report/results.json" "$work/second.json"
            rm -rf "$work/s2"
            MOE_STUDIO_BIN="$CLI" WORK="$work" SEEDS="" PARTS_SEEDS=2 PARTS=ffn PUBLISHED_SEEDS="1 2" \
                bash "experiments/$exp.sh" --smoke >/dev/null
            python3 experiments/check_pooled.py "$exp" "$work/second.json" "$work/report/results.json"
            python3 -c "import json, sys; r = json.load(open(sys.argv[1]))
assert [x['seed'] for x in r['methods']['ffn-oracle']] == ['1', '2'] and r['seeds'] == ['1', '2'], r['seeds']
# The oracle of FFN-only experts is each expert exactly (retention 1.0 as a float); the share of
# averaging's gap to it each ridge router recovers, over both seeds, as defined; the FFN-only top-2
# router's routing report pooled like the top-1's.
g = r['ffn_gap_recovered']; m = lambda k: sum(x['mean_retention'] for x in r['methods'][k]) / 2
assert g['seeds'] == ['1', '2'], g
o, a = m('ffn-oracle'), m('ffn-average')
assert o == 1.0 and a < o, (o, a)
assert all(abs(g[k] - (m(k) - a) / (o - a)) < 1e-12 for k in ('ffn-dume-top1', 'ffn-dume-top2')), g
assert [x['seed'] for x in r['methods']['ffn-dume-top2.route']] == ['1', '2']
assert sorted(r['headline_gap_recovered']) == ['1', '2'], r['headline_gap_recovered']" \
                "$work/report/results.json"
            cp "$work/report/results.json" "$work/third.json"
            MOE_STUDIO_BIN="$CLI" WORK="$work" SEEDS="" PARTS_SEEDS=2 PARTS=ffn PUBLISHED_SEEDS="1 2" \
                bash "experiments/$exp.sh" --smoke >/dev/null
            cmp <(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['methods'])" "$work/third.json") \
                <(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['methods'])" "$work/report/results.json")
            cp "$work/s2/ffn-expert-code.eval.json" "$work/ffn-expert-code.eval.json"
            rm -rf "$work/s2"
            for part in ffn "ffn ood"; do
                expect_refused "PARTS=$part of a published seed" "already have it|which are not run here" "$work/s2" \
                    SEEDS="" PARTS_SEEDS=2 PARTS="$part" PUBLISHED_SEEDS="1 2"
            done
            # A kept result that differs from the published one: refused before any training.
            mkdir -p "$work/s2"
            python3 -c "import json, sys; e = json.load(open(sys.argv[1])); e['datasets'][0]['ppl'] *= 1.01
json.dump(e, open(sys.argv[2], 'w'))" "$work/ffn-expert-code.eval.json" "$work/s2/ffn-expert-code.eval.json"
            expect_refused "a published FFN-only row with another result here" "has another result than the published one" "$work/s2/ffn-expert-code" \
                SEEDS="" PARTS_SEEDS=2 PARTS=ffn PUBLISHED_SEEDS="1 2"
        fi
        if [ "$exp" = neuronmoe ]; then
            # Every control against NeuronMoE on the same task items, for the first sitting's seed.
            python3 -c "import json, sys; r = json.load(open(sys.argv[1])); p = r['task_accuracy_paired']
assert sorted(x['a'] for x in p) == sorted(a for a in r['allocations'] if a != 'neuronmoe'), p
assert all(x['b'] == 'neuronmoe' and x['seed'] == '1' and set(x['acc_norm']) == {'docs', 'hu', 'el', 'tr'} for x in p), p" \
                "$work/first.json"
            cp "$work/report/results.json" "$work/second.json"
            # (the allocations it does not train are read from the published rows)
            rm -rf "$work/s2" "$work"/alloc-*.json
            MOE_STUDIO_BIN="$CLI" WORK="$work" SEEDS=2 PUBLISHED_SEEDS="1 2" ALLOCS=layermoe \
                bash "experiments/$exp.sh" --smoke >/dev/null
            python3 experiments/check_pooled.py "$exp" "$work/second.json" "$work/report/results.json"
            grep -q "Pooled allocation by allocation" "$work/report/README.md"
            # A published seed that would be lost (not carried, not run again) is refused, before
            # any training (no run directory of seed 3).
            expect_refused "dropping published seed 2 of the other allocations" "neither carries" "$work/s3" \
                SEEDS=3 PUBLISHED_SEEDS=1 ALLOCS=layermoe
            # A published seed trained again on purpose (its run directory gone: RERUN_SEEDS) for
            # its post-training analysis: kept only because it reproduces the published numbers,
            # and then its entries and analysis replace the published ones.
            cp "$work/report/results.json" "$work/third.json"
            # With it, a new row: NeuronMoE's allocation Drop-Upcycled (its own analysis).
            # uniform's seed 1 is trained again too: its pair with NeuronMoE is scored again and replaces
            # the published one.
            MOE_STUDIO_BIN="$CLI" WORK="$work" SEEDS=1 RERUN_SEEDS=1 PUBLISHED_SEEDS="1 2" ALLOCS="neuronmoe neuronmoe-drop uniform" \
                ANALYSE=1 bash "experiments/$exp.sh" --smoke >/dev/null
            python3 experiments/check_pooled.py "$exp" "$work/third.json" "$work/report/results.json"
            grep -q -- "--drop-ratio 0.5" "$work/commands.log"
            python3 -c "import json, sys; r = json.load(open(sys.argv[1])); a = r['allocations']
assert r['reproduced'] == {'neuronmoe s1': 0.0, 'uniform s1': 0.0}, r.get('reproduced')
assert a['neuronmoe']['seeds'] == ['1', '2'] and 'neuronmoe s1' in r['post_training'], r['post_training']
assert a['neuronmoe-drop']['seeds'] == ['1'] and a['neuronmoe-drop']['new_experts_per_layer'] == a['neuronmoe']['new_experts_per_layer']
assert 'neuronmoe-drop s1' in r['post_training'] and r['paired_vs_neuronmoe']['neuronmoe-drop']['same_total'], r['paired_vs_neuronmoe']
assert 'neuronmoe-drop s1 before training' in r['post_training'] and 'neuronmoe s1 before training' not in r['post_training']
# the pairs: one record per (control, seed), seed 1's scored again by the retrained models, the
# difference the mean of the per-item acc_norm differences of the two reports on disk
k = [(x['a'], x['b'], x['seed']) for x in r['task_accuracy_paired']]
assert len(k) == len(set(k)) and {('neuronmoe-drop', 'neuronmoe', '1'), ('uniform', 'neuronmoe', '1'), ('uniform', 'neuronmoe', '2')} <= set(k), k
hu = lambda m: next(t for t in json.load(open(f'{sys.argv[2]}/s1/{m}-s2.tasks.json'))['tasks'] if t['name'] == 'hu')['samples']
d = [x['acc_norm'] - y['acc_norm'] for x, y in zip(hu('neuronmoe-drop'), hu('neuronmoe'))]
got = next(x for x in r['task_accuracy_paired'] if x['a'] == 'neuronmoe-drop' and x['seed'] == '1')['acc_norm']['hu']
assert abs(got['diff'] - sum(d) / len(d)) < 1e-12 and got['items'] == len(d), (got, d)" \
                "$work/report/results.json" "$work"
            # The same, against a published seed 1 it does not reproduce: refused.
            python3 -c "import json, sys; r = json.load(open(sys.argv[1])); r['allocations']['neuronmoe']['s2'][0]['hu'] *= 1.01
json.dump(r, open(sys.argv[1], 'w'))" "$work/report/results.json"
            expect_refused "a retrained seed that does not reproduce" "not the same training" "$work/not-made" \
                SEEDS=1 RERUN_SEEDS=1 PUBLISHED_SEEDS="1 2" ALLOCS=neuronmoe ANALYSE=1
        fi
        if [ "$exp" = upcycling ]; then
            # Both seeds of every row; each paired change as defined (same seed: same tokens); one
            # token stream per evaluation text; stage 1 costs more FLOPs per token than dense-cpt.
            python3 -c "import json, sys; r = json.load(open(sys.argv[1]))
rows = r['rows']
assert sorted(rows) == ['dense-cpt', 'dense-ffn', 'drop', 'granular', 'naive', 'noise'], sorted(rows)
assert all([x['seed'] for x in v] == ['1', '2'] for v in rows.values()), rows
by = lambda m: {x['seed']: x for x in rows[m]}
variants = ['drop', 'granular', 'naive', 'noise']
for key, b in (('paired_vs_naive', 'naive'), ('paired_vs_dense_ffn', 'dense-ffn'), ('paired_vs_dense_cpt', 'dense-cpt')):
    assert sorted(r[key]) == sorted(set(variants + ['dense-ffn', 'dense-cpt']) - {b} if b == 'naive' else variants), (key, r[key])
    for m, p in r[key].items():
        assert m != b and sorted(p) == ['1', '2'], (key, m, p)
        for s, d in p.items():
            for t in ('hu', 'en'):
                assert abs(d[t] - (by(m)[s][t] / by(b)[s][t] - 1)) < 1e-12, (key, m, s, t)
assert sorted(r['paired_vs_naive']) == ['dense-cpt', 'dense-ffn', 'drop', 'granular', 'noise'], r['paired_vs_naive']
# the published seed's training stream carried, the same text in both seeds; load balance in [1, 2]
# for every MoE row (top-2 of 4 copies), none for the dense rows
assert sorted(r['train_streams']) == ['1', '2'] and r['train_streams']['1'] == r['train_streams']['2'], r['train_streams']
assert all((x['balance'] is None) == m.startswith('dense') for m, v in rows.items() for x in v), rows
assert all(1 <= x['balance'] <= 2 + 1e-9 for m in variants for x in rows[m]), rows
t = r['task_accuracy']
assert sorted(t) == sorted(['dense'] + list(rows)) and all([x['seed'] for x in t[m]] == ['1', '2'] for m in rows), t
assert sorted((p['a'], p['seed']) for p in r['task_accuracy_paired']) == sorted((m, s) for m in rows if m != 'naive' for s in '12')
assert sorted(r['eval_streams']) == ['en', 'hu'], r['eval_streams']
assert r['flops']['experts'] > r['flops']['dense'] > r['flops']['ffn'] > 0, r['flops']" "$work/report/results.json"
            # A seed both published and run again is refused before any training.
            expect_refused "a seed both published and run" "seed\(s\) 2 are both published and run here" "$work/s3" \
                SEEDS="2 3" PUBLISHED_SEEDS="1 2"
            # Pooled row by row: a third sitting runs seed 3 without granular (the published
            # granular rows carried), a fourth adds granular to the published seed 3 alone (no dense
            # run), paired with seed 3's published rows.
            cp "$work/report/results.json" "$work/second.json"
            MOE_STUDIO_BIN="$CLI" WORK="$work" SEEDS=3 PUBLISHED_SEEDS="1 2" VARIANTS="naive noise drop" \
                bash "experiments/$exp.sh" --smoke >/dev/null
            python3 experiments/check_pooled.py "$exp" "$work/second.json" "$work/report/results.json"
            grep -q "granular. lacks seed(s) 3" "$work/report/README.md"
            cp "$work/report/results.json" "$work/third.json"
            # (a published seed's row neither carried nor run again, or both, is refused up front)
            expect_refused "dropping published seed 3 of other rows" "neither carries" "$work/s3/granular" \
                SEEDS=3 PUBLISHED_SEEDS="1 2" DENSE="" VARIANTS=granular
            expect_refused "a published row run again" "both published and run here" "$work/s3/granular" \
                SEEDS=3 PUBLISHED_SEEDS="1 2 3" DENSE="" VARIANTS="naive granular"
            # (seed 3's run directory kept: its rows' task items are here, so granular gets its pair
            # against naive, and the published pairs are not made a second time)
            # A publication made before expert 0's shares and the before-training scores were
            # recorded: seed 3's are dropped from the published results.json, and the report takes
            # them again from seed 3's kept evaluations (check_pooled against third.json below).
            python3 -c "import json, sys; p = sys.argv[1]; r = json.load(open(p))
for key, rows in (('expert0_share', ('naive', 'noise', 'drop')), ('before_training', ('noise', 'drop'))):
    for m in rows:
        r[key][m].pop('3')
json.dump(r, open(p, 'w'))" "$work/report/results.json"
            before=$(stat -c %Y "$work/s3/naive.eval.json" "$work/s3/dense-ffn.eval.json")
            MOE_STUDIO_BIN="$CLI" WORK="$work" SEEDS=3 PUBLISHED_SEEDS="1 2 3" DENSE="" VARIANTS=granular \
                bash "experiments/$exp.sh" --smoke >/dev/null
            [ "$before" = "$(stat -c %Y "$work/s3/naive.eval.json" "$work/s3/dense-ffn.eval.json")" ] ||
                { echo "upcycling: a published row was evaluated again" >&2; exit 1; }
            python3 experiments/check_pooled.py "$exp" "$work/third.json" "$work/report/results.json"
            python3 -c "import json, sys; r = json.load(open(sys.argv[1]))
k = [(p['a'], p['b'], p['seed']) for p in r['task_accuracy_paired']]
assert len(k) == len(set(k)) and ('granular', 'naive', '3') in k, k" "$work/report/results.json"
            python3 -c "import json, sys; r = json.load(open(sys.argv[1])); rows = r['rows']
assert all([x['seed'] for x in v] == ['1', '2', '3'] for v in rows.values()), rows
by = lambda m: {x['seed']: x for x in rows[m]}
for key, b in (('paired_vs_naive', 'naive'), ('paired_vs_dense_ffn', 'dense-ffn'), ('paired_vs_dense_cpt', 'dense-cpt')):
    d = r[key]['granular']['3']
    assert all(abs(d[t] - (by('granular')['3'][t] / by(b)['3'][t] - 1)) < 1e-12 for t in ('hu', 'en')), (key, d)
assert r['train_streams']['3'] == r['train_streams']['1'], r['train_streams']" "$work/report/results.json"
        fi
        rm -rf "$work"
    done
fi

if want e2e; then
    step "browser end-to-end (scripts/build_web.sh + playwright-core + chromium)"
    MOE_STUDIO_BIN="$CLI" bash tests/e2e/run.sh
fi

if want e2e-backend; then
    step "server end-to-end (moe-studio serve + Jobs page: upload/resume, train over SSE, download)"
    MOE_STUDIO_BIN="$CLI" bash tests/e2e/run_backend.sh
fi

# The generic Burn path (what a GPU runs) against the CPU path, on wgpu over
# lavapipe (backend/tests/wgpu_parity.rs), alone: `cargo test` above runs it
# too, in the same build.
if want wgpu; then
    step "wgpu parity: the generic Burn path on lavapipe vs the CPU path"
    cargo test --workspace $TEST_FEATURES --test wgpu_parity -- --nocapture
fi

finish
