#!/usr/bin/env bash
# test_serve_hardening.sh: the low items of issue #33 against `convoy serve`
# and its command line, each an attack that once worked.
#
# Usage (CTest passes these): test_serve_hardening.sh PATH/TO/convoy SOURCE_DIR
#
# 1. a GGUF whose context_length is 2^31 (it wrapped negative) is refused by
#    run and serve, naming the key and its limit;
# 2. a FIFO given as a file (--api-key-file, -m, --chat-template, --key of
#    serve and of a stage) is refused at once, naming what it is (opening it
#    waited for a writer, and serve had SIGTERM blocked by then);
# 3. with an origin list, every answer says Vary: Origin (without an
#    Origin, with a listed one, with another: the CORS header differs);
# 4. /health answers 503 in llama-server's error shape while a failover is
#    at work (the only stage was killed; --failover-wait 60 s), and 200
#    once the stage is back;
# 5. a client that sends its request headers one byte a second is cut, and
#    so is one that sends its body so after whole headers (--timeout 2: a
#    request is due within 4 s), each cut logged, while a keep-alive client
#    idle between requests is not;
# 6. after each attack of issue #33's item 1 (a response_format schema of
#    arrays nested 25, 30, 60 and 65 deep: compiled or refused) and of the
#    slow clients above, an honest chat request is answered within 2 s.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3 "for raw clients"
need_stories

make_tmp KILL

# serve_1t LOG ARGS...: start_server of the model on a free port, 1 thread.
serve_1t() {
    start_server "$1" -m "$model" --port "$(free_port)" -t 1 "${@:2}"
}

# honest_within_2s: a plain chat request to $base answers 200 within 2 s.
honest_within_2s() {
    local code
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$base/v1/chat/completions" \
        -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}')"
    [[ "$code" == 200 ]]
}

# health_within SECONDS CODE: polls /health every 0.2 s until it answers CODE.
health_within() {
    local code=""
    for _ in $(seq $(($1 * 5))); do
        code="$(curl -s -o "$tmp/health.json" -w '%{http_code}' --max-time 5 "$base/health")"
        [[ "$code" == "$2" ]] && return 0
        sleep 0.2
    done
    return 1
}

# 1. context_length 2^31
python3 - "$model" "$tmp/ctx2g.gguf" <<'EOF'
import struct, sys
d = bytearray(open(sys.argv[1], 'rb').read())
at = d.find(b"llama.context_length") + len(b"llama.context_length")
assert struct.unpack_from('<I', d, at)[0] == 4  # GGUF_TYPE_UINT32
struct.pack_into('<I', d, at + 4, 1 << 31)
open(sys.argv[2], 'wb').write(d)
EOF
timeout -s KILL 30 "$convoy" run -m "$tmp/ctx2g.gguf" -p hi -n 2 >/dev/null 2>"$tmp/err"
expect "run: context_length 2^31 is refused naming its limit" \
    grep -q "context_length 2147483648 is over the limit of 16777216" "$tmp/err"
timeout -s KILL 30 "$convoy" serve -m "$tmp/ctx2g.gguf" --port 0 2>"$tmp/err"
expect "serve: context_length 2^31 is refused naming its limit" \
    grep -q "context_length 2147483648 is over the limit of 16777216" "$tmp/err"

# 2. a FIFO as a file; KILL: serve blocks SIGTERM while it starts
mkfifo "$tmp/fifo"
fifo_refused() { # fifo_refused WHAT ARGS...: convoy ARGS ends within 20 s, naming the FIFO
    local what="$1"
    shift
    timeout -s KILL 20 "$convoy" "$@" >/dev/null 2>"$tmp/err"
    [[ $? != 137 ]] && grep -q "fifo is a FIFO, not a regular file" "$tmp/err" && pass "a FIFO as $what is refused" ||
        fail "a FIFO as $what: $(if [[ -s "$tmp/err" ]]; then tail -1 "$tmp/err"; else echo "no answer in 20 s"; fi)"
}
fifo_refused "serve --api-key-file" serve -m "$model" --port 0 --api-key-file "$tmp/fifo"
fifo_refused "serve -m" serve -m "$tmp/fifo" --port 0
fifo_refused "serve --chat-template" serve -m "$model" --port 0 --chat-template "$tmp/fifo"
fifo_refused "serve --key" serve -m "$model" --port 0 --nodes "127.0.0.1:$(free_port)" --key "$tmp/fifo"
fifo_refused "stage --key" stage --listen "127.0.0.1:$(free_port)" -m "$model" --key "$tmp/fifo"

