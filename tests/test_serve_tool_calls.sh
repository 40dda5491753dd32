#!/usr/bin/env bash
# test_serve_tool_calls.sh: `convoy serve` with tools, end to end, on
# stories260K.
# 1. With --chat-template FILE, a small Hermes-style Jinja template (tools
#    in the system turn, calls as <tool_call>, tool results as a tool turn)
#    written here: a chat with `tools` and a `tool` message is answered 200,
#    whole (a chat.completion whose finish_reason is stop, length or
#    tool_calls) and streamed (chunks ending in [DONE]).
# 2. Forced calls (test_serve_tool_calls.mjs "forced", the official openai
#    client) with the real templates of each call format (Qwen2.5: Hermes,
#    Mistral Nemo: Mistral, Llama 3.1: Llama 3), on one machine and on a
#    2-stage chain (this machine the first stage, a `convoy stage` on
#    loopback the second), whose calls must be the single machine's; and
#    /v1/responses with a function tool ("responses") on the Qwen2.5 one.
# 3. Built-in families: qwen2.5, qwen3, llama3.1 and mistral render a
#    conversation with tools, calls and tool results exactly as their
#    reference templates do (/apply-template against `convoy
#    render-template`); chatml, llama3.1 and mistral force a call and
#    answer after a tool result ("builtin"); gemma refuses tools with a 400
#    naming it.
# Calls from canned outputs (a grammar holds the model to them) are
# test_serve_structured.sh's.
#
# Usage (CTest passes these): test_serve_tool_calls.sh PATH/TO/convoy SOURCE_DIR
# Installs `openai` and `ajv` under BUILD_DIR/npm (once). Without npm (or
# when installing fails) it skips, except under CI=true.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
templates="$shared/reference/chat-templates"
need_data "$templates"
need curl
npm_need "$npm_dir" openai ajv
cp "$src/tests/test_serve_tool_calls.mjs" "$src/tests/checks.mjs" "$npm_dir/"

make_tmp

# serve LOG ARGS...: convoy serve on a free port; sets base (.../v1) and
# server_pid once it listens
serve() {
    start_serve "$convoy" "$1" -m "$model" --host 127.0.0.1 "${@:2}" && base="$base/v1"
}

cat >"$tmp/hermes.jinja" <<'JINJA'
{%- if tools %}<|im_start|>system
You may call these tools:
<tools>
{%- for t in tools %}
{{ t | tojson }}
{%- endfor %}
</tools>
Answer a call as <tool_call>{"name": NAME, "arguments": ARGS}</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
JINJA

serve "$tmp/serve.log" --chat-template "$tmp/hermes.jinja"

tools='[{"type":"function","function":{"name":"get_weather","description":"The weather in a city",
  "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]'
messages='[{"role":"user","content":"Weather in Paris?"},
  {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
   "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
  {"role":"tool","tool_call_id":"call_1","content":"sunny"}]'

# chat STREAM: the status line's code, the body in $tmp/body
chat() {
    curl -s --max-time 60 -o "$tmp/body" -w '%{http_code}' "$base/chat/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"messages\":$messages,\"tools\":$tools,\"max_tokens\":16,\"stream\":$1}"
}

code="$(chat false)"
if [[ "$code" == 200 ]] && python3 - "$tmp/body" <<'PY'; then
import json, sys
j = json.load(open(sys.argv[1]))
c = j["choices"][0]
assert j["object"] == "chat.completion" and c["message"]["role"] == "assistant", j
assert c["finish_reason"] in ("stop", "length", "tool_calls"), c
assert ("tool_calls" in c["message"]) == (c["finish_reason"] == "tool_calls"), c
PY
    pass "a chat with tools and a tool message is answered"
else
    fail "chat with tools: $code $(head -c 500 "$tmp/body")"
fi

code="$(chat true)"
if [[ "$code" == 200 ]] && python3 - "$tmp/body" <<'PY'; then
import json, sys
events = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert events and events[-1] == "[DONE]", events
chunks = [json.loads(e) for e in events[:-1]]
assert all(c["object"] == "chat.completion.chunk" for c in chunks), chunks
assert chunks[0]["choices"][0]["delta"]["role"] == "assistant", chunks[0]
assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls"), chunks[-1]
PY
    pass "a streamed chat with tools ends in a finish reason and [DONE]"
