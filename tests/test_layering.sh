#!/usr/bin/env bash
# test_layering.sh: includes point one way through the house
# (scripts/layering.sh holds the table): the tree passes, and a copy of it
# with forbidden includes planted fails, naming each one.
#
# Usage: test_layering.sh PATH-TO-CONVOY SOURCE-DIR (CTest passes both).
set -u
SRC=$2
CHECK="$SRC/scripts/layering.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
n_fail=0
fail() { n_fail=$((n_fail + 1)); echo "FAIL $1" >&2; }

if bash "$CHECK" "$SRC"; then echo "ok   the tree"; else fail "the tree has forbidden includes"; fi

# A copy with one include up the house in each kind of place: a lower floor
# reaching up, convoy.h reaching into the engine, app reaching past it.
cp -r "$SRC/src" "$SRC/app" "$SRC/include" "$TMP/"
sed -i '0,/^#include "/s//#include "serve\/sched.h"\n&/' "$TMP/src/infer/forward.c"
sed -i '0,/^#include </s//#include "infer\/sampler.h"\n&/' "$TMP/include/convoy.h"
sed -i '0,/^#include "/s//#include "core\/alloc.h"\n&/' "$TMP/app/main.c"
out=$(bash "$CHECK" "$TMP")
rc=$?
for planted in 'src/infer/forward.c:.*serve/sched.h' 'include/convoy.h:.*infer/sampler.h' 'app/main.c:.*core/alloc.h'; do
    if [[ "$rc" -ne 0 ]] && grep -q "$planted" <<<"$out"; then
        echo "ok   planted $planted is found"
    else
        fail "planted $planted is not found (exit $rc): $out"
    fi
done
[[ "$n_fail" -eq 0 ]] || exit 1
