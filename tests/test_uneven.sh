#!/usr/bin/env bash
# test_uneven.sh: an uneven fleet on test hosts (issue #37). Three stages
# on hosts 1..3 of scripts/cluster.sh, the head on host 0, serving a
# synthetic 6-layer model that no stage can hold alone (--mem at the
# stage's own bytes plus 88 MiB: 5 layers); host 2 is held to 25% of a
# core (`cluster.sh cpu`) from the start. The head's plan must give the
# slow host fewer layers than each of the others, or none, and say what it
# predicts; the greedy tokens must equal one machine's. How fast the plan
# runs against every split is bench/uneven.sh's to measure: a test never
# asserts on time.
#
# Usage (CTest passes these): test_uneven.sh PATH/TO/convoy SOURCE_DIR
# Needs root, `ip netns` and a writable cpu cgroup controller: otherwise it
# skips, except under CI=true, where that is a failure.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_netns test_uneven

model="$(synth_1024x6 "$convoy")" || exit 1
test_hosts cvu 4
own_kb="$(stage_own_kb "$convoy" "$model" "$tmp")" || exit 1
mem=$(((own_kb + 88 * 1024) * 1024))
prompt="Once upon a time"

bash "$cluster" cpu 2 25 2>"$tmp/cpu.err" || skip "test_uneven needs a cpu cgroup: $(cat "$tmp/cpu.err")"
start_host_stages "$cluster" "$tmp" "1 2 3" -m "$model" --insecure --mem "$mem"

"$convoy" run -m "$model" -p "$prompt" -n 24 --temp 0 --ignore-eos --ids --ctx 256 >"$tmp/one.ids" 2>"$tmp/one.err" ||
    { echo "FAIL one machine: $(cat "$tmp/one.err")"; exit 1; }
bash "$cluster" run 0 "$convoy" run --insecure -m "$model" -p "$prompt" -n 24 --temp 0 --ignore-eos --ids --ctx 256 \
    --nodes "$nodes" >"$tmp/chain.ids" 2>"$tmp/chain.err"
plan="$(grep -m1 "plan: " "$tmp/chain.err")"
echo "${plan#*convoy: }"
grep -m1 "nodes: " "$tmp/chain.err" | sed 's/^convoy: //'

# layers HOST: how many layers the plan gives host HOST
layers() {
    local range
    range="$(grep -o "\[[0-9]*, [0-9]*) on 10.77.0.$(($1 + 1)):7000" <<<"$plan")"
    [[ -n "$range" ]] || { echo 0; return; }
    awk -F'[][, )]+' '{ print $3 - $2 }' <<<"$range"
}
slow="$(layers 2)" a="$(layers 1)" c="$(layers 3)"
expect "the plan covers the 6 layers ($a + $slow + $c)" test $((a + slow + c)) -eq 6
expect "the slow host has fewer layers than each other host, or none ($slow against $a and $c)" \
    test "$slow" -lt "$a" -a "$slow" -lt "$c" -o "$slow" -eq 0
expect "the plan says what it predicts" grep -q "a token in [0-9.]* ms predicted" <<<"$plan"
if [[ "$slow" -eq 0 ]]; then
    expect "the plan names the host it leaves out" grep -q "left out: 10.77.0.3:7000" <<<"$plan"
fi
expect "24 greedy tokens identical to one machine's" cmp -s "$tmp/one.ids" "$tmp/chain.ids"
checks_summary
