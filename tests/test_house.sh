#!/usr/bin/env bash
# test_house.sh: the house's two rules over src/, app/ and include/:
# includes point one way (scripts/layering.sh holds the table) and no
# function is longer than 80 lines (scripts/function_length.sh), so that an
# orchestrator stays a list of named phases; and its rule for scripts: every
# shell test and bench script sources its folder's lib.sh, which holds the
# setup they share. The tree passes all three, and a copy of it with
# violations planted fails, naming each one.
#
# Usage: test_house.sh PATH-TO-CONVOY SOURCE-DIR (CTest passes both).
set -u
. "$(dirname "$0")/lib.sh"
test_args "$@"
# it reads the sources, the same in both suites: the release suite's run
# is the check
release_suite_only
make_tmp
# finds NAME OUTPUT STATUS PATTERN: the check failed and named PATTERN.
finds() {
    if [[ "$3" -ne 0 ]] && grep -q "$4" <<<"$2"; then pass "$1"; else fail "$1 (exit $3): $2"; fi
}

for check in layering function_length; do
    expect "$check: the tree" bash "$src/scripts/$check.sh" "$src"
done

# Includes up the house in each kind of place: a lower floor reaching up,
# convoy.h reaching into the engine, app reaching past it.
cp -r "$src/src" "$src/app" "$src/include" "$tmp/"
sed -i '0,/^#include "/s//#include "serve\/sched.h"\n&/' "$tmp/src/infer/forward.c"
sed -i '0,/^#include </s//#include "infer\/sampler.h"\n&/' "$tmp/include/convoy.h"
sed -i '0,/^#include "/s//#include "core\/alloc.h"\n&/' "$tmp/app/main.c"
out=$(bash "$src/scripts/layering.sh" "$tmp")
rc=$?
for planted in 'src/infer/forward.c:.*serve/sched.h' 'include/convoy.h:.*infer/sampler.h' 'app/main.c:.*core/alloc.h'; do
    finds "layering finds $planted" "$out" "$rc" "$planted"
done

{
    echo "int planted_long(void)"
    echo "{"
    for i in $(seq 1 80); do echo "    int x$i = $i;"; done
    echo "}"
} >"$tmp/src/core/long.c"
out=$(bash "$src/scripts/function_length.sh" "$tmp")
finds "function_length finds a planted 83-line function" "$out" "$?" "src/core/long.c:1: 83 lines"

# unsourced DIR: the shell tests and bench scripts under DIR that do not
# take their setup from their folder's lib.sh (sourced by that one line).
unsourced() {
    local f
    for f in "$1"/tests/test_*.sh "$1"/bench/*.sh; do
        [[ "$f" == */lib.sh ]] || grep -qxF '. "$(dirname "$0")/lib.sh"' "$f" || echo "${f#"$1"/}"
    done
}
out=$(unsourced "$src")
expect "every tests/test_*.sh and bench/*.sh sources its folder's lib.sh${out:+ (not: $out)}" test -z "$out"
mkdir -p "$tmp/scripts/tests" "$tmp/scripts/bench"
cp "$src"/tests/*.sh "$tmp/scripts/tests/"
cp "$src"/bench/*.sh "$tmp/scripts/bench/"
sed -i '/^\. "$(dirname "$0")\/lib.sh"$/d' "$tmp/scripts/tests/test_pack.sh" "$tmp/scripts/bench/seal.sh"
out=$(unsourced "$tmp/scripts")
expect "a script planted without its lib.sh is named" test "$out" = "$(printf 'tests/test_pack.sh\nbench/seal.sh')"
checks_summary
