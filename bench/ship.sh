#!/usr/bin/env bash
# ship.sh: a stage with an empty cache receives its layers from the head
# over a 100 Mbit/s link, serves them bit for bit, finds them in its cache
# on the next start, and resumes a cut transfer (issue 14).
#
#   bash bench/ship.sh            (as root: it makes test hosts, scripts/cluster.sh)
#
# Builds convoy in BUILD (default build, Release) and makes (once) a
# synthetic Llama-3.2-1B-shaped Q8_0 model (about 1.2 GB) in
# bench/out/models. One machine's logits of TOKENS (default 16) token ids
# (`convoy eval`) are the reference. Then two test hosts (cluster prefix
# CONVOY_CLUSTER_PREFIX, default cvship): host 0 runs the head (`convoy eval
# --nodes local,STAGE`, which plans the split: the head keeps the first
# layers, the stage gets the rest), host 1 a `convoy stage --cache DIR` with
# no model, its link limited to RATE (default 100mbit, cluster.sh rate,
# both directions); every link in plaintext (--insecure).
#
#  1. empty cache: the stage fetches its shard from the head (coded with
#     convoy's rANS coder); its logits must equal one machine's. From the
#     head's `shipped` line: the coded bytes C (SHIP payloads, to 0.1 MB)
#     and the seconds T of the transfer (the longer of the head's, until
#     the last frame is handed to its socket, and the stage's `received`
#     line's, until the last segment is written; the stage's hash check
#     after it is not in T), against
#     the bound C * 8 / RATE: T must be at most BOUND (default 1.1) times
#     it. The shard kept in DIR must hold as many bytes as the head shipped.
#  2. second start: the stage restarted on the same DIR takes the shard from
#     its cache (`from the cache`), the head ships nothing (no `shipping`
#     or `shipped` line; and fewer than 4 MB cross to host 1 in the whole
#     run, eth0's rx_bytes), the logits are one machine's.
#  3. cut: DIR emptied, the stage is SIGKILLed once its `receiving` lines
#     pass CUT_PCT (default 50) percent (the head fails then, as it should);
#     restarted with the same DIR it resumes from its .part (`resuming ...
#     after byte N`), the head ships from byte F (F <= N, within a 1 MiB
#     segment of it) only the rest, and the logits are one machine's; the
#     shard it ends with is the first run's, byte for byte.
# Every run also counts the bytes that cross host 1's link to it (rx_bytes
# of its eth0, as the kernel counts them, GRO-merged packets included).
#
# Prints a report (also in bench/out/ship-PREFIX/report.txt, with every
# process's log) and appends one JSON line to bench/out/ship.jsonl; exit
# status 1 when any check fails. Processes and hosts are torn down on exit.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

rate="${RATE:-100mbit}" bound="${BOUND:-1.1}"
n_tokens="${TOKENS:-16}" cut_pct="${CUT_PCT:-50}"
export CONVOY_CLUSTER_PREFIX="${CONVOY_CLUSTER_PREFIX:-cvship}"
cluster=scripts/cluster.sh
out="bench/out/ship-$CONVOY_CLUSTER_PREFIX"
cache="$out/cache"
port=7000 # start_host_stage's

