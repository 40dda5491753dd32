#!/bin/bash
# test_neon_qemu.sh: runs the kernel tests (tests/test_kernels.c, and the
# kernel part of tests/test_attention.c) as an
# aarch64 program under qemu, so the NEON kernels are checked bit for bit
# against the references on an x86 machine. Skips with a message unless the
# cross compiler and qemu are installed (Debian gcc-aarch64-linux-gnu,
# qemu-user), and in the sanitizer suite (CONVOY_SANITIZED=1: the programs
# are the release suite's). Args: path-to-convoy-binary (unused), source-dir.
set -u
. "$(dirname "$0")/lib.sh"
test_args "$@"
cc=aarch64-linux-gnu-gcc
# it builds its own aarch64 programs, the same in both suites: the release
# suite's run is the check, a second one only costs a minute
release_suite_only
if ! command -v $cc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
    echo "SKIP: $cc or qemu-aarch64 not found (install gcc-aarch64-linux-gnu qemu-user)"
    exit 0
fi
make_tmp
sources=()
for f in "$src"/src/core/*.c "$src"/src/kernels/*.c; do
    case "$f" in *_avx2.c | *_avx512.c) continue ;; esac
    sources+=("$f")
done
status=0
# test_attention: only its kernel checks (CONVOY_KERNELS_ONLY leaves out the engine)
for t in test_kernels test_attention; do
    if ! $cc -std=c11 -O2 -Wall -Wextra -ffp-contract=off -fno-fast-math -D_GNU_SOURCE -DCONVOY_KERNELS_ONLY \
            -DCONVOY_SOURCE_DIR="\"$src\"" -DCONVOY_BINARY_DIR="\"$tmp\"" -I"$src/src" -I"$src/tests" \
            "${sources[@]}" "$src/tests/$t.c" -static -pthread -lm -o "$tmp/$t"; then
        echo "FAIL: aarch64 build of $t"
        exit 1
    fi
    qemu-aarch64 "$tmp/$t" || status=1
done
exit $status
