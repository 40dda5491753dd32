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

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
templates="$shared/reference/chat-templates"
npm_need "$npm_dir" openai ajv ajv-formats
cp "$src/tests/test_serve_structured.mjs" "$src/tests/checks.mjs" "$npm_dir/"

# the schema compiler alone: random sentences of its grammars validated by ajv
AJV_DIR="$npm_dir" node "$src/tests/test_schema_ajv.mjs" "$build" || exit 1

make_tmp

# serve NAME ARGS...: convoy serve on a free port; sets url to its /v1.
serve() {
    start_serve "$convoy" "$tmp/$1.log" -m "$model" --host 127.0.0.1 "${@:2}" && url="$base/v1"
}

start_local_stages "$tmp/stage.log" "$model"

serve one -np 4 && one="$url"
serve chain -np 4 --nodes "local,$nodes" && chain="$url"
serve hermes --chat-template "$templates/Qwen-Qwen2.5-7B-Instruct.jinja" && hermes="$url"
serve mistral --chat-template "$templates/mistralai-Mistral-Nemo-Instruct-2407.jinja" && mistral="$url"
serve llama3 --chat-template "$templates/meta-llama-Llama-3.1-8B-Instruct.jinja" && llama3="$url"
serve qwen3 --chat-template "$templates/Qwen-Qwen3-0.6B.jinja" && qwen3="$url"
serve r1 --chat-template "$templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja" && r1="$url"

(cd "$npm_dir" && node test_serve_structured.mjs "$one" "$chain" "$hermes" "$mistral" "$llama3" "$qwen3" "$r1")