[[ "$(id -u)" -eq 0 ]] || die "needs root (test hosts are network namespaces)"
[[ "$rate" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die "RATE '$rate' is not N{bit,kbit,mbit,gbit}"
rate_bps="$(awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[2]}" \
    'BEGIN { m = u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : u == "gbit" ? 1e9 : 1; printf "%.0f", n * m }')"

BUILD_TYPE="${BUILD_TYPE:-Release}" bench_build
model="$(bench_model llama-1b-q8_0 --shape llama-3.2-1b --type Q8_0)"
model_bytes="$(stat -c %s "$model")"
say "model: $model, $model_bytes bytes"

rm -rf "$out"
mkdir -p "$out" "$cache"
# ids spread below 32000 (the synthetic models' vocabulary)
python3 -c "import json, sys; n = int(sys.argv[1]); json.dump({'tokens': [1] + [(7919 * i + 13) % 32000 for i in range(1, n)]}, open(sys.argv[2], 'w'))" \
    "$n_tokens" "$out/tokens.json"

# ---- processes ----

stage_pid="" head_pid=""
stop_stage() {
    [[ -n "$stage_pid" ]] || return 0
    kill "$stage_pid" 2>/dev/null || true
    wait "$stage_pid" 2>/dev/null || true
    stage_pid=""
}
make_tmp
at_exit 'stop_head; stop_stage; bash "$cluster" down >/dev/null 2>&1'
trap 'exit 130' INT TERM

stage_addr=""

# start_stage LOG: `convoy stage --cache` on host 1, back once it listens.
start_stage() {
    start_host_stage "$cluster" 1 "$convoy" "$1" --cache "$cache" --insecure ||
        die "the stage did not start: $(tail -3 "$1")"
}

head_args() { echo eval -m "$model" --tokens "$out/tokens.json" --insecure --nodes "local,$stage_addr:$port"; }

# run_head NAME: the head's eval on host 0 (logits in $out/NAME.f32, log in
# $out/NAME-head.log); its exit status. rx[NAME]: the bytes host 1 received meanwhile.
declare -A rx=()
link_rx() { on 1 cat /sys/class/net/eth0/statistics/rx_bytes; }
run_head() {
    local before rc=0
    before="$(link_rx)"
    # shellcheck disable=SC2046
    on 0 timeout 900 "$convoy" $(head_args) --logits "$out/$1.f32" 2>"$out/$1-head.log" || rc=$?
    rx[$1]=$(($(link_rx) - before))
    return $rc
}
mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }

# ---- checks ----

# same_logits NAME: $same is yes when NAME's logits are one machine's, bit for bit
same_logits() {
    if [[ -s "$out/$1.f32" ]] && cmp -s "$out/one.f32" "$out/$1.f32"; then
        pass "$1: logits bit-identical to one machine's"
        same=yes
    else
        fail "$1: logits differ from one machine's or missing: $(tail -2 "$out/$1-head.log" | tr '\n' ' ')"
        same=no
    fi
}

# shipped LOG: the head's last `shipped` line as "L0 L1 MOVED_MB FROM CODED_MB PCT SECONDS MBPS", or nothing
shipped() {
    sed -nE 's/.*shipped layers \[([0-9]+), ([0-9]+)\) to node [^ ]+: ([0-9.]+) MB from byte ([0-9]+) as ([0-9.]+) MB coded \(([0-9.]+)%\) in ([0-9.]+) s, ([0-9.]+) MB\/s coded.*/\1 \2 \3 \4 \5 \6 \7 \8/p' \
        "$1" | tail -1
}
# shard size in bytes from the stage's `receiving`/`received` lines (0.1 MB)
shard_mb() { sed -nE 's/.*receiv(ing|ed) layers \[[0-9]+, [0-9]+\): [0-9.]+ of ([0-9.]+) MB.*/\2/p' "$1" | tail -1; }
# the seconds of the stage's last `received` line
received_s() { sed -nE 's/.*received layers \[[0-9]+, [0-9]+\): .* in ([0-9.]+) s,.*/\1/p' "$1" | tail -1; }
# the stage's last `receiving` percentage
received_pct() { sed -nE 's/.*receiving layers \[[0-9]+, [0-9]+\): .*\(([0-9]+)%\).*/\1/p' "$1" | tail -1; }
fx() { awk "BEGIN { printf \"$1\", $2 }"; }

# ---- 0. one machine ----

bash "$cluster" up 2 >/dev/null
stage_addr="$(bash "$cluster" addr 1)"
bash "$cluster" rate 1 "$rate"
say "hosts up: head $(bash "$cluster" addr 0), stage $stage_addr (link $rate); logs in $out"
on 0 "$convoy" eval -m "$model" --tokens "$out/tokens.json" --logits "$out/one.f32" 2>"$out/one.log" ||
    die "one machine's eval failed: $(tail -3 "$out/one.log")"

