#!/usr/bin/env bash
# DUME at the papers' size (issue 38 item 4; docs/benchmarks.md, "DUME at the papers' size"):
# three dense experts of Llama-3.2-3B's shape (hidden 3072, FFN 8192, 28 layers, 24 heads, 8 KV
# heads; SmolLM2's tokenizer and vocabulary, 49,152, so the embedding stays small), random weights
# from `init-random` (one seed each, bf16) -> `moerge` (7.2B parameters, bf16) -> `route` (3 domains
# x 2,000 statistics tokens + 2,000 held-out tokens of routing accuracy) -> `eval` (1,000 tokens per
# domain), route and eval with --weights-dtype bf16. Prints each step's wall time and peak RSS
# (GNU time). Needs ~36 GB of disk under WORK (the dense experts are deleted once merged) and the
# shared data's domain corpora; takes ~20 minutes on 2 cores.
#
#   bash scripts/bench_dume3b.sh [WORK_DIR]      (default: $TMPDIR/moe-studio-dume3b)
#   BIN=path/to/moe-studio  DATA=path/to/shared/data  WEIGHTS=bf16|f32
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
WORK=${1:-${TMPDIR:-/tmp}/moe-studio-dume3b}
DATA=${DATA:-${MOE_STUDIO_DATA:-../shared/data}}
WEIGHTS=${WEIGHTS:-bf16}
BIN=${BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release -p moe-studio
  BIN=$CARGO_TARGET_DIR/release/moe-studio
fi
D=$DATA/corpora/domain
TOK=$DATA/models/smollm2-135m-instruct/tokenizer.json
for f in "$TOK" "$D/code/train.txt" "$D/math/train.txt" "$D/docs/train.txt"; do
  [ -f "$f" ] || { echo "missing $f (set DATA to the shared data directory)" >&2; exit 1; }
done
mkdir -p "$WORK"
cat > "$WORK/config.json" <<'EOF'
{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
  "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
  "vocab_size": 49152, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0, "tie_word_embeddings": true, "hidden_act": "silu",
  "attention_bias": false, "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2,
  "torch_dtype": "bfloat16"
}
EOF
step() { # NAME COMMAND...
  local name=$1; shift
  /usr/bin/time -f "$name wall_s=%e peak_rss_gib=%M" "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" || {
    tail -5 "$WORK/$name.err" >&2; exit 1; }
  tail -1 "$WORK/$name.err" | awk '{split($3, a, "="); printf "%s %s peak_rss_gib=%.2f\n", $1, $2, a[2] / 1048576}'
}
echo "$(date -u +%FT%TZ) $(uptime)"
rm -rf "$WORK"/dense? "$WORK/moe" "$WORK/routed"
for s in 1 2 3; do
  step "init-random-$s" "$BIN" init-random --config "$WORK/config.json" --tokenizer "$TOK" --seed $s --dtype bf16 --out "$WORK/dense$s"
done
step moerge "$BIN" moerge "$WORK/dense1" "$WORK/dense2" "$WORK/dense3" --top-k 1 --dtype bf16 --out "$WORK/moe" --json
rm -rf "$WORK"/dense?
step route "$BIN" route "$WORK/moe" --weights-dtype "$WEIGHTS" --max-tokens 2000 --eval-tokens 2000 --json --out "$WORK/routed" \
  --domain "code=$D/code/train.txt:$D/code/valid.txt" --domain "math=$D/math/train.txt:$D/math/valid.txt" \
  --domain "docs=$D/docs/train.txt:$D/docs/valid.txt"
step eval "$BIN" eval "$WORK/routed" --weights-dtype "$WEIGHTS" --max-tokens 1000 --json \
  --data "code=$D/code/valid.txt" --data "math=$D/math/valid.txt" --data "docs=$D/docs/valid.txt"
echo "$(date -u +%FT%TZ) $(uptime)"
