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
#    (4xx OpenAI errors; another model name is served as this one), 8
#    requests bit-identical alone and concurrently
#    in random orders, a full queue (503), a client disconnect that frees
#    its slot, /health and /metrics;
# 2. serves the same model over a pipeline of 2 `convoy stage` nodes on
#    loopback and checks the client basics and that the 8 requests, alone
#    and concurrently, give the texts of step 1; then kills a node: the
#    other takes its layers and gives the same text (a failover); then
#    kills the other: a request gets a 500 error, /health a 503, and the
#    server stays up;
# 3. serves it over a pipeline of this machine and one `convoy stage`
#    (--nodes local,HOST:PORT), checks that the log shows the plan and
#    that completions and chat completions with logprobs (greedy and
#    seeded temperature > 0,
#    streamed or not, alone and concurrently) give step 1's texts and
#    logprobs / top_logprobs bit for bit: jansson prints reals with 17
#    significant digits, so equal text is equal bits;
# 4. serves it over this machine and one stage, kills the stage while a
#    request streams and starts it again 3 s later: the stream pauses and
#    ends with the text of a run without failure, a request sent meanwhile
#    gets its usual text, the same server throughout; then stops the stage
#    while idle (/health turns 503) and continues it (200);
# 5. checks that SIGTERM stops each server cleanly.
# Without npm (or when the install fails) it skips, except under CI=true.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
npm_need "$npm_dir" openai

make_tmp

# serve_v1 LOG ARGS...: start_server of the model on a free port; base is
# the /v1 URL.
serve_v1() {
    start_server "$1" -m "$model" --host 127.0.0.1 --port 0 "${@:2}" && base="$base/v1"
}

# stop_server: SIGTERM, and the server must exit 0 within 10 s.
stop_server() {
    term_server && pass "SIGTERM stops the server (exit 0)"
}

# node resolves ESM imports from the script's folder upwards, not from
# NODE_PATH: run a copy beside node_modules.
cp "$src/tests/test_serve.mjs" "$src/tests/checks.mjs" "$npm_dir/"
run_node() {
    node "$npm_dir/test_serve.mjs" "$@" 2>&1
}

# The logprobs requests of step 3, up to convoy.h's most alternatives.
max_top="$(sed -n 's/^#define CONVOY_MAX_TOP_LOGPROBS \([0-9][0-9]*\).*/\1/p' "$src/include/convoy.h")"
chat='"messages":[{"role":"user","content":"Tell me a story"}]'
lp_routes=(completions completions completions chat/completions chat/completions chat/completions)
lp_bodies=(
    '{"prompt":"Once upon a time","max_tokens":24,"temperature":0,"logprobs":5}'
    '{"prompt":"The little dog","max_tokens":24,"temperature":0.9,"seed":42,"logprobs":'"$max_top"'}'
    '{"prompt":"One day","max_tokens":20,"temperature":0.8,"seed":3,"logprobs":2,"stream":true}'
    '{'"$chat"',"max_tokens":16,"temperature":0,"logprobs":true,"top_logprobs":3}'
    '{'"$chat"',"max_tokens":16,"temperature":1.0,"top_p":0.95,"seed":7,"logprobs":true}'
    '{'"$chat"',"max_tokens":12,"temperature":0,"logprobs":true,"top_logprobs":2,"stream":true}'
)

# fetch_logprobs DIR [concurrent]: sends the logprobs requests to $base one
# after the other (or all at once) and keeps answer I in DIR/I.
fetch_logprobs() {
    local dir="$1" i curls=()
    mkdir -p "$dir"
    for i in "${!lp_bodies[@]}"; do
        curl -s --max-time 60 "$base/${lp_routes[$i]}" -H 'Content-Type: application/json' \
            -d '{"model":"stories260K",'"${lp_bodies[$i]:1}" >"$dir/$i" &
        curls+=("$!")
        [[ "${2:-}" == concurrent ]] || wait "$!"
    done
    wait "${curls[@]}"
}