# ---- 1. empty cache ----

say "1. a stage with an empty cache"
start_stage "$out/first-stage.log"
t0="$(date +%s.%N)"
run_head first || fail "first: the head failed: $(tail -3 "$out/first-head.log" | tr '\n' ' ')"
first_wall="$(fx %.1f "$(date +%s.%N) - $t0")"
same_logits first
first_same=$same
read -r l0 l1 first_mb first_from first_coded first_pct first_s first_rate < <(shipped "$out/first-head.log") || true
# T is the longer of the two ends' clocks: the head's stops when the last
# frame is handed to its socket, the stage's when it has been written
stage_s="$(received_s "$out/first-stage.log")"
[[ -n "${first_s:-}" && -n "$stage_s" ]] && first_s="$(fx %.2f "($stage_s > $first_s) ? $stage_s : $first_s")"
shard_file="$(find "$cache" -name '*.layers-*.gguf' | head -1)"
shard_bytes="$([[ -n "$shard_file" ]] && stat -c %s "$shard_file" || echo 0)"
ratio="nan" bound_s="nan"
if [[ -n "${first_s:-}" ]]; then
    bound_s="$(fx %.2f "$first_coded * 1e6 * 8 / $rate_bps")"
    ratio="$(fx %.3f "$first_s / $bound_s")"
    [[ "$first_from" == 0 ]] || fail "first: shipped from byte $first_from, not 0"
    if awk "BEGIN { exit !($ratio <= $bound) }"; then
        pass "first: $first_coded MB coded in $first_s s: ${ratio}x the bound C*8/rate ($bound_s s)"
    else
        fail "first: $first_coded MB coded in $first_s s: ${ratio}x the bound C*8/rate ($bound_s s), over ${bound}x"
    fi
else
    fail "first: no shipped line in the head's log"
fi
grep -q "received layers" "$out/first-stage.log" || fail "first: the stage logged no 'received layers'"
[[ -n "$shard_file" && ! -e "$shard_file.part" ]] || fail "first: no shard in $cache (or a .part left): $(ls "$cache")"
# the shard's bytes against the `shipped` MB count (0.1 MB)
if [[ -n "${first_mb:-}" && "$shard_bytes" -gt 0 ]]; then
    awk "BEGIN { d = $shard_bytes / 1e6 - $first_mb; exit !(d < 0.06 && d > -0.06) }" ||
        fail "first: the shard holds $shard_bytes bytes, the head shipped $first_mb MB"
fi
first_sum=""
[[ -z "$shard_file" ]] || first_sum="$(sha256sum <"$shard_file")"
serving="$(grep -o 'serving layers.*' "$out/first-stage.log" | tail -1 || true)"
stop_stage

# ---- 2. second start ----

say "2. the stage restarted on the same cache"
start_stage "$out/second-stage.log"
run_head second || fail "second: the head failed: $(tail -3 "$out/second-head.log" | tr '\n' ' ')"
same_logits second
second_same=$same
second_bytes=0
if grep -qE "shipp(ing|ed) layers" "$out/second-head.log"; then
    second_bytes="$(shipped "$out/second-head.log" | awk '{print $3 " MB"}')"
    fail "second: the head shipped again: $(grep -E 'shipp(ing|ed) layers' "$out/second-head.log" | tail -1)"
fi
((rx[second] < 4000000)) || fail "second: $(mb "${rx[second]}") crossed to the stage's host"
if grep -q "from the cache" "$out/second-stage.log"; then
    pass "second: $(grep -o 'layers .* from the cache' "$out/second-stage.log" | tail -1), nothing shipped"
else
    fail "second: the stage did not log 'from the cache'"
fi
stop_stage

# ---- 3. a cut transfer resumes ----

