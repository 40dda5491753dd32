#!/usr/bin/env bash
# test_pack.sh: `convoy pack` then `convoy unpack` gives back the GGUF byte
# for byte: stories260K (F32, from ../shared) and a small synthetic Q4_K
# model; a cut or corrupted pack file is refused and leaves no output.
#
# Usage (CTest passes these): test_pack.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail
convoy="${1:?usage: test_pack.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_pack.sh PATH/TO/convoy SOURCE_DIR}"
. "$src/tests/lib.sh"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

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

stories="$src/../shared/models/stories260K.gguf"
[[ -f "$stories" ]] || skip "$stories not found (clone ../shared beside the repo)"
round_trip stories260K "$stories"

[[ $failures -eq 0 ]] || exit 1
