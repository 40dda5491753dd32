#!/usr/bin/env bash
# test_cluster.sh: scripts/cluster.sh and tools/linkemu on 3 test hosts.
#
# Usage (CTest passes these): test_cluster.sh PATH/TO/convoy SOURCE_DIR
# linkemu is taken from beside the convoy binary. Needs root and `ip netns`;
# otherwise it prints a skip line and passes. Under its own cluster prefix
# ("cvt", so a developer's "cv" cluster is left alone) it: brings up 3
# hosts; pings around the ring; runs an echo server on host 2 and measures
# from host 0, through a linkemu on host 1, the round trip of one message
# (at least twice the one-way delay) and of ten messages sent 20 ms apart
# (they travel together: far less than ten round trips, which a relay that
# slept per chunk would take); checks jitter keeps the lower bound; checks
# a tbf rate limit slows a 1 MB echo to at least its lower bound; checks
# 100% loss blocks ping and 0% lets it through; tears down, checks nothing
# is left, and tears down again (idempotent). A trap tears down on any exit.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
cluster="$src/scripts/cluster.sh"
export LINKEMU="$build/linkemu"
export CONVOY_CLUSTER_PREFIX=cvt

need_netns test_cluster
for tool in python3 ping nft tc; do
    command -v "$tool" >/dev/null || {
        echo "FAIL: $tool not found (scripts/install-deps.sh installs it)"
        exit 1
    }
done
[[ -x "$LINKEMU" ]] || {
    echo "FAIL: linkemu not built at $LINKEMU"
    exit 1
}

make_tmp
at_exit 'bash "$cluster" down'

cat >"$tmp/echo.py" <<'EOF'
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("listening", flush=True)
def serve(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        d = c.recv(65536)
        if not d:
            break
        c.sendall(d)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
EOF

# probe.py HOST PORT MODE: prints milliseconds. MODE one: one 1-byte round
# trip; train: 10 one-byte messages 20 ms apart, until all echoes are back;
# bulk: 1 MB sent and echoed back.
cat >"$tmp/probe.py" <<'EOF'
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def expect(n):
    got = 0
    while got < n:
        d = c.recv(1 << 20)
        if not d:
            raise SystemExit("connection closed")
        got += len(d)
mode = sys.argv[3]
c.sendall(b"w"); expect(1)  # warm up the connection through the relay
t = time.monotonic()
if mode == "one":
    c.sendall(b"x"); expect(1)
elif mode == "train":
    for i in range(10):
        c.sendall(b"y"); time.sleep(0.02)
    expect(10)
else:
    data = bytes(1 << 20)
    import threading
    th = threading.Thread(target=c.sendall, args=(data,)); th.start()
    expect(len(data)); th.join()
print(int((time.monotonic() - t) * 1000))
EOF

probe() { bash "$cluster" run 0 python3 "$tmp/probe.py" "$@"; }

if ! bash "$cluster" up 3; then
    echo "FAIL: cluster.sh up 3"
    exit 1
fi
pass "up 3"

for pair in "0 1" "1 2" "2 0"; do
    set -- $pair
    if bash "$cluster" run "$1" ping -c 1 -W 2 "$(bash "$cluster" addr "$2")" >/dev/null; then
        pass "ping host $1 -> host $2"
    else
        fail "ping host $1 -> host $2"
    fi
done

bash "$cluster" run 2 python3 "$tmp/echo.py" 10.77.0.3 7000 >"$tmp/echo.log" 2>&1 &
for _ in $(seq 50); do
    grep -q listening "$tmp/echo.log" && break
    sleep 0.1
done

direct="$(probe 10.77.0.3 7000 one)" || direct=""
[[ -n "$direct" ]] && pass "direct echo round trip ${direct} ms" || fail "direct echo"

delay=100
if bash "$cluster" delay 1 7100 10.77.0.3:7000 "$delay"; then
    pass "linkemu started on host 1"
else
    fail "linkemu start"
fi
rtt="$(probe 10.77.0.2 7100 one)" || rtt=0
if ((rtt >= 2 * delay - 5)); then
    pass "one round trip through linkemu: ${rtt} ms (>= $((2 * delay)) ms expected)"
else
    fail "one round trip through linkemu: ${rtt} ms, expected >= $((2 * delay))"
fi
train="$(probe 10.77.0.2 7100 train)" || train=0
# in flight together: about 180 ms of sending + one round trip; one sleep
# per chunk would need at least 10 round trips (2000 ms)
if ((train >= 2 * delay - 5 && train < 1500)); then
    pass "10 messages 20 ms apart through linkemu: ${train} ms (pipelined)"
else
    fail "10 messages 20 ms apart through linkemu: ${train} ms, expected in [$((2 * delay)), 1500)"
fi

bash "$cluster" delay 1 7101 10.77.0.3:7000 30 20 7 || fail "linkemu with jitter start"
jit="$(probe 10.77.0.2 7101 one)" || jit=0
((jit >= 55)) && pass "round trip with 30 ms delay + jitter: ${jit} ms" || fail "jitter round trip ${jit} ms < 60"
bash "$cluster" undelay 1 7101
if bash "$cluster" run 0 python3 "$tmp/probe.py" 10.77.0.2 7101 one >/dev/null 2>&1; then
    fail "undelay left the emulator running"
else
    pass "undelay stops the emulator"
fi

# 16 mbit/s both ways on host 2: 1 MB each way takes >= 0.5 s
bash "$cluster" rate 2 16mbit || fail "rate 2 16mbit"
bulk="$(probe 10.77.0.3 7000 bulk)" || bulk=0
((bulk >= 350)) && pass "1 MB echo at 16 mbit: ${bulk} ms" || fail "1 MB echo at 16 mbit took ${bulk} ms (< 350)"
bash "$cluster" rate 2 off || fail "rate 2 off"
fast="$(probe 10.77.0.3 7000 bulk)" || fast=0
((fast < bulk)) && pass "rate off: 1 MB echo ${fast} ms" || fail "rate off: 1 MB echo ${fast} ms, not faster than ${bulk}"

bash "$cluster" loss 2 100 || fail "loss 2 100"
if bash "$cluster" run 0 ping -c 1 -W 1 10.77.0.3 >/dev/null; then
    fail "ping through 100% loss"
else
    pass "100% loss drops ping"
fi
bash "$cluster" loss 2 0 || fail "loss 2 0"
bash "$cluster" run 0 ping -c 1 -W 2 10.77.0.3 >/dev/null && pass "loss 0 restores ping" || fail "ping after loss 0"

bash "$cluster" down || fail "down"
if ip netns list | grep -qE '^cvt([0-9]+|sw)( |$)'; then
    fail "namespaces left after down"
else
    pass "down removes every namespace"
fi
bash "$cluster" down && pass "down again (idempotent)" || fail "second down"

checks_summary
