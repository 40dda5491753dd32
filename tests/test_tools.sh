#!/usr/bin/env bash
# test_tools.sh: `convoy synth`, `convoy quantize` and `convoy info` end to end.
#
# Usage: test_tools.sh PATH-TO-CONVOY SOURCE-DIR (CTest passes both).
# Checks: synth is byte-identical across runs and thread counts; the
# fingerprint follows the shape and not the weights; info reads synth
# models and stories260K; quantize falls back (and says so) for rows that
# do not fit a block; quantized tensors are byte-identical to llama.cpp's
# llama-quantize output for the same F32 model (../shared/reference/models);
# synth --type T (Q4_K_M too, with file_type 15) equals quantize of the F32
# synth model; bad input gives an error, never a crash. Data under ../shared
# is skipped when absent, and a failure when CI=true.
set -u

. "$(dirname "$0")/lib.sh"
test_args "$@"
make_tmp

n_skip=0
need_shared() { # need_shared REL: 0 when ../shared/REL exists
    [ -e "$shared/$1" ] && return 0
    if [ "${CI:-}" = true ]; then
        fail "missing test data $shared/$1 (CI=true)"
    else
        n_skip=$((n_skip + 1))
        echo "SKIP: test data $shared/$1 not found"
    fi
    return 1
}
# info_line FILE KEY: the value of "KEY: value" in `convoy info FILE`
info_line() { "$convoy" info "$1" | sed -n "s/^$2: //p"; }
# tensor_table FILE: "name type offset bytes" per tensor
tensor_table() { "$convoy" info "$1" | awk '$1 ~ /^[0-9]+$/ && NF >= 6 { print $2, $3, $(NF-1), $NF }'; }
# same_tensors A B: prints "same differ" counts over the tensors of A that B
# holds with the same type; names each tensor whose bytes differ on stderr
same_tensors() {
    local same=0 differ=0 name off_a off_b bytes
    while read -r name off_a off_b bytes; do
        if [ "$bytes" != - ] && cmp -s -n "$bytes" -i "$off_a:$off_b" "$1" "$2"; then
            same=$((same + 1))
        else
            differ=$((differ + 1))
            echo "  $name differs between $1 and $2" >&2
        fi
    done < <(awk 'NR == FNR { type[$1] = $2; off[$1] = $3; bytes[$1] = $4; next }
                  ($1 in type) && type[$1] == $2 { print $1, off[$1], $3, (bytes[$1] == $4 ? $4 : "-") }' \
                 <(tensor_table "$1") <(tensor_table "$2"))
    echo "$same $differ"
}
status() { "$@" > /dev/null 2> "$tmp/err.txt"; echo $?; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---- synth: determinism, presets, fallbacks ----

"$convoy" synth --shape tiny --type Q8_0 -o "$tmp/tiny-a.gguf" -t 1 > "$tmp/synth.out" 2> "$tmp/synth.err"
expect "synth tiny Q8_0 runs" test $? -eq 0
"$convoy" synth --shape tiny --type Q8_0 -o "$tmp/tiny-b.gguf" -t 3 > /dev/null 2>&1
expect "synth is byte-identical for 1 and 3 threads" test "$(sha "$tmp/tiny-a.gguf")" = "$(sha "$tmp/tiny-b.gguf")"
expect "synth reports the 5 ffn_down fallbacks (rows of 172)" \
    test "$(grep -c 'ffn_down.weight: rows of 172 do not fit Q8_0 blocks, using F16' "$tmp/synth.err")" -eq 5
expect "synth prints the fingerprint" grep -Eq 'fingerprint [0-9a-f]{16}$' "$tmp/synth.out"

"$convoy" synth --shape tiny --type Q4_K -o "$tmp/tiny-q4k.gguf" 2> "$tmp/synth.err" > /dev/null
expect "synth tiny Q4_K: rows of 64 fall back to Q5_0 (as llama.cpp's Q4_K -> Q5_0)" \
    test "$(grep -c 'rows of 64 do not fit Q4_K blocks, using Q5_0' "$tmp/synth.err")" -eq 32
expect "synth tiny Q4_K: rows of 172 fall back to F16" \
    test "$(grep -c 'ffn_down.weight: rows of 172 do not fit Q4_K blocks, using F16' "$tmp/synth.err")" -eq 5

"$convoy" synth --dims 256,4,8,2,768,2048 --ctx 512 --output-scale 4 --type F32 -o "$tmp/mini-f32.gguf" -t 2 > /dev/null
"$convoy" synth --shape synth-mini --type F32 -o "$tmp/mini-f32-b.gguf" --name synth-256x4-f32 > /dev/null
expect "--shape synth-mini equals the same --dims" test "$(sha "$tmp/mini-f32.gguf")" = "$(sha "$tmp/mini-f32-b.gguf")"
"$convoy" synth --shape synth-mini --type F32 --seed 7 -o "$tmp/mini-f32-seed7.gguf" > /dev/null
expect "another seed gives other weights" test "$(sha "$tmp/mini-f32.gguf")" != "$(sha "$tmp/mini-f32-seed7.gguf")"
fp_mini=$(info_line "$tmp/mini-f32.gguf" fingerprint)
expect "the fingerprint ignores the weights (seed)" test "$fp_mini" = "$(info_line "$tmp/mini-f32-seed7.gguf" fingerprint)"
"$convoy" synth --shape synth-mini --type F32 --rope-theta 500000 -o "$tmp/mini-theta.gguf" > /dev/null
expect "the fingerprint follows the architecture keys" test "$fp_mini" != "$(info_line "$tmp/mini-theta.gguf" fingerprint)"
"$convoy" synth --shape synth-mini --type F32 --tied -o "$tmp/mini-tied.gguf" > /dev/null
expect "--tied drops output.weight" test "$(tensor_table "$tmp/mini-tied.gguf" | grep -c '^output.weight ')" -eq 0
expect "the fingerprint follows the tensor directory" test "$fp_mini" != "$(info_line "$tmp/mini-tied.gguf" fingerprint)"

# synth --type T quantizes the same f32 values that --type F32 stores
for t in Q8_0 Q4_0 F16 Q4_K Q4_K_M; do
    "$convoy" synth --shape synth-mini --type $t -o "$tmp/mini-synth-$t.gguf" > /dev/null
    "$convoy" quantize "$tmp/mini-f32.gguf" "$tmp/mini-quant-$t.gguf" $t > /dev/null
    expect "synth --type $t equals quantize of the F32 synth model (39 tensors)" \
        test "$(same_tensors "$tmp/mini-synth-$t.gguf" "$tmp/mini-quant-$t.gguf")" = "39 0"
done
expect "synth and quantize Q4_K_M set llama.cpp's file_type 15" \
    test "$(info_line "$tmp/mini-synth-Q4_K_M.gguf" file_type),$(info_line "$tmp/mini-quant-Q4_K_M.gguf" file_type)" = \
    "15 (MOSTLY_Q4_K_M),15 (MOSTLY_Q4_K_M)"

# ---- info ----

"$convoy" info "$tmp/tiny-a.gguf" > "$tmp/info.txt"
expect "info on a synth model" test $? -eq 0
expect "info: hyperparameters of tiny" \
    test "$(grep -E '^(n_embd|n_layer|n_head|n_head_kv|n_ff|n_vocab|n_ctx): ' "$tmp/info.txt" | tr '\n' ' ')" = \
    "n_embd: 64 n_layer: 5 n_head: 8 n_head_kv: 4 n_ff: 172 n_vocab: 512 n_ctx: 512 "
expect "info: tokenizer" grep -qx 'tokenizer: llama (SentencePiece), 512 tokens, bos 1, eos 2, unk 0' "$tmp/info.txt"
expect "info: file type Q8_0" grep -qx 'file_type: 7 (MOSTLY_Q8_0)' "$tmp/info.txt"
expect "info: 48 tensors, norms F32, ffn_down F16, others Q8_0" test \
    "$(tensor_table "$tmp/tiny-a.gguf" | awk '{ k = $1; sub(/^blk\.[0-9]+\./, "", k); print k, $2 }' | sort -u | tr '\n' ',')" = \
    "attn_k.weight Q8_0,attn_norm.weight F32,attn_output.weight Q8_0,attn_q.weight Q8_0,attn_v.weight Q8_0,ffn_down.weight F16,ffn_gate.weight Q8_0,ffn_norm.weight F32,ffn_up.weight Q8_0,output.weight Q8_0,output_norm.weight F32,token_embd.weight Q8_0,"

# a model's name is its author's: control bytes are printed escaped
"$convoy" synth --shape tiny --type Q8_0 --name "$(printf 'evil\033]0;owned\007\nfile_type: 99')" \
    -o "$tmp/evil.gguf" > /dev/null
expect "info: a name's control bytes are escaped, on its one line" \
    test "$("$convoy" info "$tmp/evil.gguf" | grep -c -e $'\033' -e '^file_type: 99')$("$convoy" info "$tmp/evil.gguf" |
        sed -n 's/^name: //p')" = '0evil\x1B]0;owned\x07\x0Afile_type: 99'

if need_shared models/stories260K.gguf; then
    S=$shared/models/stories260K.gguf
    "$convoy" info "$S" > "$tmp/info-s.txt"
    expect "info on stories260K" test $? -eq 0
    expect "info: stories260K dims" test "$(grep -E '^(n_embd|n_layer|n_ff|rope_theta): ' "$tmp/info-s.txt" | tr '\n' ' ')" = \
        "n_embd: 64 n_layer: 5 n_ff: 172 rope_theta: 10000 (default) "
    expect "info: stories260K has 48 tensors" grep -qx 'tensors: 48' "$tmp/info-s.txt"

    for t in Q8_0 Q4_0 F16; do
        "$convoy" quantize "$S" "$tmp/s-$t.gguf" $t > "$tmp/q-$t.out"
        expect "quantize stories260K to $t" test $? -eq 0
        "$convoy" info "$tmp/s-$t.gguf" > /dev/null
        expect "info on stories260K $t" test $? -eq 0
        expect "stories260K $t: attn_q is $t" test "$(tensor_table "$tmp/s-$t.gguf" | awk '$1 == "blk.0.attn_q.weight" { print $2 }')" = $t
    done
    expect "quantize Q8_0 reports the ffn_down fallbacks" \
        test "$(grep -c 'fallback: blk\.[0-4]\.ffn_down.weight: rows of 172 do not fit Q8_0 blocks, using F16' "$tmp/q-Q8_0.out")" -eq 5
    expect "quantize Q4_0 reports the ffn_down fallbacks" \
        test "$(grep -c 'fallback: blk\.[0-4]\.ffn_down.weight: rows of 172 do not fit Q4_0 blocks, using F16' "$tmp/q-Q4_0.out")" -eq 5
    expect "quantize F16 needs no fallback" grep -q ' 0 fell back$' "$tmp/q-F16.out"
    expect "quantize sets general.file_type" test "$(info_line "$tmp/s-Q4_0.gguf" file_type)" = "2 (MOSTLY_Q4_0)"
    expect "quantized ffn_down is F16" \
        test "$(tensor_table "$tmp/s-Q4_0.gguf" | awk '$1 ~ /ffn_down/ { print $2 }' | sort -u)" = F16
    expect "quantize keeps the hyperparameters (fingerprint keys)" test \
        "$(grep -E '^(n_embd|n_layer|n_head|n_head_kv|n_ff|n_vocab|n_ctx|rope_dim|rms_eps): ' "$tmp/info-s.txt")" = \
        "$("$convoy" info "$tmp/s-Q8_0.gguf" | grep -E '^(n_embd|n_layer|n_head|n_head_kv|n_ff|n_vocab|n_ctx|rope_dim|rms_eps): ')"
fi

# ---- quantize against llama-quantize ----

R=reference/models
if need_shared $R/synth-mini-f32.gguf; then
    M=$shared/$R/synth-mini-f32.gguf
    # llama-quantize (no imatrix) uses the reference quantizers: every tensor of
    # the same type must be byte-identical. Its mixes differ from a pure TYPE:
    # output.weight is Q6_K for Q4_0 and the K types (so --output-type Q6_K
    # here), and Q4_K_M / Q5_K_M put Q6_K on attn_v and ffn_down of layers 2-3,
    # which leaves 35 tensors of the same type to compare.
    for t in Q8_0:q8_0:39 F16:f16:39 BF16:bf16:39 Q4_0:q4_0:38 Q4_0+Q6_K:q4_0:39 Q6_K:q6_k:39 \
        Q4_K+Q6_K:q4_k_m:35 Q5_K+Q6_K:q5_k_m:35; do
        IFS=: read -r spec ref want <<< "$t"
        type=${spec%+*}
        output_type=${spec#"$type"}
        output_type=${output_type#+}
        args=("$M" "$tmp/mini-$spec.gguf" "$type")
        [ -n "$output_type" ] && args+=(--output-type "$output_type")
        need_shared $R/synth-mini-$ref.gguf || continue
        "$convoy" quantize "${args[@]}" > /dev/null
        expect "quantize synth-mini-f32 to $spec" test $? -eq 0
        expect "synth-mini $spec: $want tensors byte-identical to llama-quantize's $ref" \
            test "$(same_tensors "$tmp/mini-$spec.gguf" "$shared/$R/synth-mini-$ref.gguf")" = "$want 0"
    done
    if need_shared $R/synth-mini-q8_0.gguf; then
        expect "quantize refuses to requantize Q8_0 tensors" \
            test "$(status "$convoy" quantize "$shared/$R/synth-mini-q8_0.gguf" "$tmp/requant.gguf" Q4_0)" -eq 1
        expect "  ... and says why" grep -q 'only F32, F16 and BF16 tensors are converted' "$tmp/err.txt"
    fi
fi

# ---- bad input: an error message and status, never a crash ----

expect "info on a missing file fails" test "$(status "$convoy" info "$tmp/missing.gguf")" -eq 1
head -c 1000 "$tmp/tiny-a.gguf" > "$tmp/truncated.gguf"
expect "info on a truncated file fails" test "$(status "$convoy" info "$tmp/truncated.gguf")" -eq 1
expect "quantize to an unknown type is a usage error" test "$(status "$convoy" quantize "$tmp/tiny-a.gguf" "$tmp/x.gguf" Q9_9)" -eq 2
expect "quantize of a truncated file fails" test "$(status "$convoy" quantize "$tmp/truncated.gguf" "$tmp/x.gguf" Q8_0)" -eq 1
cp "$tmp/tiny-a.gguf" "$tmp/in-place.gguf"
expect "quantize refuses to overwrite its input" \
    test "$(status "$convoy" quantize "$tmp/in-place.gguf" "$tmp/in-place.gguf" Q4_0)" -eq 1
expect "  ... and leaves it as it was" test "$(sha "$tmp/in-place.gguf")" = "$(sha "$tmp/tiny-a.gguf")"
expect "synth with n_embd not a multiple of n_head fails" \
    test "$(status "$convoy" synth --dims 100,2,8,8,256,512 --type F32 -o "$tmp/x.gguf")" -eq 1
expect "  ... and says why" grep -q 'n_embd 100 is not a multiple of n_head 8' "$tmp/err.txt"
expect "synth with a vocabulary under 259 tokens fails" \
    test "$(status "$convoy" synth --dims 64,1,8,8,256,100 --type F32 -o "$tmp/x.gguf")" -eq 1
expect "synth with an unknown shape is a usage error" test "$(status "$convoy" synth --shape nope --type F32 -o "$tmp/x.gguf")" -eq 2
for dims in 64,2,8 64,2,8,8,256,512,9 64,2,x,8,256,512; do
    expect "synth with --dims $dims is a usage error" test "$(status "$convoy" synth --dims $dims --type F32 -o "$tmp/x.gguf")" -eq 2
done
expect "synth into a missing directory fails" \
    test "$(status "$convoy" synth --shape tiny --type F32 -o "$tmp/no/such/dir.gguf")" -eq 1

echo "$n_skip skipped"
checks_summary
