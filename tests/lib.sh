# lib.sh: shell helpers the test scripts share (sourced, not a test).
# Every tests/test_*.sh opens with `. "$(dirname "$0")/lib.sh"` and
# `test_args "$@"`; bench/lib.sh sources it too, for the stages and ports.
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

# test_args "$@": the two arguments CTest passes a shell test (PATH/TO/convoy
# SOURCE_DIR) into convoy and src; sets shared (the test data:
# $CONVOY_SHARED, else ../shared beside the source), build (the binary's
# folder, absolute) and npm_dir (build/npm, where npm_need installs).
test_args() {
    local usage="usage: $(basename "$0") PATH/TO/convoy SOURCE_DIR"
    convoy="${1:?$usage}"
    src="${2:?$usage}"
    shared="${CONVOY_SHARED:-$src/../shared}"
    build="$(cd "$(dirname "$convoy")" 2>/dev/null && pwd)"
    npm_dir="$build/npm"
}

# release_suite_only: ends the test as passed in the sanitizer suite
# (CONVOY_SANITIZED=1), for a test whose run there checks nothing more;
# the caller's comment says why.
release_suite_only() {
    if [[ "${CONVOY_SANITIZED:-}" == 1 ]]; then
        echo "not run in the sanitizer suite (the release suite runs it)"
        exit 0
    fi
}

# need TOOL [WHY]: skips the test unless TOOL is on PATH.
need() {
    command -v "$1" >/dev/null || skip "$1 is needed${2:+ $2}"
}

# need_data PATH...: skips the test unless every PATH (test data) exists.
need_data() {
    local p
    for p in "$@"; do
        [[ -e "$p" ]] || skip "test data $p not found"
    done
}

# need_stories: sets model to ../shared's stories260K.gguf, the tests'
# real model; skips the test without it.
need_stories() {
    model="$shared/models/stories260K.gguf"
    need_data "$model"
}

# make_tmp [SIGNAL]: sets tmp to a new temporary folder and pids to an
# empty list; at exit the processes in pids are stopped (stop_pids SIGNAL),
# the commands given to at_exit run in order, and tmp is removed.
exit_cmds=()
make_tmp() {
    tmp="$(mktemp -d)"
    pids=()
    exit_signal="${1:-TERM}"
    trap run_exit_cmds EXIT
}

# at_exit CMD: CMD (a string, eval'd) runs at exit, after stop_pids.
at_exit() {
    exit_cmds+=("$1")
}

# run_exit_cmds: the EXIT trap make_tmp sets.
run_exit_cmds() {
    local c
    stop_pids "$exit_signal"
    for c in "${exit_cmds[@]}"; do eval "$c" || true; done
    rm -rf "$tmp"
}

# stop_pids [SIGNAL]: sends SIGNAL (default TERM) to every process in pids
# (resuming a stopped one so that it can die), waits for each, empties pids.
stop_pids() {
    local p
    for p in "${pids[@]}"; do { kill -"${1:-TERM}" "$p" && kill -CONT "$p"; } 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}

# die MESSAGE: ends the test as failed, printing "FAIL MESSAGE".
die() {
    echo "FAIL $*"
    exit 1
}

# test_hosts PREFIX N: make_tmp, then N test hosts of scripts/cluster.sh
# (its path in cluster) named PREFIX (CONVOY_CLUSTER_PREFIX); at exit the
# head (stop_head) and the hosts go too. Ends the script as failed when
# the hosts do not come up.
test_hosts() {
    export CONVOY_CLUSTER_PREFIX="$1"
    cluster="$src/scripts/cluster.sh"
    make_tmp
    head_pid=""
    at_exit 'stop_head; bash "$cluster" down'
    bash "$cluster" up "$2" >/dev/null || die "cluster.sh up $2"
}

# on HOST CMD...: CMD in test host HOST of scripts/cluster.sh ($cluster).
on() {
    bash "$cluster" run "$@"
}

# host_addr HOST: test host HOST's address.
host_addr() {
    echo "10.77.0.$(($1 + 1))"
}

