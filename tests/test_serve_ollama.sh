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

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
npm_need "$npm_dir" ollama
cp "$src/tests/test_serve_ollama.mjs" "$src/tests/checks.mjs" "$npm_dir/"

make_tmp

# serve LOG ARGS...: convoy serve of the model on a free port; sets base once it listens
serve() { start_serve "$convoy" "$1" -m "$model" -np 2 "${@:2}"; }

bytes="$(stat -c %s "$model")"
serve "$tmp/single.log"
single="$base"
echo "== one machine"
expect "one machine" node "$npm_dir/test_serve_ollama.mjs" "$single" "$bytes"

start_local_stages "$tmp/stage.log" "$model"
serve "$tmp/chain.log" --nodes "local,$nodes" --split 3,2
chain="$base"
echo "== a 2-stage chain"
expect "a 2-stage chain" node "$npm_dir/test_serve_ollama.mjs" "$chain" "$bytes" "$single"
checks_summary
