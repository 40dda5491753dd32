#!/usr/bin/env bash
# test_serve_tool_calls.sh: `convoy serve` with tools, end to end: stories260K
# with --chat-template FILE, a small Hermes-style Jinja template (tools in
# the system turn, calls as <tool_call>, tool results as a tool turn)
# written here. A chat with `tools` and a `tool` message is answered 200,
# whole (a chat.completion whose finish_reason is stop, length or
# tool_calls) and streamed (chunks ending in [DONE]). Calls from canned
# outputs (a grammar holds the model to them) are test_serve_structured.sh's.
#
# Usage (CTest passes these): test_serve_tool_calls.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail

convoy="${1:?usage: test_serve_tool_calls.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_serve_tool_calls.sh PATH/TO/convoy SOURCE_DIR}"
shared="${CONVOY_SHARED:-$src/../shared}"
model="$shared/models/stories260K.gguf"

. "$src/tests/lib.sh"
[[ -f "$model" ]] || skip "test data $model not found"
command -v curl >/dev/null || skip "curl is needed"

tmp="$(mktemp -d)"
server_pid=""
trap '[[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
failures=0
pass() { echo "ok   $*"; }
fail() {
    echo "FAIL $*"
    failures=$((failures + 1))
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

log="$tmp/serve.log"
"$convoy" serve -m "$model" --host 127.0.0.1 --port 0 --chat-template "$tmp/hermes.jinja" 2>"$log" &
server_pid=$!
port=""
for _ in $(seq 100); do
    port="$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\)/v1.*|\1|p' "$log")"
    [[ -n "$port" ]] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
done
[[ -n "$port" ]] || { echo "FAIL convoy serve did not start: $(cat "$log")"; exit 1; }
base="http://127.0.0.1:$port/v1"

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

[[ "$failures" == 0 ]] || exit 1
