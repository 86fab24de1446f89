#!/usr/bin/env bash
# The CPU backend choice (issue 12 item 1), by measurement: the same
# SmolLM2-135M workloads through the studio's own model code
# (tools/backend-cmp) on
#   flex       burn-flex (std, simd, rayon; gemm's AVX-512 kernels on x86_64,
#              which shared/Cargo.toml enables) — what moe_shared::CpuBackend is
#   nd-plain   burn-ndarray as the workspace had it (no threads, no SIMD)
#   nd-mt      burn-ndarray with multi-threads + simd
#   nd-blas    nd-mt with Debian's OpenBLAS (libopenblas-dev) for matmul
# Workloads: prefill of 512 tokens (all logits), generation of 64 tokens
# with the KV cache, one training step (upcycled 4 experts top-2, experts
# stage, 4 x 256, AdamW). The variants run interleaved (A B C ... A B C ...),
# ROUNDS times; the median per variant is printed (tokens/s).
#
#   bash scripts/backend_compare.sh [ROUNDS]     # default 3; on an idle machine
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
ROUNDS="${1:-3}"
GGUF="$(bash tests/reference/fetch_smollm2.sh)"
BINS="$MOE_STUDIO_CACHE/backend-cmp"
mkdir -p "$BINS"
if ! dpkg -s libopenblas-dev >/dev/null 2>&1; then
    echo "nd-blas needs Debian's libopenblas-dev (apt-get install -y libopenblas-dev)" >&2
    exit 1
fi
cp Cargo.lock tools/backend-cmp/Cargo.lock
for v in nd-plain nd-mt nd-blas; do
    (cd tools/backend-cmp && cargo build -q --release --features "$v")
    cp "$CARGO_TARGET_DIR/release/backend-cmp" "$BINS/$v"
done
MOE="$(mktemp -d)"
trap 'rm -rf "$MOE"' EXIT
"$BINS/nd-plain" flex upcycle "$GGUF" "$MOE/moe"

RES="$BINS/results.jsonl"
: > "$RES"
echo "load before: $(cat /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
    for w in prefill generate train; do
        m="$GGUF"; [ "$w" = train ] && m="$MOE/moe"
        reps=3; [ "$w" = train ] && reps=1
        "$BINS/nd-plain" flex "$w" "$m" "$reps" | sed 's/"build":"nd-plain"/"variant":"flex"/' | tee -a "$RES"
        for v in nd-plain nd-mt nd-blas; do
            "$BINS/$v" ndarray "$w" "$m" "$reps" | sed "s/\"build\":\"$v\"/\"variant\":\"$v\"/" | tee -a "$RES"
        done
    done
done
echo "load after: $(cat /proc/loadavg)"
python3 - "$RES" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
vs = ["flex", "nd-plain", "nd-mt", "nd-blas"]
print("\n| variant | prefill 512 tok/s | generate 64 tok/s | train step tok/s |")
print("|---|---|---|---|")
for v in vs:
    cells = []
    for w in ("prefill", "generate", "train"):
        x = [r["tokens_per_s"] for r in rows if r.get("variant") == v and r["workload"] == w]
        cells.append(f"{statistics.median(x):.1f}" if x else "-")
    print(f"| {v} | " + " | ".join(cells) + " |")
EOF
