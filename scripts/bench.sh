#!/usr/bin/env bash
# Every benchmark of `moe-studio bench`, ours beside the reference measured
# in the same run, written to docs/benchmarks.md (machine, versions, date,
# load) and bench-results.jsonl.
#
#   bash scripts/bench.sh [--smoke] [--python PY] [--baseline-bin BIN]
#                         [--mergekit-python PY] [--out FILE] [--repeat N]
#
# --python PY          a Python with torch + transformers (default: the
#                      reference venv ~/.cache/moe-studio/pyref-venv when it
#                      exists; without one, ours only)
# --baseline-bin BIN   another moe-studio binary (e.g. a release build of an
#                      older commit): `perplexity` (20k tokens of en/valid)
#                      and `neurons` (200 texts) run with both, interleaved
# --mergekit-python PY a Python with mergekit: tests/reference/bench_merge.py
#                      (graft / task arithmetic vs mergekit) runs too
# --smoke              tiny sizes on stories260K, 1 repetition: only checks
#                      that every benchmark executes (CI); writes nothing
#                      under docs/
#
# Benchmarks need an otherwise idle machine: the load average is recorded
# before and after, and a warning is printed when it is above 0.5.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

SMOKE=0 PY="" BASE="" MK="" OUT="docs/benchmarks.md" REPEAT=5
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) SMOKE=1 ;;
        --python) PY="$2"; shift ;;
        --baseline-bin) BASE="$2"; shift ;;
        --mergekit-python) MK="$2"; shift ;;
        --out) OUT="$2"; shift ;;
        --repeat) REPEAT="$2"; shift ;;
        *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$PY" ] && [ "$SMOKE" = 0 ] && [ -x "$MOE_STUDIO_CACHE/pyref-venv/bin/python" ]; then
    PY="$MOE_STUDIO_CACHE/pyref-venv/bin/python"
fi

if [ -n "${MOE_STUDIO_BIN:-}" ]; then
    BIN="$MOE_STUDIO_BIN"
elif [ "$SMOKE" = 1 ]; then
    cargo build -q -p moe-studio
    BIN="$CARGO_TARGET_DIR/debug/moe-studio"
else
    cargo build -q --release -p moe-studio
    BIN="$CARGO_TARGET_DIR/release/moe-studio"
fi
REF=()
[ -n "$PY" ] && REF=(--reference-python "$PY")

STORIES="$MOE_STUDIO_DATA/models/stories260K/stories260K.bin"
VALID="$MOE_STUDIO_DATA/corpora/lang/en/valid.txt"
RESULTS="$(mktemp)"
trap 'rm -f "$RESULTS"' EXIT
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
if awk -v l="${LOAD_BEFORE%% *}" 'BEGIN { exit !(l > 0.5) }'; then
    echo "WARNING: load average $LOAD_BEFORE: other work is running; timings will not be valid benchmark figures" >&2
fi

run() { # NAME ARGS...: one `moe-studio bench` workload, JSON into RESULTS
    local name="$1"; shift
    echo "== $name ($(date +%H:%M:%S))" >&2
    "$BIN" bench "$@" --json | tee -a "$RESULTS"
}

if [ "$SMOKE" = 1 ]; then
    M="$STORIES"
    run prefill prefill "$M" --tokens 16 --repeat 1
    run generate generate "$M" --prompt-tokens 4 --new-tokens 4 --repeat 1
    run train train "$M" --seq-len 16 --batch 2 --steps 1
    run ridge ridge "$M" --tokens 64 --context 32 --repeat 1
    run neurons neurons "$M" --texts "$VALID" --count 4 --max-tokens 16 --batch 2 --repeat 1
    python3 - "$RESULTS" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = [r["workload"] for r in rows]
assert names == ["prefill", "generate", "train", "ridge", "neurons"], names
for r in rows:
    o = r["ours"]
    assert o["median"] > 0 and o["min"] <= o["median"] <= o["max"] and o["seconds"], r
    assert o["peak_rss_mib"] and o["peak_rss_mib"] > 0, r
print("bench smoke: %d workloads ran" % len(rows))
EOF
    exit 0
fi

GGUF="$(bash tests/reference/fetch_smollm2.sh)"
run prefill prefill "$GGUF" --tokens 512 --repeat "$REPEAT" "${REF[@]}"
run generate generate "$GGUF" --prompt-tokens 32 --new-tokens 64 --repeat 3 "${REF[@]}"
run train train "$GGUF" --experts 4 --top-k 2 --stage experts --seq-len 256 --batch 4 --steps 3 "${REF[@]}"
run ridge ridge "$GGUF" --tokens 10000 --context 512 --repeat 3 "${REF[@]}"
run neurons neurons "$GGUF" --texts "$VALID" --count 200 --max-tokens 256 --repeat 3 "${REF[@]}"

# perplexity and neurons through the CLI, ours and (optionally) a baseline
# binary, interleaved: A B A B A B.
cli_time() { # BIN ARGS...: seconds of one run
    local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}
