#!/usr/bin/env bash
# chaos.sh: 50 completions through a 3-stage pipeline on a bad network, a
# link down and a stage killed, give the texts of a clean run (issue 13).
#
#   bash bench/chaos.sh            (as root: it makes test hosts, scripts/cluster.sh)
#
# Builds nothing: BUILD (default build/) must hold convoy and linkemu, e.g.
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && make -C build -j2 convoy linkemu
#
# Test hosts (cluster prefix CONVOY_CLUSTER_PREFIX, default cvx): host 0 runs
# the head (`convoy serve` and the client), hosts 1-3 the stages A, B, C,
# host 4 the standby S, every process holding one cluster key (`--key`;
# SECURITY=insecure runs every link in plaintext with `--insecure` instead).
# MODEL defaults to stories260K from ../shared (CONVOY_SHARED). DRAFT=ngram (or
# a draft GGUF) makes the chaos run's head speculate with windows in flight
# (SPEC_WINDOWS=D fixes their number, default chosen): its texts are then
# compared with the clean run's plain decoding.
#
# Phases:
#   clean  the 50 requests (greedy and temperature 0.8 with fixed seeds, 10
#          prompts, 80-120 tokens each, CONCURRENCY=8 at once) on the
#          pipeline with no fault; every text is kept.
#   chaos  the same requests on a new pipeline in which every link goes
#          through a link emulator (tools/linkemu: DELAY_MS=10 plus a uniform
#          JITTER_MS=20 each way) in front of each stage, so head -> A, A -> B,
#          B -> C and C -> head all cross one, and every host drops LOSS=5% of
#          the packets entering and leaving it (nftables, cluster.sh loss; a
#          packet between two hosts crosses two such rules). While requests
#          are in flight: host 2 (stage B) loses its link for 3 s
#          (`ip link set eth0 down`, then up) once 20% of the tokens are in,
#          and stage C is SIGKILLed at 55% and restarted on the same address
#          1 s later.
#   report every text compared with the clean run's, errors, wall times,
#          failovers and their pause from /metrics, the server's log lines
#          about each fault; printed and saved in bench/out/chaos/report.txt,
#          one JSON line appended to bench/out/chaos.jsonl. Exit status 1
#          when a text differs or a request failed.
# Everything (processes, emulators, hosts) is torn down on exit, also on failure.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

BUILD="${BUILD:-build}"
convoy="$BUILD/convoy"
export LINKEMU="${LINKEMU:-$BUILD/linkemu}"
export CONVOY_CLUSTER_PREFIX="${CONVOY_CLUSTER_PREFIX:-cvx}"
shared="${CONVOY_SHARED:-../shared}"
MODEL="${MODEL:-$shared/models/stories260K.gguf}"
N_REQUESTS="${N_REQUESTS:-50}" CONCURRENCY="${CONCURRENCY:-8}"
DELAY_MS="${DELAY_MS:-10}" JITTER_MS="${JITTER_MS:-20}" LOSS="${LOSS:-5}"
SECURITY="${SECURITY:-key}"
DRAFT="${DRAFT:-}" SPEC_WINDOWS="${SPEC_WINDOWS:-0}"
LINK_DOWN_S="${LINK_DOWN_S:-3}" PEER_TIMEOUT_MS="${PEER_TIMEOUT_MS:-5000}"
out="bench/out/chaos"
cluster="scripts/cluster.sh"
port=8080
stage_port=7000 relay_port=7100 # stage_port: start_host_stage's

now() { date +%s.%N; }

[[ -x "$convoy" && -x "$LINKEMU" ]] || die "no $convoy or $LINKEMU: build them first (see the header)"
[[ -f "$MODEL" ]] || die "model $MODEL not found (set MODEL or CONVOY_SHARED)"
[[ "$(id -u)" -eq 0 ]] || die "needs root (test hosts are network namespaces)"

# ---- processes ----

case "$SECURITY" in
key) security=(--key "$out/cluster.key") ;;
insecure) security=(--insecure) ;;
*) die "SECURITY must be key or insecure" ;;
esac

declare -A pid_of=()
head_pid=""
client_pid=""

stop_processes() {
    for p in $client_pid $head_pid "${pid_of[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in $client_pid $head_pid "${pid_of[@]}"; do wait "$p" 2>/dev/null || true; done
    client_pid="" head_pid=""
    pid_of=()
}

