#!/usr/bin/env bash
# test_stage_limits.sh: a stage that strangers cannot hold or use. Raw
# frames (tests/stage_peer.py, built from a real head's HELLO, so they
# follow the protocol as it is) sent to a local stage of stories260K:
#  1. a HELLO asking 4096 slots x 8192 positions is refused by name
#     (NO_MEMORY) and the stage's resident memory does not grow; 5000 slots
#     are over the protocol's limit (TOO_LARGE);
#  2. in a session agreed for 4-row f32 batches: a FORWARD of 8 rows
#     (TOO_LARGE), one of f16 activations (ACT_TYPE), neither computed
#     (STATS), and the header of a 64 MiB FORWARD (BAD_FRAME, before its
#     payload is read);
#  3. a session whose head goes silent is ended (TIMEOUT) after the stage's
#     --timeout, and the stage then serves a real head within 2 s;
# and a stage without --mem takes MemAvailable as its budget and says so.
#
# Usage (CTest passes these): test_stage_limits.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
need python3 "to craft frames"

make_tmp
peer=(python3 "$src/tests/stage_peer.py")
head=(-m "$model" -p "Once upon a time" -n 4 --temp 0 --ctx 256 --batch 4)

# A real head's assignment HELLO, taken by a fake node.
fake="$(free_port)"
"${peer[@]}" capture "$fake" "$tmp/hello" &
capture_pid=$!
wait_listening "$fake"
"$convoy" run "${head[@]}" --nodes "127.0.0.1:$fake" >/dev/null 2>&1
wait "$capture_pid" || die "no assignment HELLO captured from the head"

port="$(free_port)"
start_local_stage "$convoy" "$tmp/stage.log" "$port" -m "$model" --mem 256M --timeout 1500
pids+=("$stage_pid")
rss() { awk '/VmRSS/ {print $2}' "/proc/$stage_pid/status"; }

echo "1. a HELLO of 4096 slots x 8192 positions"
before="$(rss)"
"${peer[@]}" check "$port" "$tmp/hello" huge || die "the stage took a huge HELLO"
after="$(rss)"
echo "  stage resident: $before KB before, $after KB after"
((after - before < 1024)) || die "the stage grew by $((after - before)) KB"

echo "2. FORWARDs over the agreed size or of another type"
"${peer[@]}" check "$port" "$tmp/hello" forwards || die "a FORWARD was not refused as it should be"

echo "3. a silent head"
"${peer[@]}" check "$port" "$tmp/hello" silent || die "the silent session was not ended"
start=$(date +%s%N)
out="$("$convoy" run "${head[@]}" --nodes "127.0.0.1:$port" 2>&1)" || die "a real head after the silent one: $out"
ms=$((($(date +%s%N) - start) / 1000000))
echo "  a real head served in $ms ms"
((ms < 2000)) || die "the real head waited $ms ms"

echo "4. the default budget"
port2="$(free_port)"
start_local_stage "$convoy" "$tmp/default.log" "$port2" -m "$model"
pids+=("$stage_pid")
grep -q "budget [0-9.]* GB (MemAvailable)" "$tmp/default.log" || die "no MemAvailable budget: $(cat "$tmp/default.log")"
grep -o "budget [^,]*" "$tmp/default.log"
echo "PASS"
