#!/usr/bin/env bash
# test_failover.sh: a stage that dies or stops loses no request.
#
# Usage (CTest passes these): test_failover.sh PATH/TO/convoy SOURCE_DIR
#
# A synthetic model (1024 wide, 6 layers, Q4_0, made once beside the
# build), stages A, B, C and a standby S on loopback, and `convoy serve
# --nodes A,B,C --standby S --peer-timeout 2000`, every link keyed. Four streaming completions
# at once, 200 tokens each: two greedy, two at temperature 0.8 with seeds
# (one held to a grammar: its state is replayed too).
# 1. Without failure: the reference texts.
# 2. SIGKILL of the middle stage B once the streams have 400 chunks (mid-stream): all four
#    complete with the reference texts, /metrics counts one failover, the
#    server log names B; the pause (kill to the next chunk) is printed.
# 3. B restarted; SIGSTOP of C, now serving, once the streams have 400
#    chunks: the same texts, C named within --peer-timeout, two failovers.
# 4. C resumed; two greedy completions of 64 tokens, one with a prompt of
#    about 400 tokens, which goes down the chain in pipelined chunks
#    (cache_prompt false: every time); then again with SIGKILL of the
#    first stage A once the server has run 150 of their prompt tokens:
#    the same texts, three failovers, and the kill came before the long
#    prompt's first token.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3 "for the streaming clients"
need curl

model="$(synth_1024x6 "$convoy")" || exit 1

make_tmp
declare -A stage_of=()
server_pid=""
# a stage may be stopped (SIGSTOP): resumed first, so that it can die
at_exit 'for p in "${stage_of[@]}" $server_pid; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done; wait 2>/dev/null'

declare -A port_of=()
for s in A B C S; do port_of[$s]="$(free_port)"; done
key="$tmp/cluster.key"
"$convoy" keygen "$key" >/dev/null || { echo "FAIL: convoy keygen"; exit 1; }
start_stage() { # NAME
    start_local_stage "$convoy" "$tmp/stage-$1.log" "${port_of[$1]}" -m "$model" --key "$key"
    stage_of[$1]=$stage_pid
}
for s in A B C S; do start_stage "$s"; done
addr() { echo "127.0.0.1:${port_of[$1]}"; }

port="$(free_port)"
base="http://127.0.0.1:$port/v1"
"$convoy" serve -m "$model" --port "$port" --slots 4 --client-slots 4 --ctx 512 --peer-timeout 2000 \
    --nodes "$(addr A),$(addr B),$(addr C)" --standby "$(addr S)" --key "$key" 2>"$tmp/serve.log" &
server_pid=$!
for _ in $(seq 300); do
    curl -sf "${base%/v1}/health" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sf "${base%/v1}/health" >/dev/null || { fail "the server did not start: $(tail -5 "$tmp/serve.log")"; exit 1; }

