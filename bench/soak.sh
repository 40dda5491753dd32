#!/usr/bin/env bash
# soak.sh: a soak of `convoy serve` (bench/soak.mjs drives it).
#
#   bench/soak.sh [SECONDS]      default 120
#   CHAIN=1 bench/soak.sh        the server runs a 2-stage pipeline: the first
#                                layers itself, the rest on a `convoy stage`
#                                on another loopback port (--nodes local,...)
#
# Serves stories260K on a free loopback port (8 slots, a queue of 64) and
# has 64 concurrent clients mix normal and streamed requests (whose texts
# must equal those of the same requests alone), random disconnects, and
# malformed and oversized bodies. Passes when the server stays up, every
# completed request has its tokens, nothing unexpected came back, and its
# resident memory at the end is within 5% of the start. The report line is
# appended to bench/out/soak.jsonl; the PASS/FAIL verdict goes to stderr (and
# the exit status), so that file holds JSON lines only. SECONDS must be more
# than 5 (the warm-up before the start RSS).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-120}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
make --no-print-directory -C build -j2 convoy >/dev/null
mkdir -p bench/out
model="${CONVOY_SHARED:-../shared}/models/stories260K.gguf"
port=$((20000 + RANDOM % 20000))
nodes=()
pid=
stage_pid=
trap 'kill $pid $stage_pid 2>/dev/null || true; wait 2>/dev/null || true' EXIT
if [[ "${CHAIN:-0}" == 1 ]]; then
    stage_port=$((port + 1))
    build/convoy stage --listen "127.0.0.1:$stage_port" -m "$model" 2>bench/out/soak-stage.log &
    stage_pid=$!
    nodes=(--nodes "local,127.0.0.1:$stage_port")
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$stage_port") 2>/dev/null && break
        sleep 0.1
    done
    kill -0 "$stage_pid" 2>/dev/null || { echo "soak.sh: the stage did not start (bench/out/soak-stage.log)" >&2; exit 1; }
fi
build/convoy serve -m "$model" --host 127.0.0.1 --port "$port" --slots 8 --queue 64 --ctx 256 "${nodes[@]}" \
    2>bench/out/soak-server.log &
pid=$!
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done
node bench/soak.mjs "http://127.0.0.1:$port" "$seconds" "$pid" | tee -a bench/out/soak.jsonl
