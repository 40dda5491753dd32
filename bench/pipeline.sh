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
. "$(dirname "$0")/lib.sh"
mode="${1:-loopback}"
tokens="${TOKENS:-64}"
bench_build convoy bench_pipeline
model="${MODEL:-$(bench_model llama-1b-q4_0 --shape llama-3.2-1b --type Q4_0)}"

case "$mode" in
loopback)
    make_tmp
    for i in 0 1; do
        taskset -c "$i" "$convoy" stage --listen "127.0.0.1:780$i" -m "$model" 2>"$tmp/stage$i.log" &
        pids+=($!)
        stage_listens "$tmp/stage$i.log" "780$i" 100 0.1 || die "no stage at 127.0.0.1:780$i"
    done
    taskset -c 0 "$build/bench_pipeline" -m "$model" -n "$tokens" --label "loopback, pinned" \
        --chain 127.0.0.1:7800,127.0.0.1:7801
    ;;
hosts)
    test_hosts cvb 5
    for h in 1 2 3 4; do
        bash "$cluster" run "$h" taskset -c $(((h + 1) % 2)) "$convoy" stage \
            --listen "$(host_addr "$h"):7000" -m "$model" --insecure 2>"$tmp/stage$h.log" &
        pids+=($!)
        stage_listens "$tmp/stage$h.log" 7000 100 0.1 || die "no stage on host $h"
    done
    n() { local l=""; for h in $(seq 1 "$1"); do l+="${l:+,}10.77.0.$((h + 1)):7000"; done; echo "$l"; }
    on 0 taskset -c 0 "$build/bench_pipeline" -m "$model" -n "$tokens" \
        --label "test hosts" --chain "$(n 2)" --chain "$(n 3)" --chain "$(n 4)"
    ;;
*)
    echo "usage: bench/pipeline.sh loopback|hosts" >&2
    exit 2
    ;;
esac
