#!/usr/bin/env bash
# test_keys.sh: keyed pipelines (--key, convoy keygen, --insecure).
#
# Usage (CTest passes these): test_keys.sh PATH/TO/convoy SOURCE_DIR
#
# A `convoy stage` with --key on 127.0.0.1 (stories260K from ../shared)
# refuses a head with another key, a head without a key and a raw client
# that sends only the first half of the key handshake: each is logged in
# the stage's log with its address, and none gets a layer computed (the
# stage never says it serves layers). A head with the right key then prints
# the same greedy tokens as a plaintext pipeline, and 20 idle sockets held
# open at the stage do not keep a head from being served within 2 s.
# Around it: keygen never overwrites, a key file others can read is refused,
# and plaintext beyond loopback needs --insecure on both ends.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3 "for raw clients"
need_stories

make_tmp
run_ids() { # run_ids NODES ARGS...: the greedy ids of a short generation, on stdout
    local nodes="$1"
    shift
    "$convoy" run -m "$model" -p "Once upon a time" -n 24 --temp 0 --ids --nodes "$nodes" "$@"
}

"$convoy" keygen "$tmp/key" 2>/dev/null && "$convoy" keygen "$tmp/other" 2>/dev/null
expect "keygen writes 64 hex digits, mode 600" \
    test "$(stat -c %a "$tmp/key")" = 600 -a "$(grep -cE '^[0-9a-f]{64}$' "$tmp/key")" = 1
! "$convoy" keygen "$tmp/key" 2>"$tmp/err"
expect "keygen refuses to overwrite" has "$tmp/err" "refusing to overwrite"
cp "$tmp/key" "$tmp/open" && chmod 644 "$tmp/open"
! "$convoy" stage --listen 127.0.0.1:1 -m "$model" --key "$tmp/open" 2>"$tmp/err"
expect "a key file others can read is refused" has "$tmp/err" "readable by others"
! timeout 10 "$convoy" stage --listen "0.0.0.0:$(free_port)" -m "$model" 2>"$tmp/err"
expect "plaintext stage beyond loopback refused" grep -q -- "--key FILE.*--insecure" "$tmp/err"
! run_ids 10.255.255.1:7000 >/dev/null 2>"$tmp/err" # refused before any connect
expect "plaintext head to a node beyond loopback refused" grep -q -- "has no --key.*--insecure" "$tmp/err"

port="$(free_port)"
start_local_stage "$convoy" "$tmp/stage.log" "$port" -m "$model" --key "$tmp/key"
pids+=("$stage_pid")
nodes="local,127.0.0.1:$port"

! run_ids "$nodes" --key "$tmp/other" >/dev/null 2>"$tmp/err"
expect "a head with another key fails" has "$tmp/err" "did not prove the cluster key"
! run_ids "$nodes" >/dev/null 2>"$tmp/err"
expect "a head without a key fails" test -s "$tmp/err"
python3 - "$port" >"$tmp/half.txt" <<'EOF'
import os, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"CVK1" + os.urandom(32))
t0 = time.time()
got = b""
while len(got) < 64:
    b = s.recv(64 - len(got))
    if not b:
        break
    got += b
s.settimeout(20)
rest = s.recv(1)  # the stage must close: b"" within its deadline
print(len(got), len(rest), round(time.time() - t0, 1))
EOF
read -r reply_len rest_len half_s <"$tmp/half.txt"
expect "a half handshake is answered once, then dropped (${half_s:-?} s)" \
    test "${reply_len:-0}" = 64 -a "${rest_len:-1}" = 0
sleep 0.2
expect "refusals are logged with the peer's address" test \
    "$(grep -c "refused peer 127.0.0.1:[0-9]*: closed the connection during the key handshake" "$tmp/stage.log")" \
    -ge 1 -a "$(grep -c "refused peer 127.0.0.1:[0-9]*: sent a plaintext frame" "$tmp/stage.log")" -ge 1 -a \
    "$(grep -c "refused peer 127.0.0.1:[0-9]*: no key handshake within" "$tmp/stage.log")" -ge 1
expect "no layer was served to a refused peer" test "$(grep -c "serving layers" "$tmp/stage.log")" = 0

run_ids "$nodes" --key "$tmp/key" >"$tmp/keyed.txt" 2>"$tmp/err"
expect "a head with the key is served" test -s "$tmp/keyed.txt"
plain_port="$(free_port)"
start_local_stage "$convoy" "$tmp/plain.log" "$plain_port" -m "$model"
pids+=("$stage_pid")
run_ids "local,127.0.0.1:$plain_port" >"$tmp/plain.txt" 2>/dev/null
expect "keyed and plaintext pipelines give the same tokens: $(head -c 60 "$tmp/keyed.txt")" \
    cmp -s "$tmp/keyed.txt" "$tmp/plain.txt"

python3 - "$port" <<'EOF' &
import socket, sys, time
socks = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(20)]
time.sleep(8)
EOF
pids+=("$!")
sleep 0.3
t0=$(date +%s.%N)
run_ids "$nodes" --key "$tmp/key" >"$tmp/busy.txt" 2>"$tmp/err"
secs=$(python3 -c "import sys; print(round($(date +%s.%N) - $t0, 2))")
expect "with 20 idle sockets held open, a head is served in ${secs} s (< 2 s)" \
    python3 -c "import sys; sys.exit(0 if $secs < 2 and open('$tmp/busy.txt').read() == open('$tmp/keyed.txt').read() else 1)"
checks_summary
