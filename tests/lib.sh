# lib.sh: shell helpers the test scripts share (sourced, not a test).
#
# skip REASON: ends the test as skipped, or as failed when CI=true (CI
# always has what the suite needs, so a skip there is a missing install).
skip() {
    if [[ "${CI:-}" == true ]]; then
        echo "FAIL: $* (CI=true: required)"
        exit 1
    fi
    echo "SKIP: $*"
    exit 0
}

# wait_for PATTERN FILE [TENTHS]: waits until a line of FILE matches
# PATTERN (grep), at most TENTHS tenths of a second (default 600); 1 when
# none came.
wait_for() {
    local pattern="$1" file="$2" n="${3:-600}"
    for _ in $(seq "$n"); do
        grep -q "$pattern" "$file" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# start_serve CONVOY LOG ARGS...: `convoy serve ARGS` on a free port, its pid
# added to pids; sets base to its URL once it listens, else fails the test.
start_serve() {
    local convoy="$1" log="$2" port
    shift 2
    port="$(free_port)"
    "$convoy" serve --port "$port" "$@" >/dev/null 2>"$log" &
    pids+=($!)
    wait_for "listening on" "$log" 300 || { echo "FAIL: convoy serve $*: $(tail -3 "$log")"; exit 1; }
    base="http://127.0.0.1:$port"
}

# need_netns NAME: test NAME runs test hosts (scripts/cluster.sh): it skips
# unless run as root with `ip netns`.
need_netns() {
    [[ "$(id -u)" -eq 0 ]] && command -v ip >/dev/null && ip netns list >/dev/null 2>&1 ||
        skip "$1 needs root and ip netns"
}

# pass NAME / fail NAME: a check's line, counted in checks and failures;
# expect NAME CMD...: pass or fail as CMD succeeds; checks_summary: the
# closing "N passed, N failed" line, and the exit status.
checks=0 failures=0
pass() {
    echo "ok   $*"
    checks=$((checks + 1))
}
fail() {
    echo "FAIL $*"
    checks=$((checks + 1)) failures=$((failures + 1))
}
expect() {
    local name="$1"
    shift
    if "$@"; then pass "$name"; else fail "$name"; fi
}
checks_summary() {
    echo "$((checks - failures)) passed, $failures failed"
    [[ $failures -eq 0 ]]
}

# synth_1024x6 CONVOY: prints the path of a synthetic model (1024 wide, 6
# layers, 8 heads, 4 KV heads, FF 2816, vocabulary 2048, Q4_0, 2048
# positions) made once beside the build (test-models/); ends the test as
# failed when it cannot be made.
synth_1024x6() {
    local models model
    models="$(cd "$(dirname "$1")" && pwd)/test-models"
    model="$models/synth-1024x6-q4_0.gguf"
    mkdir -p "$models"
    [[ -f "$model" ]] || "$1" synth --dims 1024,6,8,4,2816,2048 --type Q4_0 -o "$model" >/dev/null ||
        { echo "FAIL: could not synthesize $model" >&2; exit 1; }
    echo "$model"
}

# stage_own_kb CONVOY MODEL DIR: the KB a `convoy stage` serving MODEL says
# at start are its process's own (its log in DIR); ends the test as failed
# when it says none.
stage_own_kb() {
    local p kb
    p="$(free_port)"
    start_local_stage "$1" "$3/own.log" "$p" -m "$2"
    kill "$stage_pid"
    wait "$stage_pid" 2>/dev/null
    kb="$(sed -n "s/.*, \([0-9.]*\) MB of it this process's own.*/\1/p" "$3/own.log" | awk '{printf "%d", $1 * 1e6 / 1024}')"
    [[ -n "$kb" ]] || { echo "FAIL the stage did not report its own bytes: $(cat "$3/own.log")" >&2; exit 1; }
    echo "$kb"
}

# start_budget_stages CONVOY MODEL DIR KB N: N `convoy stage` nodes on
# loopback serving MODEL with --mem KB KiB (logs DIR/stageI.log); sets pids
# to their pids and nodes to "127.0.0.1:P,..." for --nodes.
start_budget_stages() {
    local i p
    pids=()
    nodes=""
    for ((i = 1; i <= $5; i++)); do
        p="$(free_port)"
        : >"$3/stage$i.log"
        start_local_stage "$1" "$3/stage$i.log" "$p" -m "$2" --mem "$(($4 * 1024))"
        pids+=("$stage_pid")
        nodes="${nodes:+$nodes,}127.0.0.1:$p"
    done
}

# flip_tensor_byte CONVOY FILE TENSOR: inverts one byte of TENSOR's data in
# FILE (its middle byte; `convoy info` lists the file offsets).
flip_tensor_byte() {
    local off bytes
    read -r off bytes < <("$1" info "$2" | awk -v t="$3" '$2 == t { print $(NF - 1), $NF }')
    [[ -n "$off" ]] || { echo "FAIL no tensor $3 in $2"; exit 1; }
    python3 -c "
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(int(sys.argv[2]))
    b = f.read(1)
    f.seek(int(sys.argv[2]))
    f.write(bytes([b[0] ^ 0xff]))
" "$2" "$((off + bytes / 2))"
}

# npm_need DIR PKG...: installs into DIR/node_modules (once) each npm
# package it lacks; skips the test without node and npm or when an install
# fails (offline?).
npm_need() {
    local dir="$1" pkg
    shift
    command -v node >/dev/null && command -v npm >/dev/null || skip "node and npm are needed for $*"
    for pkg in "$@"; do
        [[ -f "$dir/node_modules/$pkg/package.json" ]] ||
            npm install --silent --no-audit --no-fund --prefix "$dir" "$pkg" >/dev/null 2>&1 ||
            skip "npm install $pkg failed (offline?)"
    done
}

# free_port: a TCP port that no socket of this machine holds now, below
# the kernel's ephemeral range (32768 up) so no outgoing connection takes
# it. Calls in one test (one $$) a tenth of a millisecond apart get
# different ports; no Python, which takes 0.3 s to start here.
free_port() {
    local t="${EPOCHREALTIME/[.,]/}" p
    for ((p = 20000 + (t / 100 + $$ * 1009) % 12000; ; p = 20000 + (p - 19999) % 12000)); do
        grep -q "$(printf ':%04X ' "$p")" /proc/net/tcp /proc/net/tcp6 2>/dev/null || break
    done
    echo "$p"
}

# wait_listening PORT: returns once something listens on TCP port PORT of
# this machine (at most 5 s).
wait_listening() {
    local hex
    hex="$(printf ':%04X ' "$1")"
    for _ in $(seq 500); do
        grep -q "$hex" /proc/net/tcp && return 0
        sleep 0.01
    done
}

# start_local_stage CONVOY LOG PORT ARGS...: `convoy stage` on
# 127.0.0.1:PORT with ARGS (-m MODEL, ...), its stderr appended to LOG;
# sets stage_pid and returns once the stage listens (at most 5 s).
start_local_stage() {
    local convoy="$1" log="$2" port="$3"
    shift 3
    "$convoy" stage --listen "127.0.0.1:$port" "$@" 2>>"$log" &
    stage_pid=$!
    for _ in $(seq 500); do
        grep -q " on port $port," "$log" 2>/dev/null && return 0
        sleep 0.01
    done
}

# start_host_stage CLUSTER HOST CONVOY LOG ARGS...: `convoy stage` in test
# host HOST of scripts/cluster.sh (CLUSTER), on its address, port 7000,
# with ARGS (-m MODEL, ...), its stderr appended to LOG; sets stage_pid (the
# stage itself: cluster.sh and ip netns exec both exec) and returns once
# the stage listens (at most 5 s).
start_host_stage() {
    local cluster="$1" host="$2" convoy="$3" log="$4"
    shift 4
    bash "$cluster" run "$host" "$convoy" stage --listen "10.77.0.$((host + 1)):7000" --insecure "$@" 2>>"$log" &
    stage_pid=$!
    for _ in $(seq 100); do
        grep -q " on port 7000," "$log" 2>/dev/null && return 0
        sleep 0.05
    done
}
