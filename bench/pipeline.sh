#!/usr/bin/env bash
# pipeline.sh: single-user decode through pipelines against the unsplit
# model (bench/bench_pipeline.c does the measuring).
#
#   bench/pipeline.sh loopback   2 stages on 127.0.0.1, stage i pinned to core i, the head and
#                                the unsplit baseline on core 0, 1 thread each (the parity check)
#   bench/pipeline.sh hosts      2-, 3- and 4-stage chains, each stage on its own test host
#                                (scripts/cluster.sh; stages alternate between the cores)
#
# MODEL (default: a synthetic Llama-3.2-1B-shaped Q4_0, made once in bench/out/models) and
# TOKENS (default 64) can be set in the environment. Raw lines go to bench/out/pipeline.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-loopback}"
tokens="${TOKENS:-64}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
make --no-print-directory -C build -j2 convoy bench_pipeline >/dev/null
mkdir -p bench/out/models
model="${MODEL:-bench/out/models/llama-1b-q4_0.gguf}"
[[ -f "$model" ]] || build/convoy synth --shape llama-3.2-1b --type Q4_0 -o "$model" >/dev/null

pids=()
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    [[ "$mode" == hosts ]] && CONVOY_CLUSTER_PREFIX=cvb bash scripts/cluster.sh down
    return 0
}
trap cleanup EXIT

wait_port() { # wait_port [HOST_INDEX] ADDR PORT
    for _ in $(seq 100); do
        if [[ $# -eq 3 ]]; then
            CONVOY_CLUSTER_PREFIX=cvb bash scripts/cluster.sh run "$1" bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null && return
        else
            (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return
        fi
        sleep 0.1
    done
    echo "pipeline.sh: no stage at $*" >&2
    exit 1
}

case "$mode" in
loopback)
    for i in 0 1; do
        taskset -c "$i" build/convoy stage --listen "127.0.0.1:780$i" -m "$model" 2>/dev/null &
        pids+=($!)
        wait_port 127.0.0.1 "780$i"
    done
    taskset -c 0 build/bench_pipeline -m "$model" -n "$tokens" --label "loopback, pinned" \
        --chain 127.0.0.1:7800,127.0.0.1:7801
    ;;
hosts)
    export CONVOY_CLUSTER_PREFIX=cvb
    bash scripts/cluster.sh up 5 >/dev/null
    for h in 1 2 3 4; do
        bash scripts/cluster.sh run "$h" taskset -c $(((h + 1) % 2)) build/convoy stage \
            --listen "10.77.0.$((h + 1)):7000" -m "$model" --insecure 2>/dev/null &
        pids+=($!)
        wait_port 0 "10.77.0.$((h + 1))" 7000
    done
    n() { local l=""; for h in $(seq 1 "$1"); do l+="${l:+,}10.77.0.$((h + 1)):7000"; done; echo "$l"; }
    bash scripts/cluster.sh run 0 taskset -c 0 build/bench_pipeline -m "$model" -n "$tokens" \
        --label "test hosts" --chain "$(n 2)" --chain "$(n 3)" --chain "$(n 4)"
    ;;
*)
    echo "usage: bench/pipeline.sh loopback|hosts" >&2
    exit 2
    ;;
esac
