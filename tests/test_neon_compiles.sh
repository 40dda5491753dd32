#!/bin/bash
# test_neon_compiles.sh: the NEON kernels compile for aarch64 (clang
# -fsyntax-only with --target=aarch64-linux-gnu), so an x86 machine catches
# a broken ARM build. Skips with a message when clang cannot target aarch64
# (it needs the aarch64 C library headers: Debian libc6-dev-arm64-cross).
# Args: path-to-convoy-binary (unused), source-dir.
set -u
. "$(dirname "$0")/lib.sh"
test_args "$@"
target=aarch64-linux-gnu
if ! command -v clang >/dev/null; then
    echo "SKIP: clang not found"
    exit 0
fi
if ! printf '#include <arm_neon.h>\n#include <string.h>\n' |
        clang --target=$target -fsyntax-only -x c - 2>/dev/null; then
    echo "SKIP: clang cannot compile for $target here (install libc6-dev-arm64-cross)"
    exit 0
fi
status=0
for f in "$src"/src/*/*_neon.c; do
    [ -e "$f" ] || continue
    if clang --target=$target -std=c11 -Wall -Wextra -ffp-contract=off -fsyntax-only -I"$src/src" "$f"; then
        echo "ok   ${f#$src/}"
    else
        echo "FAIL ${f#$src/}"
        status=1
    fi
done
exit $status
