#!/usr/bin/env bash
# plan_paper.sh: `convoy plan` on paper (issue #37): what fleets of 8 and
# 16 PCs (bench/fleets/eight.json, sixteen.json: stated memory, GB/s,
# GFLOP/s and gigabit links) would serve Llama 3.1 70B and 405B shapes at
# Q4_K (dims as `convoy synth --dims` takes them, the real vocabulary),
# for 1, 4 and 16 users, plain and with speculation (4 drafts a window at
# an acceptance of 0.6), and the time to first token of a 2,000-token
# prompt. Needs no model file and no node.
#
#   bench/plan_paper.sh
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_build
models=("70B 8192,80,64,8,28672,128256" "405B 16384,126,128,8,53248,128256")
for fleet in eight sixteen; do
    for m in "${models[@]}"; do
        read -r name dims <<<"$m"
        echo "== $name on bench/fleets/$fleet.json"
        "$convoy" plan --dims "$dims" --type Q4_K --fleet "bench/fleets/$fleet.json" --users 1,4,16 \
            --prompt 2000 --ctx 4096
        "$convoy" plan --dims "$dims" --type Q4_K --fleet "bench/fleets/$fleet.json" --users 1,4,16 \
            --spec-k 4 --accept 0.6 --prompt 2000 --ctx 4096 | tail -n +2
    done
done
