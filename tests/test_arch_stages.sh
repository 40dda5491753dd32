#!/usr/bin/env bash
# test_arch_stages.sh: the architectures beyond llama's, synthesized
# (convoy synth, Q4_0): gemma3-mini (sliding window 16 on 6 of its 7
# layers), gemma2-mini (window 16 on layers 0 and 2 of 4, attention and
# final logits soft-capped), qwen3moe-mini, qwen2moe-mini (shared expert),
# mixtral-mini (a llama with experts) and gpt-oss-mini (attention sinks,
# window 16 on layers 0 and 2 of 4, YaRN, MXFP4 experts with biases). Each
# gives bit-identical logits
# of 64 tokens (on which the Gemmas' window moves) with 1 and 2 threads,
# in chunks of 7, and through 1, 2 and 3 `convoy stage` processes on
# loopback, and the same greedy tokens on a 2-stage chain as on one
# machine; `convoy info` and `convoy run`'s load line name the
# architecture. Refused by name: the gemma3 file renamed gemma4 (with the
# supported list), a qwen3moe file whose expert_used_count exceeds its
# expert_count, one whose
# blk.0.ffn_up_exps.weight has the wrong shape, and a gpt-oss file whose
# blk.0.attn_sinks.weight has the wrong length. Then phi3-mini (Q4_0:
# fused Q/K/V and gate/up, partial RoPE with its long LongRoPE factors in a
# context of 1024) gives one machine's logits through 1 and 2 stages and
# through the 2 shards of `convoy split`, and a shard whose
# rope_factors_long.weight differs is refused naming it.
#
# Usage (CTest passes these): test_arch_stages.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3 "to write the tokens and patch files"

make_tmp
python3 -c "import json; json.dump({'tokens': [2] + [3 + (i * 7919) % 2040 for i in range(1, 64)]}, open('$tmp/tokens.json', 'w'))"
prompt="Once upon a time"

# patch FILE OUT PYTHON: OUT is FILE's bytes after PYTHON edits bytearray d.
patch() {
    python3 -c "
import struct
d = bytearray(open('$1', 'rb').read())
$3
open('$2', 'wb').write(d)"
}

# refused NAME FILE MESSAGE: convoy run refuses FILE saying MESSAGE.
refused() {
    "$convoy" run -m "$2" -p hi -n 1 >/dev/null 2>"$tmp/refused"
    expect "$1" grep -qF "$3" "$tmp/refused"
}

# same NAME ARGS...: eval of $model with ARGS gives one machine's logits bit for bit.
same() {
    local name="$1"
    shift
    if "$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/got.f32" "$@" 2>"$tmp/err" &&
        cmp -s "$tmp/one.f32" "$tmp/got.f32"; then
        pass "$shape $name: logits bit-identical to one machine's, 1 thread"
    else
        fail "$shape $name: logits differ or eval failed: $(cat "$tmp/err")"
    fi
}

# check SHAPE ARCH LAYERS SPLIT2 SPLIT3: the checks above for one shape.
check() {
    shape="$1"
    model="$tmp/$shape-q4_0.gguf"
    "$convoy" synth --shape "$shape" --type Q4_0 -o "$model" >/dev/null || { fail "synth $shape"; return; }
    expect "$shape: convoy info names the architecture" grep -q "^architecture: $2$" <("$convoy" info "$model")
    "$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/one.f32" -t 1 2>"$tmp/err" ||
        { fail "$shape: one machine's eval: $(cat "$tmp/err")"; return; }
    local one ids
    one="$("$convoy" run -m "$model" -p "$prompt" -n 24 --temp 0 --ignore-eos --ids 2>"$tmp/run.err")"
    expect "$shape: convoy run's load line names the architecture" grep -q "($2, $3 layers," "$tmp/run.err"
    same "2 threads" -t 2
    same "chunks of 7" --batch 7
    start_local_stages "$tmp/stages.log" "$model" "$model" "$model"
    local two="${addrs[1]},${addrs[2]}"
    same "1 stage" --nodes "${addrs[0]}"
    same "2 stages ($4)" --nodes "$two" --split "$4"
    same "2 stages, chunks of 5" --nodes "$two" --split "$4" --batch 5
    same "3 stages ($5)" --nodes "$nodes" --split "$5"
    ids="$("$convoy" run -m "$model" -p "$prompt" -n 24 --temp 0 --ignore-eos --ids --nodes "$two" --split "$4" \
        2>"$tmp/err")"
    if [[ -n "$one" && "$ids" == "$one" ]]; then
        pass "$shape 2 stages: 24 greedy tokens as one machine"
    else
        fail "$shape 2 stages: greedy tokens '$ids' vs '$one': $(cat "$tmp/err")"
    fi
    stop_pids
}

