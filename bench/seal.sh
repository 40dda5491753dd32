#!/usr/bin/env bash
# seal.sh: what keyed links (--key: authenticated, encrypted frames) cost a
# pipeline's decode.
#
#   bench/seal.sh
#
# A 2-stage chain on loopback: a local first stage (the head, pinned to core
# 0) and one `convoy stage` (core 1), twice: a plaintext stage and a keyed
# one side by side. ROUNDS rounds (default 5) each run `convoy run` greedy
# (a 16-token prompt, then TOKENS tokens, default 64, 1 thread per stage)
# through both, alternating which goes first, on the synthetic
# Llama-3.2-1B-shaped Q4_0 (made once in bench/out/models) and on
# stories260K (../shared, skipped when absent). Prints each model's median
# decode tokens/s per mode and the median keyed/plaintext ratio of the
# rounds' pairs (with the smallest and largest), checks that both modes
# gave the same tokens, and appends one JSON line per measurement to
# bench/out/seal.jsonl. BUILD (default build) is the build directory.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds="${ROUNDS:-5}"
tokens="${TOKENS:-64}"
bench_build
big="$(bench_model llama-1b-q4_0 --shape llama-3.2-1b --type Q4_0)"
small="${CONVOY_SHARED:-../shared}/models/stories260K.gguf"

make_tmp
"$convoy" keygen "$tmp/key" 2>/dev/null

start_stage() { # start_stage MODEL PORT ARGS...: a stage on core 1
    local model="$1" port="$2"
    shift 2
    taskset -c 1 "$convoy" stage --listen "127.0.0.1:$port" -m "$model" "$@" 2>>"$tmp/stages.log" &
    pids+=($!)
    stage_listens "$tmp/stages.log" "$port" 600 0.1 || die "no stage on port $port"
}

one_run() { # one_run MODEL PORT ARGS...: prints decode tok/s; the ids go to $tmp/ids.MODE
    local model="$1" port="$2" mode="$3"
    shift 3
    taskset -c 0 "$convoy" run -m "$model" -p "Once upon a time there was a little robot who" -n "$tokens" \
        --temp 0 --ignore-eos --ids --nodes "local,127.0.0.1:$port" "$@" >"$tmp/ids.$mode" 2>"$tmp/run.err" ||
        { cat "$tmp/run.err" >&2; exit 1; }
    sed -nE 's/.*decode [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/p' "$tmp/run.err"
}

measure_model() { # measure_model NAME MODEL
    local name="$1" model="$2" plain_port key_port plain=() keyed=() ratios=()
    plain_port="$(free_port)"
    start_stage "$model" "$plain_port"
    key_port="$(free_port)"
    start_stage "$model" "$key_port" --key "$tmp/key"
    for r in $(seq "$rounds"); do
        local p k
        if ((r % 2)); then
            p="$(one_run "$model" "$plain_port" plain)"
            k="$(one_run "$model" "$key_port" keyed --key "$tmp/key")"
        else
            k="$(one_run "$model" "$key_port" keyed --key "$tmp/key")"
            p="$(one_run "$model" "$plain_port" plain)"
        fi
        cmp -s "$tmp/ids.plain" "$tmp/ids.keyed" || die "$name: keyed tokens differ"
        plain+=("$p")
        keyed+=("$k")
        ratios+=("$(python3 -c "print($k / $p)")")
        for m in plain keyed; do
            local v="$p"
            [[ "$m" == keyed ]] && v="$k"
            printf '{"bench":"seal","model":"%s","mode":"%s","round":%d,"tokens":%d,"decode_tok_s":%s}\n' \
                "$name" "$m" "$r" "$tokens" "$v" >>bench/out/seal.jsonl
        done
    done
    python3 - "$name" "${plain[*]}" "${keyed[*]}" "${ratios[*]}" <<'EOF'
import statistics, sys
name, plain, keyed, ratios = sys.argv[1], *[list(map(float, a.split())) for a in sys.argv[2:]]
print(f"{name}: decode plaintext {statistics.median(plain):.2f} tok/s, keyed {statistics.median(keyed):.2f} tok/s, "
      f"keyed/plaintext {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
      f"{len(ratios)} rounds)")
EOF
    stop_pids
}

echo "seal.sh: $rounds rounds of $tokens greedy tokens, 2 stages on loopback (head core 0, stage core 1)"
measure_model "llama-1b-q4_0" "$big"
if [[ -f "$small" ]]; then
    measure_model "stories260K" "$small"
else
    echo "seal.sh: $small not found, stories260K skipped"
fi
