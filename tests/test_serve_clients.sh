#!/usr/bin/env bash
# test_serve_clients.sh: `convoy serve` as llama-server's users run it:
# its command line, API keys, browsers, HTTP details, logs and SIGTERM.
#
# Usage (CTest passes these): test_serve_clients.sh PATH/TO/convoy SOURCE_DIR
#
# Installs `openai` and `@langchain/openai` under BUILD_DIR/npm (once;
# without LangChain its request shapes are sent with fetch, and the output
# says so), then serves stories260K:
# 1. with llama-server's command line `-m M -c 4096 -np 4 --host 127.0.0.1
#    --port P --api-key K -t 2`: 4 slots of 1024 tokens (-c is the context of
#    all slots together, as there) with 2 threads, seen in the start line and
#    /props; a prompt that needs more than 1024 tokens is refused; the
#    openai client and ChatOpenAI with their default model names, streamed
#    and not, with the key; without it or with a wrong one a 401 in OpenAI's
#    error shape; /health open, HEAD; GETs keep the connection; 405 with
#    Allow; /tokenize and /detokenize; a log line per request with its
#    tokens and times, and the /health ones only with --verbose; keys from
#    --api-key-file (refused when others may read it);
# 2. with the defaults on loopback (CORS '*'): a browser's preflight gets
#    the CORS answer; a cross-origin text/plain POST gets 415 and runs
#    nothing (no token is generated); a JSON one from the page runs;
#    --cors ORIGIN: another origin gets 403, the preflight of the allowed one
#    names it; --strict-model: another model name is a 404;
# 3. SIGTERM while 4 requests stream: each stream ends with an error event
#    and then "data: [DONE]", and the server exits 0;
# 4. the command line: --draft 16 is refused pointing at --spec-k, -ngl is
#    accepted with a note, --version, -f (a prompt file, llama-cli's: not
#    llama-server's either) is unknown, and listening beyond loopback without
#    a key warns.
# 5. (in 1) /v1/responses with the AI SDK's default OpenAI provider (`ai`,
#    `@ai-sdk/openai`, installed beside openai) and fetch
#    (test_serve_responses.mjs); without those packages it is left out with
#    a note, and fails under CI=true.
# Without npm (or when installing openai fails) it skips, except under CI=true.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
npm_need "$npm_dir" openai
npm_try "$npm_dir" "its requests are emulated" @langchain/openai @langchain/core
npm_try "$npm_dir" "/v1/responses is not checked" @ai-sdk/openai ai
cp "$src/tests/test_serve_clients.mjs" "$src/tests/test_serve_responses.mjs" "$src/tests/checks.mjs" "$npm_dir/"

make_tmp

# status URL [CURL ARGS...]: the HTTP status of a request
status() { curl -s -o "$tmp/body" -w '%{http_code}' --max-time 30 "$@"; }

generated() { curl -s "$base/metrics" -H "Authorization: Bearer $key" | sed -n 's/^convoy_generated_tokens_total //p'; }

# 1. llama-server's command line
key="sk-test-$RANDOM$RANDOM"
port="$(free_port)"
if start_server "$tmp/s1.log" -m "$model" -c 4096 -np 4 --host 127.0.0.1 --port "$port" --api-key "$key" -t 2; then
    expect "-c 4096 -np 4 -t 2: 4 slots of 1024 tokens, 2 threads, on the port given" \
        grep -q "listening on http://127.0.0.1:$port/v1 (.*4 slots of 1024 tokens.*, 2 threads" "$tmp/s1.log"
    props="$(curl -s "$base/props" -H "Authorization: Bearer $key")"
    expect "/props: total_slots 4, n_ctx 1024" python3 -c '
