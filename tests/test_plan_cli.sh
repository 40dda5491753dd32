#!/usr/bin/env bash
# test_plan_cli.sh: `convoy plan` as a user runs it.
# 1. On paper: a 70B-shaped model (--dims) on a fleet file of two nodes:
#    a forecast line for each count of users, each plan covering the 80
#    layers within the nodes' memory (the small node never holds them all),
#    one user's tokens/s below the fast node's bandwidth over the model's
#    bytes; bad fleet files and flags are refused naming the problem.
# 2. Live: two `convoy stage` nodes of stories260K on loopback, measured
#    (--nodes, --save), then planned again from the saved fleet file
#    (--fleet): the same forecast lines, figure for figure (the
#    simulation is deterministic, and the file holds every measured figure).
#
# Usage (CTest passes these): test_plan_cli.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
make_tmp

# 1. on paper
dims=8192,80,64,8,28672,128256
cat >"$tmp/fleet.json" <<'EOF'
{"nodes": [{"name": "desk", "mem_gb": 64, "gb_s": 40, "gflop_s": 400, "rtt_ms": 0.3, "mbit_s": 1000},
           {"name": "laptop", "mem_gb": 16, "gb_s": 20, "gflop_s": 200, "rtt_ms": 0.3, "mbit_s": 1000}]}
EOF
"$convoy" plan --dims "$dims" --type Q4_K --fleet "$tmp/fleet.json" --users 1,2,4 --prompt 500 >"$tmp/paper.out" \
    2>"$tmp/paper.err"
# users, plan, tok/s for each line
awk '$1 ~ /^[0-9]+$/ { print $1, $3, $5 }' "$tmp/paper.out" >"$tmp/lines"
expect "on paper: a line for 1, 2 and 4 users" test "$(awk '{ printf "%s,", $1 }' "$tmp/lines")" = "1,2,4,"
expect "on paper: every plan covers the 80 layers, the 16 GB node holds fewer than 40" \
    awk -F'[ ,]' '{ if ($2 + $3 != 80 || $3 >= 40) exit 1 }' "$tmp/lines"
# Q4_K: 144 bytes per 256 weights; 70B's 69.5G weights in its layers and output
expect "on paper: one user below the fast node's 40 GB/s over the model's bytes" \
    awk '$1 == 1 { exit !($3 > 0 && $3 < 40e9 / (69.5e9 * 144 / 256)) }' "$tmp/lines"
expect "on paper: the bottleneck is named" grep -q "node desk\|node laptop\|round trip" "$tmp/paper.out"

refused() { # NAME PATTERN ARGS...: convoy plan ARGS fails, its message matching PATTERN
    local name="$1" pattern="$2"
    shift 2
    if "$convoy" plan "$@" >"$tmp/out" 2>&1; then
        fail "$name: accepted"
    elif grep -q -e "$pattern" "$tmp/out"; then
        pass "$name"
    else
        fail "$name: $(head -2 "$tmp/out")"
    fi
}
echo '{"nodes": [{"name": "x", "gb_s": 10}]}' >"$tmp/nomem.json"
echo '{"nodes": [' >"$tmp/broken.json"
echo '{"nodes": [{"mem_gb": 1, "gb_s": 10}]}' >"$tmp/small.json"
refused "a node without mem_gb" "fleet node 0: an object with mem_gb" --dims "$dims" --fleet "$tmp/nomem.json"
refused "a fleet file that is not JSON" "broken.json" --dims "$dims" --fleet "$tmp/broken.json"
refused "a fleet too small for the model" "the model needs" --dims "$dims" --fleet "$tmp/small.json"
refused "a split of the wrong length" "split" --dims "$dims" --fleet "$tmp/fleet.json" --split 80
refused "users that are not counts" "--users" --dims "$dims" --fleet "$tmp/fleet.json" --users 1,x
refused "both --nodes and --fleet" "give -m or --dims" --dims "$dims" --fleet "$tmp/fleet.json" --nodes 127.0.0.1:1

# 2. live, then from the saved figures
need_stories
start_local_stages "$tmp/stages.log" "$model" "$model"
if "$convoy" plan -m "$model" --nodes "$nodes" --cpus 1,1 --save "$tmp/saved.json" --users 1,2 --ctx 512 \
    --spec-k 3 --accept 0.5 >"$tmp/live.out" 2>"$tmp/live.err"; then
    pass "live: measured two stages"
else
    fail "live: $(tail -2 "$tmp/live.err")"
fi
expect "live: each node's figures printed" test "$(grep -c "^  127.0.0.1:" "$tmp/live.out")" -eq 2
"$convoy" plan -m "$model" --fleet "$tmp/saved.json" --users 1,2 --ctx 512 --spec-k 3 --accept 0.5 \
    >"$tmp/paper2.out" 2>&1
grep '^[0-9]' "$tmp/live.out" >"$tmp/live.lines"
grep '^[0-9]' "$tmp/paper2.out" >"$tmp/paper2.lines"
if [[ -s "$tmp/live.lines" ]] && cmp -s "$tmp/live.lines" "$tmp/paper2.lines"; then
    pass "the saved fleet gives the live forecast figure for figure ($(head -1 "$tmp/live.lines" | tr -s ' '))"
else
    fail "saved fleet: $(cat "$tmp/live.lines") / $(cat "$tmp/paper2.lines")"
fi
checks_summary
