#!/usr/bin/env bash
# test_serve.sh: `convoy serve` end to end with the official `openai` npm
# client (tests/test_serve.mjs does the checks).
#
# Usage (CTest passes these): test_serve.sh PATH/TO/convoy SOURCE_DIR
#
# Installs `openai` under BUILD_DIR/npm (once), then:
# 1. serves stories260K on a free loopback port (4 slots, a queue of 4, a
#    32-token batch so prompts go through in chunks, ChatML) and runs the
#    whole suite: streamed and non-streamed completions and chat
#    completions, stop strings, seeds, penalties, logprobs, bad requests
#    (4xx OpenAI errors), 8 requests bit-identical alone and concurrently
#    in random orders, a full queue (503), a client disconnect that frees
#    its slot, /health and /metrics;
# 2. serves the same model over a pipeline of 2 `convoy stage` nodes on
#    loopback and checks the client basics and that the 8 requests, alone
#    and concurrently, give the texts of step 1; then kills a node: a
#    request gets a 500 error, /health a 503, and the server stays up;
# 3. checks that SIGTERM stops the server cleanly.
# Without npm (or when the install fails) it skips, except under CI=true.
set -uo pipefail

convoy="${1:?usage: test_serve.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_serve.sh PATH/TO/convoy SOURCE_DIR}"
shared="${CONVOY_SHARED:-$src/../shared}"
model="$shared/models/stories260K.gguf"
npm_dir="$(cd "$(dirname "$convoy")" && pwd)/npm"

. "$src/tests/lib.sh"
[[ -f "$model" ]] || skip "test data $model not found"
command -v node >/dev/null && command -v npm >/dev/null || skip "node and npm are needed for the openai client"
if [[ ! -f "$npm_dir/node_modules/openai/package.json" ]]; then
    npm install --silent --no-audit --no-fund --prefix "$npm_dir" openai >/dev/null 2>&1 ||
        skip "npm install openai failed (offline?)"
fi

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

# start_server LOG ARGS...: starts convoy serve on a free port; sets
# server_pid and base (the /v1 URL), or fails.
start_server() {
    local log="$1"
    shift
    "$convoy" serve -m "$model" --host 127.0.0.1 --port 0 "$@" 2>"$log" &
    server_pid=$!
    pids+=("$server_pid")
    local port=""
    for _ in $(seq 100); do
        port="$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\)/v1.*|\1|p' "$log")"
        [[ -n "$port" ]] && break
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -z "$port" ]]; then
        fail "convoy serve did not start: $(cat "$log")"
        return 1
    fi
    base="http://127.0.0.1:$port/v1"
}

# stop_server: SIGTERM, and the server must exit 0 within 10 s.
stop_server() {
    kill -TERM "$server_pid"
    local rc=""
    for _ in $(seq 100); do
        kill -0 "$server_pid" 2>/dev/null || { wait "$server_pid"; rc=$?; break; }
        sleep 0.1
    done
    if [[ "$rc" == 0 ]]; then
        pass "SIGTERM stops the server (exit 0)"
    else
        fail "the server did not stop cleanly on SIGTERM (status '${rc:-still running}')"
        kill -9 "$server_pid" 2>/dev/null
    fi
}

# node resolves ESM imports from the script's folder upwards, not from
# NODE_PATH: run a copy beside node_modules.
cp "$src/tests/test_serve.mjs" "$npm_dir/test_serve.mjs"
run_node() {
    node "$npm_dir/test_serve.mjs" "$@" 2>&1
}

# 1. one machine
if start_server "$tmp/serve.log" --slots 4 --queue 4 --ctx 2048 --batch 32 --chat-template chatml; then
    if run_node "$base" local "$tmp/alone.json"; then
        pass "local suite"
    else
        fail "local suite (server log: $(tail -5 "$tmp/serve.log"))"
    fi
    stop_server
fi

# 2. a pipeline of two stages on loopback
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
if [[ -f "$tmp/alone.json" ]] && command -v python3 >/dev/null; then
    nodes=""
    stage_pids=()
    for i in 1 2; do
        p="$(free_port)"
        "$convoy" stage --listen "127.0.0.1:$p" -m "$model" 2>"$tmp/stage$i.log" &
        pids+=("$!")
        stage_pids+=("$!")
        nodes="${nodes:+$nodes,}127.0.0.1:$p"
    done
    sleep 0.5
    if start_server "$tmp/serve-chain.log" --slots 4 --queue 16 --ctx 2048 --batch 32 --nodes "$nodes" \
        --timeout 5000; then
        if run_node "$base" chain "$tmp/alone.json"; then
            pass "pipeline suite (2 stages)"
        else
            fail "pipeline suite (server log: $(tail -5 "$tmp/serve-chain.log"))"
        fi
        # a dead node: requests get a 500 error naming the problem, /health
        # says 503, the server stays up and still answers
        { kill -9 "${stage_pids[1]}" && wait "${stage_pids[1]}"; } 2>/dev/null
        body='{"model":"stories260K","prompt":"Once upon a time","max_tokens":8}'
        code="$(curl -s -o "$tmp/dead.json" -w '%{http_code}' --max-time 30 "$base/completions" -d "$body")"
        if [[ "$code" == 500 ]] && grep -q '"type":"server_error"' "$tmp/dead.json"; then
            pass "a dead node: 500 with an error ($(head -c 160 "$tmp/dead.json"))"
        else
            fail "a dead node: got $code $(cat "$tmp/dead.json")"
        fi
        code="$(curl -s -o "$tmp/health.json" -w '%{http_code}' --max-time 10 "${base%/v1}/health")"
        if [[ "$code" == 503 ]] && grep -q '"status":"error"' "$tmp/health.json"; then
            pass "/health reports the failed engine (503)"
        else
            fail "/health after a dead node: got $code $(cat "$tmp/health.json")"
        fi
        code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$base/models")"
        [[ "$code" == 200 ]] && pass "the server still answers" || fail "the server does not answer ($code)"
        stop_server
    fi
else
    fail "pipeline suite not run (no local results or no python3)"
fi

if ((failures)); then
    echo "$failures failed"
    exit 1
fi
echo "all passed"
