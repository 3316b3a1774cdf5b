#!/usr/bin/env bash
# Installs what ctrain needs on a fresh Debian 12 machine (apt packages by name) and builds it.
#   scripts/setup.sh            what building and training need, then a release build in build/
#   scripts/setup.sh --tests    also what the tests need: Criterion, PyTorch, numpy, pytest, pyzmq,
#                               clang (the libFuzzer target), procps (pgrep), python3-venv; and the
#                               virtual environment build-venv/ with pip's tensorboard, xprof,
#                               safetensors, onnx and onnxruntime; it sees Debian's torch, numpy
# CTRAIN_BUILD_DIR builds elsewhere, CTRAIN_MESON_ARGS passes meson options, CTRAIN_VENV names the
# virtual environment's folder. Each step's output goes to build-logs/; a step that fails prints
# its log and the script exits 1. While another apt-get or dpkg (unattended-upgrades, a second
# setup) holds the package locks, apt-get waits for them, up to CTRAIN_APT_LOCK_TIMEOUT seconds
# (600), saying which lock and which process; past that it says so in one line and exits 1.
set -euo pipefail

# step NAME COMMAND...: runs COMMAND with its output in $logs/NAME.log; on failure prints the
# command, its exit status and the end of the log, and exits 1.
step() {
    local name=$1 log="$logs/$1.log"
    shift
    local rc=0
    "$@" >"$log" 2>&1 || rc=$?
    if ((rc != 0)); then
        step_failed "$name" "$rc" "$log" "$@"
    fi
}

# step_failed NAME STATUS LOG COMMAND...: the failure report of step, and exit 1.
step_failed() {
    local name=$1 rc=$2 log=$3
    shift 3
    echo "setup: $name failed (exit status $rc): $*" >&2
    echo "setup: the last 100 lines of $log:" >&2
    tail -n 100 "$log" | sed 's/^/    /' >&2
    exit 1
}

# The locks apt-get and dpkg take (fcntl locks): dpkg's frontend lock and its own, the package
# lists' (apt-get update) and the download cache's.
apt_locks=(/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock
           /var/cache/apt/archives/lock)

# lock_holder FILE: "pid N (COMMAND)" of the process holding a POSIX lock on FILE, read from
# /proc/locks (readable without root); nothing when FILE is free or absent.
lock_holder() {
    local dev ino id pid cmd=""
    read -r dev ino < <(stat -c '%d %i' "$1" 2>/dev/null) || return 0
    # /proc/locks names a file MAJOR:MINOR:INODE (hex, hex, decimal); waiters' lines have "->"
    id=$(printf '%02x:%02x:%s' $(((dev >> 8) & 0xfff)) $(((dev & 0xff) | ((dev >> 12) & 0xfff00))) "$ino")
    pid=$(awk -v id="$id" '$2 != "->" && $6 == id { print $5; exit }' /proc/locks 2>/dev/null) ||
        true
    [[ -n "$pid" ]] || return 0
    if [[ "$pid" -le 0 ]]; then # a pid of another pid namespace
        echo "a process outside this container"
        return 0
    fi
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-120) || cmd=""
    cmd=${cmd% }
    echo "pid $pid${cmd:+ ($cmd)}"
}

# held_apt_lock: "FILE, held by HOLDER" for the first of apt_locks that a process holds; nothing
# when all are free.
held_apt_lock() {
    local f h
    for f in "${apt_locks[@]}"; do
        h=$(lock_holder "$f")
        if [[ -n "$h" ]]; then
            echo "$f, held by $h"
            return 0
        fi
    done
}

# apt_lock_message LOG: the lock apt-get could not get, from its words in LOG ("Could not get
# lock FILE. It is held by process N (NAME)"), as "FILE, held by pid N (NAME)".
apt_lock_message() {
    sed -n -e 's/^.*Could not get lock \([^ ]*\)\. It is held by process \([0-9]*\) \(([^)]*)\).*$/\1, held by pid \2 \3/p' \
        -e 's/^.*Could not get lock \([^ ]*[^ .]\).*$/\1/p' "$1" | tail -n 1
}

