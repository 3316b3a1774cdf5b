#!/usr/bin/env bash
# The prepared GPU run (issue 37): built on a build machine, run in one go on a GPU machine.
#   scripts/gpu/verify.sh --prepare   here: builds build-gpu/ (-Dnative=false; sm_90 code and
#                                     PTX) and gathers build-gpu/bundle/: the GPU tests, the
#                                     kernel benchmark and the shared libraries the GPU machine
#                                     lacks (not cuBLAS: it has its own; under 64 MiB in all)
#   scripts/gpu/verify.sh             on the GPU machine, from the repository root with
#                                     build-gpu/bundle carried there: probes the GPU and its
#                                     libraries, runs every kernel against its CPU twin on fresh
#                                     random inputs, CUDA's bf16/fp16 conversions against the
#                                     CPU's, compute-sanitizer's memcheck and racecheck on the
#                                     kernel tests, and the kernel figures (elementwise against
#                                     copy bandwidth, GEMM against cuBLAS). Writes its log and a
#                                     summary into $OUT (or build-gpu/out) and exits 1 when a
#                                     check failed.
# With the device tool: run(command="scripts/gpu/verify.sh", carry=["build-gpu/bundle"],
# timeout_s=540). Not yet in it (the trainer does not run on the CUDA backend): training runs,
# resume, NCCL and the step times against PyTorch; the summary says so.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
bundle=build-gpu/bundle

prepare() {
    local build=build-gpu
    local log=build-logs/gpu-setup.log
    mkdir -p build-logs
    if [[ ! -f $build/build.ninja ]]; then
        meson setup "$build" -Dnative=false -Dcuda=enabled -Dtests=enabled -Dmpi=disabled \
            >"$log" 2>&1 || { tail -30 "$log"; exit 1; }
    fi
    ninja -C "$build" tests/cuda/kernel_parity_gpu tests/cuda/test_cuda_half_parity \
        scripts/bench/kernel_bench || exit 1
    rm -rf "$bundle"
    mkdir -p "$bundle/lib"
    cp "$build/tests/cuda/kernel_parity_gpu" "$build/tests/cuda/test_cuda_half_parity" \
        "$build/scripts/bench/kernel_bench" "$bundle/"
    # every library they need but the C/C++ runtime and cuBLAS (the GPU machine's toolkit and
    # PyTorch bring those; 500 MB would not travel)
    ldd "$bundle"/kernel_parity_gpu "$bundle"/kernel_bench "$bundle"/test_cuda_half_parity |
        awk '$3 ~ /^\// { print $3 }' | sort -u |
        grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64|libpthread|libdl|librt|libcublas|libcublasLt)\.so' |
        while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
    du -sh "$bundle"
    echo "verify: bundle ready; on the GPU machine: scripts/gpu/verify.sh (carry $bundle)"
}

# The folders holding libcublasLt.so.13 and libcudart.so.13 on the GPU machine: the toolkit's,
# else PyTorch's NVIDIA wheels.
cuda_library_dirs() {
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        [[ -e $d/libcublasLt.so.13 ]] && echo "$d"
    done
    python3 - <<'EOF' 2>/dev/null
import glob, os, site
for root in site.getsitepackages():
    for lib in glob.glob(os.path.join(root, "nvidia", "**", "libcublasLt.so.13"), recursive=True):
        print(os.path.dirname(lib))
EOF
}

failed=()
summary=()
# check NAME COMMAND...: runs it with its output in the log; records ok or FAILED.
check() {
    local name=$1 rc
    shift
    echo "=== verify: $name: $*" | tee -a "$log"
    "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    if ((rc == 0)); then
        summary+=("ok      $name")
    else
        summary+=("FAILED  $name (exit status $rc)")
        failed+=("$name")
    fi
}

run_checks() {
    [[ -x $bundle/kernel_parity_gpu ]] || {
        echo "verify: no $bundle: run scripts/gpu/verify.sh --prepare on the build machine and carry it"
        exit 2
    }
    local out=${OUT:-build-gpu/out}
    mkdir -p "$out"
    log=$out/verify.log
    : >"$log"
    local dirs
    dirs=$(cuda_library_dirs | paste -sd:)
    export LD_LIBRARY_PATH="$PWD/$bundle/lib${dirs:+:$dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    check "probe" nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    check "kernel parity (fresh random inputs)" "$bundle/kernel_parity_gpu"
    check "bf16/fp16 conversions" "$bundle/test_cuda_half_parity"
    if command -v compute-sanitizer >/dev/null; then
        check "memcheck" timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
            "$bundle/kernel_parity_gpu" --seed 7 --exclude gemm
        check "racecheck" timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 \
            "$bundle/kernel_parity_gpu" --seed 8 --exclude gemm
    else
        summary+=("FAILED  sanitizers: compute-sanitizer is not on PATH")
        failed+=(sanitizers)
    fi
    check "kernel figures" "$bundle/kernel_bench"
    summary+=("not yet: training runs (MLP, CNN, GPT, resume, NCCL, step times): the trainer does not run on the CUDA backend yet (its eager MLP step is in the parity test)")
    {
        echo "=== verify: summary"
        printf '    %s\n' "${summary[@]}"
    } | tee -a "$log" | tee "$out/summary.txt"
    ((${#failed[@]} == 0))
}

case "${1:-}" in
--prepare) prepare ;;
"" | --run) run_checks ;;
-h | --help) sed -n '2,20p' "$0" ;;
*)
    echo "verify: unknown option '$1' (--prepare, --run or --help)" >&2
    exit 2
    ;;
esac
