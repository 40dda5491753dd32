#!/usr/bin/env bash
# users.sh: many users at once (bench/bench_users.c), unsplit against a
# 2-stage pipeline on two test hosts with one core per stage.
#
#   bench/users.sh [MODEL...]
#
# Default models: stories260K, a synthetic Q8_0 model of about 22 MB that
# stays in the shared L3 cache (n_embd 512, 5 layers, vocab 4096), and the
# synthetic Llama-3.2-1B-shaped Q4_0. For each: the unsplit model on core 0
# (1 thread) for U = 1, 2, 4, 8 users, then the pipeline on two test hosts:
# host 0 on core 0 runs bench_users, the server's scheduler and stage 1 in
# one process (--nodes local,...), host 1 (10.77.0.2) on core 1 runs stage 2
# (`convoy stage`).
# It also prints the read bandwidth ceiling (2 threads / 1 thread) measured
# in the same run for the memory-bound 1B model. TOKENS (default 128) per user.
# DRAFT=q8_0|q4_0|ngram|PATH.gguf adds speculative runs of every target (a
# self-draft quantized from each model into bench/out/models, the n-gram
# drafter, or a given draft model, for one MODEL only), with their ratios
# to the unsplit model with the same speculation too. convoy quantize takes F32/F16/BF16 models
# only, so q8_0|q4_0 stop with a message for the synthetic ones (already
# quantized): give those DRAFT=PATH.gguf, e.g. a `convoy synth` of the same
# shape with --type Q4_0 (the same weights).
# REPEAT (default 5): runs of each measurement, each paired with a baseline run.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
tokens="${TOKENS:-128}"
bench_build convoy bench_users bench_decode
l3_dims=512,5,8,8,1536,4096
l3="$(bench_model synth-22mb-q8_0 --dims $l3_dims --type Q8_0)"
big="$(bench_model llama-1b-q4_0 --shape llama-3.2-1b --type Q4_0)"
models=("$@")
if [[ "${DRAFT:-}" == *.gguf && ${#models[@]} -ne 1 ]]; then
    say "DRAFT=PATH.gguf drafts for one target: name exactly one MODEL (its vocabulary must match)"
    exit 2
fi
[[ ${#models[@]} -gt 0 ]] || models=("${CONVOY_SHARED:-../shared}/models/stories260K.gguf" "$l3" "$big")

test_hosts cvu 2
for m in "${models[@]}"; do
    draft=()
    case "${DRAFT:-}" in
    "") ;;
    ngram) draft=(--draft ngram) ;;
    *.gguf) draft=(--draft "$DRAFT") ;;
    *)
        d="bench/out/models/$(basename "$m" .gguf)-draft-$DRAFT.gguf"
        if [[ ! -f "$d" ]] && ! "$convoy" quantize "$m" "$d" "$DRAFT" >/dev/null; then
            echo "users.sh: $m cannot be quantized to $DRAFT (convoy quantize takes F32/F16/BF16 models);" \
                "give DRAFT=PATH.gguf, e.g. for the 22 MB model: build/convoy synth --dims $l3_dims" \
                "--type Q4_0 -o bench/out/models/synth-22mb-q4_0.gguf, then" \
                "DRAFT=bench/out/models/synth-22mb-q4_0.gguf bench/users.sh $l3" >&2
            exit 1
        fi
        draft=(--draft "$d")
        ;;
    esac
    : >"$tmp/stage1.log"
    stage_cores=1 start_host_stage "$cluster" 1 "$convoy" "$tmp/stage1.log" -m "$m" --insecure || true
    pids+=("$stage_pid")
    on 0 taskset -c 0 "$build/bench_users" -m "$m" -n "$tokens" --repeat "${REPEAT:-5}" --label "users" \
        --nodes local,10.77.0.2:7000 --insecure "${draft[@]}"
    stop_pids
    echo
done
echo "bandwidth ceiling for memory-bound models (2 threads / 1 thread):"
"$build/bench_decode" --bandwidth-only