# apt_step NAME APT-GET-ARGUMENTS...: step NAME running apt-get (through sudo when not root),
# waiting while another process holds a package lock, for CTRAIN_APT_LOCK_TIMEOUT seconds at
# most (600): a line says which lock and which process it waits for (again when they change,
# and once a minute). The holders come from /proc/locks before apt-get starts, and from
# apt-get's own words when it finds a lock taken anyway (taken after the check, or held where
# /proc/locks does not show it): apt-get waits a few seconds itself (DPkg::Lock::Timeout, apt
# >= 1.9.11; not for the lists' lock), then fails, and is run again. Past the bound: one line,
# and exit 1.
apt_step() {
    local name=$1 log="$logs/$1.log"
    shift
    local limit=$apt_lock_timeout start=$SECONDS left held said="" said_at=0 rc
    while :; do
        left=$((limit - (SECONDS - start)))
        held=$(held_apt_lock)
        if [[ -z "$held" ]]; then
            rc=0
            "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive LC_ALL=C apt-get \
                -o DPkg::Lock::Timeout=$((left > 5 ? 5 : (left > 1 ? left : 1))) "$@" \
                >"$log" 2>&1 || rc=$?
            ((rc == 0)) && return 0
            grep -q "Could not get lock" "$log" || step_failed "$name" "$rc" "$log" apt-get "$@"
            held=$(apt_lock_message "$log")
            held=${held:-"that apt-get names in $log"}
            left=$((limit - (SECONDS - start)))
        fi
        if ((left <= 0)); then
            echo "setup: $name: gave up after waiting $limit s for the package lock $held;" \
                "let it finish (or set CTRAIN_APT_LOCK_TIMEOUT higher) and run" \
                "scripts/setup.sh again" >&2
            exit 1
        fi
        if [[ "$held" != "$said" ]] || ((SECONDS - said_at >= 60)); then
            echo "setup: $name: waiting for the package lock $held (up to $left s more;" \
                "CTRAIN_APT_LOCK_TIMEOUT sets the limit)" >&2
            said=$held said_at=$SECONDS
        fi
        sleep 1
    done
}

apt_lock_timeout="${CTRAIN_APT_LOCK_TIMEOUT:-600}"
if [[ ! "$apt_lock_timeout" =~ ^[0-9]+$ ]]; then
    echo "setup: CTRAIN_APT_LOCK_TIMEOUT is a number of seconds, not '$apt_lock_timeout'" >&2
    exit 2
fi
sudo=()

# Sourced (a test of the functions above sets logs and calls them): nothing more.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0

cd "$(dirname "$0")/.."

tests=0
case "${1:-}" in
"") ;;
--tests) tests=1 ;;
*)
    echo "usage: scripts/setup.sh [--tests]" >&2
    exit 2
    ;;
esac
build="${CTRAIN_BUILD_DIR:-build}"
venv="${CTRAIN_VENV:-build-venv}"
logs="${CTRAIN_LOG_DIR:-build-logs}"
mkdir -p "$logs"

# Building and training. gcc only recommends libc6-dev, and apt-get is told
# --no-install-recommends, so it is named.
packages=(gcc libc6-dev pkg-config meson ninja-build libopenblas-dev libdnnl-dev zlib1g-dev
          libyaml-dev protobuf-c-compiler libprotobuf-c-dev openmpi-bin libopenmpi-dev libzmq3-dev
          libjpeg62-turbo-dev libpng-dev libmicrohttpd-dev dataset-fashion-mnist fortunes)
if ((tests)); then
    # Every program the tests call: python3 with torch, numpy, pytest and zmq (the raw-message
    # tests), the venv module, pgrep (procps), clang and compiler-rt (libFuzzer), mpirun, meson,
    # ninja, pkg-config and gcc (the install test), bash; ca-certificates for pip; ip and tc
    # (iproute2) for the hosts made of network namespaces, and a Slurm controller and node
    # daemon to run the Slurm scripts on them (tests/integration/slurm_cluster.py); g++ builds
    # the CUDA kernels under the CPU stand-in for the CUDA runtime (tests/cuda/).
    packages+=(libcriterion-dev python3 python3-torch python3-numpy python3-pytest python3-zmq
               python3-venv procps clang libclang-rt-dev ca-certificates iproute2 slurmctld
               slurmd slurm-client g++)
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || {
            echo "setup: these Debian packages are missing and neither root nor sudo can install" \
                "them: ${missing[*]}" >&2
            exit 1
        }
        sudo=(sudo)
    fi
    apt_step apt-update update
    apt_step apt-install install -y --no-install-recommends "${missing[@]}"
fi

