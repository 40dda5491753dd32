#!/usr/bin/env bash
# builds.sh: two commits of convoy side by side in one run, for a change
# that should move no figure (a refactor) or one that should (a kernel).
#
#   bench/builds.sh OLD_REV [NEW_REV]        (NEW_REV default: HEAD)
#
# Builds each commit (git worktree, RelWithDebInfo) under bench/out/builds/,
# then runs ROUNDS rounds (default 5), each measuring both builds one after
# the other, in alternating order:
#   - decode: `convoy run` greedy on the synthetic Llama-3.2-1B-shaped Q4_0
#     (memory-bound), a 121-token prompt then 64 tokens, 1 and 2 threads:
#     prefill and decode tokens/s as convoy prints them;
#   - serve: bench_users (the scheduler of `convoy serve` without HTTP) on
#     the ~22 MB Q8_0 model, 4 users of 64 tokens: aggregate tokens/s,
#     unsplit and on a 2-stage chain (a local first stage and the build's
#     own `convoy stage` on a loopback port).
# Prints medians of each build's figures and of the new/old ratio of each
# round's pair (with the smallest and largest ratio), and appends one JSON
# line per measurement to bench/out/builds.jsonl.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
[[ $# -ge 1 ]] || { echo "usage: bench/builds.sh OLD_REV [NEW_REV]" >&2; exit 2; }
rounds="${ROUNDS:-5}"
revs=("$(git rev-parse --short "$1")" "$(git rev-parse --short "${2:-HEAD}")")
out=bench/out
mkdir -p "$out/builds" "$out/models"

build_rev() { # build_rev REV: bench/out/builds/REV/build/{convoy,bench_users}
    local dir="$out/builds/$1"
    [[ -d "$dir/src" ]] || git worktree add --detach -f "$dir/src" "$1" >/dev/null
    cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    make --no-print-directory -C "$dir/build" -j2 convoy bench_users >/dev/null
}
for r in "${revs[@]}"; do build_rev "$r"; done

convoy="$out/builds/${revs[1]}/build/convoy"
big="$(bench_model llama-1b-q4_0 --shape llama-3.2-1b --type Q4_0)"
small="$(bench_model synth-22mb-q8_0 --dims 512,5,8,8,1536,4096 --type Q8_0)"
prompt="$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..11})"

# measure REV: prints "metric value" lines for one build.
measure() {
    local bin="$out/builds/$1/build" t line
    for t in 1 2; do
        line="$("$bin/convoy" run -m "$big" -p "$prompt" -n 64 -t "$t" --temp 0 --ignore-eos 2>&1 >/dev/null |
                grep 'prefill .* decode')"
        echo "prefill_t$t $(sed -E 's/.*prefill [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<<"$line")"
        echo "decode_t$t $(sed -E 's/.*decode [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<<"$line")"
    done
    local log="$out/builds/$1/stage.log" table port
    port="$(free_port)"
    : >"$log"
    start_local_stage "$bin/convoy" "$log" "$port" -m "$small"
    pids=("$stage_pid")
    table="$("$bin/bench_users" -m "$small" -n 64 --users 4 --repeat 1 --nodes "local,127.0.0.1:$port")"
    stop_pids
    echo "serve_u4 $(grep '^| unsplit | none | 4 |' <<<"$table" | awk -F'|' '{gsub(/ /, "", $6); print $6}')"
    echo "serve_chain_u4 $(grep '^| pipeline | none | 4 |' <<<"$table" | awk -F'|' '{gsub(/ /, "", $6); print $6}')"
}

declare -A val
for ((k = 0; k < rounds; k++)); do
    order=(0 1)
    ((k % 2)) && order=(1 0)
    for i in "${order[@]}"; do
        while read -r metric v; do
            val["$i,$metric,$k"]="$v"
            printf '{"bench":"builds","rev":"%s","metric":"%s","round":%d,"value":%s}\n' \
                "${revs[$i]}" "$metric" "$k" "$v" >>"$out/builds.jsonl"
        done < <(measure "${revs[$i]}")
    done
done

echo "old ${revs[0]} against new ${revs[1]}, $rounds rounds alternating, medians (tokens/s)"
echo "| figure | old | new | new / old (min-max) |"
echo "|---|---:|---:|---:|"
for metric in prefill_t1 decode_t1 prefill_t2 decode_t2 serve_u4 serve_chain_u4; do
    olds=() news=() ratios=()
    for ((k = 0; k < rounds; k++)); do
        olds+=("${val[0,$metric,$k]}")
        news+=("${val[1,$metric,$k]}")
        ratios+=("$(awk -v a="${val[0,$metric,$k]}" -v b="${val[1,$metric,$k]}" 'BEGIN {printf "%.3f", b / a}')")
    done
    lo="$(printf '%s\n' "${ratios[@]}" | sort -g | head -1)"
    hi="$(printf '%s\n' "${ratios[@]}" | sort -g | tail -1)"
    printf '| %s | %.2f | %.2f | %.3fx (%s-%s) |\n' "$metric" "$(median "${olds[@]}")" "$(median "${news[@]}")" \
        "$(median "${ratios[@]}")" "$lo" "$hi"
done
