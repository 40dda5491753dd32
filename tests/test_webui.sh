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

convoy="${1:?usage: test_webui.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_webui.sh PATH/TO/convoy SOURCE_DIR}"
shared="${CONVOY_SHARED:-$src/../shared}"
model="$shared/models/stories260K.gguf"
npm_dir="$(cd "$(dirname "$convoy")" && pwd)/npm"

. "$src/tests/lib.sh"
[[ -f "$model" ]] || skip "test data $model not found"
chromium="$(command -v chromium || true)"
[[ -n "$chromium" ]] || skip "Debian's chromium is needed for the page"
npm_need "$npm_dir" playwright-core
cp "$src/tests/test_webui.mjs" "$src/tests/checks.mjs" "$npm_dir/"

tmp="$(mktemp -d)"
shots="${WEBUI_SHOTS:-$tmp}"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT
checks=0 failures=0

# serve LOG MODEL ARGS...: convoy serve on a free port; sets base once it listens
serve() {
    local log="$1" m="$2" port
    shift 2
    port="$(free_port)"
    "$convoy" serve -m "$m" --port "$port" "$@" >/dev/null 2>"$log" &
    pids+=($!)
    wait_for "listening on" "$log" 300 || { echo "FAIL: convoy serve $*: $(tail -3 "$log")"; exit 1; }
    base="http://127.0.0.1:$port"
}

serve "$tmp/keyed.log" "$model" --api-key secret
expect "the page needs no key where the API does" \
    test "$(curl -s -o "$tmp/page" -w '%{http_code}' "$base/")" = 200 -a \
    "$(curl -s -o /dev/null -w '%{http_code}' "$base/props")" = 401
expect "GET / is the page" grep -q "<title>convoy</title>" "$tmp/page"
stage_port="$(free_port)"
start_local_stage "$convoy" "$tmp/stage.log" "$stage_port" -m "$model"
pids+=("$stage_pid")
serve "$tmp/chain.log" "$model" --nodes "local,127.0.0.1:$stage_port" --split 3,2
chain="$base"
serve "$tmp/off.log" "$model" --no-webui
expect "--no-webui: / is a 404 that says why" \
    test "$(curl -s -o "$tmp/off" -w '%{http_code}' "$base/")" = 404 -a -n "$(grep -- "--no-webui" "$tmp/off")"
big="$(synth_1024x6 "$convoy")"
serve "$tmp/long.log" "$big"
node "$npm_dir/test_webui.mjs" "$chromium" "$chain" "$shots/webui-chat.png" "$base" "$shots/webui-stop.png"
expect "the page in Chromium" test $? = 0
checks_summary