else
    fail "streamed chat with tools: $code $(head -c 500 "$tmp/body")"
fi

kill_server

# 2. forced calls in each format, one machine and a 2-stage chain
start_local_stages "$tmp/stage.log" "$model"
for t in Qwen-Qwen2.5-7B-Instruct mistralai-Mistral-Nemo-Instruct-2407 meta-llama-Llama-3.1-8B-Instruct; do
    echo "== $t, one machine and a 2-stage chain"
    serve "$tmp/$t.log" --chat-template "$templates/$t.jinja"
    single="$base"
    single_pid="$server_pid"
    # the sanitizer suite (ten times slower) runs the chain with the first
    # format only: the others take the same paths there
    chain=""
    if [[ "${CONVOY_SANITIZED:-}" != 1 || "$t" == Qwen-* ]]; then
        serve "$tmp/$t.chain.log" --chat-template "$templates/$t.jinja" --nodes "local,$nodes" \
            --split 3,2
        chain="$base"
    fi
    expect "$t: the forced-call suite" node "$npm_dir/test_serve_tool_calls.mjs" forced "$single" $chain
    if [[ "$t" == Qwen-* ]]; then
        expect "$t: the responses suite" node "$npm_dir/test_serve_tool_calls.mjs" responses "$single"
    fi
    [[ -n "$chain" ]] && kill_server
    server_pid="$single_pid"
    kill_server
done

# 3. built-in families
cat >"$tmp/history.json" <<'JSON'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris and Nice?"},
 {"role": "assistant", "content": "Let me look.", "tool_calls": [
  {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
  {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Nice\"}"}}]},
 {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}, {"role": "tool", "tool_call_id": "call_2",
  "content": "rain"}, {"role": "user", "content": "And Rome?"}],
 "tools": [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
  "required": ["city"]}}}]}
JSON
# one call per message, with Mistral's 9-character ids
python3 - "$tmp/history.json" >"$tmp/history1.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["messages"]
m[2]["content"], m[2]["tool_calls"] = "", m[2]["tool_calls"][:1]
m[2]["tool_calls"][0]["id"] = m[3]["tool_call_id"] = "abcdefghi"
del m[4]
m.insert(4, {"role": "assistant", "content": "Sunny."})
json.dump(r, sys.stdout)
PY
for each in qwen2.5:Qwen-Qwen2.5-7B-Instruct:history qwen3:Qwen-Qwen3-0.6B:history \
    llama3.1:meta-llama-Llama-3.1-8B-Instruct:history1 mistral:mistralai-Mistral-Nemo-Instruct-2407:history1; do
    IFS=: read -r family reference history <<<"$each"
    serve "$tmp/$family.log" --chat-template "$family"
    curl -s --max-time 60 "${base%/v1}/apply-template" -d @"$tmp/$history.json" |
        python3 -c 'import json, sys; sys.stdout.write(json.load(sys.stdin)["prompt"])' >"$tmp/native.txt"
    "$convoy" render-template --template "$templates/$reference.jinja" --request "$tmp/$history.json" \
        --bos "<s>" --eos "</s>" >"$tmp/ref.txt"
    if [[ -s "$tmp/native.txt" ]] && cmp -s "$tmp/native.txt" "$tmp/ref.txt"; then
        pass "built-in $family renders tools, calls and results as $reference.jinja does"
    else
        fail "built-in $family with tools: $(diff "$tmp/ref.txt" "$tmp/native.txt" | head -10)"
    fi
    [[ "$family" == qwen* ]] ||
        expect "built-in $family: the call suite" node "$npm_dir/test_serve_tool_calls.mjs" builtin "$base" "$family"
    kill_server
done
serve "$tmp/chatml.log" --chat-template chatml
expect "built-in chatml: the call suite" node "$npm_dir/test_serve_tool_calls.mjs" builtin "$base" chatml
kill_server
serve "$tmp/gemma.log" --chat-template gemma
code="$(curl -s --max-time 60 -o "$tmp/body" -w '%{http_code}' "$base/chat/completions" -d @"$tmp/history.json")"
if [[ "$code" == 400 ]] && grep -q 'gemma' "$tmp/body"; then
    pass "a built-in family without a tool format refuses tools by name"
else
    fail "gemma with tools: $code $(head -c 300 "$tmp/body")"
fi
kill_server

checks_summary
