#!/usr/bin/env bash
# cluster.sh: a cluster of test "hosts" on one machine (docs/DESIGN.md §13).
#
#   cluster.sh up K                 create hosts 0..K-1 (replacing a leftover cluster; see "Sharing")
#   cluster.sh down [--force]       stop everything and remove it (idempotent, safe after failures)
#   cluster.sh run I CMD...         run CMD in host I
#   cluster.sh addr I               print host I's address
#   cluster.sh rate I RATE|off      limit host I's link to RATE (tc tbf, both directions), e.g. 100mbit
#   cluster.sh loss I PCT           drop PCT% of packets entering and leaving host I (nftables); 0 = none
#   cluster.sh cpu I PCT|off        limit host I's processes, those running and those started later, to
#                                   PCT% of one core in all (a CPU cgroup's quota): a slow host
#   cluster.sh delay I LPORT HOST:PORT DELAY_MS [JITTER_MS [SEED]]
#                                   start the link emulator in host I on ADDR(I):LPORT relaying to
#                                   HOST:PORT with that one-way delay each direction; connect to
#                                   ADDR(I):LPORT instead of HOST:PORT to get a long link
#   cluster.sh undelay I LPORT      stop that emulator
#   cluster.sh status               list hosts, qdiscs, loss rules, emulators
#
# Topology: host I is the network namespace ${P}I (P = $CONVOY_CLUSTER_PREFIX,
# default "cv", so cv0, cv1, ...) with loopback up and one interface eth0 at
# 10.77.0.(I+1)/24. Every eth0 is a veth pair whose other end sits on the
# bridge br0 of a switch namespace ${P}sw, so all hosts share one L2 segment
# and nothing of the cluster lives in the root namespace: traffic only
# flows between the hosts (and inside each host's loopback). A rate limit
# sits on both ends of host I's veth (egress of eth0 and of its switch
# port), loss rules in host I's own nftables (input and output on eth0).
# A CPU limit is a cgroup per host (convoy-${P}I under the cpu controller,
# v1 or v2) that `run` puts its command in.
# This kernel has no netem, so delay comes from tools/linkemu (found as
# $LINKEMU, else build/linkemu or build-asan/linkemu under the repo).
# State (owner, emulator pids and logs) is kept in /run/convoy-cluster-${P};
# `down` kills every process still inside the hosts, then deletes the
# namespaces.
#
# Sharing: a cluster belongs to the process that brought it up
# ($CONVOY_CLUSTER_OWNER, default the caller of `up`, e.g. the test
# script). While its owner lives, another `up` of the same prefix waits for
# it (up to $CONVOY_CLUSTER_WAIT seconds, default 600) instead of tearing
# it down, and a `down` from anyone else leaves it alone (--force does
# not); a dead owner's cluster is fair game. So concurrent test runs of one
# prefix take turns. The prefix must start and end with a letter (so that
# one prefix's host names never match another's, e.g. cv1 vs cvb1).
# Needs root, iproute2 and nftables (scripts/install-deps.sh installs them).
set -euo pipefail

P="${CONVOY_CLUSTER_PREFIX:-cv}"
SW="${P}sw"
STATE="/run/convoy-cluster-${P}"
LOCK="/run/convoy-cluster-${P}.lock"
OWNER="${CONVOY_CLUSTER_OWNER:-$PPID}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

[[ "$P" =~ ^[a-z]([a-z0-9]*[a-z])?$ ]] || die "CONVOY_CLUSTER_PREFIX '$P' must be lowercase letters and digits, starting and ending with a letter"

# The live owner of the cluster other than us, if any.
other_owner() {
    local o
    o="$(cat "$STATE/owner" 2>/dev/null || true)"
    if [[ -n "$o" && "$o" != "$OWNER" ]] && kill -0 "$o" 2>/dev/null; then
        echo "$o"
    fi
}

need_root() {
    [[ "$(id -u)" -eq 0 ]] || die "needs root (network namespaces)"
    command -v ip >/dev/null || die "ip (iproute2) not found; run scripts/install-deps.sh"
}

host_ns() { echo "${P}$1"; }
host_addr() { echo "10.77.0.$(($1 + 1))"; }

check_host() {
    [[ "$1" =~ ^[0-9]+$ ]] || die "host '$1' is not a number"
    ip netns list | grep -qE "^$(host_ns "$1")( |$)" || die "host $1 ($(host_ns "$1")) does not exist; run: cluster.sh up K"
}

# Namespaces of this cluster: the switch and every host.
our_namespaces() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${P}([0-9]+|sw)$" | sort -V || true
}

