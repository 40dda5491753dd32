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

convoy="${1:?usage: test_serve_clients.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_serve_clients.sh PATH/TO/convoy SOURCE_DIR}"
shared="${CONVOY_SHARED:-$src/../shared}"
model="$shared/models/stories260K.gguf"
npm_dir="$(cd "$(dirname "$convoy")" && pwd)/npm"

. "$src/tests/lib.sh"
[[ -f "$model" ]] || skip "test data $model not found"
npm_need "$npm_dir" openai
if [[ ! -f "$npm_dir/node_modules/@langchain/openai/package.json" ]]; then
    npm install --silent --no-audit --no-fund --prefix "$npm_dir" @langchain/openai @langchain/core >/dev/null 2>&1 ||
        echo "note: npm install @langchain/openai failed: its requests are emulated"
fi
if [[ ! -f "$npm_dir/node_modules/@ai-sdk/openai/package.json" ]]; then
    npm install --silent --no-audit --no-fund --prefix "$npm_dir" ai @ai-sdk/openai >/dev/null 2>&1 ||
        echo "note: npm install ai @ai-sdk/openai failed: /v1/responses is not checked"
fi
cp "$src/tests/test_serve_clients.mjs" "$src/tests/test_serve_responses.mjs" "$src/tests/checks.mjs" "$npm_dir/"

tmp="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

failures=0
pass() { echo "ok   $*"; }
fail() {
    echo "FAIL $*"
    failures=$((failures + 1))
}
check() { # check NAME COMMAND...: passes when the command succeeds
    local name="$1"
    shift
    if "$@"; then pass "$name"; else fail "$name"; fi
}

# start_server LOG ARGS...: convoy serve with ARGS (which give the port);
# sets server_pid and base once it listens, or fails.
start_server() {
    local log="$1"
    shift
    : >"$log"
    "$convoy" serve -m "$model" "$@" 2>>"$log" &
    server_pid=$!
    pids+=("$server_pid")
    local port=""
    for _ in $(seq 100); do
        port="$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\)/v1.*|\1|p' "$log")"
        [[ -n "$port" ]] && break
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -z "$port" ]]; then
        fail "convoy serve $* did not start: $(cat "$log")"
        return 1
    fi
    base="http://127.0.0.1:$port"
}

# stop_server: SIGTERM; the server must exit 0 within 10 s.
stop_server() {
    kill -TERM "$server_pid"
    local rc=""
    for _ in $(seq 100); do
        kill -0 "$server_pid" 2>/dev/null || { wait "$server_pid"; rc=$?; break; }
        sleep 0.1
    done
    if [[ "$rc" != 0 ]]; then
        fail "the server did not stop cleanly on SIGTERM (status '${rc:-still running}')"
        kill -9 "$server_pid"
    fi
}

# status URL [CURL ARGS...]: the HTTP status of a request
status() { curl -s -o "$tmp/body" -w '%{http_code}' --max-time 30 "$@"; }

generated() { curl -s "$base/metrics" -H "Authorization: Bearer $key" | sed -n 's/^convoy_generated_tokens_total //p'; }

# 1. llama-server's command line
key="sk-test-$RANDOM$RANDOM"
port="$(free_port)"
if start_server "$tmp/s1.log" -c 4096 -np 4 --host 127.0.0.1 --port "$port" --api-key "$key" -t 2; then
    check "-c 4096 -np 4 -t 2: 4 slots of 1024 tokens, 2 threads, on the port given" \
        grep -q "listening on http://127.0.0.1:$port/v1 (.*4 slots of 1024 tokens.*, 2 threads" "$tmp/s1.log"
    props="$(curl -s "$base/props" -H "Authorization: Bearer $key")"
    check "/props: total_slots 4, n_ctx 1024" python3 -c '
import json, sys
p = json.loads(sys.argv[1])
sys.exit(not (p["total_slots"] == 4 and p["default_generation_settings"]["n_ctx"] == 1024))' "$props"
    long="$(python3 -c 'print("{\"prompt\":\"" + "dog " * 1100 + "\",\"max_tokens\":4}")')"
    check "a prompt past a slot's 1024 tokens is refused (400)" \
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
    check "/health needs no key" test "$(status "$base/health")" = 200
    check "HEAD /health" test "$(curl -s -o /dev/null -w '%{http_code}' -I "$base/health")" = 200
    check "/v1/models without the key: 401 invalid_api_key" \
        test "$(status "$base/v1/models")" = 401 -a "$(grep -c '"code":"invalid_api_key"' "$tmp/body")" = 1
    curl -sv -o /dev/null -o /dev/null "$base/health" "$base/v1/models" -H "Authorization: Bearer $key" 2>"$tmp/kv"
    check "two GETs on one connection (keep-alive)" grep -q "Re-using existing connection" "$tmp/kv"
    curl -s -D "$tmp/h405" -o /dev/null -X DELETE "$base/v1/models" -H "Authorization: Bearer $key"
    check "405 with Allow" grep -qi "^Allow: GET, HEAD, OPTIONS" "$tmp/h405"
    ids="$(curl -s "$base/tokenize" -H "Authorization: Bearer $key" -d '{"content":"Once upon a time"}' |
        python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["tokens"]))')"
    check "/tokenize then /detokenize gives the text back" test "$(curl -s "$base/detokenize" \
        -H "Authorization: Bearer $key" -d "{\"tokens\":$ids}")" = '{"content":" Once upon a time"}'
    line='INFO  POST /v1/chat/completions 200 from 127\.0\.0\.1: [0-9]+ prompt \+ [0-9]+ generated tokens, '
    check "a log line per request, with tokens and times" \
        grep -qE "${line}first token [0-9.]+ ms, total [0-9.]+ ms$" "$tmp/s1.log"
    check "/health lines only with --verbose" test "$(grep -c ' /health ' "$tmp/s1.log")" = 0
    stop_server
