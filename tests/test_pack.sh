#!/usr/bin/env bash
# test_pack.sh: `convoy pack` then `convoy unpack` gives back the GGUF byte
# for byte: stories260K (F32, from ../shared), a small synthetic Q4_K model
# and a Q8_0 one whose tensors span several segments; a cut or corrupted
# pack file, a version 1 one, and one claiming a terabyte-long segment are
# refused and leave no output.
#
# Usage (CTest passes these): test_pack.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
. "$(dirname "$0")/lib.sh"
test_args "$@"

make_tmp

# round_trip NAME GGUF: pack, unpack, cmp.
round_trip() {
    local name=$1 gguf=$2
    if "$convoy" pack "$gguf" "$tmp/$name.cvpk" >"$tmp/$name.log" 2>&1 &&
        "$convoy" unpack "$tmp/$name.cvpk" "$tmp/$name.gguf" >>"$tmp/$name.log" 2>&1 &&
        cmp -s "$gguf" "$tmp/$name.gguf"; then
        pass "$name: $(head -1 "$tmp/$name.log")"
    else
        fail "$name: round trip"
        cat "$tmp/$name.log"
    fi
}

"$convoy" synth --dims 256,2,4,2,512,300 --type Q4_K -o "$tmp/q4k.gguf" >/dev/null 2>&1 || fail "convoy synth"
round_trip synth-q4_k "$tmp/q4k.gguf"

"$convoy" synth --dims 1024,1,8,8,2048,4000 --type Q8_0 -o "$tmp/q8.gguf" >/dev/null 2>&1 || fail "convoy synth"
round_trip synth-q8_0 "$tmp/q8.gguf"

# refused NAME WANT BYTES: a pack file of BYTES (printf format) is refused
# with a message holding WANT, leaving no output.
refused() {
    local name=$1 want=$2
    printf "$3" >"$tmp/$name.cvpk"
    if "$convoy" unpack "$tmp/$name.cvpk" "$tmp/$name.gguf" >/dev/null 2>"$tmp/$name.err" ||
        [[ -e "$tmp/$name.gguf" ]] || ! grep -q "$want" "$tmp/$name.err"; then
        fail "$name: accepted, leaves output or says: $(cat "$tmp/$name.err")"
    else
        pass "$name refused: $(cat "$tmp/$name.err")"
    fi
}
zero8='\x00\x00\x00\x00\x00\x00\x00\x00'
tera='\x00\x00\x00\x00\x00\x01\x00\x00'
refused version-1 "version 1" "CVPK\x01\x00\x00\x00$zero8$zero8"
refused huge-segment "over the" "CVPK\x02\x00\x00\x00$tera\x01\x00\x00\x00\x00\x00\x00\x00\x00$tera"

# A pack file cut short, and one with a byte of its coded data changed.
size=$(stat -c %s "$tmp/synth-q4_k.cvpk")
head -c $((size / 2)) "$tmp/synth-q4_k.cvpk" >"$tmp/cut.cvpk"
if "$convoy" unpack "$tmp/cut.cvpk" "$tmp/cut.gguf" >/dev/null 2>"$tmp/cut.err" || [[ -e "$tmp/cut.gguf" ]]; then
    fail "a cut pack file is accepted or leaves output"
else
    pass "cut pack file refused: $(cat "$tmp/cut.err")"
fi
printf 'X' | dd of="$tmp/cut.cvpk" bs=1 seek=3 conv=notrunc status=none
if "$convoy" unpack "$tmp/cut.cvpk" "$tmp/bad.gguf" >/dev/null 2>&1; then
    fail "a pack file with a bad magic is accepted"
else
    pass "bad magic refused"
fi

need_stories
round_trip stories260K "$model"

checks_summary
