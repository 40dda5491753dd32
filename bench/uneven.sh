#!/usr/bin/env bash
# uneven.sh: the planner on an uneven fleet against every split (issue
# #37). Three stages on test hosts 1..3 (scripts/cluster.sh, prefix "cvb"),
# the head on host 0; host 2 held to PCT% of a core (default 25) from the
# start, each stage's --mem at its own bytes plus MEM_MB (default 180: 6
# of the default model's 8 layers, 4 with the output matrix), so no stage
# holds the model alone. It decodes N tokens (default 48) one stream at a
# time with every split the budgets allow (--split a,b,c, zeros included) and prints each one's
# tokens/s; then the planner's plan and the sweep's three fastest splits
# run again alternated REPEAT times (default 5), and it prints their
# medians and the plan's against the best. The ids of every run must
# equal one machine's.
#
#   bench/uneven.sh [MODEL]
#
# Stages are pinned: hosts 1 and 3 on core 1, host 2 and the head on core
# 0 (one stream keeps one stage busy at a time). Default model: a
# synthetic 8-layer Llama 2048 wide, Q4_0 (made once under
# bench/out/models). Needs root, ip netns and a cpu cgroup.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
pct="${PCT:-25}" mem_mb="${MEM_MB:-180}" n="${N:-48}" repeat="${REPEAT:-5}"
bench_build
model="${1:-$(bench_model synth-2048x8-q4_0 --dims 2048,8,16,8,5632,32000 --type Q4_0)}"
n_layer="$("$convoy" info "$model" | awk '$1 == "n_layer:" { print $2 }')"
test_hosts cvb 4
own_kb="$(stage_own_kb "$convoy" "$model" "$tmp")"
mem=$(((own_kb + mem_mb * 1024) * 1024))
bash "$cluster" cpu 2 "$pct"
core=(0 1 0 1)
start_host_stages "$cluster" "$tmp" "1 2 3" --insecure -m "$model" --mem "$mem"
prompt="Once upon a time"
taskset -c 0 "$convoy" run -m "$model" -p "$prompt" -n "$n" --temp 0 --ignore-eos --ids --ctx 256 \
    >"$tmp/one.ids" 2>/dev/null

# run ARGS...: the decode tokens/s of one chain run, or "refused"
run() {
    on 0 taskset -c 0 "$convoy" run --insecure -m "$model" -p "$prompt" -n "$n" --temp 0 \
        --ignore-eos --ids --ctx 256 --batch 32 --nodes "$nodes" "$@" >"$tmp/chain.ids" 2>"$tmp/chain.err" ||
        { echo "refused: $(tail -1 "$tmp/chain.err" | cut -c1-150)"; return; }
    cmp -s "$tmp/one.ids" "$tmp/chain.ids" || die "ids differ with $*"
    grep -o 'decode [0-9]* tokens in [0-9.]* s ([0-9.]* tok/s)' "$tmp/chain.err" | tr -d '(' | awk '{print $7}'
}

echo "split      tok/s"
sweep="$tmp/sweep"
for ((a = 0; a <= n_layer; a++)); do
    for ((b = 0; a + b <= n_layer; b++)); do
        split="$a,$b,$((n_layer - a - b))"
        tps="$(run --split "$split")"
        printf '%-10s %s\n' "$split" "$tps"
        [[ "$tps" == refused* ]] || echo "$tps $split" >>"$sweep"
    done
done
run >/dev/null
plan="$(grep -m1 'plan: ' "$tmp/chain.err" | sed 's/^convoy: plan: //')"
echo "planner: $plan"
grep -m1 'nodes: ' "$tmp/chain.err" | sed 's/^convoy: //'

# The sweep's fastest splits, measured again alternated with the plan: one
# pass's best is partly luck on a machine whose speed drifts.
mapfile -t top < <(sort -rn "$sweep" | head -3 | awk '{ print $2 }')
declare -A all
for r in $(seq "$repeat"); do
    all[plan]+=" $(run)"
    for split in "${top[@]}"; do all[$split]+=" $(run --split "$split")"; done
done
echo "alternated $repeat times, median tok/s:"
best=0 best_split=""
for split in "${top[@]}"; do
    m="$(median <<<"${all[$split]}")"
    echo "  split $split: $m   (${all[$split]# })"
    if awk -v x="$m" -v y="$best" 'BEGIN { exit !(x > y) }'; then best="$m" best_split="$split"; fi
done
p="$(median <<<"${all[plan]}")"
echo "  planner: $p   (${all[plan]# })"
echo "planner against the best split ($best_split): $(awk -v p="$p" -v s="$best" 'BEGIN { printf "%.3f", p / s }')"
