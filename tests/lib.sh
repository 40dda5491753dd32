# lib.sh: shell helpers the test scripts share (sourced, not a test).
#
# skip REASON: ends the test as skipped, or as failed when CI=true (CI
# always has what the suite needs, so a skip there is a missing install).
skip() {
    if [[ "${CI:-}" == true ]]; then
        echo "FAIL: $* (CI=true: required)"
        exit 1
    fi
    echo "SKIP: $*"
    exit 0
}
