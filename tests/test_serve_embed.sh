#!/usr/bin/env bash
# test_serve_embed.sh: `convoy serve --embeddings` (serve/embed.h) with the
# official `openai` npm client's embeddings.create and the `ollama` npm
# client's embed (test_serve_embed.mjs says what is checked), on one
# machine and on a 2-stage chain (this machine the first stage, a
# `convoy stage` on loopback the second, which pools), whose vectors must
# be the single machine's bit for bit; and a server without --embeddings,
# whose embedding routes answer 501.
#
# Usage (CTest passes these): test_serve_embed.sh PATH/TO/convoy SOURCE_DIR
# Without npm (or when installing the clients fails) it skips, except under CI=true.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
npm_need "$npm_dir" openai ollama
cp "$src/tests/test_serve_embed.mjs" "$src/tests/checks.mjs" "$npm_dir/"

make_tmp

# serve LOG ARGS...: convoy serve of the model on a free port; sets base once it listens
serve() { start_serve "$convoy" "$1" -m "$model" -np 2 "${@:2}"; }

serve "$tmp/plain.log"
echo "== without --embeddings"
expect "without --embeddings" node "$npm_dir/test_serve_embed.mjs" "$base" off

serve "$tmp/single.log" --embeddings
single="$base"
echo "== one machine"
expect "one machine" node "$npm_dir/test_serve_embed.mjs" "$single" on

start_local_stages "$tmp/stage.log" "$model"
serve "$tmp/chain.log" --embeddings --nodes "local,$nodes" --split 3,2
echo "== a 2-stage chain"
expect "a 2-stage chain" node "$npm_dir/test_serve_embed.mjs" "$base" on "$single"
checks_summary
