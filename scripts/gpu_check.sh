#!/usr/bin/env bash
# The CUDA check (issue 12 item 6), for a bare GPU machine: no cargo, no
# registry, no ../shared, no network. Everything it needs travels with the
# working tree: the stripped binary built HERE by
#
#   bash scripts/gpu_check.sh --build      # cargo build --release --features cuda, strip, copy to gpu/
#
# and this script plus tests/reference/ (the PyTorch reference, used when the
# GPU machine has torch + transformers with CUDA). On the GPU machine:
#
#   bash scripts/gpu_check.sh [BIN]        # default gpu/moe-studio; <= 8 minutes
#
# It writes SmolLM2-135M-shaped random weights (`moe-studio init-random`:
# values do not matter for speed), then times with `--backend cuda`:
# prefill of 512 tokens, generation of 64 tokens with the KV cache, and a
# training step (upcycled to 4 experts top-2, experts stage, 4 x 256, AdamW),
# printing tokens/s, the reference's tokens/s where torch is there, and the
# training step's MFU (model FLOPs utilisation: model FLOPs per token x
# tokens/s / the GPU's peak; the peak is looked up by GPU name, FP32 and
# TF32-tensor-core figures, or given as PEAK_TFLOPS). Results: stdout and
# $OUT (or /tmp/gpu-check) as JSON lines; exit 1 when a workload failed.
#
# CI runs it on the CPU with a tiny shape (`BACKEND=cpu SHAPE=tiny`, the
# bench step of scripts/test.sh), so that its commands and flags stay the
# CLI's own between GPU loans; the numbers of that run mean nothing.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--build" ]; then
    source scripts/env.sh
    cargo build --release -p moe-studio --features cuda
    mkdir -p gpu
    cp "$CARGO_TARGET_DIR/release/moe-studio" gpu/moe-studio
    strip gpu/moe-studio
    ls -l gpu/moe-studio
    exit 0
fi

BIN="${1:-gpu/moe-studio}"
BACKEND="${BACKEND:-cuda}"
SHAPE="${SHAPE:-smollm2}"
OUTDIR="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUTDIR"
W="$(mktemp -d)"
START=$(date +%s)
log() { echo "[$(( $(date +%s) - START ))s] $*"; }

log "machine: $(nproc) CPUs, $(grep MemTotal /proc/meminfo | awk '{print $2/1048576 " GiB"}')"
if [ "$BACKEND" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUTDIR/gpu.txt"
else
    echo "no GPU: --backend $BACKEND" | tee "$OUTDIR/gpu.txt"
fi
: > "$OUTDIR/results.jsonl"
GPU_NAME="$(head -1 "$OUTDIR/gpu.txt")"

# The CUDA backend compiles its kernels with NVRTC at run time: find a
# libnvrtc (CUDA toolkit, or the nvidia-cuda-nvrtc wheel that torch pulls).
for d in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/lib/x86_64-linux-gnu \
    $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | tr ' ' '\n' \
      | while read -r s; do ls -d "$s"/nvidia/*/lib 2>/dev/null; done); do
    if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        log "libnvrtc from $d"
        break
    fi
done

# hidden, FFN, layers, heads, KV heads, context, RoPE theta, vocabulary: SmolLM2-135M's, or tiny (CI)
case "$SHAPE" in
tiny) set -- 64 128 2 4 2 1024 10000 512 ;;
*) set -- 576 1536 30 9 3 8192 100000 49152 ;;
esac
cat > "$W/config.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": $1,
 "intermediate_size": $2, "num_hidden_layers": $3, "num_attention_heads": $4,
 "num_key_value_heads": $5, "max_position_embeddings": $6, "rms_norm_eps": 1e-05,
 "rope_theta": $7, "rope_scaling": null, "tie_word_embeddings": true,
 "attention_bias": false, "vocab_size": $8, "bos_token_id": 1, "eos_token_id": 2,
 "hidden_act": "silu", "torch_dtype": "float32"}
EOF
log "writing $SHAPE-shaped random weights"
"$BIN" init-random --config "$W/config.json" --out "$W/smollm2" || { echo "init-random failed"; exit 1; }

REF=()
if [ "$BACKEND" = cuda ] && python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
    REF=(--reference-python "$(command -v python3)")
    export MOE_STUDIO_TORCH_DEVICE=cuda MOE_STUDIO_REFERENCE_DIR="$PWD/tests/reference"
    log "reference: $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
else
    log "reference: no torch with CUDA here; ours only"
fi

bench() { # SECONDS NAME ARGS...
    local limit="$1" name="$2"; shift 2
    log "$name"
    if timeout "$limit" "$BIN" --backend "$BACKEND" bench "$@" --json >"$W/$name.json" 2>"$W/$name.err"; then
        tail -1 "$W/$name.json" | tee -a "$OUTDIR/results.jsonl"
    else
        echo "{\"workload\":\"$name\",\"error\":\"exit $? (see below)\"}" | tee -a "$OUTDIR/results.jsonl"
        tail -20 "$W/$name.err"
    fi
}
bench 120 prefill prefill "$W/smollm2" --tokens 512 --repeat 5 "${REF[@]}"
bench 120 generate generate "$W/smollm2" --prompt-tokens 32 --new-tokens 64 --repeat 3 "${REF[@]}"
bench 200 train train "$W/smollm2" --experts 4 --top-k 2 --stage experts --seq-len 256 --batch 4 --steps 5 "${REF[@]}"

python3 - "$OUTDIR/results.jsonl" "$GPU_NAME" "${PEAK_TFLOPS:-}" "$BACKEND" <<'EOF' || cat "$OUTDIR/results.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
name, given = sys.argv[2], sys.argv[3]
# Dense peak TFLOP/s (vendor data sheets, SXM parts): FP32 (CUDA cores), TF32 tensor cores.
peaks = {"H200": (67, 495), "H100": (67, 495), "A100": (19.5, 156), "L40S": (91.6, 183), "A10": (31.2, 62.5)}
fp32, tf32 = next((v for k, v in peaks.items() if k in name), (None, None))
if given:
    fp32 = tf32 = float(given)
print(f"\n{sys.argv[4]} check on {name}")
for r in rows:
    if "error" in r:
        print(f"  {r['workload']}: FAILED ({r['error']})")
        continue
    o, ref = r["ours"], r.get("reference")
    line = f"  {r['workload']:9s} moe-studio {o['median']:9.1f} tok/s ({o['min']:.1f}-{o['max']:.1f})"
    if ref:
        line += f" | torch {ref['median']:9.1f} tok/s | ratio {r['ratio']:.2f}"
    print(line)
    f = (r.get("extra") or {}).get("model_flops_per_token")
    if f:
        for label, peak in (("FP32", fp32), ("TF32", tf32)):
            if peak:
                mfu = o["median"] * f / (peak * 1e12)
                msg = f"    MFU vs {label} peak {peak} TFLOP/s: moe-studio {100 * mfu:.2f}%"
                if ref:
                    msg += f", torch {100 * ref['median'] * f / (peak * 1e12):.2f}%"
                print(msg)
        print(f"    (model FLOPs per token {f / 1e9:.3f} GFLOP: 6 x active matmul parameters + causal attention)")
EOF
log "done (results in $OUTDIR/results.jsonl)"
rm -rf "$W"
! grep -q '"error"' "$OUTDIR/results.jsonl"
