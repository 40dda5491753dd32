#!/usr/bin/env bash
# test.sh: the whole test suite. Installs what is missing, then builds and
# runs every CTest test twice: a release build in build/ and an
# AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/ (its
# tests see CONVOY_SANITIZED=1 and may shorten their work). Both suites run
# even when the first fails; the last line is a one-line summary and the
# exit status is non-zero on any failure. CI runs this as root with CI=true.
set -uo pipefail
cd "$(dirname "$0")/.."

if ! bash scripts/install-deps.sh; then
    echo "test.sh: FAIL (install-deps.sh failed)"
    exit 1
fi

summary=()
failed=0

# run_suite NAME DIR [VAR=VALUE...] -- [CMAKE_ARGS...]: configure, build with
# make -j2, run ctest with the variables set; appends "NAME: result".
run_suite() {
    local name="$1" dir="$2"
    shift 2
    local envs=()
    while [[ $# -gt 0 && "$1" != -- ]]; do
        envs+=("$1")
        shift
    done
    shift
    echo "== $name: configure and build in $dir/"
    if ! cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" || ! make --no-print-directory -C "$dir" -j2; then
        summary+=("$name: build failed")
        failed=1
        return
    fi
    echo "== $name: ctest in $dir/"
    local log="$dir/ctest.log"
    (cd "$dir" && env "${envs[@]}" ctest --output-on-failure --no-tests=error) 2>&1 | tee "$log"
    local rc="${PIPESTATUS[0]}"
    local counts
    counts="$(grep -Eo '[0-9]+ tests failed out of [0-9]+' "$log" | tail -1)"
    if [[ "$rc" -ne 0 ]]; then
        summary+=("$name: FAILED (${counts:-ctest exit $rc})")
        failed=1
    else
        summary+=("$name: ok (${counts:-no count})")
    fi
}

run_suite release build --
# the npm packages the tests install (oracles, clients, a browser driver):
# the release suite's, not downloaded twice
[[ -d build/npm ]] && mkdir -p build-asan && cp -a build/npm build-asan/
run_suite asan build-asan CONVOY_SANITIZED=1 ASAN_OPTIONS=detect_leaks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 -- -DCONVOY_SANITIZE=ON

joined="$(printf '%s; ' "${summary[@]}")"
if [[ "$failed" -ne 0 ]]; then
    echo "test.sh: FAIL: ${joined%; }"
    exit 1
fi
echo "test.sh: PASS: ${joined%; }"
