#!/usr/bin/env bash
# test_fingerprint.sh: a stage is accepted only if the weights it will read
# are the head's. Tiny synthetic models, a head with a local first stage
# (layers [0, 2) here, --split 2,3) and one `convoy stage` on loopback
# (layers [2, 5) and the output matrix):
# 1. the same shape with other weights (--seed 2) is refused at HELLO,
#    naming the first tensor of the stage's layers that differs;
# 2. one byte flipped in blk.3.attn_k.weight (the stage's layers) is
#    refused naming that tensor, and one in output.weight (the stage holds
#    the output matrix) naming it;
# 3. one byte flipped in blk.0.attn_q.weight (the head's own layers) or in
#    token_embd.weight (a stage reads hidden states, not embeddings) is
#    accepted, and the chain generates what one machine does;
# 4. a restarted stage reads its hashes from the cache beside its model,
#    and a link planted as the cache's temporary file is not followed.
#
# Usage (CTest passes these): test_fingerprint.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3 "to flip bytes"

make_tmp
synth_tiny 1 "$tmp/a.gguf" && synth_tiny 2 "$tmp/seed2.gguf" || die "convoy synth"

# flip MODEL TENSOR: a copy of a.gguf as MODEL with one byte of TENSOR's
# data inverted.
flip() {
    cp "$tmp/a.gguf" "$1"
    flip_tensor_byte "$convoy" "$1" "$2"
}

# run_against MODEL: the head (a.gguf, layers [0, 2) here) with a stage
# serving MODEL; the head's output in $tmp/out and err, its status returned.
run_against() {
    : >"$tmp/stage.log"
    start_local_stages "$tmp/stage.log" "$1"
    "$convoy" run -m "$tmp/a.gguf" -p "Once upon a time" -n 8 --temp 0 --ids --nodes "local,$nodes" \
        --split 2,3 >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    stop_pids
    return $rc
}

# refused MODEL TENSOR WHY: the stage serving MODEL is refused naming TENSOR.
refused() {
    if run_against "$1"; then
        fail "$3: the chain ran: $(cat "$tmp/out")"
    elif grep -q "tensor $2 differs from the head's (different weights) (FINGERPRINT)" "$tmp/err"; then
        pass "$3: $(grep -m1 FINGERPRINT "$tmp/err")"
    else
        fail "$3: not refused naming $2: $(cat "$tmp/err")"
    fi
    if grep -q "$1" "$tmp/err"; then
        fail "$3: the refusal shows the stage's model path"
    fi
}

one="$("$convoy" run -m "$tmp/a.gguf" -p "Once upon a time" -n 8 --temp 0 --ids 2>/dev/null)"
[[ -n "$one" ]] || die "one machine generated nothing"

# accepted MODEL WHY: the stage serving MODEL is accepted and the chain
# generates one machine's tokens.
accepted() {
    if run_against "$1" && [[ "$(cat "$tmp/out")" == "$one" ]]; then
        pass "$2: accepted, the same tokens as one machine $one"
    else
        fail "$2: $(cat "$tmp/out" "$tmp/err")"
    fi
}

refused "$tmp/seed2.gguf" blk.2.attn_q.weight "another seed (same shape)"
flip "$tmp/layer3.gguf" blk.3.attn_k.weight
refused "$tmp/layer3.gguf" blk.3.attn_k.weight "one byte in the stage's layer 3"
flip "$tmp/output.gguf" output.weight
refused "$tmp/output.gguf" output.weight "one byte in the stage's output matrix"
flip "$tmp/layer0.gguf" blk.0.attn_q.weight
accepted "$tmp/layer0.gguf" "one byte in layer 0 (the head's)"
flip "$tmp/embd.gguf" token_embd.weight
accepted "$tmp/embd.gguf" "one byte in token_embd (not read by a stage)"

# The stage cached its hashes beside its model; a second start reads them.
: >"$tmp/stage.log"
start_local_stage "$convoy" "$tmp/stage.log" "$(free_port)" -m "$tmp/embd.gguf"
pids+=("$stage_pid")
stop_pids
if grep -q "hashes from $tmp/embd.gguf.convoy-hashes" "$tmp/stage.log"; then
    pass "a restarted stage reads its hashes from the cache"
else
    fail "no cache hit on restart: $(cat "$tmp/stage.log")"
fi

# A link planted where a stage writes its cache's temporary file (MODEL.
# convoy-hashes.PID.tmp) is replaced, not followed: the file it points to
# keeps its bytes and the cache is written.
cp "$tmp/embd.gguf" "$tmp/linked.gguf"
echo keep >"$tmp/victim"
port="$(free_port)"
(
    ln -s "$tmp/victim" "$tmp/linked.gguf.convoy-hashes.$BASHPID.tmp"
    exec "$convoy" stage --listen "127.0.0.1:$port" -m "$tmp/linked.gguf" 2>"$tmp/linked.log"
) &
linked_pid=$!
for _ in $(seq 100); do
    [[ -f "$tmp/linked.gguf.convoy-hashes" ]] && break
    sleep 0.1
done
kill "$linked_pid" 2>/dev/null
wait "$linked_pid" 2>/dev/null
if [[ "$(cat "$tmp/victim")" == keep && -f "$tmp/linked.gguf.convoy-hashes" && ! -L "$tmp/linked.gguf.convoy-hashes" ]]; then
    pass "a link planted as the cache's temporary file is not followed"
else
    fail "the planted link: victim holds '$(head -c 40 "$tmp/victim")'; $(ls -l "$tmp"/linked.gguf.convoy-hashes* 2>&1 | tr '\n' ' ')"
fi

checks_summary
