#!/usr/bin/env bash
# vs_llamacpp.sh: convoy against llama.cpp's own AVX2 build, side by side.
#
# For each model and thread count, runs convoy (build/bench_decode --model)
# and llama-bench in turns, run by run, on the same file: prefill of a
# PP-token prompt and decode of TG tokens. Alternating makes a busy
# machine slow both alike; each round gives one ratio (convoy tok/s /
# llama.cpp tok/s) and the table prints the median ratio and the median
# tokens/s of each. Decode rows also show the roofline: the read bandwidth
# of 1 or 2 threads (bench_decode --bandwidth-only, measured once at the
# start) over the weight bytes convoy reads per token. With DEPTH set, the
# decode runs after DEPTH tokens of context (llama-bench -d, with flash
# attention on; convoy's attention is always fused). 1-thread runs of both
# programs are pinned to the same core (CORE, default 0): the cores of a
# VM can differ by 20%, so an unpinned run's speed depends on where it lands.
# On a CPU with AVX-512 VNNI convoy runs its AVX-512 kernels there, while
# llama.cpp's build here is AVX2: CONVOY_KERNELS=avx2 compares AVX2 with
# AVX2. The first line names the kernels convoy ran.
#
# usage: bench/vs_llamacpp.sh [-r ROUNDS] [-t "1 2"] [-b BUILD_DIR] [MODEL.gguf ...]
#   defaults: 5 rounds, threads 1 and 2, build/, PP=512 TG=64 DEPTH=0 CORE=0 TESTS="pp tg"
#   (environment), models bench/out/models/llama-1b-{q4_0,q4_k,q5_k,q6_k,q8_0,q4_k_m}.gguf
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=5 threads="1 2" build=build
while getopts r:t:b: o; do
    case $o in
    r) rounds=$OPTARG ;;
    t) threads=$OPTARG ;;
    b) build=$OPTARG ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
PP=${PP:-512} TG=${TG:-64} DEPTH=${DEPTH:-0} CORE=${CORE:-0} TESTS=${TESTS:-pp tg}
shared=${CONVOY_SHARED:-../shared}
lb=$shared/tools/llama.cpp/bin/llama-bench
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(bench/out/models/llama-1b-{q4_0,q4_k,q5_k,q6_k,q8_0,q4_k_m}.gguf)
for f in "$build/bench_decode" "$lb" "${models[@]}"; do
    [ -e "$f" ] || { echo "vs_llamacpp: missing $f" >&2; exit 1; }
done

# A command of THREADS threads: on core CORE alone when THREADS is 1.
pinned() { # threads command...
    if [ "$1" = 1 ]; then taskset -c "$CORE" "${@:2}"; else "${@:2}"; fi
}
# llama-bench's tokens/s of one test (pp or tg) as one number.
llama() { # model threads pp tg [depth]
    local depth=()
    [ "${5:-0}" -gt 0 ] && depth=(-d "$5" -fa on)
    pinned "$2" "$lb" -m "$1" -t "$2" -p "$3" -n "$4" "${depth[@]}" -r 1 -o jsonl 2>/dev/null |
        sed -n 's/.*"avg_ts": *\([0-9.e+-]*\).*/\1/p' | head -1
}

# GB/s of 1 and 2 threads
read -r bw1 bw2 kernels < <("$build/bench_decode" --bandwidth-only |
    sed -n 's/^read bandwidth: \([0-9.]*\) GB\/s (1 thread), \([0-9.]*\) GB\/s.*kernels: \(.*\)$/\1 \2 \3/p')
echo "read bandwidth: $bw1 GB/s (1 thread), $bw2 GB/s (2 threads); convoy kernels: $kernels"
printf '| model | threads | test | convoy tok/s | llama.cpp tok/s | ratio (median of %d) | roofline tok/s | convoy of roof |\n|---|---:|---|---:|---:|---:|---:|---:|\n' "$rounds"
for m in "${models[@]}"; do
    name=$(basename "$m" .gguf)
    for t in $threads; do
        for test in $TESTS; do
            [ "$test" = pp ] && test=pp$PP || test=tg$TG
            [ "${test:0:2}" = tg ] && [ "$DEPTH" -gt 0 ] && test=$test@d$DEPTH
            cv=() ll=() ra=() bytes=0
            for ((r = 0; r < rounds; r++)); do
                if [ "${test:0:2}" = pp ]; then
                    c=$(pinned "$t" "$build/bench_decode" --model "$m" --threads "$t" --pp "$PP" --tg 0 | awk '{print $1}')
                    l=$(llama "$m" "$t" "$PP" 0)
                else
                    read -r _ c bytes < <(pinned "$t" "$build/bench_decode" --model "$m" --threads "$t" --pp 0 --tg "$TG" \
                        --depth "$DEPTH")
                    l=$(llama "$m" "$t" 0 "$TG" "$DEPTH")
                    [ "$DEPTH" -eq 0 ] || bytes=0 # the roofline counts weights, not the KV cache
                fi
                cv+=("$c") ll+=("$l") ra+=("$(awk -v a="$c" -v b="$l" 'BEGIN {printf "%.4f", a / b}')")
            done
            c=$(median "${cv[@]}")
            roof=n/a of=n/a
            if [ "$bytes" -gt 0 ]; then
                [ "$t" = 1 ] && bw=$bw1 || bw=$bw2
                roof=$(awk -v g="$bw" -v b="$bytes" 'BEGIN {printf "%.2f", g * 1e9 / b}')
                of=$(awk -v c="$c" -v r="$roof" 'BEGIN {printf "%.0f%%", 100 * c / r}')
            fi
            printf '| %s | %s | %s | %.2f | %.2f | %.2fx | %s | %s |\n' "$name" "$t" "$test" "$c" \
                "$(median "${ll[@]}")" "$(median "${ra[@]}")" "$roof" "$of"
        done
    done
done
