#!/usr/bin/env bash
# Installs what ctrain needs on a fresh Debian machine (apt packages by name) and builds it.
#   scripts/setup.sh            runtime + build dependencies, then a release build in build/
#   scripts/setup.sh --tests    also the test dependencies (Criterion, PyTorch, numpy, pytest,
#                               pyzmq, clang for the libFuzzer target)
# Set CTRAIN_BUILD_DIR to build elsewhere, CTRAIN_MESON_ARGS to pass meson options.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(gcc pkg-config meson ninja-build libopenblas-dev libdnnl-dev zlib1g-dev libyaml-dev
          protobuf-c-compiler libprotobuf-c-dev openmpi-bin libopenmpi-dev libzmq3-dev
          dataset-fashion-mnist)
if [[ "${1:-}" == "--tests" ]]; then
    # clang and its runtime: the libFuzzer target; python3-zmq: tests that send raw messages
    packages+=(libcriterion-dev python3-torch python3-numpy python3-pytest python3-zmq clang
               libclang-rt-dev)
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi
if [[ "${1:-}" == "--tests" ]]; then
    # TensorBoard's own event reader and the safetensors reader check what ctrain writes; they are
    # pip packages, installed into the `python3` first on PATH (not Debian's /usr/bin/python3).
    python3 -c "import tensorboard, safetensors" 2>/dev/null ||
        python3 -m pip install -q tensorboard safetensors
fi

build="${CTRAIN_BUILD_DIR:-build}"
if [[ ! -f "$build/build.ninja" ]]; then
    # shellcheck disable=SC2086
    meson setup "$build" ${CTRAIN_MESON_ARGS:-} >/dev/null
fi
ninja -C "$build" >/dev/null
echo "setup: built $build/coordinator/ctrain"
