#!/usr/bin/env bash
# test_house.sh: the house's two rules over src/, app/ and include/:
# includes point one way (scripts/layering.sh holds the table) and no
# function is longer than 80 lines (scripts/function_length.sh), so that an
# orchestrator stays a list of named phases. The tree passes both, and a
# copy of it with violations planted fails, naming each one.
#
# Usage: test_house.sh PATH-TO-CONVOY SOURCE-DIR (CTest passes both).
set -u
SRC=$2
if [[ "${CONVOY_SANITIZED:-}" == 1 ]]; then
    # it reads the sources, the same in both suites: the release suite's
    # run is the check
    echo "not run again in the sanitizer suite (the release suite runs it)"
    exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
n_fail=0
fail() { n_fail=$((n_fail + 1)); echo "FAIL $1" >&2; }
# finds NAME OUTPUT STATUS PATTERN: the check failed and named PATTERN.
finds() {
    if [[ "$3" -ne 0 ]] && grep -q "$4" <<<"$2"; then echo "ok   $1"; else fail "$1 (exit $3): $2"; fi
}

for check in layering function_length; do
    if bash "$SRC/scripts/$check.sh" "$SRC"; then echo "ok   $check: the tree"; else fail "$check: the tree"; fi
done

# Includes up the house in each kind of place: a lower floor reaching up,
# convoy.h reaching into the engine, app reaching past it.
cp -r "$SRC/src" "$SRC/app" "$SRC/include" "$TMP/"
sed -i '0,/^#include "/s//#include "serve\/sched.h"\n&/' "$TMP/src/infer/forward.c"
sed -i '0,/^#include </s//#include "infer\/sampler.h"\n&/' "$TMP/include/convoy.h"
sed -i '0,/^#include "/s//#include "core\/alloc.h"\n&/' "$TMP/app/main.c"
out=$(bash "$SRC/scripts/layering.sh" "$TMP")
rc=$?
for planted in 'src/infer/forward.c:.*serve/sched.h' 'include/convoy.h:.*infer/sampler.h' 'app/main.c:.*core/alloc.h'; do
    finds "layering finds $planted" "$out" "$rc" "$planted"
done

{
    echo "int planted_long(void)"
    echo "{"
    for i in $(seq 1 80); do echo "    int x$i = $i;"; done
    echo "}"
} >"$TMP/src/core/long.c"
out=$(bash "$SRC/scripts/function_length.sh" "$TMP")
finds "function_length finds a planted 83-line function" "$out" "$?" "src/core/long.c:1: 83 lines"
[[ "$n_fail" -eq 0 ]] || exit 1
