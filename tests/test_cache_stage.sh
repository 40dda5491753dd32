#!/usr/bin/env bash
# test_cache_stage.sh: a stage without a model (`convoy stage --cache DIR`)
# receives its layers from the head. stories260K on loopback, every link
# keyed, the head "local" with layers [0, 2) and the stage [2, 5):
# 1. an empty cache: the head ships the shard, the stage writes it to DIR,
#    byte for byte the file `convoy split` writes for those layers, and
#    the chain's logits are one machine's, bit for bit;
# 2. the stage restarted: it serves from its cache, nothing is shipped;
# 3. half of the shard left as a .part (a transfer cut): the stage resumes
#    after it, the head ships the rest from the segment boundary below;
# 4. a .part with a changed byte: the file fails its hashes, the stage
#    fetches it again whole, and the logits are still one machine's;
# 5. a receiving stage in the middle of a 3-stage chain: the same logits;
# 6. -m with --cache, and a --cache that is a file, are refused by name.
#
# Usage (CTest passes these): test_cache_stage.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3 "to write the tokens and change a byte"
need_stories

make_tmp

"$convoy" keygen "$tmp/key" 2>/dev/null || { echo "FAIL keygen"; exit 1; }
python3 -c "import json; json.dump({'tokens': [1, 403, 407, 261, 378, 327, 3, 266, 289, 402]}, open('$tmp/tokens.json', 'w'))"
"$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/one.f32" 2>"$tmp/err" ||
    { echo "FAIL one machine's eval: $(cat "$tmp/err")"; exit 1; }
"$convoy" split "$model" --split 2,3 -o "$tmp" >/dev/null 2>&1 || { echo "FAIL split"; exit 1; }
want="$tmp/stories260K.shard-2-of-2.gguf"
cache="$tmp/cache"
port="$(free_port)"

# run NAME: a fresh stage on the cache, the keyed chain's logits against one
# machine's; the stage's log in $tmp/NAME.stage, the head's in $tmp/NAME.head.
run() {
    stop_pids
    start_local_stage "$convoy" "$tmp/$1.stage" "$port" --cache "$cache" --key "$tmp/key"
    pids+=("$stage_pid")
    if "$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/$1.f32" --nodes "local,127.0.0.1:$port" \
        --split 2,3 --key "$tmp/key" 2>"$tmp/$1.head" && cmp -s "$tmp/one.f32" "$tmp/$1.f32"; then
        pass "$1: logits bit-identical to one machine's"
    else
        fail "$1: logits differ or eval failed: $(cat "$tmp/$1.head")"
    fi
}
shard() { ls "$cache"/*.layers-2-5.gguf 2>/dev/null; }

run empty
if grep -q "shipped layers \[2, 5) to node 127.0.0.1:$port: .* from byte 0 as" "$tmp/empty.head" &&
    cmp -s "$(shard)" "$want"; then
    pass "empty: the head shipped layers [2, 5); the cached file is the split's shard byte for byte"
else
    fail "empty: no shipment, or the cached file differs: $(cat "$tmp/empty.head" "$tmp/empty.stage")"
fi

run again
if ! grep -q "ship" "$tmp/again.head" && grep -q "layers \[2, 5) from the cache" "$tmp/again.stage"; then
    pass "again: served from the cache, nothing shipped"
else
    fail "again: $(cat "$tmp/again.head" "$tmp/again.stage")"
fi

file="$(shard)"
head -c 400000 "$want" >"$file.part" && rm -f "$file" "$file.convoy-hashes"
run resumed
from="$(sed -n 's/.*shipped layers \[2, 5) .* from byte \([0-9]*\) as.*/\1/p' "$tmp/resumed.head")"
if grep -q "resuming layers \[2, 5) after byte 400000" "$tmp/resumed.stage" && [[ -n "$from" ]] &&
    ((from > 0 && from <= 400000)) && cmp -s "$file" "$want"; then
    pass "resumed: after byte 400000 of the .part, shipped from byte $from"
else
    fail "resumed: $(cat "$tmp/resumed.head" "$tmp/resumed.stage")"
fi

head -c 400000 "$want" >"$file.part" && rm -f "$file" "$file.convoy-hashes"
python3 -c "
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(300000); b = f.read(1); f.seek(300000); f.write(bytes([b[0] ^ 0xff]))" "$file.part"
run corrupt
if grep -q "do not check: tensor .* differs.*fetching them whole" "$tmp/corrupt.stage" &&
    grep -q "from byte 0 as" "$tmp/corrupt.head" && cmp -s "$file" "$want"; then
    pass "corrupt: the changed .part failed its hashes and was fetched again whole"
else
    fail "corrupt: $(cat "$tmp/corrupt.head" "$tmp/corrupt.stage")"
fi
stop_pids

# a receiving stage in the middle of a chain: the layers it gets, then the
# last stage (a model of its own) behind it, the logits one machine's
start_local_stage "$convoy" "$tmp/middle.stage" "$port" --cache "$tmp/cache-middle" --key "$tmp/key"
pids+=("$stage_pid")
last_port="$(free_port)"
start_local_stage "$convoy" "$tmp/last.stage" "$last_port" -m "$model" --key "$tmp/key"
pids+=("$stage_pid")
if "$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/middle.f32" \
    --nodes "local,127.0.0.1:$port,127.0.0.1:$last_port" --split 1,2,2 --key "$tmp/key" 2>"$tmp/middle.head" &&
    cmp -s "$tmp/one.f32" "$tmp/middle.f32"; then
    pass "middle: a receiving stage before another one, logits bit-identical to one machine's"
else
    fail "middle: $(cat "$tmp/middle.head" "$tmp/middle.stage")"
fi
stop_pids

if ! "$convoy" stage --listen "127.0.0.1:$port" -m "$model" --cache "$cache" 2>"$tmp/both" &&
    grep -q "(--model) or receives its layers (--cache), one of the two" "$tmp/both"; then
    pass "-m with --cache is refused"
else
    fail "-m with --cache: $(cat "$tmp/both")"
fi
if ! "$convoy" stage --listen "127.0.0.1:$port" --cache "$want" 2>"$tmp/file" && grep -q "not a directory" "$tmp/file"; then
    pass "a --cache that is a file is refused"
else
    fail "--cache FILE: $(cat "$tmp/file")"
fi
checks_summary
