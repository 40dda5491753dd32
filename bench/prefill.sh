#!/usr/bin/env bash
# prefill.sh: time to first token of a long prompt through a 2-stage
# pipeline on loopback, its chunks pipelined across the stages (the
# default) against chunking off (--prefill-chunk -1: the prompt as one
# batch, through every stage in turn) and against one machine, alternated
# run by run in one script.
#
#   bench/prefill.sh [MODEL]
#
# The head is stage 1 on core 0 (--nodes local,...), a `convoy stage` on
# core 1 is stage 2, 1 thread each; the one-machine run takes core 0.
# Default model: a synthetic Llama-3.2-1B-shaped Q4_K_M (made once under
# bench/out/models). TOKENS (default about 2000): the prompt's length, made
# of random words; REPEAT (default 3). Each run generates 4 greedy tokens,
# and the three configurations must give the same ids.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
repeat="${REPEAT:-3}"
words="${WORDS:-764}" # about 2,000 tokens with the synthetic models' tokenizer
bench_build
model="${1:-$(bench_model llama-1b-q4_k_m --shape llama-3.2-1b --type Q4_K_M)}"
prompt="$(python3 -c "
import random
random.seed(1)
w = 'the quick brown fox jumps over lazy dog while seven small cats watch from a sunny window and think about dinner'.split()
print(' '.join(random.choice(w) for _ in range($words)))")"
port=7851
make_tmp
taskset -c 1 "$convoy" stage --listen "127.0.0.1:$port" -m "$model" -t 1 --batch 4096 2>"$tmp/stage.log" &
pids+=($!)
stage_listens "$tmp/stage.log" "$port" 200 0.1 || die "the stage did not start: $(tail -2 "$tmp/stage.log")"

# run NAME ARGS...: prints the prefill seconds; the ids go to $tmp/NAME.ids
run() {
    local name="$1"
    shift
    taskset -c 0 "$convoy" run -m "$model" -p "$prompt" -n 4 --temp 0 --ids -t 1 --ctx 4096 --batch 4096 "$@" \
        2>"$tmp/$name.err" >"$tmp/$name.ids"
    grep -o 'prefill [0-9]* tokens in [0-9.]* s' "$tmp/$name.err" | awk '{print $2, $5}'
}

declare -A secs
n_prompt=0
for r in $(seq "$repeat"); do
    for name in chunked off one; do
        case "$name" in
        chunked) out="$(run chunked --nodes "local,127.0.0.1:$port")" ;;
        off) out="$(run off --nodes "local,127.0.0.1:$port" --prefill-chunk -1)" ;;
        one) out="$(run one)" ;;
        esac
        n_prompt="${out% *}"
        secs[$name]="${secs[$name]:-} ${out#* }"
    done
    cmp -s "$tmp/chunked.ids" "$tmp/one.ids" && cmp -s "$tmp/off.ids" "$tmp/one.ids" ||
        die "the ids differ: $(cat "$tmp"/*.ids)"
done
c="$(median <<<"${secs[chunked]}")" o="$(median <<<"${secs[off]}")" u="$(median <<<"${secs[one]}")"
echo "$model, a $n_prompt-token prompt, medians of $repeat runs (same ids in every run)"
echo "| configuration | time to first token (s) | chunked / this |"
echo "|---|---:|---:|"
echo "| 2 stages, chunks pipelined | $c | 1.00x |"
echo "| 2 stages, chunking off | $o | $(ratio "$c" "$o") |"
echo "| one machine | $u | $(ratio "$c" "$u") |"
