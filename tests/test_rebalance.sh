#!/usr/bin/env bash
# test_rebalance.sh: layers move while serving (issue #37). Three stages on
# hosts 1..3 of scripts/cluster.sh, `convoy serve` on host 0 with 4 slots,
# serving a synthetic 6-layer model to 4 clients, each repeating its own
# seeded request (sampled, temperature 0.8, with log-probabilities) until
# told to stop.
#   1. Undisturbed (--no-rebalance): each client's text, the reference.
#   2. The host with the most layers is held to 20% of a core a few seconds
#      into serving: the head must move layers off it (a "rebalancing: ... moving" line, then a
#      plan with fewer layers on that host) while the clients run, and every
#      text and its log-probabilities must equal the reference. How soon and how fast it then serves
#      are in the closing notes of #37: a test never asserts on time.
#   3. The test hook CONVOY_TEST_MOVE forces a bad move (5 of 6 layers
#      on the slow host): the gate must measure it, move back, and refuse
#      to move there again (the cooling period); texts unchanged.
#
# Usage (CTest passes these): test_rebalance.sh PATH/TO/convoy SOURCE_DIR
# Needs root, `ip netns` and a writable cpu cgroup controller: otherwise it
# skips, except under CI=true, where that is a failure.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_netns test_rebalance

model="$(synth_1024x6 "$convoy")" || exit 1
test_hosts cvr 4
head_env=""
bash "$cluster" cpu 2 off 2>"$tmp/cpu.err" || skip "test_rebalance needs a cpu cgroup: $(cat "$tmp/cpu.err")"
start_host_stages "$cluster" "$tmp" "1 2 3" -m "$model" --insecure

# serve NAME [ARGS...]: the head on host 0 (log NAME.log), once it listens.
serve() {
    host0_serve "$tmp/$1.log" env $head_env "$convoy" serve -m "$model" --port 8080 -np 4 --client-slots 4 --ctx 512 \
        --insecure --nodes "$nodes" "${@:2}"
}

# clients NAME: 4 clients on host 0, client I repeating its request (texts
# in NAME/I.N) until NAME/stop exists; returns once they all stopped.
clients() {
    mkdir -p "$tmp/$1"
    client_pids=()
    for i in 0 1 2 3; do
        bash "$cluster" run 0 bash -c '
            dir="$1" i="$2" n=0
            while [[ ! -e "$dir/stop" ]]; do
                curl -s -m 120 http://127.0.0.1:8080/v1/completions -d "{\"prompt\": \"Story $i: once upon a time\",
                    \"max_tokens\": 160, \"temperature\": 0.8, \"seed\": $((i + 7)), \"ignore_eos\": true,
                    \"logprobs\": 2}" \
                    >"$dir/$i.$n" || echo "curl failed" >"$dir/$i.$n"
                n=$((n + 1))
            done' _ "$tmp/$1" "$i" &
        client_pids+=($!)
    done
}

wait_clients() {
    touch "$tmp/$1/stop"
    wait "${client_pids[@]}" 2>/dev/null
}

# same_texts NAME: every text of NAME's clients equals the reference's.
same_texts() {
    python3 - "$tmp/reference" "$tmp/$1" <<'EOF'
import glob, json, os, sys
def text(path):
    try:
        choice = json.load(open(path))["choices"][0]
        return choice["text"] + json.dumps(choice["logprobs"], sort_keys=True)
    except Exception as e:
        return "unreadable: %s" % e
ref, run = sys.argv[1], sys.argv[2]
bad = n = 0
for path in sorted(glob.glob(os.path.join(run, "[0-3].*"))):
    n += 1
    i = os.path.basename(path).split(".")[0]
    if text(path) != text(os.path.join(ref, i + ".0")):
        bad += 1
        print("  %s differs: %r" % (os.path.basename(path), text(path)[:80]))
print("  %d texts, %d differ" % (n, bad))
sys.exit(1 if bad or n < 4 else 0)
EOF
}

# layers_on HOST LINE: the layers the plan LINE gives host HOST.
layers_on() {
    local range
    range="$(grep -o "\[[0-9]*, [0-9]*) on 10.77.0.$(($1 + 1)):7000" <<<"$2")"
    [[ -n "$range" ]] || { echo 0; return; }
    awk -F'[][, )]+' '{ print $3 - $2 }' <<<"$range"
}

# 1. the reference
serve reference --no-rebalance
clients reference
sleep 2
wait_clients reference
stop_head

# 2. a host slows down while serving: the one with the most layers (the
# probes decide the first plan, and a host with none could lose none)
serve drift -v
clients drift
before="$(grep -m1 "plan: " "$tmp/drift.log")"
slow=1
for h in 2 3; do
    [[ "$(layers_on "$h" "$before")" -gt "$(layers_on "$slow" "$before")" ]] && slow="$h"
done
sleep 4
bash "$cluster" cpu "$slow" 20
slowed=$(date +%s.%N)
wait_for "rebalancing: .*moving" "$tmp/drift.log"
moved=$(date +%s.%N)
sleep 2 # the move's chain serves the clients
wait_clients drift
stop_head
bash "$cluster" cpu "$slow" off
grep "rebalancing: \|new chain" "$tmp/drift.log" | sed 's/^[0-9-]* [0-9:.]* [A-Z]* */  /'
after="$(awk -v a="$slowed" -v b="$moved" 'BEGIN { printf "%.1f", b - a }')"
expect "the head moved layers while serving ($after s after the slowdown)" \
    grep -q "rebalancing: .*moving" "$tmp/drift.log"
plan="$(grep -m1 "new chain" "$tmp/drift.log")"
now="$(layers_on "$slow" "$plan")" was="$(layers_on "$slow" "$before")"
expect "the new plan gives the slow host $slow fewer layers ($now after $was)" test "$now" -lt "$was"
expect "every text equals the undisturbed run's" same_texts drift

# 3. a bad move forced by the test hook, with host 2 slow from the start
bash "$cluster" cpu 2 20
head_env="CONVOY_TEST_MOVE=1,5,0"
serve hook -v
clients hook
wait_for "rebalancing: not moving to layers 1,5,0 again" "$tmp/hook.log" 900
wait_clients hook
stop_head
grep "rebalancing: \|new chain" "$tmp/hook.log" | sed 's/^[0-9-]* [0-9:.]* [A-Z]* */  /'
expect "the hook's bad move was made" grep -q "rebalancing: CONVOY_TEST_MOVE: moving to layers 1,5,0" "$tmp/hook.log"
expect "the gate measured it and moved back" grep -q "rebalancing: the move lost: .*moving back" "$tmp/hook.log"
expect "the move is not tried again while it cools" grep -q "rebalancing: not moving to layers 1,5,0 again" \
    "$tmp/hook.log"
expect "it was made once" test "$(grep -c "CONVOY_TEST_MOVE: moving" "$tmp/hook.log")" -eq 1
expect "every text equals the undisturbed run's" same_texts hook
checks_summary
