#!/usr/bin/env bash
# rebalance.sh: how a pipeline recovers when a node slows down while
# serving (issue #37). Three stages on test hosts 1..3 (scripts/cluster.sh,
# prefix "cvc"), `convoy serve -np 4` on host 0, 4 clients on host 0 each
# repeating a 160-token sampled request. Two runs, alternated REPEAT times
# (default 3):
#   fresh:  host 2 held to PCT% of a core (default 20) before the head
#           starts; aggregate tokens/s over WINDOW seconds (default 10)
#           after WARM seconds (default 15: time for the head to move
#           layers itself if its speed probe missed the slow host);
#   drift:  all hosts at full speed; after 5 s host 2 is held to PCT%; the
#           seconds until the head moves layers, and the aggregate tokens/s
#           over WINDOW seconds once the gate has judged the move.
# It prints each pass, then the medians and drift/fresh: the recovered
# speed against a head that planned with the slow host from the start.
# Tokens/s come from /metrics' convoy_generated_tokens_total.
#
#   bench/rebalance.sh [MODEL]
#
# Default model: the synthetic 6-layer Llama 1024 wide of the tests. Needs
# root, ip netns and a cpu cgroup.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
pct="${PCT:-20}" window="${WINDOW:-10}" repeat="${REPEAT:-3}" warm="${WARM:-15}"
bench_build
model="${1:-$(synth_1024x6 "$convoy")}"
client_pids=()
at_exit 'stop_clients'
test_hosts cvc 4
start_host_stages "$cluster" "$tmp" "1 2 3" --insecure -m "$model"

serve() {
    host0_serve "$tmp/head.log" "$convoy" serve -m "$model" --port 8080 -np 4 --client-slots 4 --ctx 512 --insecure \
        --nodes "$nodes"
}

# tokens/s over WINDOW seconds
rate() {
    local a b
    a="$(head_metric convoy_generated_tokens_total)"
    sleep "$window"
    b="$(head_metric convoy_generated_tokens_total)"
    awk -v a="$a" -v b="$b" -v w="$window" 'BEGIN { printf "%.1f", (b - a) / w }'
}

fresh() {
    bash "$cluster" cpu 2 "$pct"
    serve
    start_clients 4 0.8
    sleep "$warm"
    rate
    grep "plan: \|rebalancing: \|new chain" "$tmp/head.log" | sed 's/^[0-9-]* [0-9:.]* [A-Z]* */    fresh /' >&2
    stop_clients
    stop_head
    bash "$cluster" cpu 2 off
}

# prints "SECONDS_TO_MOVE TOK/S VERDICT"
drift() {
    serve
    start_clients 4 0.8
    sleep 5
    bash "$cluster" cpu 2 "$pct"
    local t0 t1 verdict=none
    t0=$(date +%s.%N)
    wait_for "rebalancing: .*moving" "$tmp/head.log"
    t1=$(date +%s.%N)
    wait_for "rebalancing: the move" "$tmp/head.log" 300 &&
        verdict="$(grep -m1 -o "the move [a-z]*" "$tmp/head.log" | awk '{ print $3 }')"
    printf '%s %s %s\n' "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" "$(rate)" "$verdict"
    grep "rebalancing: \|new chain" "$tmp/head.log" | sed 's/^[0-9-]* [0-9:.]* [A-Z]* */    /' >&2
    stop_clients
    stop_head
    bash "$cluster" cpu 2 off
}

echo "pass  fresh tok/s  drift: s to move  tok/s after  gate"
f_all=() d_all=() s_all=()
for ((r = 1; r <= repeat; r++)); do
    f="$(fresh)"
    drift >"$tmp/drift.out" # to its end: the head and the clients are gone then
    read -r s d v <"$tmp/drift.out"
    printf '%-5d %11s  %16s  %11s  %s\n' "$r" "$f" "$s" "$d" "$v"
    f_all+=("$f") d_all+=("$d") s_all+=("$s")
done
fm="$(median "${f_all[@]}")" dm="$(median "${d_all[@]}")" sm="$(median "${s_all[@]}")"
echo "medians: fresh start with host 2 at $pct%: $fm tok/s; after the move: $dm tok/s ($(awk -v a="$dm" -v b="$fm" \
    'BEGIN { printf "%.3f", a / b }')x); moved $sm s after the slowdown"
