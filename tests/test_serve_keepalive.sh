#!/usr/bin/env bash
# test_serve_keepalive.sh: a stream whose first token comes later than the
# server's --timeout is not cut. A synthetic model (1024 wide, 6 layers,
# Q4_0) on one slot with --timeout 1 at one thread: a long completion holds
# the slot for seconds while a streamed chat and a streamed completion wait
# in the queue; both get ": keep-alive" comments (which clients skip) and
# then their whole answer, ending in "data: [DONE]". Before the comments, a
# connection silent for --timeout seconds was closed under a stream whose
# prompt took that long (a CPU prefilling a long history).
#
# Usage (CTest passes these): test_serve_keepalive.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3
need curl

model="$(synth_1024x6 "$convoy")" || exit 1

make_tmp
start_serve "$convoy" "$tmp/serve.log" -m "$model" --slots 1 --client-slots 1 -t 1 --timeout 1
url="$base"

# the slot's holder: long enough (seconds) that the queued streams outlive --timeout several times
curl -s "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "a", "max_tokens": 1900, "ignore_eos": true, "temperature": 0}' >"$tmp/long.json" &
holder=$!
sleep 0.3
curl -s -N "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true}' >"$tmp/chat.sse" &
chat=$!
curl -s -N "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "hi", "max_tokens": 4, "stream": true}' >"$tmp/completion.sse" &
completion=$!
wait "$holder" "$chat" "$completion"

for s in chat completion; do
    # one comment every third of --timeout: 4 or more mean the stream waited past it
    n="$(grep -c "^: keep-alive" "$tmp/$s.sse")"
    expect "the queued $s stream waited past --timeout, with $n keep-alive comments" [ "$n" -ge 4 ]
    expect "the queued $s stream got its answer and [DONE]" grep -q "^data: \[DONE\]" "$tmp/$s.sse"
    expect "the queued $s stream's events parse, comments aside" python3 -c '
import json, sys
events = [l[6:] for l in open(sys.argv[1]).read().splitlines() if l.startswith("data: ") and l != "data: [DONE]"]
assert events and all(json.loads(e)["object"] in ("chat.completion.chunk", "text_completion") for e in events)' "$tmp/$s.sse"
done
checks_summary
