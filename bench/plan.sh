#!/usr/bin/env bash
# plan.sh: `convoy plan`'s predictions against measured runs (issue #37).
# Fleets of 2, 3 and 4 stages on test hosts 1..N (scripts/cluster.sh,
# prefix "cvp"), the head on host 0: hosts 1 and 3 on core 1 at full
# speed, hosts 2 and 4 (and the head) on core 0 made slower (PCT% of its
# speed left: 50, 60, 70 for the three fleets) by tools/slowcore, a
# real-time process that takes the rest of every 250 us: a slower CPU,
# however idle. Stages of one core share it when several users keep both
# busy: `convoy plan --cpus` says which do. For each fleet:
#   1. `convoy plan --nodes` measures the stages and prints the plan for
#      1, 2 and 4 users (SPLITS=even: the layers shared evenly by every
#      host instead, so that each run crosses them all);
#   2. `convoy serve -np U --split PLAN` with U clients, each repeating a
#      greedy request of 160 tokens, measures aggregate tokens/s over
#      WINDOW seconds (default 6, after 2 s of warm-up) from /metrics,
#      without speculation and with ngram drafts (--spec-k 4,
#      --spec-windows 2 for one user, 1 for more), the drafts a window
#      carries (drafted over windows: prompt lookup finds few in a random
#      model's text) and their acceptance (accepted over the drafts of the
#      windows not dropped as stale);
#   3. `convoy plan --fleet` predicts the same runs (the same split,
#      speculation with the measured drafts and acceptance) from the
#      stages' figures measured just before the run and just after it
#      (--save), the mean of the two: this machine's speed drifts by tens of
#      percent over minutes.
# Steps 2 and 3 are repeated REPEAT times (default 3); each line gives the
# medians of the predictions, of the measurements and of their ratios.
# USERS="1 4" and SPECS=on pick runs.
# Prints each run: predicted, measured, predicted/measured.
#
#   bench/plan.sh [MODEL]
#
# Default model: a synthetic 8-layer Llama 2048 wide, Q4_0 (made once
# under bench/out/models, as bench/uneven.sh makes it). Needs root, ip
# netns and a cpu cgroup.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
window="${WINDOW:-6}" repeat="${REPEAT:-3}"
bench_build convoy slowcore
model="${1:-$(bench_model synth-2048x8-q4_0 --dims 2048,8,16,8,5632,32000 --type Q4_0)}"
n_layer="$("$convoy" info "$model" | awk '$1 == "n_layer:" { print $2 }')"
# the clients' prompts ("Story N") in tokens: where each request's context starts
prompt_tokens="$("$convoy" tokenize -m "$model" -p "Story 1" 2>/dev/null | tr -cd ',' | wc -c)"
prompt_tokens=$((prompt_tokens + 1))
client_pids=()
at_exit 'stop_clients'
test_hosts cvp 5
core=(0 1 0 1 0)
# each fleet: its stages, the speed left on core 0 (FLEETS="2 50;3 60" picks)
IFS=';' read -r -a fleets <<<"${FLEETS:-2 50;3 60;4 70}"

# start_fleet N PCT: stages on hosts 1..N, core 0 at PCT%; sets nodes and
# cpus (each node's core, numbered from 1, for --cpus)
start_fleet() {
    local h
    cpus=""
    "$build/slowcore" 0 "$2" 250 &
    pids+=($!)
    start_host_stages "$cluster" "$tmp" "$(seq -s ' ' 1 "$1")" --insecure -m "$model"
    for ((h = 1; h <= $1; h++)); do cpus="${cpus:+$cpus,}$((core[h] + 1))"; done
}

# plan OUT ARGS...: `convoy plan` on the head's host, its output in OUT
plan() {
    local out="$1"
    shift
    on 0 taskset -c 0 "$convoy" plan -m "$model" --ctx 512 --prompt "$prompt_tokens" \
        --tokens 160 "$@" >"$out" 2>"$tmp/plan.err" ||
        die "convoy plan failed: $(tail -2 "$tmp/plan.err")"
}
# measure_fleet SPLIT FILE: the stages measured with that split, saved to FILE
measure_fleet() {
    plan "$tmp/measured.out" --insecure --nodes "$nodes" --cpus "$cpus" --split "$1" --save "$2" --users 1
    grep "10.77" "$tmp/measured.out" | sed 's/^/    /' >&2
}

# column FILE USERS N: field N of FILE's forecast line for USERS
column() { awk -v u="$2" -v n="$3" '$1 == u && $3 ~ /^[0-9,]+$/ { print $n }' "$1"; }

# spec_counts: "DRAFTED ACCEPTED WINDOWS CANCELLED" from /metrics (zeros
# without speculation)
spec_counts() {
    on 0 curl -s http://127.0.0.1:8080/metrics | awk '
        $1 == "convoy_spec_drafted_total" { d = $2 } $1 == "convoy_spec_accepted_total" { a = $2 }
        $1 == "convoy_spec_windows_total" { w = $2 } $1 == "convoy_spec_windows_cancelled_total" { c = $2 }
        END { print d + 0, a + 0, w + 0, c + 0 }'
}

