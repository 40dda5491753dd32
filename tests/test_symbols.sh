#!/usr/bin/env bash
# test_symbols.sh: every symbol the engine library exports carries the
# project's prefix, cv_ (internal) or convoy_ (the API of include/convoy.h),
# so that convoy links beside other code (ggml's quantize_row_q8_0_ref, a
# host's own helpers) without a clash. Lists the global symbols that
# libconvoy_engine.a (beside the convoy binary) defines, with nm, and fails
# on each one without the prefix, naming it and its object file; fails too
# when nm lists none, so that it cannot pass on an empty list. Names that
# begin with __ are the compiler's (AddressSanitizer's __odr_asan.NAME)
# and are passed over. Skips without nm, except under CI=true.
#
# Usage (CTest passes these): test_symbols.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
lib="$build/libconvoy_engine.a"
command -v nm >/dev/null || skip "nm (binutils) is needed"
[[ -f "$lib" ]] || { echo "FAIL no engine library at $lib"; exit 1; }

# nm -A -P prints "LIB[OBJECT]: SYMBOL TYPE VALUE SIZE" a symbol; kept:
# "SYMBOL OBJECT".
listed="$(nm -A -P -g --defined-only "$lib" |
    awk '{ obj = $1; sub(/^.*\[/, "", obj); sub(/\]:$/, "", obj); print $2, obj }')"
n="$(grep -c . <<<"$listed")"
if [[ "$n" -eq 0 ]]; then
    fail "nm lists no exported symbol in $lib"
else
    pass "nm lists $n exported symbols in $lib"
fi
while read -r symbol obj; do
    [[ -z "$symbol" || "$symbol" == cv_* || "$symbol" == convoy_* || "$symbol" == __* ]] && continue
    fail "$symbol ($obj) is exported without the prefix cv_ or convoy_"
done <<<"$listed"
checks_summary
