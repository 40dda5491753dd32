# lib.sh: shell helpers the bench scripts share (sourced, not a bench).
# Every bench/*.sh opens with `. "$(dirname "$0")/lib.sh"`: it moves to the
# repository's root, where the scripts name their paths from, and sources
# tests/lib.sh for what benches and tests both do (free ports, stages,
# test hosts, waiting for a log line, synthetic models).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
src="$PWD"
. tests/lib.sh

# bench_build [TARGET...]: builds TARGETs (default convoy) of the build in
# $BUILD (default build/), of type $BUILD_TYPE (default RelWithDebInfo),
# once for every script (make does nothing when they are current); sets
# build to that folder and convoy to its convoy.
bench_build() {
    build="${BUILD:-build}"
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" >/dev/null
    make --no-print-directory -C "$build" -j2 "${@:-convoy}" >/dev/null
    convoy="$build/convoy"
}

# bench_model NAME ARGS...: prints bench/out/models/NAME.gguf, the benches'
# one cache of synthetic models, made by `$convoy synth ARGS` when missing.
bench_model() {
    local name="$1"
    shift
    synth_once "$convoy" "bench/out/models/$name.gguf" "$@"
}

# head_metric NAME: the value of NAME in /metrics of the head on test host
# 0 (host0_serve's, port 8080).
head_metric() {
    on 0 curl -s http://127.0.0.1:8080/metrics | awk -v m="$1" '$1 == m { print $2 }'
}

# start_clients N TEMPERATURE: N clients on test host 0, client I
# repeating a 160-token completion of "Story I" (seed I) at TEMPERATURE to
# the head until stop_clients; their pids in client_pids.
start_clients() {
    local i
    rm -f "$tmp/stop"
    client_pids=()
    for ((i = 0; i < $1; i++)); do
        bash "$cluster" run 0 bash -c '
            while [[ ! -e "$1" ]]; do
                curl -s -m 120 http://127.0.0.1:8080/v1/completions -o /dev/null -d "{\"prompt\": \"Story $2\",
                    \"max_tokens\": 160, \"temperature\": $3, \"seed\": $2, \"ignore_eos\": true}"
            done' _ "$tmp/stop" "$i" "$2" &
        client_pids+=($!)
    done
}

# stop_clients: the clients of start_clients end their request and stop.
stop_clients() {
    touch "$tmp/stop"
    wait "${client_pids[@]}" 2>/dev/null || true
    client_pids=()
}

# say MESSAGE: MESSAGE on stderr, after the script's name.
say() {
    echo "$(basename "$0"): $*" >&2
}

# die MESSAGE: says MESSAGE and ends the script as failed.
die() {
    say "$*"
    exit 1
}

# median [NUMBER...]: the median of the NUMBERs, or of the numbers on
# stdin (separated by spaces or lines) when none are given; of an even
# count, the mean of the middle two.
median() {
    { if (($#)); then printf '%s\n' "$@"; else tr ' \t' '\n\n'; fi; } | awk 'NF' | sort -g |
        awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

# ratio A B: A / B to two decimals, with an x ("1.23x").
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'
}