check gemma3-mini gemma3 7 3,4 2,2,3
# the same file calling itself gemma4 (general.architecture's value: after the key, a u32 type and a u64 length)
patch "$model" "$tmp/gemma4.gguf" "at = d.index(b'general.architecture') + len('general.architecture') + 12
d[at:at + 6] = b'gemma4'"
refused "an unsupported architecture is refused by name with the supported list" "$tmp/gemma4.gguf" \
    "architecture 'gemma4' is not supported (supported: llama, qwen2, qwen3, gemma2, gemma3, qwen2moe, qwen3moe, phi3, gpt-oss)"

check gemma2-mini gemma2 4 1,3 1,2,1

check qwen3moe-mini qwen3moe 4 1,3 1,2,1
# expert_used_count's u32 value (after the key and its u32 type) made 9, over the 8 experts
patch "$model" "$tmp/used.gguf" "at = d.index(b'qwen3moe.expert_used_count') + len('qwen3moe.expert_used_count') + 4
d[at:at + 4] = struct.pack('<I', 9)"
refused "expert_used_count over expert_count is refused" "$tmp/used.gguf" \
    "qwen3moe.expert_used_count 9 is outside [1, expert_count 8]"
# blk.0.ffn_up_exps.weight's second dimension (after the name, a u32 n_dims and its first u64) made 32
patch "$model" "$tmp/shape.gguf" "at = d.index(b'blk.0.ffn_up_exps.weight') + len('blk.0.ffn_up_exps.weight') + 4 + 8
d[at:at + 8] = struct.pack('<Q', 32)"
refused "a bad expert tensor shape is refused naming the tensor" "$tmp/shape.gguf" \
    "tensor 'blk.0.ffn_up_exps.weight' has shape [128, 32, 8], expected [128, 64, 8]"

# check_phi3_shards: phi3-mini's checks above, in a context of 1024.
check_phi3_shards() {
    shape=phi3-mini
    model="$tmp/$shape-q4_0.gguf"
    "$convoy" synth --shape "$shape" --type Q4_0 -o "$model" >/dev/null || { fail "synth $shape"; return; }
    expect "$shape: convoy info names phi3" grep -q "^architecture: phi3$" <("$convoy" info "$model")
    "$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/one.f32" -t 1 --ctx 1024 2>"$tmp/err" ||
        { fail "$shape: one machine's eval: $(cat "$tmp/err")"; return; }
    mkdir -p "$tmp/shards"
    "$convoy" split "$model" --stages 2 -o "$tmp/shards" >/dev/null 2>"$tmp/err" ||
        { fail "$shape: split: $(cat "$tmp/err")"; return; }
    local shard="$tmp/shards/$shape-q4_0.shard-%d-of-2.gguf"
    # shellcheck disable=SC2059
    cp "$(printf "$shard" 2)" "$tmp/flipped.gguf"
    flip_tensor_byte "$convoy" "$tmp/flipped.gguf" rope_factors_long.weight
    # shellcheck disable=SC2059
    start_local_stages "$tmp/stages.log" "$model" "$model" "$model" "$(printf "$shard" 1)" "$(printf "$shard" 2)" \
        "$tmp/flipped.gguf"
    same "1 stage" --ctx 1024 --nodes "${addrs[0]}"
    same "2 stages (1 + 3 layers)" --ctx 1024 --nodes "${addrs[1]},${addrs[2]}" --split 1,3
    same "2 shards" --ctx 1024 --nodes "${addrs[3]},${addrs[4]}"
    "$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/got.f32" --ctx 1024 \
        --nodes "${addrs[3]},${addrs[5]}" >/dev/null 2>"$tmp/err"
    expect "$shape: a shard whose rope_factors_long differs is refused naming it" grep -q \
        "tensor rope_factors_long.weight differs from the head's (different weights).*(FINGERPRINT)" "$tmp/err"
    stop_pids
}

check qwen2moe-mini qwen2moe 4 2,2 1,1,2
check mixtral-mini llama 4 3,1 2,1,1

check gpt-oss-mini gpt-oss 4 1,3 1,2,1
# blk.0.attn_sinks.weight's length (after the name, a u32 n_dims) made 4, below the 8 heads
patch "$model" "$tmp/sinks.gguf" "at = d.index(b'blk.0.attn_sinks.weight') + len('blk.0.attn_sinks.weight') + 4
d[at:at + 8] = struct.pack('<Q', 4)"
refused "a gpt-oss file with a bad sinks length is refused naming the tensor" "$tmp/sinks.gguf" \
    "tensor 'blk.0.attn_sinks.weight' has 4 elements, expected [8]"
check_phi3_shards
checks_summary
