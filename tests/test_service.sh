#!/usr/bin/env bash
# test_service.sh: convoy run as a service (dist/, README "Run as a
# service"):
# 1. the systemd units of dist/ pass `systemd-analyze verify` (their
#    ExecStart pointed at this build's binary);
# 2. `cmake --install` puts the binary and the service files under a prefix;
# 3. environment variables give the main options: a stage from
#    CONVOY_LISTEN and CONVOY_MODEL alone, a server from CONVOY_MODEL,
#    CONVOY_NODES, CONVOY_SPLIT and CONVOY_PORT that answers through that
#    chain with one machine's text; the command line wins over a variable;
#    a bad value is refused naming its variable; --help lists them;
# 4. HTTPS (--ssl-key-file, --ssl-cert-file) with a certificate of a test
#    CA made here by openssl: the official `openai` client (trusting the CA
#    through NODE_EXTRA_CA_CERTS) gets a chat completion, curl with the CA
#    gets /health and without it fails verification; a key without a
#    certificate is a usage error.
#
# Usage (CTest passes these): test_service.sh PATH/TO/convoy SOURCE_DIR
# Skips without openssl, systemd-analyze or npm, except under CI=true.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
need openssl "for the test CA"
need systemd-analyze "to verify the units"
npm_need "$npm_dir" openai

make_tmp

# 1. the units
for unit in convoy-serve convoy-stage; do
    sed "s|^ExecStart=/usr/local/bin/convoy|ExecStart=$build/convoy|" "$src/dist/$unit.service" >"$tmp/$unit.service"
    out="$(systemd-analyze verify --man=no "$tmp/$unit.service" 2>&1)"
    expect "$unit.service passes systemd-analyze verify without a warning" test $? = 0 -a -z "$out"
    [[ -z "$out" ]] || echo "$out"
done

# 2. cmake --install
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null 2>&1
expect "cmake --install: bin/convoy and the units in share/convoy/systemd" \
    test -x "$tmp/prefix/bin/convoy" -a -f "$tmp/prefix/share/convoy/systemd/convoy-serve.service" \
    -a -f "$tmp/prefix/share/convoy/systemd/stage.env"

# 3. the environment
# serve_at LOG: waits for a server's start line in LOG; sets base (http or https)
serve_at() {
    base=""
    wait_for "listening on" "$1" 300 &&
        base="$(sed -n 's|.*listening on \(https*://[^/]*\)/v1.*|\1|p' "$1" | head -1)"
}
stage_port="$(free_port)"
CONVOY_LISTEN="127.0.0.1:$stage_port" CONVOY_MODEL="$model" "$convoy" stage 2>"$tmp/stage.log" &
pids+=($!)
expect "a stage from CONVOY_LISTEN and CONVOY_MODEL alone" wait_for " on port $stage_port," "$tmp/stage.log" 100
port="$(free_port)"
CONVOY_MODEL="$model" CONVOY_NODES="local,127.0.0.1:$stage_port" CONVOY_SPLIT=3,2 CONVOY_PORT=1 \
    "$convoy" serve --port "$port" 2>"$tmp/env.log" &
pids+=($!)
serve_at "$tmp/env.log"
expect "a server from CONVOY_MODEL, CONVOY_NODES and CONVOY_SPLIT; --port wins over CONVOY_PORT" \
    test "$base" = "http://127.0.0.1:$port"
body='{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}'
chain_text="$(curl -s "$base/v1/completions" -d "$body" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')"
"$convoy" run -m "$model" -p "Once upon a time" -n 16 --temp 0 >"$tmp/run.txt" 2>/dev/null
expect "... through the chain, one machine's text" \
    test -n "$chain_text" -a "Once upon a time$chain_text" = "$(cat "$tmp/run.txt")"
CONVOY_PORT=abc "$convoy" serve -m "$model" 2>"$tmp/bad.txt" >/dev/null
rc=$?
expect "CONVOY_PORT=abc: exit 2 naming the variable" \
    test "$rc" = 2 -a -n "$(grep "CONVOY_PORT expects an integer" "$tmp/bad.txt")"
CONVOY_INSECURE=maybe "$convoy" serve -m "$model" 2>"$tmp/bad.txt" >/dev/null
rc=$?
expect "CONVOY_INSECURE=maybe: exit 2 naming the variable" \
    test "$rc" = 2 -a -n "$(grep "CONVOY_INSECURE is 1, true" "$tmp/bad.txt")"
expect "serve --help lists the variables" bash -c "'$convoy' serve --help | grep -q 'CONVOY_NODES *--nodes'"

# 4. HTTPS with a test CA
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$tmp/ca.key" -out "$tmp/ca.pem" \
    -days 2 -subj "/CN=convoy test CA" >/dev/null 2>&1
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$tmp/server.key" -out "$tmp/server.csr" \
    -subj "/CN=127.0.0.1" >/dev/null 2>&1
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$tmp/ext.cnf"
openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial -out "$tmp/server.pem" \
    -days 2 -extfile "$tmp/ext.cnf" >/dev/null 2>&1 ||
    { echo "FAIL: openssl could not make the test certificate"; exit 1; }
port="$(free_port)"
"$convoy" serve -m "$model" --port "$port" --ssl-key-file "$tmp/server.key" --ssl-cert-file "$tmp/server.pem" \
    2>"$tmp/tls.log" &
pids+=($!)
serve_at "$tmp/tls.log"
expect "HTTPS: the start line says https://" test "$base" = "https://127.0.0.1:$port"
expect "HTTPS: curl with the test CA gets /health" \
    test "$(curl -s --cacert "$tmp/ca.pem" -o /dev/null -w '%{http_code}' "$base/health")" = 200
curl -s -o /dev/null "$base/health"
expect "HTTPS: curl without the CA refuses the certificate (exit 60)" test $? = 60
cat >"$npm_dir/test_service_tls.mjs" <<'JS'
import OpenAI from 'openai';
const client = new OpenAI({ baseURL: process.argv[2] + '/v1', apiKey: 'none', maxRetries: 0 });
const r = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'Hi' }],
  max_tokens: 8 });
console.log(r.choices[0].message.content.length > 0 ? 'ok' : 'empty');
JS
expect "HTTPS: the openai client, trusting the test CA, gets a chat completion" \
    test "$(NODE_EXTRA_CA_CERTS="$tmp/ca.pem" node "$npm_dir/test_service_tls.mjs" "$base" 2>&1)" = ok
"$convoy" serve -m "$model" --ssl-key-file "$tmp/server.key" 2>"$tmp/bad.txt" >/dev/null
rc=$?
expect "--ssl-key-file without --ssl-cert-file: exit 2" test "$rc" = 2 -a -n "$(grep "needs both" "$tmp/bad.txt")"

checks_summary
