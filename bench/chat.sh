#!/usr/bin/env bash
# chat.sh: a conversation's later turns with the prompt cache against the
# same chat without it (bench/chat.py, `convoy serve` on 4 slots).
#
#   bench/chat.sh [MODEL]
#
# MODEL: default a synthetic Llama-3.2-1B-shaped Q4_K model with a ChatML
# template (made once in bench/out/models). A chat of TURNS (default 8)
# turns, each adding about 150 user tokens and asking for 64 (greedy,
# ignore_eos, held to lowercase words: see chat.py), the client sending the
# whole history, its answers as text: with the cache
# (cache_prompt default) and with cache_prompt: false, alternated in one
# run, on one machine at 1 and 2 threads (core 0, cores 0-1) and on a
# 2-stage chain on two test hosts (scripts/cluster.sh: host 0 on core 0
# runs the server and the first stage, host 1 on core 1 the second). Each
# prints the time to first token of turn 1 and of the last turn and their
# ratio, and the share of the history each later turn took from the cache;
# then 4 users chat at once on the 4 slots (one machine, 2 threads).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
turns="${TURNS:-8}"
bench_build
model="${1:-$(bench_model llama-1b-q4_k-chatml --shape llama-3.2-1b --type Q4_K --chatml)}"

test_hosts cvc 2

# serve HOST CPUS THREADS [ARGS...]: a server in test host HOST on CPUS; waits until it answers.
serve() {
    local host="$1" cpus="$2" threads="$3"
    shift 3
    bash "$cluster" run "$host" taskset -c "$cpus" "$convoy" serve -m "$model" --port 8080 --ctx 4096 \
        -t "$threads" "$@" 2>bench/out/chat-serve.log &
    pids+=($!)
    for _ in $(seq 600); do
        on "$host" curl -sf localhost:8080/health >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "the server did not start: $(tail -3 bench/out/chat-serve.log)"
}

# chats LABEL: the chat with the cache and without, alternated, from host 0.
chats() {
    for mode in cache no-cache; do
        on 0 python3 bench/chat.py http://127.0.0.1:8080 "$1 $mode" --turns "$turns" \
            $([[ $mode == no-cache ]] && echo --no-cache)
    done
}

echo "== one machine, 1 thread"
serve 0 0 1
chats "1 thread"
stop_pids
echo "== one machine, 2 threads"
serve 0 0-1 2
chats "2 threads"
stop_pids
echo "== 2-stage chain (host 0 core 0: server + first stage; host 1 core 1: second stage)"
bash "$cluster" run 1 taskset -c 1 "$convoy" stage --listen 10.77.0.2:7000 -m "$model" -t 1 --insecure 2>/dev/null &
pids+=($!)
for _ in $(seq 100); do
    on 0 bash -c "exec 3<>/dev/tcp/10.77.0.2/7000" 2>/dev/null && break
    sleep 0.1
done
serve 0 0 1 --nodes local,10.77.0.2:7000 --insecure
chats "chain"
stop_pids
echo "== 4 users at once on 4 slots, one machine, 2 threads"
serve 0 0-1 2 --slots 4 --client-slots 4
on 0 python3 bench/chat.py http://127.0.0.1:8080 "4 users cache" --users 4 --turns "$turns"
stop_pids
