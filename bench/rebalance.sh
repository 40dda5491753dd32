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
cd "$(dirname "$0")/.."
pct="${PCT:-20}" window="${WINDOW:-10}" repeat="${REPEAT:-3}" warm="${WARM:-15}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
make --no-print-directory -C build -j2 convoy >/dev/null
. tests/lib.sh
model="${1:-$(synth_1024x6 build/convoy)}"
export CONVOY_CLUSTER_PREFIX=cvc
cluster=scripts/cluster.sh
tmp="$(mktemp -d)"
pids=()
head_pid=""
client_pids=()
cleanup() {
    kill $head_pid "${client_pids[@]}" "${pids[@]}" 2>/dev/null
    wait 2>/dev/null
    bash $cluster down
    rm -rf "$tmp"
}
trap cleanup EXIT

bash $cluster up 4 >/dev/null
nodes=""
for h in 1 2 3; do
    bash $cluster run "$h" build/convoy stage --listen "10.77.0.$((h + 1)):7000" --insecure -m "$model" \
        2>"$tmp/stage$h.log" &
    pids+=($!)
    nodes="${nodes:+$nodes,}10.77.0.$((h + 1)):7000"
done
sleep 2

serve() {
    bash $cluster run 0 build/convoy serve -m "$model" --port 8080 -np 4 --client-slots 4 --ctx 512 --insecure \
        --nodes "$nodes" 2>"$tmp/head.log" &
    head_pid=$!
    wait_for "listening on" "$tmp/head.log" 100 && return
    echo "rebalance.sh: the head did not start: $(tail -2 "$tmp/head.log")" >&2
    exit 1
}

clients() {
    rm -f "$tmp/stop"
    client_pids=()
    for i in 0 1 2 3; do
        bash $cluster run 0 bash -c '
            while [[ ! -e "$1" ]]; do
                curl -s -m 120 http://127.0.0.1:8080/v1/completions -o /dev/null -d "{\"prompt\": \"Story $2\",
                    \"max_tokens\": 160, \"temperature\": 0.8, \"seed\": $2, \"ignore_eos\": true}"
            done' _ "$tmp/stop" "$i" &
        client_pids+=($!)
    done
}

stop_all() {
    touch "$tmp/stop"
    wait "${client_pids[@]}" 2>/dev/null || true
    kill "$head_pid" 2>/dev/null || true
    wait "$head_pid" 2>/dev/null || true
    head_pid=""
}

generated() {
    bash $cluster run 0 curl -s http://127.0.0.1:8080/metrics | awk '$1 == "convoy_generated_tokens_total" { print $2 }'
}

# tokens/s over WINDOW seconds
rate() {
    local a b
    a="$(generated)"
    sleep "$window"
    b="$(generated)"
    awk -v a="$a" -v b="$b" -v w="$window" 'BEGIN { printf "%.1f", (b - a) / w }'
}

fresh() {
    bash $cluster cpu 2 "$pct"
    serve
    clients
    sleep "$warm"
    rate
    grep "plan: \|rebalancing: \|new chain" "$tmp/head.log" | sed 's/^[0-9-]* [0-9:.]* [A-Z]* */    fresh /' >&2
    stop_all
    bash $cluster cpu 2 off
}

# prints "SECONDS_TO_MOVE TOK/S VERDICT"
drift() {
    serve
    clients
    sleep 5
    bash $cluster cpu 2 "$pct"
    local t0 t1 verdict=none
    t0=$(date +%s.%N)
    wait_for "rebalancing: .*moving" "$tmp/head.log"
    t1=$(date +%s.%N)
    wait_for "rebalancing: the move" "$tmp/head.log" 300 &&
        verdict="$(grep -m1 -o "the move [a-z]*" "$tmp/head.log" | awk '{ print $3 }')"
    printf '%s %s %s\n' "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" "$(rate)" "$verdict"
    grep "rebalancing: \|new chain" "$tmp/head.log" | sed 's/^[0-9-]* [0-9:.]* [A-Z]* */    /' >&2
    stop_all
    bash $cluster cpu 2 off
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
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
fm="$(median "${f_all[@]}")" dm="$(median "${d_all[@]}")" sm="$(median "${s_all[@]}")"
echo "medians: fresh start with host 2 at $pct%: $fm tok/s; after the move: $dm tok/s ($(awk -v a="$dm" -v b="$fm" \
    'BEGIN { printf "%.3f", a / b }')x); moved $sm s after the slowdown"