import json, sys
p = json.loads(sys.argv[1])
sys.exit(not (p["total_slots"] == 4 and p["default_generation_settings"]["n_ctx"] == 1024))' "$props"
    long="$(python3 -c 'print("{\"prompt\":\"" + "dog " * 1100 + "\",\"max_tokens\":4}")')"
    expect "a prompt past a slot's 1024 tokens is refused (400)" \
        test "$(status "$base/v1/completions" -H "Authorization: Bearer $key" -d "$long")" = 400
    if out="$(node "$npm_dir/test_serve_clients.mjs" "$base/v1" "$key" 2>&1)"; then
        note="$(grep '^note' <<<"$out")"
        pass "clients: $(grep -c '^ok' <<<"$out") checks${note:+ ($note)}"
    else
        fail "clients: $(grep -E '^(FAIL|note)' <<<"$out")"
    fi
    if [[ -f "$npm_dir/node_modules/@ai-sdk/openai/package.json" ]]; then
        if out="$(node "$npm_dir/test_serve_responses.mjs" "$base/v1" "$key" 2>&1)"; then
            pass "/v1/responses (AI SDK, fetch): $(grep -c '^ok' <<<"$out") checks"
        else
            fail "/v1/responses: $(grep -E '^FAIL' <<<"$out")"
        fi
    elif [[ "${CI:-}" == true ]]; then
        fail "/v1/responses: ai and @ai-sdk/openai are not installed (CI=true)"
    fi
    expect "/health needs no key" test "$(status "$base/health")" = 200
    expect "HEAD /health" test "$(curl -s -o /dev/null -w '%{http_code}' -I "$base/health")" = 200
    expect "/v1/models without the key: 401 invalid_api_key" \
        test "$(status "$base/v1/models")" = 401 -a "$(grep -c '"code":"invalid_api_key"' "$tmp/body")" = 1
    curl -sv -o /dev/null -o /dev/null "$base/health" "$base/v1/models" -H "Authorization: Bearer $key" 2>"$tmp/kv"
    expect "two GETs on one connection (keep-alive)" grep -q "Re-using existing connection" "$tmp/kv"
    curl -s -D "$tmp/h405" -o /dev/null -X DELETE "$base/v1/models" -H "Authorization: Bearer $key"
    expect "405 with Allow" grep -qi "^Allow: GET, HEAD, OPTIONS" "$tmp/h405"
    ids="$(curl -s "$base/tokenize" -H "Authorization: Bearer $key" -d '{"content":"Once upon a time"}' |
        python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["tokens"]))')"
    expect "/tokenize then /detokenize gives the text back" test "$(curl -s "$base/detokenize" \
        -H "Authorization: Bearer $key" -d "{\"tokens\":$ids}")" = '{"content":" Once upon a time"}'
    line='INFO  POST /v1/chat/completions 200 from 127\.0\.0\.1: [0-9]+ prompt \+ [0-9]+ generated tokens, '
    expect "a log line per request, with tokens and times" \
        grep -qE "${line}first token [0-9.]+ ms, total [0-9.]+ ms$" "$tmp/s1.log"
    expect "/health lines only with --verbose" test "$(grep -c ' /health ' "$tmp/s1.log")" = 0
    term_server
fi
keyfile="$tmp/keys"
printf '\nsk-from-file\n' >"$keyfile"
chmod 644 "$keyfile"
"$convoy" serve -m "$model" --port 0 --api-key-file "$keyfile" >/dev/null 2>"$tmp/kf.txt"
expect "--api-key-file readable by others is refused" grep -q "readable by group or others" "$tmp/kf.txt"
chmod 600 "$keyfile"
if start_server "$tmp/s1k.log" -m "$model" --port 0 --api-key-file "$keyfile"; then
    expect "--api-key-file: its key lets a request in, none does not" \
        test "$(status "$base/v1/models" -H 'Authorization: Bearer sk-from-file')$(status "$base/v1/models")" = 200401
    term_server
fi
if start_server "$tmp/s1v.log" -m "$model" --port 0 -v; then
    curl -s -o /dev/null "$base/health"
    expect "--verbose: /health at DEBUG" grep -q "DEBUG GET /health 200 from 127.0.0.1" "$tmp/s1v.log"
    term_server
fi

