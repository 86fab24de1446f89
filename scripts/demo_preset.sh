#!/usr/bin/env bash
# The browser studio's teaching preset (issue 19 item 3), built with the
# project's own CLI from stories260K when the studio is built; never
# committed (everything here comes from $MOE_STUDIO_DATA).
#
#   scripts/demo_preset.sh [DIR]      (default frontend/dist/demo/preset)
#
# What it makes, in DIR:
#   - three domain experts: stories260K fine-tuned (`moe-studio train --stage
#     dense`) on English news prose (lang/en), Python code (domain/code) and
#     Hungarian (lang/hu), DEMO_STEPS steps each (default 300);
#   - an "instruct"-style model for the graft: stories260K fine-tuned the
#     same way on maths text (domain/math) — the ability the graft carries;
#   - the matching texts: DOMAIN.txt (training slice, the router's input)
#     and DOMAIN.heldout.txt (held-out lines, the perplexity checks);
#   - the CLI's own run of the teaching pipeline on them: `moerge` of the
#     three experts, `route` (DUME ridge router), `merge linear` (the
#     averaging baseline) and `graft` of the math delta onto the routed MoE,
#     with `perplexity` of each on each held-out text -> preset.json
#     (`checks`: oracle vs averaging per domain, graft on the ability text),
#     and manifest.json naming the files for the studio.
#
# Exits non-zero when a teaching claim does not hold (oracle perplexity at
# least 5% below averaging's on every domain; the graft lowers the ability
# text's perplexity by at least 10%).
#
# Without stories260K (a fresh machine, no ../shared/data) it says so and
# exits 3: the fetchable fallback (a small model trained from scratch on
# Debian help texts, or one cut down from SmolLM2) is not written yet.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=/dev/null
source scripts/env.sh
DIR="${1:-frontend/dist/demo/preset}"
STEPS="${DEMO_STEPS:-300}"
S260K="$MOE_STUDIO_DATA/models/stories260K"
C="$MOE_STUDIO_DATA/corpora"
if [ ! -f "$S260K/stories260K.bin" ] || [ ! -f "$S260K/tok512.bin" ]; then
    echo "[preset] stories260K is not at $S260K: the teaching preset needs it (no fetchable fallback yet)" >&2
    exit 3
fi
if [ -n "${MOE_STUDIO_CLI:-}" ]; then
    cli="$MOE_STUDIO_CLI"
else
    cargo build -q -p moe-studio >&2
    cli="$CARGO_TARGET_DIR/debug/moe-studio"
fi
base="$S260K/stories260K.bin"
ms() { date +%s%3N; }
t_all=$(ms)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
out="$tmp/preset"
mkdir -p "$out"

# Texts: the first lines of each corpus' train split (training, router) and
# of its valid split (held out). Short lines are skipped (headers).
text() { # NAME SRC_DIR TRAIN_LINES HELDOUT_LINES
    awk -v n="$3" 'length($0) > 40 { print; if (++k == n) exit }' "$2/train.txt" > "$out/$1.txt"
    awk -v n="$4" 'length($0) > 40 { print; if (++k == n) exit }' "$2/valid.txt" > "$out/$1.heldout.txt"
}
text en "$C/lang/en" 400 40
text code "$C/domain/code" 1200 120
text hu "$C/lang/hu" 400 40
text math "$C/domain/math" 800 80
domains=(en code hu)

finetune() { # NAME
    local t0
    t0=$(ms)
    "$cli" train "$base" --stage dense --data "$1=$out/$1.txt" --steps "$STEPS" --warmup 20 --lr 3e-3 \
        --seq-len 128 --batch 8 --out "$tmp/run-$1" > "$tmp/train-$1.log" 2>&1 \
        || { cat "$tmp/train-$1.log" >&2; exit 1; }
    mkdir -p "$out/$1"
    cp "$tmp/run-$1/final/model.safetensors" "$tmp/run-$1/final/config.json" "$tmp/run-$1/final/tokenizer.json" "$out/$1/"
    echo "[preset] $1 expert: $STEPS steps in $(( ($(ms) - t0) / 1000 )) s" >&2
}
for d in "${domains[@]}" math; do finetune "$d"; done

