#!/usr/bin/env bash
# Builds the browser studio into DIST (default frontend/dist): the wasm32
# binary of frontend/ in the workspace's `wasm-release` profile, its
# JavaScript glue by `wasm-bindgen --target web` (the CLI at Cargo.lock's
# version, scripts/setup.sh), the stylesheet and index.html. File names
# carry a hash of the wasm and the stylesheet, so a browser never mixes an
# old script with a new wasm.
#
# What index.html holds is what the studio's worker reads
# (frontend/src/worker/client.rs): a `modulepreload` link to the script and a
# `preload` link to the wasm, and a module script that initialises the page
# and puts the wasm exports on `window.wasmBindings` (the end-to-end suite's
# forward benchmark calls them).
#
# Only the studio's own files in DIST are replaced (the demos under
# DIST/demo stay); they are written to a temporary sibling first and moved
# in at the end, so a failed build leaves the previous one whole.
#   scripts/build_web.sh [DIST]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=/dev/null
source scripts/env.sh
DIST="${1:-frontend/dist}"
NAME=moe-studio-frontend
cargo build --target wasm32-unknown-unknown --profile wasm-release -p moe-studio-frontend --bin "$NAME"
wasm="$CARGO_TARGET_DIR/wasm32-unknown-unknown/wasm-release/$NAME.wasm"
want="$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/version = |"/, ""); print; exit}' Cargo.lock)"
have="$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')"
if [ "$have" != "$want" ]; then
    echo "wasm-bindgen ${have:-is missing}: the build needs $want (Cargo.lock's wasm-bindgen); run scripts/setup.sh" >&2
    exit 1
fi
hash="$(cat "$wasm" frontend/style.css | sha256sum | cut -c1-16)"
mkdir -p "$DIST"
stage="$(mktemp -d "$DIST/.build.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
wasm-bindgen --target web --no-typescript --out-dir "$stage" --out-name "$NAME-$hash" "$wasm"
cp frontend/style.css "$stage/style-$hash.css"
cat > "$stage/index.html" <<HTML
<!DOCTYPE html>
<html lang="en">
  <head>
    <meta charset="utf-8" />
    <meta name="viewport" content="width=device-width, initial-scale=1" />
    <link rel="icon" href="data:," />
    <title>moe-studio — dense to Mixture-of-Experts in the browser</title>
    <link rel="stylesheet" href="./style-$hash.css" />
    <link rel="modulepreload" href="./$NAME-$hash.js" crossorigin="anonymous" />
    <link rel="preload" href="./${NAME}-${hash}_bg.wasm" crossorigin="anonymous" as="fetch" type="application/wasm" />
    <script type="module">
      import init, * as bindings from "./$NAME-$hash.js";
      await init({ module_or_path: "./${NAME}-${hash}_bg.wasm" });
      window.wasmBindings = bindings;
    </script>
  </head>
  <body></body>
</html>
HTML
# Swap: the old build's files out, the new ones in (demo/ and anything else
# that is not the studio's stays).
find "$DIST" -maxdepth 1 -type f \( -name "$NAME-*.js" -o -name "${NAME}-*_bg.wasm" -o -name 'style-*.css' -o -name index.html \) -delete
mv "$stage"/* "$DIST/"
echo "[web] $DIST: $NAME-$hash ($(( $(stat -c %s "$DIST/${NAME}-${hash}_bg.wasm") / 1024 )) KiB wasm)" >&2
