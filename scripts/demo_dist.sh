#!/usr/bin/env bash
# Puts the browser studio's demos into DIST/demo (scripts/studio.sh, the
# e2e suite; issue 19 item 3). Nothing here is committed.
#   - demo/          the base model: stories260K from $MOE_STUDIO_DATA
#                    (scripts/demo_model.sh); without it, the fetched
#                    preset's base scratch260K (below), else the fetched
#                    SmolLM2 GGUF;
#   - demo/preset/   the teaching preset (scripts/demo_preset.sh), built into
#                    $DEMO_PRESET_CACHE (default $MOE_STUDIO_CACHE/demo-preset)
#                    and rebuilt only when its stamp changes: the sha256 of
#                    demo_preset.sh, the CLI binary, stories260K, the corpora
#                    it reads, and DEMO_STEPS;
#                    without stories260K (a fresh machine without
#                    ../shared/data) the fetched preset instead: texts from
#                    scripts/demo_texts.sh (Debian's gnome-user-docs via
#                    apt-get, the local Python standard library, generated
#                    arithmetic), a base trained from scratch by the CLI;
#                    cached in $DEMO_PRESET_CACHE-fetched, stamped with
#                    the scripts, the CLI, the texts, DEMO_STEPS and
#                    DEMO_BASE_STEPS;
#   - demo/real/     SmolLM2-135M-Instruct GGUF (the "real model" option)
#                    beside either preset (DEMO_REAL=0 leaves it out);
#   - when no preset can be made (the texts could not be fetched, DEMO_FETCH=0
#     turned the fetched preset off, or its teaching checks failed), demo/manifest.json carries `preset_absent`
#     with the reason, the demo is SmolLM2 and the Load page says why.
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
BASE_STEPS="${DEMO_BASE_STEPS:-2000}"
CACHE="${DEMO_PRESET_CACHE:-$MOE_STUDIO_CACHE/demo-preset}"
S260K="$MOE_STUDIO_DATA/models/stories260K"
C="$MOE_STUDIO_DATA/corpora"
log() { echo "[demo] $*" >&2; }

bash scripts/demo_model.sh "$DIST/demo"
rm -rf "$DIST/demo/preset" "$DIST/demo/real"

absent=""
fetched=""
if { [ ! -f "$S260K/stories260K.bin" ] || [ ! -f "$S260K/tok512.bin" ]; } && [ "${DEMO_FETCH:-1}" = 0 ]; then
    absent="stories260K is not at $MOE_STUDIO_DATA/models/stories260K and the fetched preset is off (DEMO_FETCH=0)"
elif [ ! -f "$S260K/stories260K.bin" ] || [ ! -f "$S260K/tok512.bin" ]; then
    # The fetched preset: the texts first (they are part of the stamp).
    fetched=1
    CACHE="$CACHE-fetched"
    log "stories260K is not at $S260K: the fetched teaching preset (a base trained from scratch; cache $CACHE)"
    mkdir -p "$CACHE"
    rm -rf "$CACHE/texts.new"
    if bash scripts/demo_texts.sh "$CACHE/texts.new" 2> "$CACHE/texts.log"; then
        rm -rf "$CACHE/texts"
        mv "$CACHE/texts.new" "$CACHE/texts"
        inputs=(scripts/demo_preset.sh scripts/demo_texts.sh scripts/demo_texts.py docs/teaching-preset.md "$CLI" "$CACHE"/texts/*.txt)
        stamp="$({ sha256sum "${inputs[@]}" | cut -d' ' -f1; echo "steps=$STEPS base_steps=$BASE_STEPS"; } | sha256sum | cut -d' ' -f1)"
    else
        cat "$CACHE/texts.log" >&2
        absent="stories260K is not at $MOE_STUDIO_DATA/models/stories260K and the fetched preset's texts could not be made (scripts/demo_texts.sh: $(grep '^\[texts\]' "$CACHE/texts.log" | tail -n 1))"
    fi
else
    inputs=(scripts/demo_preset.sh scripts/demo_texts.py docs/teaching-preset.md "$CLI" "$S260K/stories260K.bin" "$S260K/tok512.bin")
    for d in lang/en domain/code lang/hu; do inputs+=("$C/$d/train.txt" "$C/$d/valid.txt"); done
    stamp="$({ sha256sum "${inputs[@]}" | cut -d' ' -f1; echo "steps=$STEPS"; } | sha256sum | cut -d' ' -f1)"
fi
if [ -z "$absent" ]; then
    if [ -f "$CACHE/stamp" ] && [ "$(cat "$CACHE/stamp")" = "$stamp" ] && [ -f "$CACHE/preset/manifest.json" ]; then
        log "teaching preset: cached ($CACHE, stamp ${stamp:0:12})"
    else
        log "teaching preset: building (DEMO_STEPS=$STEPS; cache $CACHE)"
        rm -rf "$CACHE/preset" "$CACHE/stamp" "$CACHE/build.log"
        mkdir -p "$CACHE"
        if MOE_STUDIO_BIN="$CLI" DEMO_STEPS="$STEPS" DEMO_BASE_STEPS="$BASE_STEPS" DEMO_TEXTS="${fetched:+$CACHE/texts}" \
            bash scripts/demo_preset.sh "$CACHE/preset" 2> "$CACHE/build.log"; then
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
if [ -z "$absent" ] && [ -n "$fetched" ]; then
    # The fetched preset's base becomes the build's demo model (the preset
    # loads its base as the demo); the SmolLM2 GGUF that demo_model.sh put
    # there moves to demo/real below.
    find "$DIST/demo" -maxdepth 1 -name '*.gguf' -delete
    cp "$DIST/demo/preset/base/model.safetensors" "$DIST/demo/preset/base/config.json" \
        "$DIST/demo/preset/base/tokenizer.json" "$DIST/demo/"
    python3 - "$DIST/demo/manifest.json" "$DIST/demo/preset/preset.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[2]))
json.dump({"name": "scratch260K", "files": ["model.safetensors", "config.json", "tokenizer.json"],
           "description": "scratch260K — a 260K-parameter Llama (stories260K's shape, 512-token byte-level BPE) "
                          f"initialised and trained from scratch by the CLI ({p['base_steps']} steps) on GNOME Help in "
                          "German, Spanish, French and Italian fetched with apt-get (Debian's gnome-user-docs); "
                          "its experts learn English quotations (Debian's fortunes), Hungarian help text and Python code."},
          open(sys.argv[1], "w"))
PY
    log "demo model: scratch260K (the fetched preset's base)"
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
