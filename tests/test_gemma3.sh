#!/usr/bin/env bash
# test_gemma3.sh: a synthetic Gemma 3 (convoy synth's gemma3-mini, Q4_0:
# sliding window 16 on 6 of its 7 layers) gives bit-identical logits of 64
# tokens, on which the window moves, with 1 and 2 threads, in chunks of 7,
# and through 1 and 2 `convoy stage` processes on loopback, and the same
# greedy tokens on the chain as on one machine; `convoy info` and
# `convoy run`'s load line name the architecture, and the file renamed
# gemma2 is refused by name with the supported list.
#
# Usage (CTest passes these): test_gemma3.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
convoy="${1:?usage: test_gemma3.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_gemma3.sh PATH/TO/convoy SOURCE_DIR}"
. "$src/tests/lib.sh"
command -v python3 >/dev/null || skip "python3 is needed to pick free ports"

tmp="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
model="$tmp/gemma3-mini-q4_0.gguf"
"$convoy" synth --shape gemma3-mini --type Q4_0 -o "$model" >/dev/null || { echo "FAIL synth gemma3-mini"; exit 1; }
expect "convoy info names the architecture" grep -q "^architecture: gemma3$" <("$convoy" info "$model")
# the same file calling itself gemma2 (general.architecture's value: after the key, a u32 type and a u64 length)
python3 -c "
d = bytearray(open('$model', 'rb').read())
at = d.index(b'general.architecture') + len('general.architecture') + 12
d[at:at + 6] = b'gemma2'
open('$tmp/gemma2.gguf', 'wb').write(d)"
"$convoy" run -m "$tmp/gemma2.gguf" -p hi -n 1 >/dev/null 2>"$tmp/refused"
expect "an unsupported architecture is refused by name with the supported list" grep -q \
    "architecture 'gemma2' is not supported (supported: llama, qwen2, qwen3, gemma3, qwen2moe, qwen3moe)" "$tmp/refused"
python3 -c "import json; json.dump({'tokens': [2] + [3 + (i * 7919) % 2040 for i in range(1, 64)]}, open('$tmp/tokens.json', 'w'))"
"$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/one.f32" -t 1 2>"$tmp/err" ||
    { echo "FAIL one machine's eval: $(cat "$tmp/err")"; exit 1; }
prompt="Once upon a time"
one="$("$convoy" run -m "$model" -p "$prompt" -n 24 --temp 0 --ignore-eos --ids 2>"$tmp/run.err")"
expect "convoy run's load line names the architecture" grep -q "(gemma3, 7 layers," "$tmp/run.err"

# same NAME ARGS...: eval with ARGS gives one machine's logits bit for bit.
same() {
    local name="$1"
    shift
    if "$convoy" eval -m "$model" --tokens "$tmp/tokens.json" --logits "$tmp/got.f32" "$@" 2>"$tmp/err" &&
        cmp -s "$tmp/one.f32" "$tmp/got.f32"; then
        pass "$name: logits bit-identical to one machine's, 1 thread"
    else
        fail "$name: logits differ or eval failed: $(cat "$tmp/err")"
    fi
}
same "2 threads" -t 2
same "chunks of 7" --batch 7

ports=()
for k in 1 2 3; do
    ports+=("$(free_port)")
    start_local_stage "$convoy" "$tmp/stages.log" "${ports[-1]}" -m "$model"
    pids+=("$stage_pid")
done
one_stage="127.0.0.1:${ports[0]}"
two_stages="127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
same "1 stage" --nodes "$one_stage"
same "2 stages (3 + 4 layers)" --nodes "$two_stages" --split 3,4
same "2 stages, chunks of 5" --nodes "$two_stages" --split 3,4 --batch 5
ids="$("$convoy" run -m "$model" -p "$prompt" -n 24 --temp 0 --ignore-eos --ids --nodes "$two_stages" --split 3,4 \
    2>"$tmp/err")"
if [[ -n "$one" && "$ids" == "$one" ]]; then
    pass "2 stages: 24 greedy tokens as one machine"
else
    fail "2 stages: greedy tokens '$ids' vs '$one': $(cat "$tmp/err")"
fi
checks_summary
