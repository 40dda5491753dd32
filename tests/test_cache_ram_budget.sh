#!/usr/bin/env bash
# test_cache_ram_budget.sh: the prompt cache beyond the slots (--cache-ram)
# stays within every node's --mem. A synthetic model (1024 wide, 6 layers,
# Q4_0, 1024 positions: 12 MiB of F16 KV per slot), two `convoy stage` nodes
# with --mem at their own bytes plus 150 MiB, and `convoy serve --nodes A,B
# --slots 1 --cache-ram` of 4 slots' KV: the planner counts the cache's KV
# on each node (the serve log states it), then 6 distinct prompts of about
# 900 tokens fill the slot and every cache slot, and the first prompt
# again takes its prefix from the cache. Each stage's peak resident memory
# (VmHWM) must stay within its --mem; a budget that cannot hold the cache
# is refused up front by the planner, naming the nodes.
#
# Usage (CTest passes these): test_cache_ram_budget.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
# a budget of resident memory is the release build's to keep (the
# sanitizer's shadow memory is not the engine's); the prompt cache's paths
# are test_prompt_cache's and test_serve_sched's there
release_suite_only
need python3
need curl

model="$(synth_1024x6 "$convoy")" || exit 1

make_tmp

own_kb="$(stage_own_kb "$convoy" "$model" "$tmp")" || exit 1

# serve_with BUDGET_KB CACHE_BYTES: two stages at that budget and a server over them; sets port, or
# leaves the server's refusal in $tmp/serve.log
serve_with() {
    local kb="$1" cache="$2"
    start_budget_stages "$convoy" "$model" "$tmp" "$kb" 2
    port="$(free_port)"
    "$convoy" serve -m "$model" --nodes "$nodes" --slots 1 --ctx 1024 --cache-ram "$cache" --port "$port" -t 1 \
        2>"$tmp/serve.log" &
    server_pid=$!
    for _ in $(seq 200); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
        kill -0 "$server_pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
stop_all() {
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    stop_pids
}
# prompt SEED: about 900 token ids (BOS, then ids from SEED)
prompt() {
    python3 -c 'import random, sys; r = random.Random(int(sys.argv[1])); print([1] + [r.randrange(3, 2048) for _ in range(900)])' "$1"
}
complete() { # SEED: prints the cached tokens of a 2-token completion
    curl -s "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": $(prompt "$1"), \"max_tokens\": 2, \"temperature\": 0}" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"])'
}

slot_mib=12 # 1024 positions x 6 layers x 2 x 512 values x 2 bytes (F16)
budget_kb=$((own_kb + 150 * 1024))
if serve_with "$budget_kb" "$((4 * slot_mib))MiB"; then
    pass "a 4-prompt cache over two nodes of $((budget_kb / 1024)) MiB is planned"
    grep -q "room for 4 prompts" "$tmp/serve.log" && pass "the log states the cache" || fail "the log: $(cat "$tmp/serve.log")"
    for seed in 1 2 3 4 5 6; do
        c="$(complete "$seed")"
        [[ "$c" -le 1 ]] || fail "prompt $seed is new, yet $c tokens came from the cache"
    done
    c="$(complete 2)"
    expect "a prompt seen before, pushed out of the slot, comes from the cache ($c tokens)" [ "${c:-0}" -ge 899 ]
    for i in 0 1; do
        hwm="$(awk '/VmHWM/ {print $2}' "/proc/${pids[$i]}/status")"
        expect "stage $((i + 1)) peaked at $hwm KB, within its --mem of $budget_kb KB" [ "$hwm" -le "$budget_kb" ]
    done
else
    fail "the server did not start: $(cat "$tmp/serve.log")"
fi
stop_all

# a cache too large for the nodes: refused up front
if serve_with "$budget_kb" "$((40 * slot_mib))MiB"; then
    fail "a 40-prompt cache over two nodes of $((budget_kb / 1024)) MiB was planned"
else
    expect "a 40-prompt cache that the nodes cannot hold is refused up front" grep -q "budget\|cannot hold\|offer" "$tmp/serve.log"
fi
stop_all
checks_summary