# 3. Vary: Origin with an origin list
if serve_1t "$tmp/cors.log" --cors "http://a.example,http://b.example"; then
    curl -s -D "$tmp/h0" -o /dev/null "$base/v1/models"
    curl -s -D "$tmp/h1" -o /dev/null "$base/v1/models" -H "Origin: http://b.example"
    curl -s -D "$tmp/h2" -o /dev/null "$base/v1/models" -H "Origin: http://c.example"
    expect "an origin list: Vary: Origin without an Origin" grep -qi "^Vary: Origin" "$tmp/h0"
    expect "an origin list: Vary: Origin and the origin for a listed one" \
        bash -c "grep -qi '^Vary: Origin' '$tmp/h1' && grep -qi '^Access-Control-Allow-Origin: http://b.example' '$tmp/h1'"
    expect "an origin list: 403 with Vary: Origin for another" \
        bash -c "grep -q '^HTTP/1.1 403' '$tmp/h2' && grep -qi '^Vary: Origin' '$tmp/h2'"
    kill "$server_pid"
fi

# 4. /health while the pipeline fails over
stage_port="$(free_port)"
start_local_stage "$convoy" "$tmp/stage.log" "$stage_port" -m "$model"
pids+=("$stage_pid")
if serve_1t "$tmp/pipe.log" --nodes "127.0.0.1:$stage_port" --failover-wait 60000 --peer-timeout 2000; then
    expect "a pipeline up: /health 200" health_within 10 200
    kill -9 "$stage_pid"
    if health_within 15 503 && grep -q '"type":"unavailable_error"' "$tmp/health.json"; then
        pass "the only stage killed: /health 503 while it fails over ($(head -c 160 "$tmp/health.json"))"
    else
        fail "the only stage killed: /health still $(cat "$tmp/health.json") after 15 s (failover wait 60 s)"
    fi
    start_local_stage "$convoy" "$tmp/stage.log" "$stage_port" -m "$model"
    pids+=("$stage_pid")
    expect "the stage back: /health 200" health_within 40 200
    kill "$server_pid"
fi

# 5. slow headers
if serve_1t "$tmp/slow.log" --timeout 2; then
    python3 - "${base#http://127.0.0.1:}" >"$tmp/slow.txt" <<'EOF'
import socket, sys, time
port = int(sys.argv[1])
# a keep-alive client: two requests 1.5 s apart on one connection
k = socket.create_connection(("127.0.0.1", port))
answers = 0
for _ in range(2):
    k.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    k.settimeout(10)
    answers += b"200 OK" in k.recv(4096)
    time.sleep(1.5)
def slow(head, trickle):
    """Sends head at once, then trickle a byte a second; the seconds until
    the server cut the connection, or None."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(head)
    t0 = time.time()
    for b in trickle:
        try:
            s.sendall(bytes([b]))
            s.settimeout(1)
            if s.recv(1) == b"":
                return round(time.time() - t0, 1)
        except socket.timeout:
            pass
        except OSError:
            return round(time.time() - t0, 1)
        if time.time() - t0 > 30:
            break
    return None
# headers a byte a second; then a body a byte a second after whole headers
cut_headers = slow(b"", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100)
cut_body = slow(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 200\r\n\r\n", b" " * 200)
print(answers, *("none" if c is None else c for c in (cut_headers, cut_body)))
EOF
    read -r answers cut cut_body <"$tmp/slow.txt"
    expect "a keep-alive client idle 1.5 s between requests is answered twice" test "${answers:-0}" = 2
    expect "headers sent a byte a second are cut (after ${cut:-?} s; due within 4 s)" test "${cut:-none}" != none
    expect "a body sent a byte a second is cut (after ${cut_body:-?} s; due within 4 s)" test "${cut_body:-none}" != none
    expect "the cuts are logged" test "$(grep -c 'its request took over 4 s to arrive' "$tmp/slow.log")" -ge 2
    expect "an honest chat request after the slow client is answered within 2 s" honest_within_2s
    kill "$server_pid"
fi

# 6. nested-array schemas, each followed by an honest request
if serve_1t "$tmp/schema.log"; then
    for depth in 25 30 60 65; do
        code="$(python3 - "$depth" "$base" <<'EOF'
import json, sys, urllib.request, urllib.error
depth, base = int(sys.argv[1]), sys.argv[2]
schema = {"type": "integer"}
for _ in range(depth):
    schema = {"type": "array", "items": schema}
body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}
req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
try:
    print(urllib.request.urlopen(req, timeout=30).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("none")
EOF
)"
        expect "a schema of arrays $depth deep is answered (HTTP $code)" test "$code" = 200 -o "$code" = 400
        expect "an honest chat request after it is answered within 2 s" honest_within_2s
    done
    kill "$server_pid"
fi
checks_summary
