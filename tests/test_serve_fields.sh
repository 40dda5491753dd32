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

convoy="${1:?usage: test_serve_fields.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_serve_fields.sh PATH/TO/convoy SOURCE_DIR}"
npm_dir="$(cd "$(dirname "$convoy")" && pwd)/npm"

. "$src/tests/lib.sh"
npm_need "$npm_dir" openai
cp "$src/tests/test_serve_fields.mjs" "$src/tests/checks.mjs" "$npm_dir/"

tmp="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT

model="$tmp/fim.gguf"
"$convoy" synth --dims 64,4,4,2,128,600 --type F32 --chatml --fim -o "$model" >/dev/null ||
    { echo "FAIL: convoy synth --fim"; exit 1; }

# serve LOG ARGS...: convoy serve of the model on a free port; sets base once it listens
serve() { start_serve "$convoy" "$1" -m "$model" -np 4 "${@:2}"; }

failures=0
serve "$tmp/single.log" --mlock --no-mmap
single="$base"
# --mlock: the weights are locked (llama-server's flag; --no-mmap is accepted);
# AddressSanitizer makes mlock a no-op, so the sanitizer suite cannot see it
locked="$(awk '/^VmLck:/ {print $2}' "/proc/${pids[-1]}/status")"
if [[ "${CONVOY_SANITIZED:-}" == 1 ]]; then :; elif [[ "${locked:-0}" -gt 0 ]]; then
    echo "ok   --mlock: $locked kB locked"
else
    echo "FAIL --mlock: nothing locked (VmLck ${locked:-?})"
    failures=$((failures + 1))
fi
echo "== one machine"
node "$npm_dir/test_serve_fields.mjs" "$single" || failures=$((failures + 1))

stage_port="$(free_port)"
start_local_stage "$convoy" "$tmp/stage.log" "$stage_port" -m "$model"
pids+=("$stage_pid")
serve "$tmp/chain.log" --nodes "local,127.0.0.1:$stage_port" --split 2,2
echo "== a 2-stage chain"
node "$npm_dir/test_serve_fields.mjs" "$base" "$single" || failures=$((failures + 1))
[[ $failures -eq 0 ]]