cmd_down() {
    need_root
    local o
    o="$(other_owner)"
    if [[ -n "$o" && "${1:-}" != --force ]]; then
        echo "cluster.sh: cluster '$P' belongs to running pid $o; left alone (down --force tears it down)" >&2
        return 0
    fi
    if [[ -d "$STATE" ]]; then
        for f in "$STATE"/*.pid; do
            [[ -e "$f" ]] || continue
            kill "$(cat "$f")" 2>/dev/null || true
        done
    fi
    local namespaces
    namespaces="$(our_namespaces)"
    for ns in $namespaces; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -TERM "$pid" 2>/dev/null || true
        done
    done
    for _ in $(seq 20); do
        local left=0
        for ns in $namespaces; do
            [[ -z "$(ip netns pids "$ns" 2>/dev/null)" ]] || left=1
        done
        [[ $left -eq 0 ]] && break
        sleep 0.1
    done
    for ns in $namespaces; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -KILL "$pid" 2>/dev/null || true
        done
        ip netns del "$ns" 2>/dev/null || true
        rmdir "$(cpu_root 2>/dev/null)/convoy-$ns" 2>/dev/null || true
    done
    rm -rf "$STATE"
}

cmd_up() {
    local k="${1:-}"
    [[ "$k" =~ ^[0-9]+$ && "$k" -ge 1 && "$k" -le 200 ]] || die "up: K must be 1..200"
    need_root
    exec 9>"$LOCK"
    flock 9
    local waited=0 limit="${CONVOY_CLUSTER_WAIT:-600}" o
    while o="$(other_owner)" && [[ -n "$o" ]]; do
        ((waited == 0)) && echo "cluster.sh: cluster '$P' is in use by pid $o; waiting" >&2
        ((waited < limit * 10)) || die "up: cluster '$P' still in use by pid $o after ${limit} s"
        flock -u 9
        sleep 0.1
        waited=$((waited + 1))
        flock 9
    done
    cmd_down --force
    mkdir -p "$STATE"
    echo "$OWNER" >"$STATE/owner"
    ip netns add "$SW"
    ip -n "$SW" link set lo up
    ip -n "$SW" link add br0 type bridge
    ip -n "$SW" link set br0 up
    for ((i = 0; i < k; i++)); do
        local ns
        ns="$(host_ns "$i")"
        ip netns add "$ns"
        ip link add name eth0 netns "$ns" type veth peer name "p$i" netns "$SW"
        ip -n "$SW" link set "p$i" master br0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
    done
    echo "$k" >"$STATE/hosts"
}

cmd_run() {
    local i="${1:-}"
    shift || true
    [[ $# -ge 1 ]] || die "run: usage: cluster.sh run I CMD..."
    need_root
    check_host "$i"
    local cg
    cg="$(cpu_root 2>/dev/null)/convoy-$(host_ns "$i")"
    [[ ! -d "$cg" ]] || echo $$ >"$cg/cgroup.procs"
    exec ip netns exec "$(host_ns "$i")" "$@"
}

# Where CPU cgroups are made: the cpu controller's v1 hierarchy, or the v2
# root when it offers cpu.
cpu_root() {
    if [[ -w /sys/fs/cgroup/cpu/cgroup.procs ]]; then
        echo /sys/fs/cgroup/cpu
    elif grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
        echo /sys/fs/cgroup
    else
        return 1
    fi
}

cmd_cpu() {
    local i="${1:-}" pct="${2:-}"
    [[ "$pct" == off || ("$pct" =~ ^[0-9]+$ && "$pct" -ge 1 && "$pct" -le 100) ]] ||
        die "cpu: usage: cluster.sh cpu I PCT|off (PCT 1..100)"
    need_root
    check_host "$i"
    local root cg quota=-1
    root="$(cpu_root)" || die "cpu: no writable cpu cgroup controller (/sys/fs/cgroup/cpu or cgroup2 with cpu)"
    cg="$root/convoy-$(host_ns "$i")"
    mkdir -p "$cg"
    [[ "$pct" == off ]] || quota=$((pct * 1000))
    if [[ -e "$cg/cpu.max" ]]; then
        [[ "$quota" -lt 0 ]] && echo "max 100000" >"$cg/cpu.max" || echo "$quota 100000" >"$cg/cpu.max"
    else
        echo 100000 >"$cg/cpu.cfs_period_us"
        echo "$quota" >"$cg/cpu.cfs_quota_us"
    fi
    for pid in $(ip netns pids "$(host_ns "$i")"); do
        echo "$pid" >"$cg/cgroup.procs" 2>/dev/null || true
    done
}

# Bytes of a tc rate ("100mbit", "1gbit", "500kbit", "64000bit") per second.
rate_bytes() {
    local r="$1" n unit
    [[ "$r" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die "rate: '$r' is not N{bit,kbit,mbit,gbit}"
    n="${BASH_REMATCH[1]}"
    unit="${BASH_REMATCH[2]}"
    case "$unit" in
        bit) echo $((n / 8)) ;;
        kbit) echo $((n * 1000 / 8)) ;;
        mbit) echo $((n * 1000000 / 8)) ;;
        gbit) echo $((n * 1000000000 / 8)) ;;
    esac
}

cmd_rate() {
    local i="${1:-}" rate="${2:-}"
    [[ -n "$rate" ]] || die "rate: usage: cluster.sh rate I RATE|off"
    need_root
    check_host "$i"
    local ns
    ns="$(host_ns "$i")"
    if [[ "$rate" == off ]]; then
        ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
        ip netns exec "$SW" tc qdisc del dev "p$i" root 2>/dev/null || true
        return
    fi
    # burst: at least 10 ms of traffic (and 32 KiB), so high rates are reachable
    local bps burst
    bps="$(rate_bytes "$rate")"
    burst=$((bps / 100))
    ((burst >= 32768)) || burst=32768
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
    ip netns exec "$SW" tc qdisc replace dev "p$i" root tbf rate "$rate" burst "$burst" latency 100ms
}

cmd_loss() {
    local i="${1:-}" pct="${2:-}"
    [[ "$pct" =~ ^[0-9]+$ && "$pct" -le 100 ]] || die "loss: PCT must be 0..100"
    need_root
    command -v nft >/dev/null || die "nft (nftables) not found; run scripts/install-deps.sh"
    check_host "$i"
    local ns
    ns="$(host_ns "$i")"
    ip netns exec "$ns" nft delete table inet convoy_loss 2>/dev/null || true
    [[ "$pct" -eq 0 ]] && return
    # numgen gives 0..99; "< 100" is out of its range, so 100% is a plain drop
    local match="numgen random mod 100 < $pct"
    [[ "$pct" -eq 100 ]] && match=""
    ip netns exec "$ns" nft -f - <<EOF
table inet convoy_loss {
    chain in {
        type filter hook input priority 0; policy accept;
        iifname "eth0" $match drop
    }
    chain out {
        type filter hook output priority 0; policy accept;
        oifname "eth0" $match drop
    }
}
EOF
}

find_linkemu() {
    if [[ -n "${LINKEMU:-}" ]]; then
        [[ -x "$LINKEMU" ]] || die "LINKEMU=$LINKEMU is not executable"
        echo "$LINKEMU"
        return
    fi
    for c in "$REPO/build/linkemu" "$REPO/build-asan/linkemu"; do
        if [[ -x "$c" ]]; then
            echo "$c"
            return
        fi
    done
    die "linkemu not found: build the repo (make -C build linkemu) or set LINKEMU"
}

cmd_delay() {
    local i="${1:-}" lport="${2:-}" to="${3:-}" delay="${4:-}" jitter="${5:-0}" seed="${6:-1}"
    [[ "$lport" =~ ^[0-9]+$ && -n "$to" && "$delay" =~ ^[0-9]+$ && "$jitter" =~ ^[0-9]+$ && "$seed" =~ ^[0-9]+$ ]] ||
        die "delay: usage: cluster.sh delay I LPORT HOST:PORT DELAY_MS [JITTER_MS [SEED]]"
    need_root
    check_host "$i"
    local emu
    emu="$(find_linkemu)"
    mkdir -p "$STATE"
    cmd_undelay "$i" "$lport"
    local log="$STATE/linkemu.$i.$lport.log"
    ip netns exec "$(host_ns "$i")" "$emu" --listen "$(host_addr "$i"):$lport" --to "$to" \
        --delay-ms "$delay" --jitter-ms "$jitter" --seed "$seed" >"$log" 2>&1 &
    local pid=$!
    echo "$pid" >"$STATE/linkemu.$i.$lport.pid"
    for _ in $(seq 50); do
        if grep -q "listening on" "$log" 2>/dev/null; then
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$log" >&2 || true
    die "delay: linkemu did not start in host $i"
}

cmd_undelay() {
    local i="${1:-}" lport="${2:-}"
    local f="$STATE/linkemu.$i.$lport.pid"
    if [[ -e "$f" ]]; then
        local pid
        pid="$(cat "$f")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 20); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        rm -f "$f"
    fi
}

cmd_status() {
    need_root
    local namespaces
    namespaces="$(our_namespaces)"
    [[ -n "$namespaces" ]] || {
        echo "no cluster (prefix $P)"
        return
    }
    for ns in $namespaces; do
        [[ "$ns" == "$SW" ]] && continue
        echo "== $ns: $(ip -n "$ns" -4 -o addr show dev eth0 | awk '{print $4}')"
        ip netns exec "$ns" tc qdisc show dev eth0 | grep tbf || true
        ip netns exec "$ns" nft list table inet convoy_loss 2>/dev/null | grep -E 'drop' || true
    done
    for f in "$STATE"/linkemu.*.log; do
        [[ -e "$f" ]] && head -1 "$f"
    done
    return 0
}

cmd="${1:-}"
shift || true
case "$cmd" in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    run) cmd_run "$@" ;;
    addr)
        [[ "${1:-}" =~ ^[0-9]+$ ]] || die "addr: usage: cluster.sh addr I"
        host_addr "$1"
        ;;
    rate) cmd_rate "$@" ;;
    loss) cmd_loss "$@" ;;
    cpu) cmd_cpu "$@" ;;
    delay) cmd_delay "$@" ;;
    undelay) need_root; cmd_undelay "$@" ;;
    status) cmd_status ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
