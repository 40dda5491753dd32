#!/usr/bin/env bash
# test_serve_ollama.sh: `convoy serve`'s Ollama API (serve/ollama.h) with
# the `ollama` npm client (test_serve_ollama.mjs says what is checked), on
# one machine and on a 2-stage chain (this machine the first stage, a
# `convoy stage` on loopback the second), whose greedy texts must be the
# single machine's.
#
# Usage (CTest passes these): test_serve_ollama.sh PATH/TO/convoy SOURCE_DIR
# Without npm (or when installing ollama fails) it skips, except under CI=true.
set -uo pipefail

convoy="${1:?usage: test_serve_ollama.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_serve_ollama.sh PATH/TO/convoy SOURCE_DIR}"
shared="${CONVOY_SHARED:-$src/../shared}"
model="$shared/models/stories260K.gguf"
npm_dir="$(cd "$(dirname "$convoy")" && pwd)/npm"

. "$src/tests/lib.sh"
[[ -f "$model" ]] || skip "test data $model not found"
npm_need "$npm_dir" ollama
cp "$src/tests/test_serve_ollama.mjs" "$src/tests/checks.mjs" "$npm_dir/"

tmp="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT

# serve LOG ARGS...: convoy serve of the model on a free port; sets base once it listens
serve() { start_serve "$convoy" "$1" -m "$model" -np 2 "${@:2}"; }

failures=0
bytes="$(stat -c %s "$model")"
serve "$tmp/single.log"
single="$base"
echo "== one machine"
node "$npm_dir/test_serve_ollama.mjs" "$single" "$bytes" || failures=$((failures + 1))

stage_port="$(free_port)"
start_local_stage "$convoy" "$tmp/stage.log" "$stage_port" -m "$model"
pids+=("$stage_pid")
serve "$tmp/chain.log" --nodes "local,127.0.0.1:$stage_port" --split 3,2
chain="$base"
echo "== a 2-stage chain"
node "$npm_dir/test_serve_ollama.mjs" "$chain" "$bytes" "$single" || failures=$((failures + 1))
[[ $failures -eq 0 ]]