say "3. a transfer cut at $cut_pct% resumes"
rm -rf "$cache"
mkdir -p "$cache"
start_stage "$out/cut-stage.log"
# shellcheck disable=SC2046
on 0 timeout 900 "$convoy" $(head_args) --logits "$out/cut.f32" 2>"$out/cut-head.log" &
head_pid=$!
cut_at=""
for _ in $(seq 3000); do # up to 300 s
    p="$(received_pct "$out/cut-stage.log")"
    if [[ -n "$p" ]] && ((p >= cut_pct)); then
        cut_at="$p"
        break
    fi
    kill -0 "$head_pid" 2>/dev/null || break
    sleep 0.1
done
if [[ -n "$cut_at" ]]; then
    kill -KILL "$stage_pid"
    wait "$stage_pid" 2>/dev/null || true
    stage_pid=""
    say "SIGKILLed the stage at $cut_at%: $(grep -o 'receiving layers.*' "$out/cut-stage.log" | tail -1)"
else
    fail "cut: the transfer never reached $cut_pct%: $(tail -2 "$out/cut-stage.log" | tr '\n' ' ')"
fi
cut_head_rc=0
wait "$head_pid" || cut_head_rc=$?
head_pid=""
if ((cut_head_rc != 0)); then
    say "the cut run's head failed as expected (exit $cut_head_rc): $(tail -1 "$out/cut-head.log")"
else
    fail "cut: the head succeeded though its stage was killed"
fi
part="$(find "$cache" -name '*.part' | head -1)"
part_bytes="$([[ -n "$part" ]] && stat -c %s "$part" || echo 0)"
stop_stage

start_stage "$out/resume-stage.log"
run_head resume || fail "resume: the head failed: $(tail -3 "$out/resume-head.log" | tr '\n' ' ')"
same_logits resume
resume_same=$same
resume_n="$(sed -nE 's/.*resuming layers \[[0-9]+, [0-9]+\) after byte ([0-9]+) of .*/\1/p' "$out/resume-stage.log" | tail -1)"
read -r _ _ rest_mb rest_from rest_coded rest_pct rest_s rest_rate < <(shipped "$out/resume-head.log") || true
if [[ -z "$resume_n" ]]; then
    fail "resume: the stage did not log 'resuming ... after byte N' (.part had $part_bytes bytes)"
elif [[ -z "${rest_from:-}" ]]; then
    fail "resume: no shipped line in the head's log"
else
    seg=$((1 << 20))
    ((resume_n == part_bytes)) || fail "resume: resumed after byte $resume_n, the .part held $part_bytes"
    if ((rest_from <= resume_n && resume_n - rest_from < seg)); then
        pass "resume: the stage had $resume_n bytes, the head shipped from byte $rest_from ($((resume_n - rest_from)) bytes again)"
    else
        fail "resume: the stage had $resume_n bytes, the head shipped from byte $rest_from"
    fi
    # the rest the head moved is the shard from F on (0.1 MB)
    awk "BEGIN { d = ($shard_bytes - $rest_from) / 1e6 - $rest_mb; exit !(d < 0.06 && d > -0.06) }" ||
        fail "resume: shipped $rest_mb MB from byte $rest_from of a $shard_bytes-byte shard"
    awk "BEGIN { f = $resume_n / $shard_bytes; exit !(f > ($cut_pct - 15) / 100 && f < ($cut_pct + 20) / 100) }" ||
        fail "resume: byte $resume_n is $(fx %.1f "100 * $resume_n / $shard_bytes")% of the shard, not near $cut_pct%"
fi
[[ -n "$shard_file" && -f "$shard_file" && ! -e "$shard_file.part" ]] || fail "resume: no whole shard in $cache: $(ls "$cache")"
if [[ -n "$shard_file" && -f "$shard_file" ]]; then
    if [[ "$(sha256sum <"$shard_file")" == "$first_sum" ]]; then
        pass "resume: the shard is the first run's, byte for byte"
    else
        fail "resume: the resumed shard differs from the first run's"
    fi
fi
stop_stage

# ---- report ----

