#!/usr/bin/env bash
# pipeline_8b.sh: a model larger than any node's budget, served by 4 nodes,
# each within its --mem.
#
# Makes (once) a synthetic Llama-3.1-8B-shaped Q4_0 model (about 4.1 GB) in
# bench/out/models, then:
#  1. a single machine with --mem 1.5G refuses it, naming what it needs;
#  2. a single node started with --mem 1.5G refuses it (the head's plan);
#  3. 4 stages, each on its own test host with the same --mem, at the edge
#     of the fit: the smallest budget (to STEP_MB, default 8 MB) at which the
#     head plans the model over them, found by bisection with 1-token runs,
#     and that budget + 5%. At each the head generates TOKENS (default 16)
#     greedy tokens (identical to the unsplit model's on this larger machine
#     when UNSPLIT=1), and the script prints each stage's layers and peak
#     resident memory (VmHWM: anonymous memory and touched weight pages)
#     against its --mem; a stage over it is a failure (exit 1).
# BUILD (default build) is the build folder; CONVOY_CLUSTER_PREFIX (default
# cveight) names the test hosts, so two runs on one machine can coexist.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tokens="${TOKENS:-16}" step_mb="${STEP_MB:-8}"
bench_build
model="$(bench_model llama-8b-q4_0 --shape llama-3.1-8b --type Q4_0)"
echo "model: $model, $(stat -c %s "$model") bytes"

export CONVOY_CLUSTER_PREFIX="${CONVOY_CLUSTER_PREFIX:-cveight}"
logs="bench/out/8b-$CONVOY_CLUSTER_PREFIX"
mkdir -p "$logs"
test_hosts "$CONVOY_CLUSTER_PREFIX" 5
# start_stage HOST BUDGET: a stage on test host HOST with --mem BUDGET; its
# pid is pid_of[HOST]
declare -A pid_of
start_stage() {
    : >"$logs/stage$1.log"
    start_host_stage "$cluster" "$1" "$convoy" "$logs/stage$1.log" -m "$model" --mem "$2" --insecure || true
    pids+=("$stage_pid")
    pid_of[$1]=$stage_pid
}
args=(-m "$model" -p "Once upon a time" --temp 0 --ignore-eos --ctx 2048 --batch 64 --ids --insecure)
nodes="$(host_addr 1):7000,$(host_addr 2):7000,$(host_addr 3):7000,$(host_addr 4):7000"
# chain BUDGET_MB N: 4 stages with --mem BUDGET_MB M generate N tokens
# (output in $logs/chain.ids, messages in $logs/head.log); the stages stay up
chain() {
    for h in 1 2 3 4; do start_stage "$h" "$1M"; done
    on 0 "$convoy" run "${args[@]}" -n "$2" --nodes "$nodes" >"$logs/chain.ids" 2>"$logs/head.log"
}

echo "== 1. one machine, --mem 1.5G"
"$convoy" run "${args[@]}" -n "$tokens" --mem 1.5G || true
echo "== 2. one node with --mem 1.5G"
start_stage 1 1.5G
on 0 "$convoy" run "${args[@]}" -n "$tokens" --nodes "$(host_addr 1):7000" || true
stop_pids

echo "== 3. four nodes at the edge of the fit"
lo=512 hi=2048 # MB: the plan fails at lo and works at hi
chain "$hi" 1 || { echo "the plan fails even at $hi MB per node: $(cat "$logs/head.log")"; exit 1; }
stop_pids
while ((hi - lo > step_mb)); do
    mid=$(((lo + hi) / 2))
    if chain "$mid" 1; then hi=$mid; else lo=$mid; fi
    stop_pids
done
over=0
for budget in "$hi" "$((hi * 105 / 100))"; do
    start=$(date +%s)
    chain "$budget" "$tokens" || { echo "budget $budget MB: $(cat "$logs/head.log")"; exit 1; }
    echo "--mem ${budget}M ($((budget * 1048576)) bytes) on each of 4 stages: tokens $(cat "$logs/chain.ids")" \
        "($(($(date +%s) - start)) s with the handshake)"
    for h in 1 2 3 4; do
        hwm_kb="$(awk '/VmHWM/ {print $2}' "/proc/${pid_of[$h]}/status")"
        echo "  stage on host $h: $(grep serving "$logs/stage$h.log" | tail -1 | sed 's/convoy stage: //');" \
            "peak resident (VmHWM) $((hwm_kb / 1024)) MB of --mem ${budget} MB" \
            "($(awk -v a="$hwm_kb" -v b="$budget" 'BEGIN { printf "%.1f%%", 100 * a / (b * 1024) }'))"
        ((hwm_kb <= budget * 1024)) || over=$((over + 1))
    done
    stop_pids
done
if [[ "${UNSPLIT:-0}" == 1 ]]; then
    cp "$logs/chain.ids" bench/out/8b-chain.ids
    "$convoy" run "${args[@]}" -n "$tokens" >bench/out/8b-unsplit.ids
    cmp -s bench/out/8b-chain.ids bench/out/8b-unsplit.ids && echo "identical to the unsplit model's tokens" ||
        echo "DIFFERENT from the unsplit model's tokens: $(cat bench/out/8b-unsplit.ids)"
fi
((over == 0)) || { echo "FAIL: $over stage(s) over their --mem"; exit 1; }