PPL_ARGS=(perplexity "$GGUF" --text "$VALID" --max-tokens 20000)
NEU_DIR="$(mktemp -d)"
NEU_ARGS=(neurons "$GGUF" --lang "en=$VALID" --lang "hu=$MOE_STUDIO_DATA/corpora/lang/hu/valid.txt" --max-texts 100 --out)
for what in ppl neu; do
    for i in 1 2 3; do
        for who in ours base; do
            b="$BIN"; [ "$who" = base ] && b="$BASE"
            [ -z "$b" ] && continue
            if [ "$what" = ppl ]; then
                s=$(cli_time "$b" "${PPL_ARGS[@]}")
            else
                rm -rf "$NEU_DIR/out"; s=$(cli_time "$b" "${NEU_ARGS[@]}" "$NEU_DIR/out")
            fi
            echo "{\"workload\":\"cli-$what\",\"who\":\"$who\",\"seconds\":$s}" | tee -a "$RESULTS"
        done
    done
done
rm -rf "$NEU_DIR"

if [ -n "$MK" ]; then
    echo "== merge (mergekit)" >&2
    MJ="$(mktemp)"
    if "$MK" tests/reference/bench_merge.py --bin "$BIN" --gguf "$GGUF" --json "$MJ" >&2; then
        python3 -c 'import json,sys; print(json.dumps({"workload": "merge", "result": json.load(open(sys.argv[1]))}))' "$MJ" \
            | tee -a "$RESULTS"
    else
        echo "merge benchmark failed" >&2
    fi
    rm -f "$MJ"
fi

LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$RESULTS" "$OUT" "$LOAD_BEFORE" "$LOAD_AFTER" "$BIN" "${BASE:-}" "$PY" <<'EOF'
import json, platform, statistics, subprocess, sys, datetime
res, out, before, after, binary, base, py = sys.argv[1:8]
rows = [json.loads(l) for l in open(res) if l.strip()]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "")
isa = ", ".join(f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16") if f" {f}" in flags)
ncpu = sum(1 for l in open("/proc/cpuinfo") if l.startswith("processor"))
mem = next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal"))
def sh(*c):
    try:
        return subprocess.run(c, capture_output=True, text=True).stdout.strip()
    except Exception:
        return "?"
rustc = sh("rustc", "--version")
commit = sh("git", "rev-parse", "--short", "HEAD")
MARK = "<!-- scripts/bench.sh writes everything below this line -->"
head = ""
try:
    old = open(out).read()
    if MARK in old:
        head = old[: old.index(MARK)]
except FileNotFoundError:
    pass
L = [head.rstrip("\n") + "\n\n" + MARK + "\n" if head else "# Benchmarks\n\n" + MARK + "\n"]
L.append("## Latest run\n")
L.append("Written by `scripts/bench.sh`. Each row: median of the timed runs")
L.append("after one warm-up, the min–max range, the ratio of the medians, peak resident set. Ours and the")
L.append("reference run in the same invocation on the same machine, one after the other.\n")
L.append(f"- date: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}; commit {commit}; binary `{binary}`")
L.append(f"- machine: {cpu}, {ncpu} CPUs ({isa}), {int(mem) // 1024} MiB RAM; {platform.system()} {platform.release()}")
L.append(f"- load average (1, 5, 15 min) before: {before}; after: {after}")
L.append(f"- {rustc}; Burn 0.21.0, backend burn-flex 0.21.0 (`moe_shared::CpuBackend`)")
refs = sorted({r.get("reference_name") for r in rows if r.get("reference_name")})
L.append(f"- reference: {'; '.join(refs) if refs else 'not measured'} (`{py or '-'}`)\n")
L.append("| workload | setup | moe-studio | reference | ratio | peak RSS ours / ref (MiB) |")
L.append("|---|---|---|---|---|---|")
fmt = lambda t: f"{t['median']:.1f} ({t['min']:.1f}–{t['max']:.1f})"
for r in rows:
    if "ours" not in r:
        continue
    o, ref = r["ours"], r.get("reference")
    ref_s = f"{fmt(ref)} {r['unit']}" if ref else "-"
    ratio = f"{r['ratio']:.2f}×" if r.get("ratio") else "-"
    rss = f"{o['peak_rss_mib']:.0f} / " + (f"{ref['peak_rss_mib']:.0f}" if ref and ref.get("peak_rss_mib") else "-")
    L.append(f"| {r['workload']} | {r['setup']} | {fmt(o)} {r['unit']} | {ref_s} | {ratio} | {rss} |")
cli = {}
for r in rows:
    if r["workload"].startswith("cli-"):
        cli.setdefault(r["workload"], {}).setdefault(r["who"], []).append(r["seconds"])
if cli:
    L.append("\nCLI end to end (seconds, median of 3, interleaved with the baseline binary"
             f" `{base or '-'}`):\n")
    L.append("| command | moe-studio | baseline | speed-up |")
    L.append("|---|---|---|---|")
    names = {"cli-ppl": "perplexity, 20k tokens of en/valid.txt", "cli-neu": "neurons, en + hu, 100 texts each"}
    for k, v in cli.items():
        o = statistics.median(v["ours"]); b = statistics.median(v["base"]) if "base" in v else None
        L.append(f"| {names.get(k, k)} | {o:.1f} | {f'{b:.1f}' if b else '-'} | {f'{b / o:.2f}×' if b else '-'} |")
for r in rows:
    if r["workload"] == "merge":
        L.append("\nMerges vs mergekit (tests/reference/bench_merge.py):\n")
        L.append("```json\n" + json.dumps(r["result"], indent=1) + "\n```")
open(out, "w").write("\n".join(L) + "\n")
print("wrote", out)
EOF
