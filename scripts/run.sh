#!/usr/bin/env bash
# run.sh: the main job. Installs what running needs and is missing (the
# test tools come with scripts/test.sh), builds the release convoy binary
# in build/, starts a pipeline on this machine (two `convoy stage` nodes on
# loopback, each pinned to its own core when taskset exists) and has the
# head generate 64 tokens of stories260K for "Once upon a time" through it.
# What the stages say goes to the terminal after "[stage N]": the layers
# each serves, and when the head is done, each one's steps and its share
# of the time in compute; the head prints its plan and its speed. The
# stages are stopped on exit. Extra arguments are appended to the head's
# `convoy run` command line. The model is read from ../shared, or from
# $CONVOY_SHARED when set.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh run
model="${CONVOY_SHARED:-../shared}/models/stories260K.gguf"
if [[ ! -r "$model" ]]; then
    echo "run.sh: $model not found (clone shared/ beside the repo, or set CONVOY_SHARED)" >&2
    exit 1
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
make --no-print-directory -C build -j2 convoy >/dev/null

ports=(7701 7702)
pids=()
logs="$(mktemp -d)"
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$logs"' EXIT
for i in 0 1; do
    pin=()
    command -v taskset >/dev/null && [[ "$(nproc)" -ge 2 ]] && pin=(taskset -c "$i")
    "${pin[@]}" build/convoy stage --listen "127.0.0.1:${ports[$i]}" -m "$model" \
        2> >(tee "$logs/$i" | sed -u "s/^/[stage $((i + 1))] /" >&2) &
    pids+=($!)
done
for i in 0 1; do # wait until both listen
    for _ in $(seq 50); do
        grep -q " on port ${ports[$i]}," "$logs/$i" 2>/dev/null && break
        sleep 0.1
    done
done
build/convoy run -m "$model" -p "Once upon a time" -n 64 --nodes 127.0.0.1:7701,127.0.0.1:7702 "$@"
sleep 0.2 # the stages' session lines

