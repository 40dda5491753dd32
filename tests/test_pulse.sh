#!/usr/bin/env bash
# test_pulse.sh: a pipeline's timeout counts silence, not work.
#
# Usage (CTest passes these): test_pulse.sh PATH/TO/convoy SOURCE_DIR
#
# A synthetic model (2048 wide, 4 layers, Q4_0, made once beside the
# binary) over this machine's first layer and one `convoy stage` with the
# other three, with --peer-timeout 1000: a 781-token prompt keeps the stage
# computing one FORWARD for seconds (about 2.6 s here), yet the run
# succeeds, because the stage pulses while it works (proto.h); and a stage
# stopped (SIGSTOP) in the middle of that prompt makes the run fail
# within seconds with a message naming it.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3 "to write the prompt"

model="$(test_model "$convoy" pulse-2048x4-q4_0 --dims 2048,4,16,8,8192,4096 --type Q4_0)" || exit 1
make_tmp
prompt="$(python3 -c 'print(" ".join(["The quick brown fox jumps over the lazy dog."] * 30))')"

start_stage() {
    : >"$tmp/stage.log"
    start_local_stages "$tmp/stage.log" "$model"
    nodes="local,$nodes"
}
run_long() {
    "$convoy" run -m "$model" -p "$prompt" -n 2 --temp 0 --nodes "$nodes" --split 1,3 --peer-timeout 1000 >"$tmp/run.txt" 2>&1
}

start_stage
if run_long; then
    pass "a long FORWARD within --peer-timeout 1000: $(grep -o 'prefill [^,]*' "$tmp/run.txt")"
else
    fail "a long FORWARD was taken for silence: $(tail -c 300 "$tmp/run.txt")"
fi
stop_pids

start_stage
run_long &
run_pid=$!
until grep -q "serving layers" "$tmp/stage.log"; do sleep 0.05; done
sleep 0.3
kill -STOP "$stage_pid"
wait "$run_pid"
rc=$?
if [[ "$rc" -eq 1 ]] && grep -q "node ${nodes#local,}: no result and no sign of work for 1000 ms" "$tmp/run.txt"; then
    pass "a stopped stage is named: $(grep -o 'node .*work for [0-9]* ms' "$tmp/run.txt")"
else
    fail "a stopped stage (exit $rc): $(tail -c 300 "$tmp/run.txt")"
fi
checks_summary
