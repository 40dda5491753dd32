#!/usr/bin/env bash
# spec.sh: speculative decoding across pipelines on test hosts, with 0, 10,
# 50 and 100 ms one-way delay on every hop (bench/bench_spec.c measures),
# and llama.cpp's own speculation over RPC on the same hosts beside it.
#
# Host 0 runs the head (and the draft); hosts 1..3 run `convoy stage` and
# llama.cpp's ggml-rpc-server, each pinned to a core. A link emulator
# (tools/linkemu via scripts/cluster.sh delay) in front of each adds the
# delay both ways, so the head's FORWARD, every node-to-node hop and the
# RESULT back each pay it: one traversal of an S-stage chain crosses S + 1
# delayed hops.
#
# For each chain (STAGES x DELAYS), in turn: bench_spec (plain, each drafter
# with one window, the Q8_0 self-draft with each K of KS and each number of
# windows in flight of WINDOWS, 0 meaning chosen), then
# llama-speculative-simple with the same target, the same Q8_0 draft and
# --rpc over the same hosts, and the ratio of convoy's chosen windows to it.
#
# MODEL (default: ../shared/models/stories260K.gguf), TOKENS (256), PROMPTS (1),
# DELAYS ("0 10 50 100"), STAGES ("2 3"), KS (none; e.g. "1,2,4,8,12"),
# WINDOWS ("1,2,4,8,0") and LLAMA_K (the draft tokens llama.cpp may propose,
# 16) can be set in the environment. The drafts are made once in
# bench/out/models: a Q8_0 self-draft (rows that do not fit Q8_0 blocks fall
# back to F16, as llama.cpp's ffn_down) and a Q4_0 self-draft; the n-gram
# drafter needs none. Raw lines go to bench/out/spec.jsonl.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
model="${MODEL:-../shared/models/stories260K.gguf}"
tokens="${TOKENS:-256}"
prompts="${PROMPTS:-1}"
delays="${DELAYS:-0 10 50 100}"
stages="${STAGES:-2 3}"
ks="${KS:-}"
windows="${WINDOWS:-1,2,4,8,0}"
llama_k="${LLAMA_K:-16}"
llama=../shared/tools/llama.cpp/bin
bench_build convoy bench_spec linkemu
mkdir -p bench/out/models
base="$(basename "$model" .gguf)"
q8="bench/out/models/$base-draft-q8_0.gguf"
q4="bench/out/models/$base-draft-q4_0.gguf"
[[ -f "$q8" ]] || "$convoy" quantize "$model" "$q8" q8_0 >/dev/null
[[ -f "$q4" ]] || "$convoy" quantize "$model" "$q4" q4_0 >/dev/null

test_hosts cvs 4

wait_port() { # wait_port ADDR PORT, from host 0
    for _ in $(seq 100); do
        on 0 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null && return
        sleep 0.1
    done
    die "nothing listens at $1:$2"
}

core=(0 0 1 0) # host H on core (H + 1) % 2
start_host_stages "$cluster" "$tmp" "1 2 3" -m "$model" --insecure
for h in 1 2 3; do
    addr="$(host_addr "$h")"
    bash "$cluster" run "$h" taskset -c "${core[$h]}" "$llama/ggml-rpc-server" -H "$addr" -p 7100 -t 1 \
        >/dev/null 2>&1 &
    pids+=($!)
    wait_port "$addr" 7000
    wait_port "$addr" 7100
    for d in $delays; do
        if [[ "$d" != 0 ]]; then
            bash "$cluster" delay "$h" $((8000 + d)) "$addr:7000" "$d" >/dev/null
            bash "$cluster" delay "$h" $((9000 + d)) "$addr:7100" "$d" >/dev/null
        fi
    done
done

# llama_spec NODES: llama.cpp's speculation over RPC from host 0 on the
# PROMPTS prompts bench_spec decodes; prints its tok/s over them all (tokens
# over seconds, as bench_spec counts). The draft runs on host 0 (-ngld 0),
# as convoy's does: by default llama.cpp offloads the draft's layers to the
# RPC nodes too, and every draft token then pays the links (2.2 against 38
# tok/s at 50 ms).
llama_spec() {
    "$build/bench_spec" --print-prompts | head -n "$prompts" | while IFS= read -r text; do
        for _ in 1 2 3; do # its log thread may lose the last lines of a run
            line="$(on 0 taskset -c 0 "$llama/llama-speculative-simple" -m "$model" \
                -md "$q8" --spec-type draft-simple --spec-draft-n-max "$llama_k" -p "$text" -n "$tokens" -t 1 \
                -td 1 --temp 0 --ignore-eos --rpc "$1" -ngl 99 -ngld 0 2>&1 </dev/null >/dev/null |
                sed -n 's/^.* I decoded  *\([0-9][0-9]*\) tokens in  *\([0-9.][0-9.]*\) seconds, speed: .*$/\1 \2/p' |
                tail -1)"
            [[ -n "$line" ]] && break
        done
        echo "$line"
    done | awk 'NF == 2 {n += $1; t += $2} END {if (t > 0) printf "%.3f\n", n / t}'
}

# convoy's tok/s with the windows chosen on chain LABEL, from the raw lines.
chosen_tok_s() {
    python3 -c 'import json,sys
rows=[json.loads(l) for l in open("bench/out/spec.jsonl") if l.strip()]
rows=[r for r in rows if r.get("pipeline")==sys.argv[1] and r.get("speculation","").endswith("D auto")]
print("%.2f" % rows[-1]["tok_s"] if rows else "")' "$1"
}

summary=()
for s in $stages; do
    for d in $delays; do
        nodes=""
        rpc=""
        for h in $(seq 1 "$s"); do
            port=$([[ "$d" == 0 ]] && echo 7000 || echo $((8000 + d)))
            rport=$([[ "$d" == 0 ]] && echo 7100 || echo $((9000 + d)))
            nodes+="${nodes:+,}10.77.0.$((h + 1)):$port"
            rpc+="${rpc:+,}10.77.0.$((h + 1)):$rport"
        done
        label="$s stage(s), $d ms"
        on 0 taskset -c 0 "$build/bench_spec" -m "$model" -n "$tokens" --prompts "$prompts" \
            --draft "q8_0 self-draft=$q8" --draft "q4_0 self-draft=$q4" --draft "ngram=ngram" \
            ${ks:+--k-list "$ks"} --windows-list "$windows" --insecure --chain "$label=$nodes"
        lt=$(llama_spec "$rpc")
        ct=$(chosen_tok_s "$label")
        ratio=$(python3 -c "import sys; a,b=sys.argv[1:]; print('%.2fx' % (float(a)/float(b)) if a and b else 'n/a')" "$ct" "$lt")
        echo "llama.cpp speculation over RPC, $label: ${lt:-failed} tok/s; convoy with the windows chosen: $ct tok/s ($ratio)"
        summary+=("| $label | ${lt:-failed} | $ct | $ratio |")
    done
done
echo
echo "| pipeline | llama.cpp RPC + speculation (tok/s) | convoy, D auto (tok/s) | ratio |"
echo "|---|---:|---:|---:|"
printf '%s\n' "${summary[@]}"
