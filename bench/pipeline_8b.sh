#!/usr/bin/env bash
# pipeline_8b.sh: a model larger than any node's budget, served by 4 nodes.
#
# Makes (once) a synthetic Llama-3.1-8B-shaped Q4_0 model (about 4.1 GB) in
# bench/out/models, then:
#  1. a single machine with --mem 1.5G refuses it, naming what it needs;
#  2. a single node started with --mem 1.5G refuses it (the head's plan);
#  3. 4 stages, each on its own test host with --mem 1.5G, serve it: the
#     head generates TOKENS (default 16) greedy tokens, identical to the
#     unsplit model's on this (larger) machine when UNSPLIT=1;
# and prints each stage's layers and peak resident memory (VmHWM), which grows
# with its share of the model, not with the file.
set -euo pipefail
cd "$(dirname "$0")/.."
tokens="${TOKENS:-16}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
make --no-print-directory -C build -j2 convoy >/dev/null
mkdir -p bench/out/models
model=bench/out/models/llama-8b-q4_0.gguf
[[ -f "$model" ]] || build/convoy synth --shape llama-3.1-8b --type Q4_0 -o "$model" >/dev/null
echo "model: $model, $(stat -c %s "$model") bytes"

export CONVOY_CLUSTER_PREFIX=cveight
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; bash scripts/cluster.sh down' EXIT
bash scripts/cluster.sh up 5 >/dev/null
on() { bash scripts/cluster.sh run "$@"; }
addr() { echo "10.77.0.$(($1 + 1))"; }
start_stage() {
    bash scripts/cluster.sh run "$1" build/convoy stage --listen "$(addr "$1"):7000" -m "$model" --mem 1.5G \
        2>"bench/out/stage$1.log" &
    pids+=($!)
    for _ in $(seq 100); do
        on 0 bash -c "exec 3<>/dev/tcp/$(addr "$1")/7000" 2>/dev/null && return
        sleep 0.1
    done
}
args=(-m "$model" -p "Once upon a time" -n "$tokens" --temp 0 --ignore-eos --ctx 2048 --batch 64 --ids)

echo "== 1. one machine, --mem 1.5G"
build/convoy run "${args[@]}" --mem 1.5G || true
echo "== 2. one node with --mem 1.5G"
start_stage 1
on 0 build/convoy run "${args[@]}" --nodes "$(addr 1):7000" || true
echo "== 3. four nodes with --mem 1.5G each"
for h in 2 3 4; do start_stage "$h"; done
start=$(date +%s)
on 0 build/convoy run "${args[@]}" --nodes "$(addr 1):7000,$(addr 2):7000,$(addr 3):7000,$(addr 4):7000" \
    >bench/out/8b-chain.ids
echo "tokens: $(cat bench/out/8b-chain.ids) ($(($(date +%s) - start)) s with the handshake)"
for h in 1 2 3 4; do
    echo "stage on host $h: $(grep serving "bench/out/stage$h.log" | tail -1 | sed 's/convoy stage: //');" \
        "peak resident (VmHWM) $(grep VmHWM "/proc/${pids[$((h - 1))]}/status" | awk '{printf "%.2f GB", $2 / 1e6}')"
done
if [[ "${UNSPLIT:-0}" == 1 ]]; then
    build/convoy run "${args[@]}" >bench/out/8b-unsplit.ids
    cmp -s bench/out/8b-chain.ids bench/out/8b-unsplit.ids && echo "identical to the unsplit model's tokens" ||
        echo "DIFFERENT from the unsplit model's tokens: $(cat bench/out/8b-unsplit.ids)"
fi
