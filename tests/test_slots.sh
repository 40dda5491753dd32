#!/usr/bin/env bash
# test_slots.sh: llama-server's /slots routes on `convoy serve`.
#
# Usage (CTest passes these): test_slots.sh PATH/TO/convoy SOURCE_DIR
#
# stories260K on 2 slots with --slot-save-path: a chat's first turn runs in
# slot 0 (id_slot), GET /slots shows what it holds, the slot is saved; the
# next turn (its prompt starting with the first's) gives text, logprobs and
# cached_tokens. A fresh server restores the file into slot 0 and the same
# next turn gives the same text, logprobs and cached_tokens. Refused, with
# a message naming why: file names with '/' or "..", a slot file of
# another model, a cut or altered file, a missing one (404), a slot that
# does not exist, save and restore without --slot-save-path. erase empties
# the slot.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
need python3
need curl

make_tmp

mkdir -p "$tmp/slots"
port=""
start() { # MODEL ARGS...
    local m="$1"
    shift
    port="$(free_port)"
    "$convoy" serve -m "$m" --port "$port" --slots 2 -t 1 "$@" 2>>"$tmp/server.log" &
    server_pid=$!
    pids+=("$server_pid")
    wait_listening "$port"
}
post() { # PATH BODY: prints the status line's code, then the body
    curl -s -o "$tmp/body" -w '%{http_code}' -X POST "http://127.0.0.1:$port$1" \
        -H 'Content-Type: application/json' -d "$2"
    echo
    cat "$tmp/body"
}
field() { # JSON PYTHON-EXPR (of d)
    python3 -c 'import json, sys; d = json.loads(sys.argv[1]); print(eval(sys.argv[2]))' "$1" "$2"
}

first='{"prompt": "Once upon a time there was a little girl named Lily. She liked to play", "max_tokens": 12,
        "temperature": 0, "id_slot": 0}'
next='{"prompt": "Once upon a time there was a little girl named Lily. She liked to play with her friends in the park. One day",
       "max_tokens": 16, "temperature": 0, "logprobs": 2, "id_slot": 0}'

start "$model" --slot-save-path "$tmp/slots"
out="$(post /v1/completions "$first")"
expect "the first turn runs in slot 0" [ "$(head -1 <<<"$out")" = 200 ]
slots="$(curl -s "http://127.0.0.1:$port/slots")"
expect "GET /slots: slot 0 holds the turn, slot 1 nothing" \
    [ "$(field "$slots" '[(s["id"], s["is_processing"], s["n_tokens"] > 20) for s in d]')" = \
        "[(0, False, True), (1, False, False)]" ]
out="$(post '/slots/0?action=save' '{"filename": "lily.bin"}')"
expect "save: 200 with n_saved" [ "$(head -1 <<<"$out")" = 200 -a "$(field "$(tail -n +2 <<<"$out")" 'd["n_saved"] > 20')" = True ]
expect "the slot file is there" [ -s "$tmp/slots/lily.bin" ]
warm="$(post /v1/completions "$next" | tail -n +2)"
warm_answer="$(field "$warm" '[d["choices"][0]["text"], d["choices"][0]["logprobs"], d["usage"]["prompt_tokens_details"]["cached_tokens"]]')"
expect "the next turn reuses the first's prefix" [ "$(field "$warm" 'd["usage"]["prompt_tokens_details"]["cached_tokens"] > 15')" = True ]
for bad in '../lily.bin' 'a/b.bin' '.hidden' ''; do
    out="$(post '/slots/0?action=save' "{\"filename\": \"$bad\"}")"
    expect "save refuses the name '$bad'" [ "$(head -1 <<<"$out")" = 400 ]
    grep -q "is refused" <<<"$out" || fail "the refusal of '$bad' names the rule: $out"
done
out="$(post '/slots/0?action=restore' '{"filename": "nope.bin"}')"
expect "restore of a missing file: 404" [ "$(head -1 <<<"$out")" = 404 ]
out="$(post '/slots/7?action=save' '{"filename": "x.bin"}')"
expect "a slot that does not exist: 400 naming it" grep -q "slot 7 does not exist" <<<"$out"
kill_server

# a fresh server: restore, then the same next turn
start "$model" --slot-save-path "$tmp/slots"
out="$(post '/slots/0?action=restore' '{"filename": "lily.bin"}')"
expect "restore: 200 with n_restored" [ "$(head -1 <<<"$out")" = 200 ]
fresh="$(post /v1/completions "$next" | tail -n +2)"
fresh_answer="$(field "$fresh" '[d["choices"][0]["text"], d["choices"][0]["logprobs"], d["usage"]["prompt_tokens_details"]["cached_tokens"]]')"
expect "after restore, the next turn's text, logprobs and cached_tokens are the saved slot's" \
    [ -n "$warm_answer" -a "$fresh_answer" = "$warm_answer" ]
out="$(post '/slots/0?action=erase' '')"
expect "erase: n_erased" [ "$(field "$(tail -n +2 <<<"$out")" 'd["n_erased"] > 20')" = True ]
expect "after erase slot 0 holds nothing" \
    [ "$(field "$(curl -s "http://127.0.0.1:$port/slots")" 'd[0]["n_tokens"]')" = 0 ]
# cut and altered files
head -c 60 "$tmp/slots/lily.bin" >"$tmp/slots/cut.bin"
out="$(post '/slots/0?action=restore' '{"filename": "cut.bin"}')"
expect "a cut slot file is refused, naming why" grep -q "announces" <<<"$out"
printf 'XXXX' | cat - <(tail -c +5 "$tmp/slots/lily.bin") >"$tmp/slots/magic.bin"
out="$(post '/slots/0?action=restore' '{"filename": "magic.bin"}')"
expect "a file that is no slot file is refused" grep -q "not a version-1 convoy slot file" <<<"$out"
kill_server

# another model refuses the file; no --slot-save-path refuses save and restore
other="$tmp/other.gguf"
"$convoy" synth --dims 64,1,4,2,128,300 --type F32 -o "$other" >/dev/null || fail "convoy synth"
start "$other" --slot-save-path "$tmp/slots"
out="$(post '/slots/0?action=restore' '{"filename": "lily.bin"}')"
expect "a slot file of another model: 400 naming it" grep -q "saved with another model" <<<"$out"
kill_server
start "$model"
out="$(post '/slots/0?action=save' '{"filename": "x.bin"}')"
expect "without --slot-save-path, save is refused naming the option" grep -q -- "--slot-save-path" <<<"$out"
kill_server

checks_summary
