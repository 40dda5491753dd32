#!/usr/bin/env bash
# test_plan_budget.sh: a node never refuses a plan made from its own
# answer, and stays within it. Two `convoy stage` nodes on loopback with
# the same --mem, swept in 32 KB steps (less than any tensor of stories260K
# that a plan could forget; 192 in the sanitizer suite) over 2 MiB from 9
# MiB above the process's own
# bytes (the stage's start line says them), where stories260K's layers
# (4096 positions of KV cache each) stop fitting one by one: at every
# budget the head either plans and generates, or says up front that the
# nodes cannot hold the model; a node refusing its layers (NO_MEMORY), or
# one whose peak resident memory (VmHWM) went over its --mem, is a failure.
#
# Usage (CTest passes these): test_plan_budget.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories

make_tmp

# the process's own bytes, as a stage reports them at start
own_kb="$(stage_own_kb "$convoy" "$model" "$tmp")" || exit 1

# the sanitizer suite (ten times slower) takes every sixth budget: the
# sweep's fine steps are the release suite's
step=32
[[ "${CONVOY_SANITIZED:-}" == 1 ]] && step=192
ran=0 refused_up_front=0
for ((kb = own_kb + 9216; kb <= own_kb + 11264; kb += step)); do
    start_budget_stages "$convoy" "$model" "$tmp" "$kb" 2
    # F32 KV: the sweep's range is where its layers stop fitting
    out="$("$convoy" run -m "$model" -p "Once upon a time" -n 4 --temp 0 --ctx 4096 --kv-type f32 --nodes "$nodes" 2>&1)"
    if grep -q "NO_MEMORY" <<<"$out"; then
        fail "budget $kb KB: a node refused the plan: $(grep -m1 "NO_MEMORY" <<<"$out")"
    elif grep -q "prefill" <<<"$out"; then
        ran=$((ran + 1))
        for pid in "${pids[@]}"; do
            hwm="$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")"
            [[ "$hwm" -le "$kb" ]] || fail "budget $kb KB: a stage peaked at $hwm KB"
        done
    elif grep -q "offer\|its budget is" <<<"$out"; then
        refused_up_front=$((refused_up_front + 1))
    else
        fail "budget $kb KB: $out"
    fi
    stop_pids
done
echo "budgets swept from $((own_kb + 9216)) KB: $ran generated, $refused_up_front refused by the planner up front," \
    "$failures refused by a node or over budget"
# The sweep must cross the edge, or it tests nothing.
[[ "$ran" -gt 0 && "$refused_up_front" -gt 0 ]] || die "the sweep did not cross the edge of the fit"
[[ "$failures" -eq 0 ]]
