#!/usr/bin/env bash
# test_webui.sh: the chat page `convoy serve` answers at / (src/serve/
# webui.html), in headless Chromium (test_webui.mjs says what is checked):
# on a 2-stage chain serving stories260K, and for Stop on a synthetic model
# whose replies run long; --no-webui turns the page off (404); the page
# needs no API key where the API does. Screenshots go to $WEBUI_SHOTS
# (default: the test's temporary folder).
#
# Usage (CTest passes these): test_webui.sh PATH/TO/convoy SOURCE_DIR
# Skips without Chromium or npm (playwright-core), except under CI=true.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
chromium="$(command -v chromium || true)"
[[ -n "$chromium" ]] || skip "Debian's chromium is needed for the page"
npm_need "$npm_dir" playwright-core
cp "$src/tests/test_webui.mjs" "$src/tests/checks.mjs" "$npm_dir/"

make_tmp
shots="${WEBUI_SHOTS:-$tmp}"

# serve LOG MODEL ARGS...: convoy serve on a free port; sets base once it listens
serve() {
    start_serve "$convoy" "$1" -m "$2" "${@:3}"
}

serve "$tmp/keyed.log" "$model" --api-key secret
expect "the page needs no key where the API does" \
    test "$(curl -s -o "$tmp/page" -w '%{http_code}' "$base/")" = 200 -a \
    "$(curl -s -o /dev/null -w '%{http_code}' "$base/props")" = 401
expect "GET / is the page" grep -q "<title>convoy</title>" "$tmp/page"
start_local_stages "$tmp/stage.log" "$model"
serve "$tmp/chain.log" "$model" --nodes "local,$nodes" --split 3,2
chain="$base"
serve "$tmp/off.log" "$model" --no-webui
expect "--no-webui: / is a 404 that says why" \
    test "$(curl -s -o "$tmp/off" -w '%{http_code}' "$base/")" = 404 -a -n "$(grep -- "--no-webui" "$tmp/off")"
big="$(synth_1024x6 "$convoy")"
serve "$tmp/long.log" "$big"
node "$npm_dir/test_webui.mjs" "$chromium" "$chain" "$shots/webui-chat.png" "$base" "$shots/webui-stop.png"
expect "the page in Chromium" test $? = 0
checks_summary