dom_args=()
for d in "${domains[@]}"; do dom_args+=(--domain "$d=$out/$d.txt:$out/$d.heldout.txt"); done
"$cli" moerge "$out/en" "$out/code" "$out/hu" --out "$tmp/moerged" > /dev/null
"$cli" route "$tmp/moerged" "${dom_args[@]}" --max-tokens 2000 --context 128 --out "$tmp/routed" > "$tmp/route.log" 2>&1 \
    || { cat "$tmp/route.log" >&2; exit 1; }
"$cli" merge linear "$out/en" "$out/code" "$out/hu" --out "$tmp/averaged" > /dev/null
"$cli" graft "$tmp/routed" --base "$base" --instruct "$out/math" --out "$tmp/grafted" > /dev/null

ppl() { # MODEL TEXT
    "$cli" perplexity "$1" --text "$2" --window 128 --stride 128 --json 2>/dev/null \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["ppl"])'
}
{
    echo "{"
    echo "  \"steps\": $STEPS,"
    echo "  \"ppl\": {"
    for d in "${domains[@]}" math; do
        h="$out/$d.heldout.txt"
        oracle=$([ "$d" = math ] && ppl "$out/math" "$h" || ppl "$out/$d" "$h")
        printf '    "%s": {"base": %s, "oracle": %s, "averaging": %s, "dume": %s, "dume_grafted": %s}%s\n' "$d" \
            "$(ppl "$base" "$h")" "$oracle" "$(ppl "$tmp/averaged" "$h")" "$(ppl "$tmp/routed" "$h")" \
            "$(ppl "$tmp/grafted" "$h")" "$([ "$d" = math ] || echo ,)"
    done
    echo "  }"
    echo "}"
} > "$out/ppl.json"

python3 - "$out/ppl.json" "$out/preset.json" "$(( ($(ms) - t_all) / 1000 ))" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
ppl = p["ppl"]
checks = {}
for d in ("en", "code", "hu"):
    r = ppl[d]
    gain = 1 - r["oracle"] / r["averaging"]
    checks[f"oracle_vs_averaging_{d}"] = {"oracle": r["oracle"], "averaging": r["averaging"], "gain": gain, "ok": gain >= 0.05}
m = ppl["math"]
g = 1 - m["dume_grafted"] / m["dume"]
checks["graft_on_math"] = {"before": m["dume"], "after": m["dume_grafted"], "gain": g, "ok": g >= 0.10}
p["checks"] = checks
p["build_seconds"] = int(sys.argv[3])
json.dump(p, open(sys.argv[2], "w"), indent=2)
for k, v in checks.items():
    print(f"[preset] {'ok  ' if v['ok'] else 'FAIL'} {k}: {json.dumps(v)}", file=sys.stderr)
sys.exit(0 if all(v["ok"] for v in checks.values()) else 1)
EOF
rm "$out/ppl.json"
cat > "$out/manifest.json" <<EOF
{"name": "stories260K teaching preset",
 "base": {"name": "stories260K", "files": ["../stories260K.bin", "../tok512.bin"]},
 "experts": [
  {"name": "stories260K-en", "files": ["en/model.safetensors", "en/config.json", "en/tokenizer.json"], "text": "en.txt", "heldout": "en.heldout.txt"},
  {"name": "stories260K-code", "files": ["code/model.safetensors", "code/config.json", "code/tokenizer.json"], "text": "code.txt", "heldout": "code.heldout.txt"},
  {"name": "stories260K-hu", "files": ["hu/model.safetensors", "hu/config.json", "hu/tokenizer.json"], "text": "hu.txt", "heldout": "hu.heldout.txt"}],
 "instruct": {"name": "stories260K-math", "files": ["math/model.safetensors", "math/config.json", "math/tokenizer.json"], "text": "math.heldout.txt"}}
EOF
rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
mv "$out" "$DIR"
echo "[preset] $DIR in $(( ($(ms) - t_all) / 1000 )) s" >&2
