#!/usr/bin/env bash
# test_moe_paging.sh: a mixture of experts larger than its stages' --mem
# runs paged, exactly. A synthetic qwen3moe (convoy synth's qwen3moe-mini
# with 64 experts, 2 chosen per token, 6 layers, Q4_0) is split over 3
# `convoy stage` processes on 3 test hosts (network namespaces,
# scripts/cluster.sh; the head on a fourth), first without a budget (every
# expert of a stage's layers gets a slot), then each with a --mem that
# leaves its expert cache 24 slots for the 128 experts of its two layers:
# the plan and each stage say the experts are paged, experts are evicted
# (and read again when chosen again), the logits of 64 tokens are
# bit-identical to one machine's and the greedy continuation is the same,
# and no stage's peak resident memory (VmHWM) passes its --mem.
#
# Needs root and `ip netns`: otherwise it skips (fails under CI=true).
#
# Usage (CTest passes these): test_moe_paging.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3 "to write the tokens"
need_netns test_moe_paging

test_hosts cvm 4
model="$tmp/moe.gguf"
"$convoy" synth --shape qwen3moe-mini --experts 64 --layers 6 --type Q4_0 -o "$model" >/dev/null || die "synth"
python3 -c "import json; json.dump({'tokens': [2] + [3 + (i * 7919) % 2040 for i in range(1, 64)]}, open('$tmp/tokens.json', 'w'))"
"$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/one.f32" -t 1 2>"$tmp/err" ||
    { echo "FAIL one machine's eval: $(cat "$tmp/err")"; exit 1; }
prompt="Once upon a time"
one="$("$convoy" run -m "$model" -p "$prompt" -n 24 --temp 0 --ignore-eos --ids 2>"$tmp/err")" ||
    { echo "FAIL one machine's run: $(cat "$tmp/err")"; exit 1; }

# run_chain KB...: three stages, stage I on host I with --mem of the Ith KB KiB (0:
# none), the eval and the greedy run through them (--batch 4: a batch
# chooses at most 8 experts of a layer); the stages' logs in
# $tmp/stageI.log, the head's in $tmp/head.log, their peaks in hwm.
run_chain() {
    local i mem
    pids=()
    nodes=""
    for i in 1 2 3; do
        : >"$tmp/stage$i.log"
        mem=()
        [[ "${!i}" -gt 0 ]] && mem=(--mem "$((${!i} * 1024))")
        start_host_stage "$cluster" "$i" "$convoy" "$tmp/stage$i.log" -m "$model" --insecure "${mem[@]}"
        pids+=("$stage_pid")
        nodes="${nodes:+$nodes,}10.77.0.$((i + 1)):7000"
    done
    bash "$cluster" run 0 "$convoy" eval --insecure -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/got.f32" \
        --batch 4 --nodes "$nodes" --split 2,2,2 2>"$tmp/head.log"
    chain_ids="$(bash "$cluster" run 0 "$convoy" run --insecure -m "$model" -p "$prompt" -n 24 --temp 0 --ignore-eos \
        --ids --batch 4 --ctx 64 --nodes "$nodes" --split 2,2,2 2>>"$tmp/head.log")"
    hwm=()
    for i in 1 2 3; do
        hwm+=("$(awk '/VmHWM/ {print $2}' "/proc/${pids[$((i - 1))]}/status")")
    done
    stop_pids
}

run_chain 0 0 0
expect "without a budget, the plan holds every expert in memory" grep -q "experts: all 128 in memory" "$tmp/head.log"
expect "without a budget, logits bit-identical to one machine's" cmp -s "$tmp/one.f32" "$tmp/got.f32"
# each stage's count of its layers with every expert, and a slot's size:
# its budget leaves 24 slots for the 128 experts of its two layers
budgets=()
for i in 1 2 3; do
    read -r need slot_kb < <(sed -n 's/.*serving layers .*: \([0-9]*\) KB, every expert .* slots of \([0-9]*\) KB.*/\1 \2/p' \
        "$tmp/stage$i.log")
    [[ -n "$need" && -n "$slot_kb" ]] || { echo "FAIL stage $i did not report its count: $(cat "$tmp/stage$i.log")"; exit 1; }
    budgets+=($((need - 104 * slot_kb)))
done

run_chain "${budgets[@]}"
expect "with --mem ${budgets[*]} KiB, the plan says the experts are paged" grep -q "experts paged: " "$tmp/head.log"
for i in 1 2 3; do
    expect "stage $i says so" grep -q "experts paged: [0-9]* slots" "$tmp/stage$i.log"
done
expect "logits bit-identical to one machine's, paged" cmp -s "$tmp/one.f32" "$tmp/got.f32"
if [[ -n "$one" && "$chain_ids" == "$one" ]]; then
    pass "paged: 24 greedy tokens as one machine"
else
    fail "paged: greedy tokens '$chain_ids' vs '$one': $(cat "$tmp/head.log")"
fi
evicted="$(sed -n 's/.*experts: [0-9]* read from the file, \([0-9]*\) evicted.*/\1/p' "$tmp/stage2.log" | head -1)"
expect "experts were evicted (${evicted:-none} in the eval's session)" test "${evicted:-0}" -gt 0
for i in 0 1 2; do
    expect "stage $((i + 1)) peaked at ${hwm[$i]} KiB, within its --mem of ${budgets[$i]} KiB" \
        test "${hwm[$i]}" -le "${budgets[$i]}"
done
checks_summary