# same_logprobs REF DIR: whether each answer in DIR has REF's text and
# logprobs (reals compared as printed), and REF's have logprobs at all;
# prints what differs.
same_logprobs() {
    python3 - "$1" "$2" "${#lp_bodies[@]}" <<'EOF'
import json, sys

def answer(path):
    """(text, logprobs) of an answer, streamed or not; reals stay as printed."""
    raw = open(path).read()
    docs = [l[6:] for l in raw.splitlines() if l.startswith('data: ') and l != 'data: [DONE]'] or [raw]
    text, lp = '', {}
    for d in map(lambda d: json.loads(d, parse_float=str), docs):
        if 'error' in d:
            raise ValueError(d['error'].get('message'))
        for ch in d.get('choices', []):
            text += ch.get('text') or (ch.get('message') or ch.get('delta') or {}).get('content') or ''
            for k, v in (ch.get('logprobs') or {}).items():
                if isinstance(v, list):
                    lp.setdefault(k, []).extend(v)
                else:
                    lp[k] = v
    return text, lp

def first_diff(want, have, at=''):
    """Where have first differs from want, and how; None when equal."""
    if isinstance(want, list) and isinstance(have, list) and len(want) == len(have):
        keys = range(len(want))
    elif isinstance(want, dict) and isinstance(have, dict) and want.keys() == have.keys():
        keys = want.keys()
    else:
        return None if want == have else f'{at}: {json.dumps(have)[:160]}, expected {json.dumps(want)[:160]}'
    return next(filter(None, (first_diff(want[k], have[k], f'{at}[{k!r}]') for k in keys)), None)

ref, got, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
bad = 0
for i in range(n):
    try:
        want, have = answer(f'{ref}/{i}'), answer(f'{got}/{i}')
    except ValueError as e:
        print(f'answer {i}: {e}')
        bad += 1
        continue
    if not (want[1].get('tokens') or want[1].get('content')):
        print(f'answer {i}: the reference has no logprobs: {open(f"{ref}/{i}").read()[:300]}')
        bad += 1
    elif want != have:
        print(f'answer {i} differs at (text, logprobs){first_diff(list(want), list(have))}')
        bad += 1
sys.exit(1 if bad else 0)
EOF
}

# 1. one machine
# (--client-slots 4: the suite is one client, which may use every slot here)
if serve_v1 "$tmp/serve.log" --slots 4 --queue 4 --ctx 2048 --batch 32 --chat-template chatml --client-slots 4; then
    if run_node "$base" local "$tmp/alone.json"; then
        pass "local suite"
    else
        fail "local suite (server log: $(tail -5 "$tmp/serve.log"))"
    fi
    fetch_logprobs "$tmp/lp-local"
    stop_server
fi

# 2. a pipeline of two stages on loopback
# start_stage PORT LOG: the model's `convoy stage` on 127.0.0.1:PORT (stage_pid), once it listens.
start_stage() {
    start_local_stage "$convoy" "$2" "$1" -m "$model"
    pids+=("$stage_pid")
}
if [[ -f "$tmp/alone.json" ]] && command -v python3 >/dev/null; then
    start_local_stages "$tmp/stages.log" "$model" "$model"
    stage_pids=("${pids[@]: -2}")
    # prompts go down the chain in pipelined chunks of 8 tokens
    if serve_v1 "$tmp/serve-chain.log" --slots 4 --queue 16 --ctx 2048 --batch 32 --nodes "$nodes" \
        --peer-timeout 5000 --prefill-chunk 8; then
        if run_node "$base" chain "$tmp/alone.json"; then
            pass "pipeline suite (2 stages)"
        else
            fail "pipeline suite (server log: $(tail -5 "$tmp/serve-chain.log"))"
        fi
        # a dead node: the other takes its layers (a failover) and the text
        # stays the same; then the last node dies too: a request gets a 500
        # error naming the problem, /health says 503, the server stays up
        body='{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0}'
        text_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$1"; }
        curl -s -o "$tmp/before.json" --max-time 30 "$base/completions" -d "$body"
        { kill -9 "${stage_pids[1]}" && wait "${stage_pids[1]}"; } 2>/dev/null
        code="$(curl -s -o "$tmp/after.json" -w '%{http_code}' --max-time 30 "$base/completions" -d "$body")"
        # grep without -q: under pipefail, a grep that quits at its match can
        # leave curl writing into a closed pipe, and the check fails at random
        if [[ "$code" == 200 && "$(text_of "$tmp/after.json")" == "$(text_of "$tmp/before.json")" ]] &&
            curl -s "${base%/v1}/metrics" | grep '^convoy_failovers_total 1$' >/dev/null; then
            pass "a dead node: the other node took its layers, the same text, one failover counted"
        else
            fail "a dead node: got $code $(cat "$tmp/after.json"), before: $(cat "$tmp/before.json"), metrics:" \
                "$(curl -s "${base%/v1}/metrics" | grep '^convoy_failovers_total') (log: $(tail -3 "$tmp/serve-chain.log"))"
        fi
        { kill -9 "${stage_pids[0]}" && wait "${stage_pids[0]}"; } 2>/dev/null
        code="$(curl -s -o "$tmp/dead.json" -w '%{http_code}' --max-time 30 "$base/completions" -d "$body")"
        if [[ "$code" == 500 ]] && grep -q '"type":"server_error"' "$tmp/dead.json"; then
            pass "a dead node: 500 with an error ($(head -c 160 "$tmp/dead.json"))"
        else
            fail "a dead node: got $code $(cat "$tmp/dead.json")"
        fi
        code="$(curl -s -o "$tmp/health.json" -w '%{http_code}' --max-time 10 "${base%/v1}/health")"
        if [[ "$code" == 503 ]] && grep -q '"type":"unavailable_error"' "$tmp/health.json"; then
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

