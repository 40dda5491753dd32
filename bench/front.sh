#!/usr/bin/env bash
# front.sh: `convoy serve`'s HTTP front against a slow-header attack and a
# greedy client, while /health and another client are timed.
#
#   bench/front.sh [SECONDS] [SERVE_ARGS...]    default 30 s
#   CONVOY=PATH bench/front.sh                  that binary (else build/convoy, built here)
#
# Serves stories260K with the default options (4 slots, a queue of 64; plus
# SERVE_ARGS, e.g. "--client-slots 4 --client-connections 100000" to see it
# without the per-client limits) on a free loopback port, then for SECONDS:
#   - 520 slowloris sockets from 127.0.0.2: each sends a request line and
#     one header line every 5 s, never the end of the headers; a socket the
#     server closes is opened again at once;
#   - a greedy client, 127.0.0.3: 68 concurrent long completions (2000
#     tokens, ignore_eos), each sent again as soon as it ends;
#   - /health from 127.0.0.1 every 0.25 s, and another client, 127.0.0.4,
#     a short completion (16 tokens) every 0.5 s, each on a new connection,
#     timed from connect to the whole answer.
# (Every 127.x.y.z is this machine: four addresses make four clients.)
# Prints a report (JSON, also appended to bench/out/front.jsonl): the
# slowloris sockets the server held at the end, the greedy client's
# answers by status, the max and median latency of /health and of the
# other client's requests, and whether every one of those was answered
# (200) within 2 s; exits 1 when not.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
seconds="${1:-30}"
shift || true
if [[ -z "${CONVOY:-}" ]]; then
    bench_build
fi
convoy="${CONVOY:-$convoy}"
model="${CONVOY_SHARED:-../shared}/models/stories260K.gguf"
mkdir -p bench/out
make_tmp
start_serve "$convoy" bench/out/front-server.log -m "$model" --host 127.0.0.1 "$@"
port="${base##*:}"
ulimit -n 4096 2>/dev/null || true
python3 - "$port" "$seconds" <<'EOF' | tee -a bench/out/front.jsonl
import http.client, json, os, select, socket, statistics, sys, threading, time

port, seconds = int(sys.argv[1]), float(sys.argv[2])
end = time.monotonic() + seconds
lock = threading.Lock()

def request(src, method, path, body=None, timeout=60):
    """(status, seconds) of one request on a new connection from address src."""
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection('127.0.0.1', port, timeout=timeout, source_address=(src, 0))
        c.request(method, path, body=json.dumps(body) if body else None,
                  headers={'Content-Type': 'application/json'} if body else {})
        r = c.getresponse()
        r.read()
        c.close()
        return r.status, time.monotonic() - t0
    except OSError as e:
        return type(e).__name__, time.monotonic() - t0

def slowloris(n):
    """Holds n sockets that never finish their headers; returns how many are open at the end."""
    socks = {}
    def open_one():
        s = socket.socket()
        s.setblocking(False)
        s.bind(('127.0.0.2', 0))
        try:
            s.connect(('127.0.0.1', port))
        except BlockingIOError:
            pass
        socks[s] = 0.0
    for _ in range(n):
        open_one()
    while time.monotonic() < end:
        now = time.monotonic()
        for s, due in list(socks.items()):
            if now < due:
                continue
            try:
                s.send(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\n' if due == 0.0 else b'X-a: b\r\n')
                socks[s] = now + 5
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                s.close()
                del socks[s]
                open_one()
        poller = select.poll()
        by_fd = {s.fileno(): s for s in socks}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(50):
            s = by_fd[fd]
            try:
                if s.recv(4096) == b'':
                    raise OSError
            except OSError:
                s.close()
                socks.pop(s, None)
                open_one()
    time.sleep(0.5)
    alive = 0
    for s in socks:
        try:
            alive += s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b''
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
        s.close()
    return alive

greedy = {}
def greedy_client():
    body = {'model': 'any', 'prompt': 'Once upon a time', 'max_tokens': 2000, 'ignore_eos': True}
    while time.monotonic() < end:
        status, _ = request('127.0.0.3', 'POST', '/v1/completions', body, timeout=600)
        with lock:
            greedy[str(status)] = greedy.get(str(status), 0) + 1
        if status != 200:
            time.sleep(0.2)

def timed(src, method, path, body, every, out):
    while time.monotonic() < end:
        t0 = time.monotonic()
        out.append(request(src, method, path, body, timeout=60))
        time.sleep(max(0.0, every - (time.monotonic() - t0)))

health, other = [], []
held = []
attack = threading.Thread(target=lambda: held.append(slowloris(520)))
# the greedy requests still running at the end are left to the server's shutdown
greedy_threads = [threading.Thread(target=greedy_client, daemon=True) for _ in range(68)]
for t in [attack] + greedy_threads:
    t.start()
time.sleep(2)  # the attack is on
short = {'model': 'gpt-3.5-turbo', 'prompt': 'The little dog', 'max_tokens': 16}
probes = [threading.Thread(target=timed, args=('127.0.0.1', 'GET', '/health', None, 0.25, health)),
          threading.Thread(target=timed, args=('127.0.0.4', 'POST', '/v1/completions', short, 0.5, other))]
for t in probes:
    t.start()
for t in probes + [attack]:
    t.join()

def summary(xs):
    ok = [s for st, s in xs if st == 200]
    return {'n': len(xs), 'ok': len(ok), 'max_s': round(max(s for _, s in xs), 3) if xs else None,
            'median_s': round(statistics.median(s for _, s in xs), 3) if xs else None}

h, o = summary(health), summary(other)
passed = bool(health and other) and h['ok'] == h['n'] and o['ok'] == o['n'] and h['max_s'] <= 2 and o['max_s'] <= 2
with lock:
    print(json.dumps({'bench': 'front', 'seconds': seconds, 'slowloris_sockets': 520,
                      'slowloris_held_by_server_at_end': held[0] if held else None, 'greedy_client_answers': greedy,
                      'health': h, 'other_client': o, 'within_2s': passed}), flush=True)
os._exit(0 if passed else 1)
EOF