fi
keyfile="$tmp/keys"
printf '\nsk-from-file\n' >"$keyfile"
chmod 644 "$keyfile"
"$convoy" serve -m "$model" --port 0 --api-key-file "$keyfile" >/dev/null 2>"$tmp/kf.txt"
check "--api-key-file readable by others is refused" grep -q "readable by group or others" "$tmp/kf.txt"
chmod 600 "$keyfile"
if start_server "$tmp/s1k.log" --port 0 --api-key-file "$keyfile"; then
    check "--api-key-file: its key lets a request in, none does not" \
        test "$(status "$base/v1/models" -H 'Authorization: Bearer sk-from-file')$(status "$base/v1/models")" = 200401
    stop_server
fi
if start_server "$tmp/s1v.log" --port 0 -v; then
    curl -s -o /dev/null "$base/health"
    check "--verbose: /health at DEBUG" grep -q "DEBUG GET /health 200 from 127.0.0.1" "$tmp/s1v.log"
    stop_server
fi

# 2. browsers
page=(-H 'Origin: https://page.example')
if start_server "$tmp/s2.log" --port 0; then
    curl -s -D "$tmp/pre" -o /dev/null -X OPTIONS "$base/v1/chat/completions" "${page[@]}" \
        -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization, content-type'
    check "a preflight on loopback: 204, any origin, the headers asked" grep -q "204" "$tmp/pre"
    check "  ... Access-Control-Allow-Origin: *" grep -qi "^Access-Control-Allow-Origin: \*" "$tmp/pre"
    check "  ... Access-Control-Allow-Headers: authorization, content-type" \
        grep -qi "^Access-Control-Allow-Headers: authorization, content-type" "$tmp/pre"
    before="$(generated)"
    code="$(status "$base/v1/completions" "${page[@]}" -H 'Content-Type: text/plain' \
        -d '{"prompt":"Once upon a time","max_tokens":8}')"
    check "a cross-origin text/plain POST: 415 (unsupported_media_type)" \
        test "$code" = 415 -a "$(grep -c unsupported_media_type "$tmp/body")" = 1
    check "  ... and nothing was generated" test "$(generated)" = "$before"
    check "the same request as JSON from the page runs" test "$(status "$base/v1/completions" "${page[@]}" \
        -H 'Content-Type: application/json' -d '{"prompt":"Once upon a time","max_tokens":8}')" = 200
    check "a client without Origin may send any type (curl -d)" test "$(status "$base/v1/completions" \
        -d '{"prompt":"Once upon a time","max_tokens":8}')" = 200
    stop_server
fi
if start_server "$tmp/s2b.log" --port 0 --cors https://page.example --strict-model; then
    check "--cors: another origin gets 403" test "$(status "$base/v1/models" -H 'Origin: https://evil.example')" = 403
    curl -s -D "$tmp/pre2" -o /dev/null -X OPTIONS "$base/v1/completions" "${page[@]}" \
        -H 'Access-Control-Request-Method: POST'
    check "--cors: the allowed origin's preflight names it" \
        grep -qi "^Access-Control-Allow-Origin: https://page.example" "$tmp/pre2"
    check "--strict-model: another model name is a 404" test "$(status "$base/v1/completions" \
        -d '{"model":"gpt-3.5-turbo","prompt":"Hi","max_tokens":2}')" = 404
    stop_server
fi

# 3. SIGTERM while 4 requests stream
if start_server "$tmp/s3.log" --port 0 --ctx 4096 --client-slots 4; then
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
    stop_server
    wait "${curls[@]}"
    for i in 1 2 3 4; do
        check "SIGTERM: stream $i ends with an error event, then [DONE]" python3 -c '
import sys
events = [l for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
sys.exit(not (len(events) > 2 and events[-1] == "data: [DONE]" and "shutting_down" in events[-2]))' "$tmp/stream$i"
    done
    check "SIGTERM: the server said it drained" grep -q "SIGTERM: draining" "$tmp/s3.log"
fi

# 4. the command line
"$convoy" serve -m "$model" --draft 16 --port 0 >/dev/null 2>"$tmp/draft.txt"
check "--draft 16 is refused, pointing at --spec-k" grep -q "not a number.*--spec-k 16" "$tmp/draft.txt"
check "--version" grep -q "^convoy [0-9]" <("$convoy" serve --version)
"$convoy" serve -m "$model" -f prompt.txt >/dev/null 2>"$tmp/f.txt"
check "-f (a prompt file) is not a server option" grep -q "unknown option '-f'" "$tmp/f.txt"
"$convoy" serve -hf x --no-such-flag >"$tmp/hf.out" 2>"$tmp/hf.txt"
hf_rc=$?
check "-hf x with an unknown option: exit 2 naming it, no help on stdout, nothing pulled" \
    test "$hf_rc" = 2 -a ! -s "$tmp/hf.out" -a -n "$(grep "unknown option '--no-such-flag'" "$tmp/hf.txt")"
if start_server "$tmp/s4.log" --host 0.0.0.0 --port 0 -ngl 99; then
    check "-ngl 99: accepted, with a note that there is no GPU" \
        grep -q "WARN  -ngl/--n-gpu-layers 99: this build has no GPU" "$tmp/s4.log"
    check "listening beyond loopback without a key warns" \
        grep -q "WARN  listening on 0.0.0.0 without an API key" "$tmp/s4.log"
    stop_server
fi

if ((failures)); then
    echo "$failures failed"
    exit 1
fi
echo "all passed"