# 3. logprobs through a pipeline: this machine's layers, then a stage's,
# which computes them (--split: the planner would keep so small a model here)
if [[ -d "$tmp/lp-local" ]] && command -v python3 >/dev/null; then
    p="$(free_port)"
    start_stage "$p" "$tmp/stage-lp.log"
    if serve_v1 "$tmp/serve-lp.log" --slots 4 --queue 8 --ctx 2048 --batch 32 --chat-template chatml \
        --nodes "local,127.0.0.1:$p" --split 2,3 --peer-timeout 5000; then
        grep -q "INFO  plan: layers \[0, 2) here, \[2, 5) on 127.0.0.1:$p; a token in [0-9.]* ms predicted$" \
            "$tmp/serve-lp.log" &&
            grep -q "INFO  nodes: here: no memory limit, [0-9]* us per layer and token; 127.0.0.1:$p: budget" \
                "$tmp/serve-lp.log" &&
            pass "the head logs the plan and what each node offered: $(grep -o 'nodes: .*' "$tmp/serve-lp.log")" ||
            fail "no plan in the server log: $(grep -m2 "plan: \\|nodes: " "$tmp/serve-lp.log")"
        for how in alone concurrent; do
            fetch_logprobs "$tmp/lp-chain-$how" "$how"
            if out="$(same_logprobs "$tmp/lp-local" "$tmp/lp-chain-$how")"; then
                pass "logprobs over local + 1 stage, requests $how: one machine's, bit for bit"
            else
                fail "logprobs over local + 1 stage, requests $how: $out (server log: $(tail -3 "$tmp/serve-lp.log"))"
            fi
        done
        stop_server
    fi
else
    fail "pipeline logprobs not checked (no local answers or no python3)"
fi

