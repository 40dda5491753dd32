#!/usr/bin/env bash
# test_split.sh: `convoy split` and stages serving shards (one file per
# stage, holding only its layers). stories260K (5 layers) on loopback:
# 1. split into 2 (--stages 2) and 3 (--split 1,2,2) shards, chains of
#    `convoy stage -m SHARD` give one machine's greedy tokens, and
#    `convoy eval --nodes` one machine's logits bit for bit (the head plans
#    within the ranges the nodes offer; a "local" first node takes what
#    the shards leave);
# 2. the shards of another model (a synth model of the same shape and
#    another seed, split the same way) are refused naming the first tensor
#    that differs, a shard with one byte changed in a tensor naming it, and
#    a shard with a changed key/value by the model's fingerprint;
# 3. a node holding layers [0, 2) given [2, 5) by --split, and nodes whose
#    ranges stop short of the model, are refused with a message naming them,
#    and a node given layers outside its shard by a head that ignores the
#    ranges (a replayed HELLO) refuses them itself (BAD_RANGE);
# 4. a restarted stage reads its shard's hashes from the cache.
#
# Usage (CTest passes these): test_split.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3 "to write the tokens and flip bytes"
need_stories

make_tmp

# serve SHARD...: a stage per shard; their addresses, in order, in $nodes.
serve() {
    start_local_stages "$tmp/stages.log" "$@"
}

prompt="Once upon a time"
python3 -c "import json; json.dump({'tokens': [1, 403, 407, 261, 378, 327, 3, 266, 289, 402]}, open('$tmp/tokens.json', 'w'))"
"$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/one.f32" 2>"$tmp/err" ||
    { echo "FAIL one machine's eval: $(cat "$tmp/err")"; exit 1; }
one="$("$convoy" run -m "$model" -p "$prompt" -n 12 --temp 0 --ignore-eos --ids 2>/dev/null)"
[[ -n "$one" ]] || die "one machine generated nothing"

# chain NAME NODES [ARGS...]: the chain's greedy tokens and logits against one machine's.
chain() {
    local name=$1 list=$2
    shift 2
    if "$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/$name.f32" --nodes "$list" "$@" \
        2>"$tmp/err" && cmp -s "$tmp/one.f32" "$tmp/$name.f32"; then
        pass "$name: logits bit-identical to one machine's"
    else
        fail "$name: logits differ or eval failed: $(cat "$tmp/err")"
    fi
    local ids
    ids="$("$convoy" run -m "$model" -p "$prompt" -n 12 --temp 0 --ignore-eos --ids --nodes "$list" "$@" 2>"$tmp/err")"
    if [[ "$ids" == "$one" ]]; then
        pass "$name: greedy tokens $ids as one machine"
    else
        fail "$name: greedy tokens '$ids' vs '$one': $(cat "$tmp/err")"
    fi
}

"$convoy" split "$model" --stages 2 -o "$tmp" >"$tmp/split.out" 2>&1 &&
    grep -q "shard 2/2: layers \[3, 5)" "$tmp/split.out" || { echo "FAIL split: $(cat "$tmp/split.out")"; exit 1; }
"$convoy" split "$model" --split 1,2,2 -o "$tmp/three" >"$tmp/split.out" 2>&1 || # -o creates the folder
    { echo "FAIL split: $(cat "$tmp/split.out")"; exit 1; }
s2="$tmp/stories260K.shard-%d-of-2.gguf"
s3="$tmp/three/stories260K.shard-%d-of-3.gguf"
# shellcheck disable=SC2059
serve "$(printf "$s2" 1)" "$(printf "$s2" 2)"
chain "2 shards" "$nodes"
stop_pids
# shellcheck disable=SC2059
serve "$(printf "$s3" 1)" "$(printf "$s3" 2)" "$(printf "$s3" 3)"
chain "3 shards" "$nodes"
chain "local + shards 2, 3 of 3" "local,${nodes#*,}"
stop_pids

# refused NODES PATTERN WHY: a chain over NODES is refused (FINGERPRINT)
# with a message that matches PATTERN.
refused() {
    if "$convoy" run -m "$head" -p "$prompt" -n 4 --temp 0 --ids --nodes "$1" >"$tmp/out" 2>"$tmp/err"; then
        fail "$3: the chain ran: $(cat "$tmp/out")"
    elif grep -q "$2.*(FINGERPRINT)" "$tmp/err"; then
        pass "$3: $(grep -m1 FINGERPRINT "$tmp/err")"
    else
        fail "$3: not refused with '$2': $(cat "$tmp/err")"
    fi
}
# names TENSOR: the refusal of a tensor whose weights differ.
names() { echo "tensor $1 differs from the head's (different weights)"; }