resume_pct="$([[ -n "$resume_n" && "$shard_bytes" -gt 0 ]] && fx %.1f "100 * $resume_n / $shard_bytes" || echo "?")"
rest_bound="$([[ -n "${rest_coded:-}" ]] && fx %.2f "$rest_coded * 1e6 * 8 / $rate_bps" || echo nan)"
rest_ratio="$([[ -n "${rest_s:-}" ]] && fx %.3f "$rest_s / $rest_bound" || echo nan)"
{
    echo "== bench/ship.sh: $(basename "$model"), stage link $rate, head keeps the first layers (--nodes local,STAGE)"
    printf '%-34s %s\n' "model" "$model_bytes bytes ($(fx %.1f "$model_bytes / 1e6") MB)"
    printf '%-34s %s\n' "stage" "${serving:-?}"
    printf '%-34s %s\n' "shard (layers [${l0:-?}, ${l1:-?}))" "$shard_bytes bytes ($(fx %.1f "$shard_bytes / 1e6") MB) $(basename "${shard_file:-?}")"
    printf '%-34s %s\n' "1. empty cache: coded" "${first_coded:-?} MB (${first_pct:-?}% of the shard)"
    printf '%-34s %s\n' "   transfer" "${first_s:-?} s, ${first_rate:-?} MB/s coded (head's wall time with eval: $first_wall s)"
    printf '%-34s %s\n' "   bound C*8/rate" "$bound_s s: T = ${ratio}x the bound (limit ${bound}x)"
    printf '%-34s %s\n' "   link bytes to the stage" "${rx[first]:-?} ($(mb "${rx[first]:-0}"), host 1 eth0 rx_bytes)"
    printf '%-34s %s\n' "   logits identical" "$first_same"
    printf '%-34s %s\n' "2. second start: shipped" "$second_bytes bytes ($(grep -c 'from the cache' "$out/second-stage.log" || true) 'from the cache' line)"
    printf '%-34s %s\n' "   link bytes to the stage" "${rx[second]:-?} ($(mb "${rx[second]:-0}"): the handshake and activations)"
    printf '%-34s %s\n' "   logits identical" "$second_same"
    printf '%-34s %s\n' "3. cut: stage SIGKILLed at" "${cut_at:-?}% received, .part $part_bytes bytes"
    printf '%-34s %s\n' "   resumed after byte N" "${resume_n:-?} ($resume_pct% of the shard)"
    printf '%-34s %s\n' "   head shipped from byte F" "${rest_from:-?} (N - F = $([[ -n "$resume_n" && -n "${rest_from:-}" ]] && echo $((resume_n - rest_from)) || echo "?") bytes)"
    printf '%-34s %s\n' "   the rest" "${rest_mb:-?} MB as ${rest_coded:-?} MB coded (${rest_pct:-?}%) in ${rest_s:-?} s, ${rest_rate:-?} MB/s: ${rest_ratio}x the bound"
    printf '%-34s %s\n' "   link bytes to the stage" "${rx[resume]:-?} ($(mb "${rx[resume]:-0}"))"
    printf '%-34s %s\n' "   logits identical" "$resume_same"
    printf '%-34s %s\n' "checks failed" "$failures"
} | tee "$out/report.txt"
printf '{"bench":"ship","commit":"%s","model":"%s","rate":"%s","model_bytes":%s,"shard_bytes":%s,"coded_mb":%s,"seconds":%s,"ratio_to_bound":%s,"second_shipped":"%s","second_link_bytes":%s,"resume_after":%s,"resume_from":%s,"rest_mb":%s,"rest_seconds":%s,"identical":%s,"failures":%s}\n' \
    "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src app || echo +dirty)" "$(basename "$model")" "$rate" \
    "$model_bytes" "$shard_bytes" "${first_coded:-null}" "${first_s:-null}" "${ratio/nan/null}" "$second_bytes" "${rx[second]:-null}" "${resume_n:-null}" \
    "${rest_from:-null}" "${rest_mb:-null}" "${rest_s:-null}" \
    "$([[ "$first_same$second_same$resume_same" == yesyesyes ]] && echo true || echo false)" "$failures" >>bench/out/ship.jsonl
((failures == 0))
