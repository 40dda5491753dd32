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
convoy="${1:?usage: test_pulse.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_pulse.sh PATH/TO/convoy SOURCE_DIR}"
. "$src/tests/lib.sh"
command -v python3 >/dev/null || skip "python3 is needed to pick a free port"

model="$(dirname "$convoy")/test-models/pulse-2048x4-q4_0.gguf"
mkdir -p "$(dirname "$model")"
[[ -f "$model" ]] || "$convoy" synth --dims 2048,4,16,8,8192,4096 --type Q4_0 -o "$model" >/dev/null ||
    { echo "FAIL: could not synthesize $model"; exit 1; }
tmp="$(mktemp -d)"
stage_pid=""
trap '[[ -n "$stage_pid" ]] && kill -CONT "$stage_pid" 2>/dev/null && kill "$stage_pid" 2>/dev/null; wait; rm -rf "$tmp"' EXIT
failures=0
prompt="$(python3 -c 'print(" ".join(["The quick brown fox jumps over the lazy dog."] * 30))')"

start_stage() {
    local port
    port="$(free_port)"
    : >"$tmp/stage.log"
    start_local_stage "$convoy" "$tmp/stage.log" "$port" -m "$model"
    nodes="local,127.0.0.1:$port"
}
run_long() {
    "$convoy" run -m "$model" -p "$prompt" -n 2 --temp 0 --nodes "$nodes" --split 1,3 --peer-timeout 1000 >"$tmp/run.txt" 2>&1
}

start_stage
if run_long; then
    echo "ok   a long FORWARD within --peer-timeout 1000: $(grep -o 'prefill [^,]*' "$tmp/run.txt")"
else
    echo "FAIL a long FORWARD was taken for silence: $(tail -c 300 "$tmp/run.txt")"
    failures=$((failures + 1))
fi
kill "$stage_pid"; wait "$stage_pid" 2>/dev/null

start_stage
run_long &
run_pid=$!
until grep -q "serving layers" "$tmp/stage.log"; do sleep 0.05; done
sleep 0.3
kill -STOP "$stage_pid"
wait "$run_pid"
rc=$?
if [[ "$rc" -eq 1 ]] && grep -q "node ${nodes#local,}: no result and no sign of work for 1000 ms" "$tmp/run.txt"; then
    echo "ok   a stopped stage is named: $(grep -o 'node .*work for [0-9]* ms' "$tmp/run.txt")"
else
    echo "FAIL a stopped stage (exit $rc): $(tail -c 300 "$tmp/run.txt")"
    failures=$((failures + 1))
fi
[[ "$failures" -eq 0 ]]
