#!/usr/bin/env bash
# spec.sh: speculative decoding across pipelines on test hosts, with 0, 10,
# 50 and 100 ms one-way delay on every hop (bench/bench_spec.c measures).
#
# Host 0 runs the head (and the draft); hosts 1..3 run `convoy stage`, each
# pinned to a core. A link emulator (tools/linkemu via scripts/cluster.sh
# delay) in front of each node adds the delay both ways, so the head's
# FORWARD, every node-to-node hop and the RESULT back each pay it: one
# traversal of an S-stage chain crosses S + 1 delayed hops.
#
# MODEL (default: ../shared/models/stories260K.gguf), TOKENS (128), PROMPTS (1),
# DELAYS ("0 10 50 100"), STAGES ("1 2 3") and KS ("1,2,4,6,8,10,12") can be set in
# the environment. The drafts are made once in bench/out/models: a Q8_0
# self-draft (rows that do not fit Q8_0 blocks fall back to F16, as llama.cpp's
# ffn_down), a Q4_0 self-draft, and the n-gram drafter needs none.
# Raw lines go to bench/out/spec.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${MODEL:-../shared/models/stories260K.gguf}"
tokens="${TOKENS:-128}"
prompts="${PROMPTS:-1}"
delays="${DELAYS:-0 10 50 100}"
stages="${STAGES:-1 2 3}"
ks="${KS:-1,2,4,6,8,10,12}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
make --no-print-directory -C build -j2 convoy bench_spec linkemu >/dev/null
mkdir -p bench/out/models
base="$(basename "$model" .gguf)"
q8="bench/out/models/$base-draft-q8_0.gguf"
q4="bench/out/models/$base-draft-q4_0.gguf"
[[ -f "$q8" ]] || build/convoy quantize "$model" "$q8" q8_0 >/dev/null
[[ -f "$q4" ]] || build/convoy quantize "$model" "$q4" q4_0 >/dev/null

export CONVOY_CLUSTER_PREFIX=cvs
pids=()
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    bash scripts/cluster.sh down
    return 0
}
trap cleanup EXIT
bash scripts/cluster.sh up 4 >/dev/null

wait_port() { # wait_port ADDR PORT, from host 0
    for _ in $(seq 100); do
        bash scripts/cluster.sh run 0 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null && return
        sleep 0.1
    done
    echo "spec.sh: nothing listens at $1:$2" >&2
    exit 1
}

for h in 1 2 3; do
    addr="10.77.0.$((h + 1))"
    bash scripts/cluster.sh run "$h" taskset -c $(((h + 1) % 2)) build/convoy stage --listen "$addr:7000" \
        -m "$model" 2>/dev/null &
    pids+=($!)
    wait_port "$addr" 7000
    for d in $delays; do
        [[ "$d" == 0 ]] || bash scripts/cluster.sh delay "$h" $((8000 + d)) "$addr:7000" "$d" >/dev/null
    done
done

chains=()
for s in $stages; do
    for d in $delays; do
        nodes=""
        for h in $(seq 1 "$s"); do
            port=$([[ "$d" == 0 ]] && echo 7000 || echo $((8000 + d)))
            nodes+="${nodes:+,}10.77.0.$((h + 1)):$port"
        done
        chains+=(--chain "$s stage(s), $d ms=$nodes")
    done
done
bash scripts/cluster.sh run 0 taskset -c 0 build/bench_spec -m "$model" -n "$tokens" --prompts "$prompts" \
    --draft "q8_0 self-draft=$q8" --draft "q4_0 self-draft=$q4" --draft "ngram=ngram" --k-list "$ks" "${chains[@]}"
