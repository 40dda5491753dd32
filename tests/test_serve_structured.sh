#!/usr/bin/env bash
# test_serve_structured.sh: structured output and tool calls end to end
# (issue 16's second item), through the official openai client
# (test_serve_structured.mjs): stories260K served on one machine and on a
# 2-stage chain (this machine and a `convoy stage`) answers json_schema
# requests that parse, validate (ajv) and are the same text on both, 50
# seeds; three servers with the real Qwen 2.5, Mistral Nemo and Llama 3.1
# chat templates return tool calls from canned outputs (a GBNF `grammar`
# holds the model to the text of a call), whole and streamed; a canned
# <think> block comes back as reasoning_content (Qwen3's and DeepSeek-R1's
# templates, the latter opening the block itself). First, the
# schema compiler alone: random sentences of its grammars for the
# schemas of test_schema_ajv.mjs, patterns among them (test_schema
# --sample), validate with ajv.
#
# Installs `openai`, `ajv` and `ajv-formats` under BUILD_DIR/npm (once). Without npm (or
# when installing fails) it skips, except under CI=true.
#
# Usage (CTest passes these): test_serve_structured.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail

convoy="${1:?usage: test_serve_structured.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_serve_structured.sh PATH/TO/convoy SOURCE_DIR}"
shared="${CONVOY_SHARED:-$src/../shared}"
model="$shared/models/stories260K.gguf"
templates="$shared/reference/chat-templates"
npm_dir="$(cd "$(dirname "$convoy")" && pwd)/npm"

. "$src/tests/lib.sh"
[[ -f "$model" ]] || skip "test data $model not found"
npm_need "$npm_dir" openai ajv ajv-formats
cp "$src/tests/test_serve_structured.mjs" "$src/tests/checks.mjs" "$npm_dir/"
build="$(cd "$(dirname "$convoy")" && pwd)"

# the schema compiler alone: random sentences of its grammars validated by ajv
AJV_DIR="$npm_dir" node "$src/tests/test_schema_ajv.mjs" "$build" || exit 1

tmp="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# serve NAME ARGS...: convoy serve on a free port; sets url to its /v1.
serve() {
    local name="$1" port
    shift
    port="$(free_port)"
    "$convoy" serve -m "$model" --host 127.0.0.1 --port "$port" "$@" >"$tmp/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 200); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.05
    done
    curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "FAIL $name did not start: $(cat "$tmp/$name.log")"; exit 1; }
    url="http://127.0.0.1:$port/v1"
}

stage_port="$(free_port)"
start_local_stage "$convoy" "$tmp/stage.log" "$stage_port" -m "$model"
pids+=("$stage_pid")

serve one -np 4 && one="$url"
serve chain -np 4 --nodes "local,127.0.0.1:$stage_port" && chain="$url"
serve hermes --chat-template "$templates/Qwen-Qwen2.5-7B-Instruct.jinja" && hermes="$url"
serve mistral --chat-template "$templates/mistralai-Mistral-Nemo-Instruct-2407.jinja" && mistral="$url"
serve llama3 --chat-template "$templates/meta-llama-Llama-3.1-8B-Instruct.jinja" && llama3="$url"
serve qwen3 --chat-template "$templates/Qwen-Qwen3-0.6B.jinja" && qwen3="$url"
serve r1 --chat-template "$templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja" && r1="$url"

(cd "$npm_dir" && node test_serve_structured.mjs "$one" "$chain" "$hermes" "$mistral" "$llama3" "$qwen3" "$r1")