mkdir -p "$tmp/a" "$tmp/b"
synth_tiny 1 "$tmp/a/m.gguf" && synth_tiny 2 "$tmp/b/m.gguf" || die "convoy synth"
"$convoy" split "$tmp/a/m.gguf" --stages 2 -o "$tmp/a" >/dev/null && "$convoy" split "$tmp/b/m.gguf" --stages 2 \
    -o "$tmp/b" >/dev/null || { echo "FAIL split of the synth models"; exit 1; }
head="$tmp/a/m.gguf"
serve "$tmp/a/m.shard-1-of-2.gguf" "$tmp/b/m.shard-2-of-2.gguf"
refused "$nodes" "$(names blk.3.attn_q.weight)" "a shard of another model (seed 2) as the last stage"
stop_pids

cp "$tmp/a/m.shard-1-of-2.gguf" "$tmp/flipped.gguf"
flip_tensor_byte "$convoy" "$tmp/flipped.gguf" blk.1.ffn_up.weight
serve "$tmp/flipped.gguf" "$tmp/a/m.shard-2-of-2.gguf"
refused "$nodes" "$(names blk.1.ffn_up.weight)" "one byte changed in the first shard's blk.1.ffn_up.weight"
stop_pids

# a shard's key/values are the model's: one changed (llama.rope.freq_base
# 10000 -> 20000) makes its metadata hash another model's
cp "$tmp/a/m.shard-2-of-2.gguf" "$tmp/rekeyed.gguf"
python3 -c "
import struct, sys
d = bytearray(open(sys.argv[1], 'rb').read())
key = b'llama.rope.freq_base'
i = d.find(key) + len(key)
assert struct.unpack_from('<If', d, i) == (6, 10000.0)
struct.pack_into('<f', d, i + 4, 20000.0)
open(sys.argv[1], 'wb').write(d)" "$tmp/rekeyed.gguf"
serve "$tmp/a/m.shard-1-of-2.gguf" "$tmp/rekeyed.gguf"
refused "$nodes" "model fingerprint differs" "a shard with a changed key/value"
stop_pids

# ranges that do not fit
mkdir -p "$tmp/c"
"$convoy" split "$model" --split 2,3 -o "$tmp/c" >/dev/null || { echo "FAIL split 2,3"; exit 1; }
serve "$tmp/c/stories260K.shard-1-of-2.gguf"
head="$model"
if "$convoy" run -m "$model" -p "$prompt" -n 4 --ids --nodes "local,$nodes" --split 2,3 >"$tmp/out" 2>"$tmp/err"; then
    fail "--split 2,3 gave the shard of [0, 2) layers [2, 5): the chain ran"
elif grep -q "$nodes holds layers \[0, 2) only (its model file is a shard), the plan gives it layers \[2, 5)" \
    "$tmp/err"; then
    pass "--split outside a node's shard: $(cat "$tmp/err")"
else
    fail "--split outside a node's shard: not refused as expected: $(cat "$tmp/err")"
fi
if "$convoy" run -m "$model" -p "$prompt" -n 4 --ids --nodes "$nodes" >"$tmp/out" 2>"$tmp/err"; then
    fail "a shard of [0, 2) alone ran the model"
elif grep -q "no node after them holds layers \[2, 5)" "$tmp/err"; then
    pass "nodes short of the model: $(cat "$tmp/err")"
else
    fail "nodes short of the model: not refused as expected: $(cat "$tmp/err")"
fi
stop_pids

# A head that ignores the ranges (a real head's assignment of every layer,
# replayed) is refused by the node itself.
fake="$(free_port)"
python3 "$src/tests/stage_peer.py" capture "$fake" "$tmp/hello" &
capture_pid=$!
wait_listening "$fake"
"$convoy" run -m "$model" -p "$prompt" -n 4 --temp 0 --ctx 256 --batch 4 --nodes "127.0.0.1:$fake" >/dev/null 2>&1
if wait "$capture_pid"; then
    serve "$tmp/c/stories260K.shard-1-of-2.gguf"
    if python3 "$src/tests/stage_peer.py" check "${nodes##*:}" "$tmp/hello" shard >"$tmp/out" 2>&1; then
        pass "a node refuses layers outside its shard:$(grep ERROR "$tmp/out")"
    else
        fail "a node took layers outside its shard: $(cat "$tmp/out")"
    fi
    stop_pids
else
    fail "no assignment HELLO captured from the head"
fi

: >"$tmp/stages.log"
serve "$tmp/c/stories260K.shard-1-of-2.gguf"
stop_pids
if grep -q "hashes from $tmp/c/stories260K.shard-1-of-2.gguf.convoy-hashes" "$tmp/stages.log"; then
    pass "a restarted stage reads its shard's hashes from the cache"
else
    fail "no cache hit on restart: $(cat "$tmp/stages.log")"
fi

checks_summary
