#!/usr/bin/env bash
# Opt-in: builds the llama.cpp reference environment used by
# tests/reference/check_llamacpp.py and scripts/compat_matrix.sh:
# llama-cpp-python from PyPI, which compiles the llama.cpp it vendors (CPU,
# no network at run time). ~20-40 min on 2 cores; idempotent.
#   LLAMACPP_VENV (default $MOE_STUDIO_CACHE/llamacpp-venv)
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${MOE_STUDIO_CACHE:-$HOME/.cache/moe-studio}"
VENV="${LLAMACPP_VENV:-$CACHE/llamacpp-venv}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    echo "$VENV"
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip >&2
# Portable CPU build (the wheel is built here from the vendored source);
# no libcurl: models are local files.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
"$VENV/bin/pip" install --no-cache-dir -r "$HERE/tests/reference/requirements-llamacpp.txt" >&2
"$VENV/bin/python" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__)' >&2
echo "$VENV"
