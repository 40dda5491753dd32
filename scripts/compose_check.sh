#!/usr/bin/env bash
# compose_check.sh: dist/compose.yaml end to end on this machine, run by
# hand as root (it installs packages and may start a Docker daemon; not a
# CTest test: it needs a daemon and minutes). It:
# 1. finds a Docker daemon, or installs Debian's docker.io (and
#    docker-compose when the client has no `compose` plugin) and starts
#    dockerd itself, without touching the host's firewall or forwarding
#    (--iptables=false --ip-forward=false: containers then reach each other
#    and the host, not the Internet, so the image builds with the host's
#    network);
# 2. gets the base image debian:bookworm-slim: present, pulled, or where no
#    registry is reachable, imported from a `debootstrap --variant=minbase
#    bookworm` tree cached as a tarball in $CACHE (a stand-in with the same
#    packages' Debian, not Docker's image);
# 3. builds dist/Containerfile (convoy:latest), makes a cluster key with it
#    (owned by the image's uid 10001, mode 0600), and starts the compose
#    file's head and two keyed stages with the models of MODELS;
# 4. checks that the head answers a chat request (printed), that a
#    completion through the three containers is one container's `convoy
#    run` text, and that the head's health check turns healthy;
# 5. takes the containers, their volumes and the daemon it started down.
# Idempotent: the cached tarball and the images are kept for the next run.
#
# Usage: compose_check.sh
#   MODELS  the model folder (default: ../shared/models beside the source tree)
#   MODEL   the model file in it (default: stories260K.gguf)
#   CACHE   where the base tarball is kept (default: ${XDG_CACHE_HOME:-/var/cache}/convoy-compose)
#   JOBS    build jobs (default: 2)
set -euo pipefail

src="$(cd "$(dirname "$0")/.." && pwd)"
models="$(cd "${MODELS:-$src/../shared/models}" && pwd)"
model="${MODEL:-stories260K.gguf}"
cache="${CACHE:-${XDG_CACHE_HOME:-/var/cache}/convoy-compose}"
base_tar="$cache/debian-bookworm-minbase.tar"
project=convoy-check
tmp="$(mktemp -d)"
dockerd_pid=""
compose=()

say() { echo "compose_check: $*"; }
die() { echo "compose_check: FAIL: $*" >&2; exit 1; }

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
            >/dev/null; }
}

# a daemon: the running one, or dockerd started here (stopped on exit)
need_daemon() {
    docker info >/dev/null 2>&1 && return
    command -v dockerd >/dev/null || { say "installing docker.io"; apt_install docker.io containerd runc tini; }
    say "starting dockerd (log: $tmp/dockerd.log)"
    dockerd --iptables=false --ip-forward=false >"$tmp/dockerd.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && return
        kill -0 "$dockerd_pid" 2>/dev/null || break
        sleep 1
    done
    tail -5 "$tmp/dockerd.log" >&2
    die "dockerd did not start"
}

need_compose() {
    if docker compose version >/dev/null 2>&1; then
        compose=(docker compose)
    else
        command -v docker-compose >/dev/null || { say "installing docker-compose"; apt_install docker-compose; }
        compose=(docker-compose)
    fi
    compose+=(-p "$project" -f "$src/dist/compose.yaml")
}

need_base() {
    docker image inspect debian:bookworm-slim >/dev/null 2>&1 && return
    timeout 120 docker pull -q debian:bookworm-slim >/dev/null 2>&1 && return
    if [[ ! -s "$base_tar" ]]; then
        say "no registry: debootstrap --variant=minbase bookworm into $base_tar"
        command -v debootstrap >/dev/null || apt_install debootstrap
        debootstrap --variant=minbase bookworm "$tmp/root" http://deb.debian.org/debian >"$tmp/debootstrap.log" 2>&1 ||
            { tail -5 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }
        rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*
        mkdir -p "$cache"
        tar --numeric-owner -C "$tmp/root" -cf "$base_tar.part" . && mv "$base_tar.part" "$base_tar"
    fi
    docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' "$base_tar" debian:bookworm-slim >/dev/null
}

cleanup() {
    if [[ ${#compose[@]} -gt 0 ]]; then
        "${compose[@]}" down -v >/dev/null 2>&1 || true
    fi
    if [[ -n "$dockerd_pid" ]]; then
        kill "$dockerd_pid" 2>/dev/null || true
        wait "$dockerd_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap 'rc=$?; cleanup; exit $rc' EXIT

[[ "$(id -u)" -eq 0 ]] || die "run as root (it installs packages, starts dockerd and chowns the key)"
[[ -f "$models/$model" ]] || die "no model $models/$model"
command -v docker >/dev/null || apt_install docker.io
need_daemon
need_compose
need_base

say "building convoy:latest from dist/Containerfile"
docker build -q --network host --build-arg JOBS="${JOBS:-2}" -f "$src/dist/Containerfile" -t convoy:latest "$src" \
    >/dev/null
docker run --rm -u 0 -v "$tmp:/k" convoy:latest keygen /k/cluster.key >/dev/null 2>&1
chown 10001:10001 "$tmp/cluster.key"

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export CONVOY_MODELS_DIR="$models" CONVOY_MODEL_NAME="$model" CONVOY_KEY_PATH="$tmp/cluster.key"
export CONVOY_HTTP_PORT="$port"
"${compose[@]}" down -v >/dev/null 2>&1 || true
"${compose[@]}" up -d --no-build
for _ in $(seq 120); do
    "${compose[@]}" logs head 2>/dev/null | grep -q "listening on" && break
    sleep 1
done
"${compose[@]}" logs --no-color
base="http://127.0.0.1:$port"
curl -sf "$base/health" >/dev/null || die "the head does not answer /health at $base"

say "chat request to the head:"
body='{"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 32, "temperature": 0}'
echo "curl $base/v1/chat/completions -d '$body'"
answer="$(curl -sf "$base/v1/chat/completions" -d "$body")" || die "the chat request failed"
echo "$answer"
content="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' <<<"$answer")"
[[ -n "$content" ]] || die "the chat answer is empty"

body='{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}'
chain="$(curl -sf "$base/v1/completions" -d "$body" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')"
alone="$(docker run --rm -v "$models:/models:ro" convoy:latest run -m "/models/$model" -p "Once upon a time" -n 16 \
    --temp 0 2>/dev/null)"
[[ -n "$chain" && "Once upon a time$chain" == "$alone" ]] ||
    die "the chain's completion '$chain' is not one container's: '$alone'"
say "a completion through head, stage1 and stage2 is one container's text: $alone"

head_id="$("${compose[@]}" ps -q head)"
for _ in $(seq 30); do
    health="$(docker inspect --format '{{.State.Health.Status}}' "$head_id")"
    [[ "$health" == healthy ]] && break
    sleep 1
done
[[ "$health" == healthy ]] || die "the head's health check says '$health'"
say "the head's health check: healthy"
say "OK"
