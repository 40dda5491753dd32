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
. "$(dirname "$0")/lib.sh"
seconds="${1:-120}"
bench_build
mkdir -p bench/out
model="${CONVOY_SHARED:-../shared}/models/stories260K.gguf"
chain=()
make_tmp
if [[ "${CHAIN:-0}" == 1 ]]; then
    : >bench/out/soak-stage.log
    start_local_stages bench/out/soak-stage.log "$model" ||
        die "the stage did not start (bench/out/soak-stage.log)"
    chain=(--nodes "local,$nodes")
fi
start_serve "$convoy" bench/out/soak-server.log -m "$model" --host 127.0.0.1 --slots 8 --queue 64 --ctx 256 "${chain[@]}"
node bench/soak.mjs "$base" "$seconds" "$server_pid" | tee -a bench/out/soak.jsonl