if ((tests)); then
    # TensorBoard's own event reader, the converter of its Profile tab (xprof: a 32 MB wheel, with
    # Google Cloud Storage and DuckDB clients it imports) and the safetensors reader check what
    # ctrain writes, and onnx's checker and onnxruntime take the ONNX models it exports. They come from pip, into a
    # virtual environment (Debian's python3 is externally managed, PEP 668) that also sees
    # Debian's site packages: torch 1.13 and numpy 1.24. Debian's torch cannot use
    # NumPy 2, so pip may not bring one in; the versions are pinned so that CI gets the same set.
    check_venv() {
        "$venv/bin/python" - <<'EOF'
import numpy, torch, pytest, zmq, tensorboard, safetensors, xprof.version, onnxruntime, onnx
import xprof.convert.raw_to_tool_data  # loads the converter's native library
assert numpy.__version__.startswith("1.24.") and numpy.__file__.startswith("/usr/lib/python3/"), (
    f"numpy {numpy.__version__} from {numpy.__file__}: the venv must see Debian's numpy 1.24")
print(f"numpy {numpy.__version__} and torch {torch.__version__} (Debian), "
      f"tensorboard {tensorboard.__version__}, xprof {xprof.version.__version__}, "
      f"safetensors {safetensors.__version__}, onnxruntime {onnxruntime.__version__}")
EOF
    }
    if [[ ! -x "$venv/bin/python" ]] || ! check_venv >"$logs/venv-check.log" 2>&1; then
        echo "setup: making the test virtual environment $venv"
        # Debian's interpreter by its path: the python3 first on PATH may be another (pyenv)
        step venv /usr/bin/python3 -m venv --clear --system-site-packages "$venv"
        cat >"$venv/constraints.txt" <<'EOF'
numpy<2
tensorboard==2.21.0
safetensors==0.8.0
onnxruntime==1.30.0
onnx==1.23.1
flatbuffers==25.12.19
absl-py==2.5.1
grpcio==1.85.1
Markdown==3.11.3
MarkupSafe==3.0.4
pillow==13.0.0
protobuf==7.36.2
tensorboard-data-server==0.7.2
typing_extensions==4.16.0
Werkzeug==3.1.9
xprof==2.24.2
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
certifi==2026.10.19.post1
cheroot==11.1.2
decorator==5.3.1
duckdb==2.0.1
etils==1.15.0
fire==0.7.1
frozenlist==1.8.0
fsspec==2026.9.0
gcsfs==2026.10.1
google-api-core==2.44.0
google-auth==2.63.0
google-auth-oauthlib==1.5.0
google-cloud-core==2.8.0
google-cloud-storage==3.17.1
google-cloud-storage-control==1.17.0
google-crc32c==1.9.0
google-resumable-media==2.11.0
googleapis-common-protos==1.76.0
grpc-google-iam-v1==0.14.6
grpcio-status==1.85.1
gviz-api==1.10.0
jaraco.functools==4.6.0
ml-dtypes==0.5.4
multidict==7.2.1
opentelemetry-api==1.45.2
propcache==0.5.4
proto-plus==1.29.0
pyasn1==0.6.5
pyasn1-modules==0.4.2
requests==2.34.2
requests-oauthlib==2.0.0
termcolor==3.3.0
urllib3==2.8.0
yarl==1.25.1
zipp==4.1.2
EOF
        step pip "$venv/bin/python" -m pip install --disable-pip-version-check --no-input \
            -c "$venv/constraints.txt" tensorboard xprof safetensors onnxruntime onnx
        step venv-check check_venv
    fi
    echo "setup: $venv: $(tail -n 1 "$logs/venv-check.log")"
fi

meson_args=()
# shellcheck disable=SC2206
[[ -n "${CTRAIN_MESON_ARGS:-}" ]] && meson_args=(${CTRAIN_MESON_ARGS})
if [[ ! -f "$build/build.ninja" ]]; then
    ((tests)) && meson_args+=(-Dtests=enabled)
    step meson-setup meson setup "$build" "${meson_args[@]}"
    # meson's summary: which optional parts (tests, oneDNN, CUDA, NCCL) are on, and why not
    sed -n '/^  Optional features/,/^$/p' "$logs/meson-setup.log"
elif ((tests)) && [[ $(meson introspect --buildoptions "$build" | python3 -c 'import json, sys
print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "tests"))') != enabled ]]; then
    # a build made by scripts/run.sh (tests auto: off if Criterion was missing then)
    step meson-configure meson configure "$build" -Dtests=enabled
fi
step ninja ninja -C "$build"
echo "setup: built $build/coordinator/ctrain"
