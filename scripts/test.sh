#!/usr/bin/env bash
# Sets up and runs the whole test suite: Criterion unit suites (meson test), command-line
# integration tests (bad input, convergence on Fashion-MNIST) and PyTorch oracle tests.
#   scripts/test.sh               the full suite (release build in build/)
#   scripts/test.sh --sanitize    unit suites and CLI tests in an ASan+UBSan build (build-asan/)
# Ends with one line "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-full}"
if [[ "$mode" == "--sanitize" ]]; then
    export CTRAIN_BUILD_DIR=build-asan
    export CTRAIN_MESON_ARGS="-Db_sanitize=address,undefined -Dbuildtype=debugoptimized -Db_lundef=false"
    export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
fi
scripts/setup.sh --tests
build="${CTRAIN_BUILD_DIR:-build}"
export CTRAIN_BUILD_DIR="$build"

passed=0
failed=0
status() { # name, exit code
    if [[ "$2" -eq 0 ]]; then passed=$((passed + 1)); echo "PASS $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi
}

set +e
meson test -C "$build" --suite unit --print-errorlogs --num-processes 1
status "unit suites (meson test)" $?

pytest_args=(-q -p no:cacheprovider)
if [[ "$mode" == "--sanitize" ]]; then
    # no convergence runs; no ctypes tests (an ASan library cannot load into Python)
    /usr/bin/python3 -m pytest "${pytest_args[@]}" tests/integration \
        -k "not convergence and not tensorboard_reads_ctrain_events"
else
    /usr/bin/python3 -m pytest "${pytest_args[@]}" tests/integration tests/oracle
fi
status "integration and oracle tests (pytest)" $?
set -e

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
