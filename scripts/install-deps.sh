#!/usr/bin/env bash
# install-deps.sh: installs what convoy needs and this machine lacks, with
# apt-get (Debian 12 package names). Idempotent: prints nothing and changes
# nothing when everything is present. Runs as root, or through sudo when it
# exists.
#
#   install-deps.sh run     what building and running convoy needs (the first four lines below)
#   install-deps.sh         that, and what the tests, benchmarks and scripts need (all of them)
#
#   build-essential cmake pkg-config      C toolchain and build
#   libjansson-dev libsodium-dev libmicrohttpd-dev   JSON, link crypto, HTTP
#   libcurl4-gnutls-dev                   downloads (convoy pull, -hf)
#   util-linux                            taskset: run.sh pins each stage to a core
#   clang libclang-rt-dev                 clang and its libFuzzer/sanitizer runtimes
#   nodejs npm                            HTTP API client tests
#   iproute2 nftables                     test hosts (ip netns, tc, loss rules)
#   iputils-ping                          test hosts (reachability checks)
#   python3 python3-jinja2                tools, reference checks, chat templates rendered by Jinja2
#   gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user   NEON kernels built and run as arm64
#   libzstd-dev                           zstd -19, bench_rans's yardstick for convoy's own coder (bench only)
#   openssl systemd                       the service test: a test CA, systemd-analyze verify of the units
#   tmux                                  convoy chat driven in a terminal
#   chromium                              serve's chat page driven in headless Chromium (playwright-core from npm)
set -euo pipefail

packages=(build-essential cmake pkg-config libjansson-dev libsodium-dev libmicrohttpd-dev libcurl4-gnutls-dev
          util-linux)
if [[ "${1:-}" != run ]]; then
    packages+=(clang libclang-rt-dev nodejs npm iproute2 nftables iputils-ping python3 python3-jinja2
               gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libzstd-dev openssl systemd
               tmux chromium)
fi

# Packages that also count as present when their command is on PATH: node
# from NodeSource ships npm inside its nodejs package (and conflicts with
# Debian's npm); python3 may come from pyenv.
declare -A command_of=([nodejs]=node [npm]=npm [python3]=python3)

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: not a Debian system; make sure these (or their equivalents) are installed:" >&2
    echo "  ${packages[*]}" >&2
    exit 0
fi

missing=()
for pkg in "${packages[@]}"; do
    cmd="${command_of[$pkg]:-}"
    if [[ -n "$cmd" ]] && command -v "$cmd" >/dev/null 2>&1; then
        continue
    fi
    status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
    [[ "$status" == installed ]] || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

as_root=()
if [[ "$(id -u)" -ne 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install-deps: missing ${missing[*]}; run as root (no sudo here) to install them" >&2
        exit 1
    fi
    as_root=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
