#!/usr/bin/env bash
# test_serve_fields.sh: the request fields and routes beside the basics
# (test_serve_fields.mjs says what is checked): n choices, logit_bias,
# echo, suffix, llama-server's /completion and /infill, Ollama's suffix,
# --mlock;
# through the official openai client, on one machine and on a 2-stage
# chain (this machine the first stage, a `convoy stage` the second) that
# must give the single machine's texts. The model: a small synthetic one
# with fill-in-the-middle tokens (`convoy synth --fim`).
#
# Usage (CTest passes these): test_serve_fields.sh PATH/TO/convoy SOURCE_DIR
# Without npm (or when installing openai fails) it skips, except under CI=true.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
npm_need "$npm_dir" openai
cp "$src/tests/test_serve_fields.mjs" "$src/tests/checks.mjs" "$npm_dir/"

make_tmp

model="$tmp/fim.gguf"
"$convoy" synth --dims 64,4,4,2,128,600 --type F32 --chatml --fim -o "$model" >/dev/null ||
    die "convoy synth --fim"

# serve LOG ARGS...: convoy serve of the model on a free port; sets base once it listens
serve() { start_serve "$convoy" "$1" -m "$model" -np 4 "${@:2}"; }

serve "$tmp/single.log" --mlock --no-mmap
single="$base"
# --mlock: the weights are locked (llama-server's flag; --no-mmap is accepted);
# AddressSanitizer makes mlock a no-op, so the sanitizer suite cannot see it
locked="$(awk '/^VmLck:/ {print $2}' "/proc/${pids[-1]}/status")"
if [[ "${CONVOY_SANITIZED:-}" == 1 ]]; then :; elif [[ "${locked:-0}" -gt 0 ]]; then
    pass "--mlock: $locked kB locked"
else
    fail "--mlock: nothing locked (VmLck ${locked:-?})"
fi
echo "== one machine"
expect "one machine" node "$npm_dir/test_serve_fields.mjs" "$single"

start_local_stages "$tmp/stage.log" "$model"
serve "$tmp/chain.log" --nodes "local,$nodes" --split 2,2
echo "== a 2-stage chain"
expect "a 2-stage chain" node "$npm_dir/test_serve_fields.mjs" "$base" "$single"
checks_summary
