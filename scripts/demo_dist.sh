#!/usr/bin/env bash
# Puts the browser studio's demos into DIST/demo (scripts/studio.sh, the
# e2e suite; issue 19 item 3). Nothing here is committed.
#   - demo/          the base model (scripts/demo_model.sh: stories260K from
#                    $MOE_STUDIO_DATA, else the fetched SmolLM2 GGUF);
#   - demo/preset/   the teaching preset (scripts/demo_preset.sh), built into
#                    $DEMO_PRESET_CACHE (default $MOE_STUDIO_CACHE/demo-preset)
#                    and rebuilt only when its stamp changes: the sha256 of
#                    demo_preset.sh, the CLI binary, stories260K, the corpora
#                    it reads, and DEMO_STEPS;
#   - demo/real/     SmolLM2-135M-Instruct GGUF (the "real model" option) when
#                    the demo is stories260K (DEMO_REAL=0 leaves it out);
#   - when no preset can be made (no stories260K: a fresh machine without
#     ../shared/data; or its teaching checks failed), demo/manifest.json
#     carries `preset_absent` with the reason and the Load page shows it.
# Usage: scripts/demo_dist.sh DIST CLI
#   CLI: the moe-studio binary that builds the preset (studio.sh: release).
# Exits 0 whether or not the preset could be made (the studio works without
# it); non-zero only when the demo model itself cannot be put in place.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=/dev/null
source scripts/env.sh
DIST="$1"
CLI="$2"
STEPS="${DEMO_STEPS:-300}"
CACHE="${DEMO_PRESET_CACHE:-$MOE_STUDIO_CACHE/demo-preset}"
S260K="$MOE_STUDIO_DATA/models/stories260K"
C="$MOE_STUDIO_DATA/corpora"
log() { echo "[demo] $*" >&2; }

bash scripts/demo_model.sh "$DIST/demo"
rm -rf "$DIST/demo/preset" "$DIST/demo/real"

absent=""
if [ ! -f "$S260K/stories260K.bin" ] || [ ! -f "$S260K/tok512.bin" ]; then
    absent="stories260K is not at $MOE_STUDIO_DATA/models/stories260K (the preset's experts are fine-tuned from it; set MOE_STUDIO_DATA to the shared data folder and restart scripts/studio.sh)"
else
    inputs=(scripts/demo_preset.sh "$CLI" "$S260K/stories260K.bin" "$S260K/tok512.bin")
    for d in lang/en domain/code lang/hu domain/math; do inputs+=("$C/$d/train.txt" "$C/$d/valid.txt"); done
    stamp="$({ sha256sum "${inputs[@]}" | cut -d' ' -f1; echo "steps=$STEPS"; } | sha256sum | cut -d' ' -f1)"
    if [ -f "$CACHE/stamp" ] && [ "$(cat "$CACHE/stamp")" = "$stamp" ] && [ -f "$CACHE/preset/manifest.json" ]; then
        log "teaching preset: cached ($CACHE, stamp ${stamp:0:12})"
    else
        log "teaching preset: building (DEMO_STEPS=$STEPS; cache $CACHE)"
        rm -rf "$CACHE"
        mkdir -p "$CACHE"
        if MOE_STUDIO_CLI="$CLI" DEMO_STEPS="$STEPS" bash scripts/demo_preset.sh "$CACHE/preset" 2> "$CACHE/build.log"; then
            echo "$stamp" > "$CACHE/stamp"
        else
            rc=$?
            grep '^\[preset\]' "$CACHE/build.log" >&2 || tail -n 20 "$CACHE/build.log" >&2
            absent="scripts/demo_preset.sh failed (exit $rc; its teaching checks did not hold or a step failed: $CACHE/build.log)"
        fi
    fi
    grep '^\[preset\]' "$CACHE/build.log" 2>/dev/null | sed 's/^/[demo] /' >&2 || true
    if [ -z "$absent" ]; then
        cp -r "$CACHE/preset" "$DIST/demo/preset"
    fi
fi

if [ -n "$absent" ]; then
    log "no teaching preset: $absent"
    python3 - "$DIST/demo/manifest.json" "$absent" <<'PY'
import json, sys
p = sys.argv[1]
m = json.load(open(p))
m["preset_absent"] = sys.argv[2]
json.dump(m, open(p, "w"))
PY
elif [ "${DEMO_REAL:-1}" != 0 ]; then
    # The "real model" beside the stories260K demo: a hard link to the
    # fetched GGUF where the file system allows (98 MB), else a copy.
    GGUF="$(bash tests/reference/fetch_smollm2.sh)"
    mkdir -p "$DIST/demo/real"
    ln -f "$GGUF" "$DIST/demo/real/" 2>/dev/null || cp "$GGUF" "$DIST/demo/real/"
    printf '{"name": "SmolLM2-135M-Instruct", "files": ["%s"], "description": "SmolLM2-135M-Instruct — a real 135M-parameter Llama-architecture chat model (GGUF Q4_1, 49K vocabulary); about 1 s to load, heavier steps take seconds to minutes."}\n' "$(basename "$GGUF")" > "$DIST/demo/real/manifest.json"
fi