python3 - >"$tmp/requests.json" <<'EOF'
import json
base = {"model": "synth-1024x6-q4_0", "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True}
reqs = [dict(base, temperature=0),
        dict(base, prompt="The fox", temperature=0),
        dict(base, temperature=0.8, seed=11),
        dict(base, prompt="In a town", temperature=0.8, seed=12, grammar='root ::= [a-z ]+')]
print(json.dumps(reqs))
EOF
python3 - >"$tmp/prompt-requests.json" <<'EOF'
import json
base = {"model": "synth-1024x6-q4_0", "max_tokens": 64, "ignore_eos": True, "temperature": 0}
print(json.dumps([dict(base, prompt="The fox jumps over the dog. " * 33, cache_prompt=False),
                  dict(base, prompt="Once upon a time")]))
EOF
reqs="$tmp/requests.json"
metric() { curl -s "${base%/v1}/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
failovers() { metric convoy_failovers_total; }
# chunks_past N NAME: the streams of NAME have N text chunks.
chunks_past() { (($(cut -d' ' -f1 "$tmp/$2.progress" 2>/dev/null || echo 0) >= $1)); }
# prompt_past N: the server has run N prompt tokens in all.
prompt_past() { (($(metric convoy_prompt_tokens_total) >= $1)); }
# streams NAME [SIG PID [READY...]]: the requests of $reqs at once, the
# report in NAME.json (tools/stream_client.py); with SIG, sends it to PID once the
# command READY succeeds (default: chunks_past 400 NAME, mid-stream) and
# notes when in NAME.signal.
streams() {
    python3 "$src/tools/stream_client.py" "$base" "$reqs" "$tmp/$1.json" --concurrency 4 \
        --progress "$tmp/$1.progress" &
    local client=$! name="$1"
    if [[ $# -gt 1 ]]; then
        local sig="$2" pid="$3"
        shift 3
        [[ $# -gt 0 ]] || set -- chunks_past 400 "$name"
        until "$@" || ! kill -0 "$client" 2>/dev/null; do
            sleep 0.01
        done
        kill -"$sig" "$pid"
        date +%s.%N >"$tmp/$name.signal"
    fi
    wait "$client"
}
# pause NAME: the longest wait for a chunk after the signal (any stream).
pause() {
    python3 -c 'import json, sys
t = float(open(sys.argv[2]).read())
times = [x for x in json.load(open(sys.argv[1]))["chunk_times"] if x > t]
print(round(max(b - a for a, b in zip([t] + times, times)), 2) if times else "none")' "$tmp/$1.json" "$tmp/$1.signal"
}
field() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps(r[sys.argv[2]]))" "$@"; }

streams clean
if [[ "$(field "$tmp/clean.json" tokens)" == "[200, 200, 200, 200]" && "$(field "$tmp/clean.json" errors)" == "[null, null, null, null]" ]] &&
    python3 -c 'import json, re, sys; t = json.load(open(sys.argv[1]))["texts"][3]; sys.exit(not re.fullmatch("[a-z ]+", t))' "$tmp/clean.json"; then
    pass "four streams of 200 tokens without failure (the fourth held to its grammar)"
else
    fail "the clean run: tokens $(field "$tmp/clean.json" tokens), errors $(field "$tmp/clean.json" errors)"
fi

# check_run NAME RUN N_FAILOVERS NODE [CLEAN]: the texts and errors (none)
# are those of CLEAN (default: clean) and the server failed over N times,
# naming NODE.
check_run() {
    local name="$1" report="$tmp/$2.json" clean="$tmp/${5:-clean}.json"
    if [[ "$(field "$report" texts)" == "$(field "$clean" texts)" &&
        "$(field "$report" errors)" == "$(field "$clean" errors)" ]]; then
        pass "$name: the texts are the clean run's (the longest pause after the signal: $(pause "$2") s)"
    else
        fail "$name: $(head -c 600 "$report") / server: $(tail -3 "$tmp/serve.log")"
    fi
    if [[ "$(failovers)" == "$3" ]] && grep -q "failing over: node $4" "$tmp/serve.log"; then
        pass "$name: failover $3 counted, the log names $4: $(grep 'new chain' "$tmp/serve.log" | tail -1)"
    else
        fail "$name: failovers $(failovers), log: $(grep -E 'failing|chain|down' "$tmp/serve.log" | tail -3)"
    fi
}

streams kill KILL "${stage_of[B]}"
check_run "SIGKILL of the middle stage" kill 1 "$(addr B)"

kill -9 "${stage_of[B]}" 2>/dev/null
wait "${stage_of[B]}" 2>/dev/null
start_stage B
streams stop STOP "${stage_of[C]}"
check_run "SIGSTOP of a serving stage" stop 2 "$(addr C)"
if grep -q "node $(addr C): no result and no sign of work for 2000 ms" "$tmp/serve.log"; then
    pass "the stopped stage was named after 2000 ms of silence (--peer-timeout)"
else
    fail "the stopped stage was not detected by silence: $(grep failing "$tmp/serve.log" | tail -1)"
fi

kill -CONT "${stage_of[C]}"
reqs="$tmp/prompt-requests.json"
streams prompt-clean
if [[ "$(field "$tmp/prompt-clean.json" tokens)" == "[64, 64]" &&
    "$(field "$tmp/prompt-clean.json" errors)" == "[null, null]" ]]; then
    pass "a long prompt in pipelined chunks and a short one, 64 tokens each, without failure"
else
    fail "the clean run of the long prompt: $(head -c 600 "$tmp/prompt-clean.json")"
fi
# the kill once the first chunk (64 of about 300 tokens) is in: at +150 it came once after the last
streams prompt KILL "${stage_of[A]}" prompt_past $(($(metric convoy_prompt_tokens_total) + 64))
check_run "SIGKILL of the first stage during a long prompt" prompt 3 "$(addr A)" prompt-clean
before="$(python3 -c 'import json, sys
first = json.load(open(sys.argv[1]))["first_chunk"][0]
print(round(first - float(open(sys.argv[2]).read()), 2) if first else "none")' "$tmp/prompt.json" "$tmp/prompt.signal")"
if [[ "$before" != none && "$before" != -* ]]; then
    pass "the kill came while the long prompt was in its chunks (its first token $before s later)"
else
    fail "the kill did not come during the long prompt (its first token $before s after it)"
fi

checks_summary