# host0_serve LOG CMD...: CMD (`convoy serve ... --port 8080`, perhaps
# after env or taskset) in test host 0 of $cluster, its stderr in LOG; sets
# head_pid and returns once it listens (at most 10 s), else ends the
# script as failed.
host0_serve() {
    local log="$1"
    shift
    bash "$cluster" run 0 "$@" 2>"$log" &
    head_pid=$!
    wait_for "listening on" "$log" 100 || die "the head did not start: $(tail -3 "$log")"
}

# stop_head: ends the head of host0_serve (head_pid) and waits for it.
stop_head() {
    kill "$head_pid" 2>/dev/null || true
    wait "$head_pid" 2>/dev/null || true
    head_pid=""
}

# has FILE PATTERN: a line of FILE matches PATTERN (grep).
has() {
    grep -q -- "$2" "$1"
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

# start_server LOG ARGS...: `$convoy serve ARGS` (ARGS give the model and
# the port; --port 0 takes any), its stderr appended to LOG; sets
# server_pid (added to pids) and base to http://127.0.0.1:PORT once the
# log says where it listens; else fails the check and returns 1.
start_server() {
    local log="$1" port=""
    shift
    : >"$log"
    "$convoy" serve "$@" 2>>"$log" &
    server_pid=$!
    pids+=("$server_pid")
    for _ in $(seq 100); do
        port="$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\)/v1.*|\1|p' "$log")"
        [[ -n "$port" ]] && break
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -z "$port" ]]; then
        fail "convoy serve $* did not start: $(cat "$log")"
        return 1
    fi
    base="http://127.0.0.1:$port"
}

# kill_server: ends the server of server_pid and waits for it.
kill_server() {
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
}

# term_server: SIGTERM to server_pid; returns 0 when it exits 0 within
# 10 s, else fails the check (killing it when it runs on).
term_server() {
    local rc=""
    kill -TERM "$server_pid"
    for _ in $(seq 100); do
        kill -0 "$server_pid" 2>/dev/null || { wait "$server_pid"; rc=$?; break; }
        sleep 0.1
    done
    [[ "$rc" == 0 ]] && return 0
    fail "the server did not stop cleanly on SIGTERM (status '${rc:-still running}')"
    kill -9 "$server_pid" 2>/dev/null
    return 1
}

