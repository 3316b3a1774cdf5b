#!/usr/bin/env bash
# Runs the stand-in kernel test built without the block reduction's first barrier
# (-DCT_CUDA_TEST_DROP_BARRIER) and passes only when ThreadSanitizer reports the data race on the
# reduction's shared scratch in kernels/cuda/compat.h: the stand-in's barriers are real, so a
# missing __syncthreads is caught on a machine without a GPU.
set -uo pipefail
out=$(TSAN_OPTIONS="halt_on_error=1 exitcode=66" "$1" --seed 3 --filter "softmax [64,33]" 2>&1)
rc=$?
if ((rc != 66)) || ! grep -q "WARNING: ThreadSanitizer: data race" <<<"$out" ||
    ! grep -q "compat.h" <<<"$out"; then
    echo "expect_race: ThreadSanitizer did not report the race (exit status $rc); output:"
    echo "$out" | tail -40
    exit 1
fi
echo "expect_race: ThreadSanitizer caught the missing barrier:"
grep -m1 -A6 "WARNING: ThreadSanitizer: data race" <<<"$out"
