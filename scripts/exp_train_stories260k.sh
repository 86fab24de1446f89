#!/bin/bash
# Reproduces the training results of issue 5 on stories260K (CPU, ~40 min on 2 cores):
#  A. DeltaMoE / MoE-LPR: dense fine-tuning vs upcycled MoE stage 1 (experts) vs stage 2 (router + language prior),
#     Hungarian and English validation perplexity;
#  B. DUME: three dense domain experts -> MoErge -> ridge router; weight averaging, random routing, oracle,
#     DUME+ (router fine-tuning) and BTX baselines; per-domain perplexity.
# Usage: scripts/exp_train_stories260k.sh [OUT_DIR]   (MOE_STUDIO_BIN=path/to/moe-studio, DATA=path/to/shared/data)
set -euo pipefail
BIN=${MOE_STUDIO_BIN:-${BIN:-target/release/moe-studio}}
D=${DATA:-../shared/data}
OUT=${1:-/tmp/moe-studio-train-exp}
M=$D/models/stories260K
TOK=$M/tok512.bin
mkdir -p "$OUT" && cd "$OUT"
BIN=$(command -v "$BIN" || realpath "$OLDPWD/$BIN")

# A. Languages.
HU=$D/corpora/lang/hu/train.txt EN=$D/corpora/lang/en/train.txt
COMMON="--steps 300 --seq-len 128 --batch 8 --lr 1e-3 --warmup 20 --seed 1"
$BIN upcycle $M/stories260K.bin --experts 4 --top-k 2 --router-init random --router-std 0.02 --dtype f32 --out moe
$BIN train $M/stories260K.bin --stage dense --data hu=$HU $COMMON --out dense
$BIN train moe --tokenizer $TOK --stage experts --data hu=$HU $COMMON --out s1
$BIN train s1/final --stage router --data en=$EN:orig --data hu=$HU --steps 150 --seq-len 128 --batch 8 \
  --lr 1e-2 --warmup 10 --prior 0.1 --seed 2 --out s2
EV="--data en=$D/corpora/lang/en/valid.txt --data hu=$D/corpora/lang/hu/valid.txt --max-tokens 20000 --tokenizer $TOK"
for m in $M/stories260K.bin dense/final s1/final s2/final; do echo "== $m"; $BIN eval $m $EV; done

# B. DUME.
MIX="" EVD=""
for d in code math docs; do
  $BIN train $M/stories260K.bin --stage dense --data $d=$D/corpora/domain/$d/train.txt $COMMON --out ft_$d
  MIX="$MIX --data $d=$D/corpora/domain/$d/train.txt"
  EVD="$EVD --data $d=$D/corpora/domain/$d/valid.txt"
done
DOM="--domain code=$D/corpora/domain/code/train.txt --domain math=$D/corpora/domain/math/train.txt --domain docs=$D/corpora/domain/docs/train.txt"
$BIN moerge ft_code/final ft_math/final ft_docs/final --top-k 1 --out moerged
$BIN route moerged $DOM --top-k 1 --max-tokens 10000 --context 512 --out routed
$BIN route moerged $DOM --top-k 2 --max-tokens 10000 --context 512 --out routed_k2
$BIN merge linear ft_code/final ft_math/final ft_docs/final --out avg
$BIN train routed_k2 --tokenizer $TOK --stage router $MIX --steps 200 --seq-len 128 --batch 8 --lr 1e-3 --warmup 10 --alpha 0 --seed 3 --out plus_k2
$BIN moerge ft_code/final ft_math/final ft_docs/final --top-k 2 --router-std 0.02 --seed 1 --out btx_init
$BIN train btx_init --tokenizer $TOK --stage router $MIX --steps 200 --seq-len 128 --batch 8 --lr 1e-3 --warmup 10 --seed 3 --out btx
EV="$EVD --max-tokens 20000 --tokenizer $TOK"
for m in $M/stories260K.bin ft_code/final ft_math/final ft_docs/final avg routed routed_k2 plus_k2/final btx/final; do
  echo "== $m"; $BIN eval $m $EV
done
echo "== random routing"; $BIN eval routed $EV --routing random --seed 1
echo "== oracle"; $BIN eval routed $EV --routing oracle
