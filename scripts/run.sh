#!/usr/bin/env bash
# Sets up (scripts/setup.sh: the Debian packages that building and training need, and the build)
# and trains a job; with no arguments, the default job: the seed MLP on Fashion-MNIST from Debian's
# dataset-fashion-mnist package. The test dependencies are not needed.
#   scripts/run.sh [JOB.yaml] [ctrain train options]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${CTRAIN_BUILD_DIR:-build}/coordinator/ctrain" train "$@"