# 4. a restarted node: the only remote stage of local + 1 dies while a
# request streams and comes back 3 s later on the same port (--split pins
# the layers, so nothing else can take them; --failover-wait 6000). The
# stream pauses and ends with the text of a run without failure, a request
# sent meanwhile gets its usual text, one failover is counted, and the
# server was never restarted. Then the stage is stopped while idle: the
# failover gives up, /health says 503; continued, the server serves again
# by itself: /health 200, the same text, one reconnect counted.
health_becomes() { # health_becomes CODE TRIES: polls /health every 0.1 s until it answers CODE
    for _ in $(seq "$2"); do
        code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "${base%/v1}/health")"
        [[ "$code" == "$1" ]] && return 0
        sleep 0.1
    done
    return 1
}
completion_text() { # completion_text BODY: the text of a non-streamed completion
    curl -s --max-time 30 "$base/completions" -d "$1" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>/dev/null
}
stream_text() { # stream_text FILE: the text of a streamed completion, or its error
    python3 -c '
import json, sys
text = []
for line in open(sys.argv[1]):
    if line.startswith("data: {"):
        ev = json.loads(line[6:])
        if "error" in ev:
            print("error:", ev["error"]); sys.exit(1)
        text.append(ev["choices"][0]["text"])
print("".join(text))' "$1"
}
# stream_until_stopped: starts a long stream and stops the stage (SIGSTOP)
# once tokens flow and before the stream ends; retries a few times.
stream_until_stopped() {
    local body="${long%\}},\"stream\":true}"
    for _ in 1 2 3 4 5; do
        : >"$tmp/rs-stream.txt"
        curl -s -N --max-time 60 "$base/completions" -d "$body" >"$tmp/rs-stream.txt" &
        stream_pid=$!
        until grep -q '^data: {' "$tmp/rs-stream.txt" || ! kill -0 "$stream_pid" 2>/dev/null; do sleep 0.005; done
        kill -STOP "$stage_pid"
        grep -q 'DONE' "$tmp/rs-stream.txt" || return 0
        kill -CONT "$stage_pid"
        wait "$stream_pid"
    done
    return 1
}
if command -v python3 >/dev/null; then
    p="$(free_port)"
    start_stage "$p" "$tmp/stage-rs.log"
    if serve_v1 "$tmp/serve-rs.log" --slots 2 --ctx 2048 --nodes "local,127.0.0.1:$p" --split 2,3 \
        --peer-timeout 5000 --failover-wait 6000; then
        body='{"model":"stories260K","prompt":"Once upon a time","max_tokens":48,"temperature":0}'
        long='{"model":"stories260K","prompt":"Once","max_tokens":1900,"temperature":0,"ignore_eos":true}'
        before="$(completion_text "$body")"
        reference="$(completion_text "$long")"
        if stream_until_stopped; then
            { kill -9 "$stage_pid" && wait "$stage_pid"; } 2>/dev/null
            completion_text "$body" >"$tmp/rs-meanwhile.txt" &
            meanwhile_pid=$!
            sleep 3
            start_stage "$p" "$tmp/stage-rs.log"
            wait "$stream_pid" "$meanwhile_pid"
            [[ -n "$reference" && "$(stream_text "$tmp/rs-stream.txt")" == "$reference" ]] &&
                pass "a stream whose only node died and came back 3 s later ends with the text of a clean run" ||
                fail "the stream whose node died: $(stream_text "$tmp/rs-stream.txt" | tail -c 200) (log: $(tail -3 "$tmp/serve-rs.log"))"
            [[ -n "$before" && "$(cat "$tmp/rs-meanwhile.txt")" == "$before" ]] && kill -0 "$server_pid" &&
                pass "a request sent while the node was away: the usual text, the same server" ||
                fail "a request sent while the node was away: '$(cat "$tmp/rs-meanwhile.txt")', not '$before'"
            curl -s --max-time 10 "${base%/v1}/metrics" | grep '^convoy_failovers_total 1$' >/dev/null &&
                pass "/metrics counts one failover" || fail "/metrics: $(curl -s "${base%/v1}/metrics" | grep failover)"
            # stopped while idle: the idle check (every 0.5 s, --peer-timeout 5000)
            # finds it and the failover gives up; continued, it is served again
            kill -STOP "$stage_pid"
            health_becomes 503 400 && pass "a stage stopped while idle: /health 503 within 40 s" ||
                fail "a stage stopped while idle: /health still $code"
            # /health is 503 from the failover's start: continue once it gave up
            for _ in $(seq 400); do
                curl -s --max-time 10 "${base%/v1}/metrics" | grep '^convoy_pipeline_down 1$' >/dev/null && break
                sleep 0.1
            done
            kill -CONT "$stage_pid"
            health_becomes 200 150 && [[ "$(completion_text "$body")" == "$before" ]] &&
                pass "the stage continued: /health 200 and the same text" ||
                fail "the stage continued: /health $code (log: $(tail -3 "$tmp/serve-rs.log"))"
            curl -s --max-time 10 "${base%/v1}/metrics" |
                grep '^convoy_pipeline_reconnects_total 1$' >/dev/null &&
                pass "/metrics counts one reconnect" || fail "/metrics: $(curl -s "${base%/v1}/metrics" | grep pipeline)"
        else
            fail "no stream could be caught mid-way"
        fi
        stop_server
    fi
fi

checks_summary