# 2. browsers
page=(-H 'Origin: https://page.example')
if start_server "$tmp/s2.log" -m "$model" --port 0; then
    curl -s -D "$tmp/pre" -o /dev/null -X OPTIONS "$base/v1/chat/completions" "${page[@]}" \
        -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization, content-type'
    expect "a preflight on loopback: 204, any origin, the headers asked" grep -q "204" "$tmp/pre"
    expect "  ... Access-Control-Allow-Origin: *" grep -qi "^Access-Control-Allow-Origin: \*" "$tmp/pre"
    expect "  ... Access-Control-Allow-Headers: authorization, content-type" \
        grep -qi "^Access-Control-Allow-Headers: authorization, content-type" "$tmp/pre"
    before="$(generated)"
    code="$(status "$base/v1/completions" "${page[@]}" -H 'Content-Type: text/plain' \
        -d '{"prompt":"Once upon a time","max_tokens":8}')"
    expect "a cross-origin text/plain POST: 415 (unsupported_media_type)" \
        test "$code" = 415 -a "$(grep -c unsupported_media_type "$tmp/body")" = 1
    expect "  ... and nothing was generated" test "$(generated)" = "$before"
    expect "the same request as JSON from the page runs" test "$(status "$base/v1/completions" "${page[@]}" \
        -H 'Content-Type: application/json' -d '{"prompt":"Once upon a time","max_tokens":8}')" = 200
    expect "a client without Origin may send any type (curl -d)" test "$(status "$base/v1/completions" \
        -d '{"prompt":"Once upon a time","max_tokens":8}')" = 200
    term_server
fi
if start_server "$tmp/s2b.log" -m "$model" --port 0 --cors https://page.example --strict-model; then
    expect "--cors: another origin gets 403" test "$(status "$base/v1/models" -H 'Origin: https://evil.example')" = 403
    curl -s -D "$tmp/pre2" -o /dev/null -X OPTIONS "$base/v1/completions" "${page[@]}" \
        -H 'Access-Control-Request-Method: POST'
    expect "--cors: the allowed origin's preflight names it" \
        grep -qi "^Access-Control-Allow-Origin: https://page.example" "$tmp/pre2"
    expect "--strict-model: another model name is a 404" test "$(status "$base/v1/completions" \
        -d '{"model":"gpt-3.5-turbo","prompt":"Hi","max_tokens":2}')" = 404
    term_server
fi

# 3. SIGTERM while 4 requests stream
if start_server "$tmp/s3.log" -m "$model" --port 0 --ctx 4096 --client-slots 4; then
    body='{"prompt":"Once","max_tokens":4000,"ignore_eos":true,"stream":true}'
    curls=()
    for i in 1 2 3 4; do
        curl -s -N --max-time 60 "$base/v1/completions" -d "$body" >"$tmp/stream$i" &
        curls+=("$!")
    done
    for _ in $(seq 200); do
        n=0
        for i in 1 2 3 4; do grep -q '^data: {' "$tmp/stream$i" && n=$((n + 1)); done
        [[ "$n" == 4 ]] && break
        sleep 0.05
    done
    term_server
    wait "${curls[@]}"
    for i in 1 2 3 4; do
        expect "SIGTERM: stream $i ends with an error event, then [DONE]" python3 -c '
import sys
events = [l for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
sys.exit(not (len(events) > 2 and events[-1] == "data: [DONE]" and "shutting_down" in events[-2]))' "$tmp/stream$i"
    done
    expect "SIGTERM: the server said it drained" grep -q "SIGTERM: draining" "$tmp/s3.log"
fi

# 4. the command line
"$convoy" serve -m "$model" --draft 16 --port 0 >/dev/null 2>"$tmp/draft.txt"
expect "--draft 16 is refused, pointing at --spec-k" grep -q "not a number.*--spec-k 16" "$tmp/draft.txt"
expect "--version" grep -q "^convoy [0-9]" <("$convoy" serve --version)
"$convoy" serve -m "$model" -f prompt.txt >/dev/null 2>"$tmp/f.txt"
expect "-f (a prompt file) is not a server option" grep -q "unknown option '-f'" "$tmp/f.txt"
"$convoy" serve -hf x --no-such-flag >"$tmp/hf.out" 2>"$tmp/hf.txt"
hf_rc=$?
expect "-hf x with an unknown option: exit 2 naming it, no help on stdout, nothing pulled" \
    test "$hf_rc" = 2 -a ! -s "$tmp/hf.out" -a -n "$(grep "unknown option '--no-such-flag'" "$tmp/hf.txt")"
if start_server "$tmp/s4.log" -m "$model" --host 0.0.0.0 --port 0 -ngl 99; then
    expect "-ngl 99: accepted, with a note that there is no GPU" \
        grep -q "WARN  -ngl/--n-gpu-layers 99: this build has no GPU" "$tmp/s4.log"
    expect "listening beyond loopback without a key warns" \
        grep -q "WARN  listening on 0.0.0.0 without an API key" "$tmp/s4.log"
    term_server
fi

checks_summary