# start_serve CONVOY LOG ARGS...: `convoy serve ARGS` on a free port, its pid
# in server_pid and added to pids; sets base to its URL once it listens,
# else fails the test.
start_serve() {
    local convoy="$1" log="$2" port
    shift 2
    port="$(free_port)"
    "$convoy" serve --port "$port" "$@" >/dev/null 2>"$log" &
    server_pid=$!
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

# synth_once CONVOY FILE ARGS...: prints FILE, a model `convoy synth ARGS`
# makes when FILE is missing (whole or not at all: written beside, then
# renamed); ends the script as failed when it cannot be made.
synth_once() {
    local convoy="$1" file="$2"
    shift 2
    mkdir -p "$(dirname "$file")"
    if [[ ! -f "$file" ]]; then
        "$convoy" synth "$@" -o "$file.tmp" >/dev/null && mv "$file.tmp" "$file" ||
            { echo "FAIL: could not synthesize $file" >&2; exit 1; }
    fi
    echo "$file"
}

# test_model CONVOY NAME ARGS...: synth_once of test-models/NAME.gguf
# beside the build, the tests' cache of synthetic models.
test_model() {
    local convoy="$1" name="$2"
    shift 2
    synth_once "$convoy" "$(cd "$(dirname "$convoy")" && pwd)/test-models/$name.gguf" "$@"
}

# synth_1024x6 CONVOY: prints the path of a synthetic model (1024 wide, 6
# layers, 8 heads, 4 KV heads, FF 2816, vocabulary 2048, Q4_0, 2048
# positions) made once (test_model).
synth_1024x6() {
    test_model "$1" synth-1024x6-q4_0 --dims 1024,6,8,4,2816,2048 --type Q4_0
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
# package it lacks (PKG may pin a version: NAME@1.2.3); skips the test
# without node and npm or when an install fails (offline?).
npm_need() {
    local dir="$1" pkg
    shift
    command -v node >/dev/null && command -v npm >/dev/null || skip "node and npm are needed for $*"
    for pkg in "$@"; do
        [[ -f "$dir/node_modules/${pkg%@[0-9]*}/package.json" ]] ||
            npm install --silent --no-audit --no-fund --prefix "$dir" "$pkg" >/dev/null 2>&1 ||
            skip "npm install $pkg failed (offline?)"
    done
}

# npm_try DIR WITHOUT PKG...: installs the PKGs into DIR/node_modules when
# the first is missing, for packages a test can do without: when the
# install fails it says so, and WITHOUT (what the test leaves out).
npm_try() {
    local dir="$1" without="$2"
    shift 2
    [[ -f "$dir/node_modules/${1%@[0-9]*}/package.json" ]] ||
        npm install --silent --no-audit --no-fund --prefix "$dir" "$@" >/dev/null 2>&1 ||
        echo "note: npm install $* failed: $without"
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
    return 1
}

# start_local_stage CONVOY LOG PORT ARGS...: `convoy stage` on
# 127.0.0.1:PORT with ARGS (-m MODEL, ...), its stderr appended to LOG;
# sets stage_pid and returns once the stage listens (at most 5 s; 1 when
# it does not).
start_local_stage() {
    local convoy="$1" log="$2" port="$3"
    shift 3
    "$convoy" stage --listen "127.0.0.1:$port" "$@" 2>>"$log" &
    stage_pid=$!
    stage_listens "$log" "$port" 500 0.01
}

# stage_listens LOG PORT N STEP: returns once LOG, a stage's, says it
# listens on PORT (N looks, STEP seconds apart); 1 when it never does.
stage_listens() {
    for _ in $(seq "$3"); do
        grep -q " on port $2," "$1" 2>/dev/null && return 0
        sleep "$4"
    done
    return 1
}

# start_local_stages LOG MODEL...: a start_local_stage on a free port for
# each MODEL (uses $convoy), logs appended to LOG, pids added to pids; sets
# addrs to their "127.0.0.1:PORT"s, in order, and nodes to those joined by
# commas (for --nodes); 1 when a stage did not start.
start_local_stages() {
    local log="$1" m port rc=0
    shift
    addrs=()
    for m in "$@"; do
        port="$(free_port)"
        start_local_stage "$convoy" "$log" "$port" -m "$m" || rc=1
        pids+=("$stage_pid")
        addrs+=("127.0.0.1:$port")
    done
    nodes="$(IFS=,; echo "${addrs[*]}")"
    return $rc
}

# start_host_stage CLUSTER HOST CONVOY LOG ARGS...: `convoy stage` in test
# host HOST of scripts/cluster.sh (CLUSTER), on its address, port 7000,
# with ARGS (-m MODEL, --insecure or --key FILE, ...), pinned to the cores
# of $stage_cores when that is set (taskset), its stderr appended to LOG;
# sets stage_pid (the stage itself: cluster.sh, ip netns exec and taskset
# all exec) and returns once the stage listens (at most 10 s; 1 when it
# does not).
start_host_stage() {
    local cluster="$1" host="$2" convoy="$3" log="$4"
    shift 4
    bash "$cluster" run "$host" ${stage_cores:+taskset -c "$stage_cores"} "$convoy" stage \
        --listen "$(host_addr "$host"):7000" "$@" 2>>"$log" &
    stage_pid=$!
    stage_listens "$log" 7000 200 0.05
}

# start_host_stages CLUSTER DIR HOSTS ARGS...: a start_host_stage (of
# $convoy) on each test host of HOSTS ("1 2 3"), pinned to core ${core[H]}
# where the caller's array core names one, logs DIR/stageH.log (emptied
# first), pids added to pids; sets nodes to their addresses joined by
# commas.
start_host_stages() {
    local cluster="$1" dir="$2" hosts="$3" h
    shift 3
    nodes=""
    for h in $hosts; do
        : >"$dir/stage$h.log"
        stage_cores="${core[$h]:-}" start_host_stage "$cluster" "$h" "$convoy" "$dir/stage$h.log" "$@"
        pids+=("$stage_pid")
        nodes="${nodes:+$nodes,}$(host_addr "$h"):7000"
    done
}

# synth_tiny SEED OUT: OUT is `convoy synth --shape tiny --type Q8_0` of
# SEED (uses $convoy); its status is synth's.
synth_tiny() {
    "$convoy" synth --shape tiny --type Q8_0 --seed "$1" -o "$2" >/dev/null 2>&1
}
