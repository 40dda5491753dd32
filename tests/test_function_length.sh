#!/usr/bin/env bash
# test_function_length.sh: no function in src/ or app/ is longer than 80
# lines (scripts/function_length.sh), so that an orchestrator stays a list
# of named phases; and the check finds a planted long function.
#
# Usage: test_function_length.sh PATH-TO-CONVOY SOURCE-DIR (CTest passes both).
set -u
SRC=$2
CHECK="$SRC/scripts/function_length.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
n_fail=0
fail() { n_fail=$((n_fail + 1)); echo "FAIL $1" >&2; }

if bash "$CHECK" "$SRC"; then echo "ok   the tree"; else fail "the tree has functions over 80 lines"; fi

mkdir -p "$TMP/src/core" "$TMP/app"
{
    echo "int planted_long(void)"
    echo "{"
    for i in $(seq 1 80); do echo "    int x$i = $i;"; done
    echo "}"
} >"$TMP/src/core/long.c"
if out=$(bash "$CHECK" "$TMP"); then
    fail "a planted 83-line function passes: $out"
elif grep -q "src/core/long.c:1: 83 lines" <<<"$out"; then
    echo "ok   a planted 83-line function is found"
else
    fail "a planted 83-line function is reported wrongly: $out"
fi
[[ "$n_fail" -eq 0 ]] || exit 1