cleanup() {
    stop_processes
    bash "$cluster" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_stage HOST LOG: `convoy stage` on HOST's address, back once it listens.
start_stage() {
    local ok=0
    start_host_stage "$cluster" "$1" "$convoy" "$2" -m "$MODEL" "${security[@]}" || ok=$?
    pid_of[$1]=$stage_pid
    ((ok == 0)) || die "stage on host $1 did not start: $(tail -3 "$2")"
}

# start_stages PHASE PORT: start_stage on hosts 1-4 (logs PHASE-stageH.log);
# sets addrs to each host's address with PORT.
start_stages() {
    local h
    addrs=()
    for h in 1 2 3 4; do
        start_stage "$h" "$out/$1-stage$h.log"
        addrs+=("$(host_addr "$h"):$2")
    done
}

# start_head LOG NODES STANDBY [ARGS]: `convoy serve` in host 0, back once /health answers.
start_head() {
    local log="$1" nodes="$2" standby="$3"
    shift 3
    bash "$cluster" run 0 "$convoy" serve -m "$MODEL" --port "$port" --slots "$CONCURRENCY" --client-slots "$CONCURRENCY" --ctx 512 \
        "${security[@]}" --nodes "$nodes" --standby "$standby" --peer-timeout "$PEER_TIMEOUT_MS" "$@" 2>"$log" &
    head_pid=$!
    for _ in $(seq 300); do
        on 0 curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
        kill -0 "$head_pid" 2>/dev/null || break
        sleep 0.1
    done
    die "the head did not start: $(tail -5 "$log")"
}

metric() { on 0 curl -s "http://127.0.0.1:$port/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

# start_client NAME: the requests, in the background; results in $out/NAME.json.
start_client() {
    rm -f "$out/$1.progress"
    bash "$cluster" run 0 python3 tools/stream_client.py "http://127.0.0.1:$port/v1" "$out/requests.json" "$out/$1.json" \
        --concurrency "$CONCURRENCY" --progress "$out/$1.progress" &
    client_pid=$!
}

wait_client() {
    wait "$client_pid" || die "the client failed"
    client_pid=""
}

# ---- setup ----

make_requests() {
    python3 - "$N_REQUESTS" "$(basename "$MODEL" .gguf)" >"$out/requests.json" <<'EOF'
import json, sys
n, model = int(sys.argv[1]), sys.argv[2]
prompts = ["Once upon a time", "The little dog", "Lily and Tom went to the park", "One day, a bird",
           "There was a big red ball", "The sun was hot and", "Mom said", "In a small house lived",
           "Ben had a toy car", "The cat saw a fish"]
reqs = []
for i in range(n):
    r = {"model": model, "prompt": prompts[i % len(prompts)], "max_tokens": 80 + 20 * (i % 3),
         "ignore_eos": True, "temperature": 0}
    if i % 2:
        r.update(temperature=0.8, seed=1000 + i)
    reqs.append(r)
print(json.dumps(reqs))
EOF
}

phase_setup() {
    rm -rf "$out"
    mkdir -p "$out"
    "$convoy" keygen "$out/cluster.key" >/dev/null
    make_requests
    bash "$cluster" up 5 >/dev/null
    say "hosts up: head $(host_addr 0), stages A B C $(host_addr 1) $(host_addr 2) $(host_addr 3), standby S $(host_addr 4)"
}

# ---- clean run ----

phase_clean() {
    start_stages clean "$stage_port"
    start_head "$out/clean-serve.log" "${addrs[0]},${addrs[1]},${addrs[2]}" "${addrs[3]}"
    say "clean: $N_REQUESTS requests, $CONCURRENCY at once"
    start_client clean
    wait_client
    kill -0 "$head_pid" 2>/dev/null || die "the head died in the clean run: $(tail -3 "$out/clean-serve.log")"
    n_errors clean | grep -qx 0 || die "the clean run had errors: $(head -c 600 "$out/clean.json")"
    stop_processes
}

n_errors() { python3 -c "import json,sys; print(sum(e is not None for e in json.load(open(sys.argv[1]))['errors']))" "$out/$1.json"; }

# ---- chaos run ----

# relays: a link emulator in front of every stage, on its host; the head and
# the stages connect to these addresses, so every hop is delayed both ways.
start_relays() {
    for h in 1 2 3 4; do
        bash "$cluster" delay "$h" "$relay_port" "$(host_addr "$h"):$stage_port" "$DELAY_MS" "$JITTER_MS" "$h"
    done
}

# tcp_counters: segments sent, retransmitted, and SYNs retransmitted, summed over the hosts
tcp_counters() {
    for h in 0 1 2 3 4; do on "$h" nstat -asz TcpOutSegs TcpRetransSegs TcpExtTCPSynRetrans; done |
        awk '$1 == "TcpOutSegs" {o += $2} $1 == "TcpRetransSegs" {r += $2} $1 == "TcpExtTCPSynRetrans" {s += $2}
             END {print o, r, s}'
}

set_loss() { for h in 0 1 2 3 4; do bash "$cluster" loss "$h" "$1"; done; }

# wait_tokens PCT: until PCT% of all requested tokens have streamed in.
wait_tokens() {
    local want
    want="$(python3 -c "import json,sys; print(sum(r['max_tokens'] for r in json.load(open(sys.argv[1]))) * $1 // 100)" \
        "$out/requests.json")"
    while kill -0 "$client_pid" 2>/dev/null; do
        local got
        got="$(cut -d' ' -f1 "$out/chaos.progress" 2>/dev/null || echo 0)"
        ((${got:-0} >= want)) && return 0
        sleep 0.05
    done
    die "the client ended before $1% of the tokens; the head: $(tail -2 "$out/chaos-serve.log")"
}

# event KIND TEXT: a line of the fault timeline (KIND fault: the report
# measures the stall that follows it).
event() {
    local t n_done
    t="$(now)"
    n_done="$(cut -d' ' -f2 "$out/chaos.progress" 2>/dev/null || echo 0)"
    printf '%s\t%s\t%s\t%s\n' "$t" "$1" "$n_done" "$2" >>"$out/faults.tsv"
    say "$(printf '%.2f' "$(echo "$t - $t_chaos" | bc)") s: $2 ($n_done of $N_REQUESTS requests done)"
}

link_down() { # HOST SECONDS
    local ns="${CONVOY_CLUSTER_PREFIX}$1"
    event fault "host $1 ($(host_addr "$1"), stage B): ip link set eth0 down"
    ip -n "$ns" link set eth0 down
    sleep "$2"
    ip -n "$ns" link set eth0 up
    event info "host $1: eth0 up again after $2 s"
}

kill_and_restart() { # HOST
    event fault "host $1 ($(host_addr "$1"), stage C): SIGKILL of the stage, pid ${pid_of[$1]}"
    kill -KILL "${pid_of[$1]}"
    wait "${pid_of[$1]}" 2>/dev/null || true
    sleep 1
    start_stage "$1" "$out/chaos-stage$1.log"
    event info "host $1: stage restarted on $(host_addr "$1"):$stage_port, pid ${pid_of[$1]}"
}

phase_chaos() {
    start_stages chaos "$relay_port"
    start_relays
    set_loss "$LOSS"
    local spec=()
    [[ -z "$DRAFT" ]] || spec=(--draft "$DRAFT" --spec-windows "$SPEC_WINDOWS")
    start_head "$out/chaos-serve.log" "${addrs[0]},${addrs[1]},${addrs[2]}" "${addrs[3]}" "${spec[@]}"
    say "chaos: $N_REQUESTS requests, $LOSS% loss per host, ${DELAY_MS}+U[0,$JITTER_MS] ms per hop each way"
    : >"$out/faults.tsv"
    read -r tcp_out0 tcp_re0 tcp_syn0 < <(tcp_counters)
    t_chaos="$(now)"
    start_client chaos
    wait_tokens 20
    link_down 2 "$LINK_DOWN_S"
    wait_tokens 55
    kill_and_restart 3
    wait_client
    event info "all requests done"
    failovers="$(metric convoy_failovers_total)"
    pause_s="$(metric convoy_failover_pause_seconds_total)"
    pause_s="$(printf '%.3f' "${pause_s:-0}")"
    reconnects="$(metric convoy_pipeline_reconnects_total)"
    windows="$(metric convoy_spec_windows_total)" windows_cancelled="$(metric convoy_spec_windows_cancelled_total)"
    read -r tcp_out tcp_re tcp_syn < <(tcp_counters)
    tcp="$((tcp_out - tcp_out0)) TCP segments sent, $((tcp_re - tcp_re0)) retransmitted ($((tcp_syn - tcp_syn0)) SYNs)"
    set_loss 0
    stop_processes
}

# ---- report ----

compare() { # prints: identical errors clean_wall chaos_wall clean_errors
    python3 - "$out/clean.json" "$out/chaos.json" <<'EOF'
import json, sys
clean, chaos = (json.load(open(p)) for p in sys.argv[1:3])
same = sum(a == b for a, b in zip(clean["texts"], chaos["texts"]))
errs = sum(e is not None for e in chaos["errors"])
print(same, errs, clean["wall_s"], chaos["wall_s"], sum(e is not None for e in clean["errors"]),
      sum(t or 0 for t in chaos["tokens"]))
EOF
}

timeline() {
    python3 - "$out/faults.tsv" "$out/chaos.json" "$t_chaos" "$N_REQUESTS" <<'EOF'
import json, sys
events = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
times, t0, n = json.load(open(sys.argv[2]))["chunk_times"], float(sys.argv[3]), sys.argv[4]
for t, kind, done, text in events:
    t = float(t)
    line = f"  {t - t0:7.2f} s  {text} ({done} of {n} requests done)"
    if kind == "fault":
        window = [t] + [c for c in times if t < c < t + 20]
        stall = max(b - a for a, b in zip(window, window[1:])) if len(window) > 1 else float("nan")
        line += f"; stall {stall:.2f} s"
    print(line)
EOF
}

server_lines() {
    grep -nE "failing over|new chain|no new chain|pipeline is down|reconnect|refused|back" "$out/chaos-serve.log" |
        sed 's/^/    /' || echo "    (none)"
}

phase_report() {
    local same errs wall_clean wall_chaos clean_errs tokens
    read -r same errs wall_clean wall_chaos clean_errs tokens < <(compare)
    {
        echo "== bench/chaos.sh: $N_REQUESTS requests, $CONCURRENCY at once, model $(basename "$MODEL"), links: ${security[*]}"
        echo "clean run:  ${wall_clean} s, $clean_errs errors"
        echo "chaos run:  ${wall_chaos} s ($tokens tokens), $LOSS% loss on every host, ${DELAY_MS} ms + U[0,$JITTER_MS] ms per hop;"
        echo "            $tcp on the hosts"
        echo "identical:  $same of $N_REQUESTS texts equal to the clean run's"
        echo "errors:     $errs of $N_REQUESTS requests"
        [[ -z "$DRAFT" ]] || echo "windows:    chaos run speculating (--draft $DRAFT, --spec-windows $SPEC_WINDOWS): ${windows:-?} windows verified, ${windows_cancelled:-?} of them cancelled (convoy_spec_windows_*)"
        echo "failovers:  ${failovers:-?} (convoy_failovers_total), pause ${pause_s:-?} s in all (convoy_failover_pause_seconds_total), ${reconnects:-?} reconnects after going down"
        echo "faults (seconds since the chaos run began; stall: the longest time in the next 20 s in which no request got a token):"
        timeline
        echo "server log (chaos-serve.log):"
        server_lines
    } | tee "$out/report.txt"
    printf '{"bench":"chaos","commit":"%s","model":"%s","security":"%s","requests":%s,"concurrency":%s,"loss_pct":%s,"delay_ms":%s,"jitter_ms":%s,"link_down_s":%s,"peer_timeout_ms":%s,"identical":%s,"errors":%s,"clean_wall_s":%s,"chaos_wall_s":%s,"failovers":%s,"failover_pause_s":%s,"draft":"%s","windows":%s,"windows_cancelled":%s}\n' \
        "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src app || echo +dirty)" "$(basename "$MODEL")" "$SECURITY" \
        "$N_REQUESTS" "$CONCURRENCY" "$LOSS" "$DELAY_MS" "$JITTER_MS" "$LINK_DOWN_S" "$PEER_TIMEOUT_MS" \
        "$same" "$errs" "$wall_clean" "$wall_chaos" "${failovers:-null}" "${pause_s:-null}" "$DRAFT" "${windows:-null}" "${windows_cancelled:-null}" >>bench/out/chaos.jsonl
    [[ "$same" -eq "$N_REQUESTS" && "$errs" -eq 0 && "$clean_errs" -eq 0 ]]
}

phase_setup
phase_clean
phase_chaos
phase_report
