#!/usr/bin/env bash
# Sets up and runs the whole test suite: Criterion unit suites (meson test), command-line
# integration tests (bad input, convergence on Fashion-MNIST) and PyTorch oracle tests.
#   scripts/test.sh               the full suite (release build in build/)
#   scripts/test.sh --sanitize    unit suites and CLI tests in an ASan+UBSan build (build-asan/)
# scripts/setup.sh --tests installs every Debian package the tests call and makes the virtual
# environment build-venv/ (CTRAIN_VENV): pytest and every Python check run under its interpreter,
# which CT_PYTHON names for the C unit tests. Ends with one line "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-full}"
case "$mode" in
full) ;;
--sanitize)
    export CTRAIN_BUILD_DIR=build-asan
    export CTRAIN_MESON_ARGS="-Db_sanitize=address,undefined -Dbuildtype=debugoptimized -Db_lundef=false"
    # allocator_may_return_null: an allocation too large to satisfy returns NULL, as malloc does
    # on a real system, instead of aborting, so the out-of-memory paths are tested too
    export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    ;;
*)
    echo "usage: scripts/test.sh [--sanitize]" >&2
    exit 2
    ;;
esac

passed=0
failed=0
status() { # name, exit code
    if [[ "$2" -eq 0 ]]; then passed=$((passed + 1)); echo "PASS $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi
}

if ! scripts/setup.sh --tests; then
    status "setup (scripts/setup.sh --tests)" 1
    echo "$passed passed, $failed failed"
    exit 1
fi
build="${CTRAIN_BUILD_DIR:-build}"
venv="${CTRAIN_VENV:-build-venv}"
[[ "$venv" == /* ]] || venv="$PWD/$venv"
export CTRAIN_BUILD_DIR="$build"
export CT_PYTHON="$venv/bin/python"

set +e
meson test -C "$build" --suite unit --print-errorlogs --num-processes 1
status "unit suites (meson test)" $?

pytest_args=(-q -p no:cacheprovider)
if [[ "$mode" == "--sanitize" ]]; then
    # no convergence runs; no ctypes tests (an ASan library cannot load into Python)
    "$CT_PYTHON" -m pytest "${pytest_args[@]}" tests/integration \
        -k "not convergence and not tensorboard_reads_ctrain_events"
else
    "$CT_PYTHON" -m pytest "${pytest_args[@]}" tests/integration tests/oracle
fi
status "integration and oracle tests (pytest)" $?
set -e

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
