#!/usr/bin/env bash
# test_serve_template_budget.sh: a hostile chat template is bounded for all
# requests together, not only per render (issue #33, item 2).
#
# Usage (CTest passes these): test_serve_template_budget.sh PATH/TO/convoy SOURCE_DIR
#
# The server renders stories260K's chats with a template (as a GGUF could
# hold) that is honest for most messages, but for "attack" grows a list
# until its render's 256 MiB are spent, for "sort" sorts 3000 strings of
# 100,000 bytes (13 s of CPU before comparisons counted as steps) and for
# "equal" compares two lists that share their parts six deep (10^12 pairs:
# it never ended). Then:
# 1. each of those alone is refused with a 400 naming its limit;
# 2. 16 clients send hostile requests for 12 s, one after another each,
#    while an honest client asks every half second: the server's peak
#    resident memory stays within 1 GiB above its baseline (the renders'
#    pool is 256 MiB, --template-mem's default) and every honest request is
#    answered within 2 s, with text;
# 3. a client that sends "attack" and leaves after 0.3 s: its render stops
#    (the log's line for it, the last, ends within 1 s of the leaving; the
#    render alone takes 2 s here).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"
need python3 "for the clients"
need_stories

make_tmp

cat >"$tmp/hostile.jinja" <<'EOF'
{%- set what = messages[0].content -%}
{%- if what == 'attack' -%}
{%- set ns = namespace(l=[]) -%}
{%- for i in range(100000) -%}{%- set ns.l = ns.l + ['xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'] -%}{%- endfor -%}
{%- elif what == 'sort' -%}
{%- set ns = namespace(l=[]) -%}
{%- set big = 'a' * 100000 -%}
{%- for i in range(3000) -%}{%- set _ = ns.l.append(big) -%}{%- endfor -%}
{{- ns.l | sort | length -}}
{%- elif what == 'equal' -%}
{%- set ns = namespace(a=['x'], b=['x']) -%}
{%- for i in range(6) -%}{%- set ns.a = [ns.a] * 100 -%}{%- set ns.b = [ns.b] * 100 -%}{%- endfor -%}
{{- ns.a == ns.b -}}
{%- endif -%}
{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}
{% endfor %}<|assistant|>
EOF

start_serve "$convoy" "$tmp/serve.log" -m "$model" -t 1 --chat-template "$tmp/hostile.jinja"
port="${base##*:}"

python3 - "$port" "$server_pid" >"$tmp/out.txt" 2>&1 <<'EOF'
import json, socket, sys, threading, time, urllib.error, urllib.request
port, pid = int(sys.argv[1]), int(sys.argv[2])
url = f"http://127.0.0.1:{port}/v1/chat/completions"

def ask(content, max_tokens=8):
    body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)

def rss_kb(field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field):
            return int(line.split()[1])

# 1. each alone
limits = {"attack": "bytes of memory", "sort": "steps", "equal": "steps"}
for what, limit in limits.items():
    code, body = ask(what)
    msg = body.get("error", {}).get("message", "")
    print("alone", what, "ok" if code == 400 and limit in msg else "FAIL", code, msg[:160])

# 2. 16 hostile clients for 12 s, an honest one every 0.5 s
code, _ = ask("hello")
base = rss_kb("VmRSS")
stop = time.time() + 12
hostile = {"n": 0, "bad": []}
def attacker(k):
    what = ("attack", "sort", "equal")[k % 3]
    while time.time() < stop:
        code, body = ask(what)
        hostile["n"] += 1
        if code != 400:
            hostile["bad"].append(code)
threads = [threading.Thread(target=attacker, args=(k,)) for k in range(16)]
for t in threads:
    t.start()
time.sleep(1)
worst, failed = 0.0, []
while time.time() < stop - 0.5:
    t0 = time.time()
    code, body = ask("hello")
    worst = max(worst, time.time() - t0)
    if code != 200 or not body["choices"][0]["message"]["content"]:
        failed.append((code, str(body)[:160]))
    time.sleep(0.5)
for t in threads:
    t.join()
peak = rss_kb("VmHWM")
print("load", "baseline_kb", base, "peak_kb", peak, "above_mib", (peak - base) // 1024, "hostile", hostile["n"],
      "hostile_not_400", len(hostile["bad"]), "honest_worst_s", round(worst, 2), "honest_failed", len(failed),
      failed[:2])

# 3. a client that leaves
s = socket.create_connection(("127.0.0.1", port))
body = json.dumps({"messages": [{"role": "user", "content": "attack"}], "max_tokens": 8}).encode()
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
time.sleep(0.3)
s.close()
time.sleep(3)
EOF
cat "$tmp/out.txt"
for what in attack sort equal; do
    expect "alone: '$what' is refused with a 400 naming its limit" grep -q "^alone $what ok" "$tmp/out.txt"
done
read -r _ _ base _ peak _ above _ n_hostile _ not_400 _ worst _ n_failed _ < <(grep "^load" "$tmp/out.txt")
expect "16 hostile clients (${n_hostile:-?} requests): peak RSS ${above:-?} MiB above the baseline, within 1024" \
    test "${above:-99999}" -le 1024
expect "every hostile request was refused (400)" test "${not_400:-1}" = 0 -a "${n_hostile:-0}" -gt 16
expect "meanwhile every honest request was answered, the slowest in ${worst:-?} s (within 2)" \
    python3 -c "import sys; sys.exit(not (float(sys.argv[1]) <= 2 and int(sys.argv[2]) == 0))" "${worst:-99}" "${n_failed:-1}"
left_ms="$(grep "POST /v1/chat/completions" "$tmp/serve.log" | tail -1 | sed -n 's/.* in \([0-9.]*\) ms.*/\1/p')"
expect "a client that left after 0.3 s: its render ended in ${left_ms:-?} ms (within 1300)" \
    python3 -c "import sys; sys.exit(not float(sys.argv[1]) <= 1300)" "${left_ms:-99999}"
checks_summary