# measure USERS SPLIT SERVE_ARGS...: prints "TOK/S DRAFTS ACCEPTANCE" of U
# clients (drafts a window, and their acceptance; 0 0 without speculation)
measure() {
    local users="$1" split="$2" a b s0 s1
    shift 2
    host0_serve "$tmp/head.log" taskset -c 0 "$convoy" serve -m "$model" --port 8080 -np "$users" \
        --client-slots "$users" --ctx 512 --insecure --nodes "$nodes" --split "$split" --no-rebalance "$@"
    start_clients "$users" 0
    sleep 2
    a="$(head_metric convoy_generated_tokens_total)" s0="$(spec_counts)"
    sleep "$window"
    b="$(head_metric convoy_generated_tokens_total)" s1="$(spec_counts)"
    stop_clients
    stop_head
    awk -v a="$a" -v b="$b" -v w="$window" -v s0="$s0" -v s1="$s1" 'BEGIN {
        split(s0, x); split(s1, y)
        d = y[1] - x[1]; acc = y[2] - x[2]; win = y[3] - x[3]; c = y[4] - x[4]
        live = win > 0 ? d * (win - c) / win : 0
        printf "%.1f %.2f %.3f\n", (b - a) / w, (win > 0 ? d / win : 0), (live > 0 ? acc / live : 0) }'
}

# pair USERS SPLIT SPEC: one measured run between two measurements of the
# stages; prints "PREDICTED MEASURED DRAFTS ACCEPTANCE"
pair() {
    local users="$1" split="$2" spec="$3" args=() pargs=() d=1 got drafts accept
    [[ "$users" == 1 ]] && d=2
    [[ "$spec" == on ]] && args=(--draft ngram --spec-k 4 --spec-windows "$d")
    measure_fleet "$split" "$tmp/before.json"
    measure "$users" "$split" "${args[@]}" >"$tmp/measure.out"
    measure_fleet "$split" "$tmp/after.json"
    read -r got drafts accept <"$tmp/measure.out"
    [[ "$spec" == on ]] && pargs=(--spec-k 4 --spec-windows "$d" --drafts "$drafts" --accept "$accept")
    plan "$tmp/before.out" --fleet "$tmp/before.json" --users "$users" --split "$split" "${pargs[@]}"
    plan "$tmp/after.out" --fleet "$tmp/after.json" --users "$users" --split "$split" "${pargs[@]}"
    awk -v a="$(column "$tmp/before.out" "$users" 5)" -v b="$(column "$tmp/after.out" "$users" 5)" -v m="$got" \
        -v d="$drafts" -v acc="$accept" 'BEGIN { printf "%.2f %s %s %s\n", (a + b) / 2, m, d, acc }'
}

# even_split N: the model's layers shared by N hosts, the first ones taking one more
even_split() {
    awk -v n="$1" -v l="$n_layer" \
        'BEGIN { for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", int(l / n) + (i < l % n) }'
}

printf '%-7s %-6s %-5s %-12s %-7s %-7s %11s %11s %8s\n' fleet users spec split drafts accept predicted measured ratio
for fleet in "${fleets[@]}"; do
    read -r n_stages pct <<<"$fleet"
    start_fleet "$n_stages" "$pct"
    plan "$tmp/plan0.out" --insecure --nodes "$nodes" --cpus "$cpus" --users 1,2,4
    sed 's/^/    /' "$tmp/plan0.out" >&2
    for users in ${USERS:-1 2 4}; do
        split="$(column "$tmp/plan0.out" "$users" 3)"
        [[ "${SPLITS:-plan}" == even ]] && split="$(even_split "$n_stages")"
        for spec in ${SPECS:-off on}; do
            : >"$tmp/pairs"
            for ((r = 1; r <= repeat; r++)); do
                pair "$users" "$split" "$spec" | tee -a "$tmp/pairs" | sed "s/^/    pass $r: /" >&2
            done
            read -r drafts accept < <(awk '{ d += $3; a += $4 } END { printf "%.2f %.3f\n", d / NR, a / NR }' \
                "$tmp/pairs")
            [[ "$spec" == on ]] || drafts=- accept=-
            printf '%-7s %-6s %-5s %-12s %-7s %-7s %11s %11s %8s\n' "$n_stages@$pct%" "$users" "$spec" "$split" \
                "$drafts" "$accept" "$(awk '{ print $1 }' "$tmp/pairs" | median)" \
                "$(awk '{ print $2 }' "$tmp/pairs" | median)" "$(awk '{ print $1 / $2 }' "$tmp/pairs" | median)"
        done
    done
    stop_pids
done
