#!/usr/bin/env bash
# Proves the README's two commands on a clean Debian 12: a root made by
# `debootstrap --variant=minbase bookworm` (cached as a tarball in /var/cache/ctrain-fresh/), given
# this host's apt sources, an /etc/hosts, its DNS and its extra CA certificates (pip needs them
# behind a TLS-inspecting proxy), and a clean clone of this repository's committed HEAD (so that
# uncommitted files cannot make it pass). There it runs, as the README says:
#   command 1 (run):   scripts/run.sh     installs what is missing, builds, trains the default job
#   command 2 (test):  scripts/test.sh    installs the test dependencies too, runs every test
# It prints the time of each phase and a PASS or FAIL line, and exits 1 on failure.
#   scripts/check_fresh_machine.sh [--command run|test|both] [--refresh] [--keep] [--no-apt-cache]
#     --command    which command to prove (default run); both: each in its own fresh root
#     --refresh    make the debootstrap tarball again
#     --keep       leave the root in place afterwards (it is printed)
#     --no-apt-cache  download every package again (by default the .deb files apt downloads are
#                  kept in the cache folder between runs; apt still installs each one)
# Runs as root (debootstrap, mount, chroot). The root is bind-mounted on itself, and /proc, /sys,
# /dev into it; all are always unmounted, even when a step fails. CTRAIN_FRESH_CACHE and
# CTRAIN_FRESH_WORK name the cache folder and where roots are made (/var/tmp).
# shellcheck disable=SC2317 # the phases' functions are called through phase()
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

which_command=run
refresh=0
keep=0
apt_cache=1
while (($#)); do
    case "$1" in
    --command)
        which_command="${2:-}"
        shift
        ;;
    --command=*) which_command="${1#--command=}" ;;
    --refresh) refresh=1 ;;
    --keep) keep=1 ;;
    --no-apt-cache) apt_cache=0 ;;
    -h | --help)
        sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "check_fresh_machine: unknown argument $1 (see --help)" >&2
        exit 2
        ;;
    esac
    shift
done
case "$which_command" in
run) commands=(run) ;;
test) commands=(test) ;;
both) commands=(run test) ;;
*)
    echo "check_fresh_machine: --command takes run, test or both, not '$which_command'" >&2
    exit 2
    ;;
esac
if [[ $(id -u) -ne 0 ]]; then
    echo "check_fresh_machine: needs root (debootstrap, mount, chroot): sudo $0 ..." >&2
    exit 2
fi

suite=bookworm
arch=$(dpkg --print-architecture)
cache="${CTRAIN_FRESH_CACHE:-/var/cache/ctrain-fresh}"
work="${CTRAIN_FRESH_WORK:-/var/tmp}"
tarball="$cache/$suite-minbase-$arch.tar.gz"
mkdir -p "$cache" "$work"
logs=$(mktemp -d "$work/ctrain-fresh-logs.XXXXXX")
started=$SECONDS
timings=()

say() { echo "check_fresh_machine: $*"; }

# Unmounts every mount at or under a folder, deepest first.
unmount_under() {
    local dir mounts m
    dir=$(realpath -m "$1")
    mapfile -t mounts < <(awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' \
        /proc/mounts | sort -r)
    for m in "${mounts[@]}"; do
        umount "$m" 2>/dev/null || umount -l "$m" || say "could not unmount $m"
    done
}
# Ends the processes still running inside a root (a command interrupted), by their ids.
stop_processes_in() {
    local root pids p signal
    root=$(realpath -m "$1")
    for signal in TERM KILL; do
        pids=()
        for p in /proc/[0-9]*; do
            [[ "$(readlink "$p/root" 2>/dev/null)" == "$root" ]] && pids+=("${p#/proc/}")
        done
        ((${#pids[@]})) || return 0
        kill -s "$signal" "${pids[@]}" 2>/dev/null || true
        sleep 2
    done
}
# Unmounts everything in a root and removes it (or, with --keep, says where it is).
drop_root() {
    stop_processes_in "$1"
    unmount_under "$1"
    if ((keep)); then
        say "kept $1"
    else
        rm -rf --one-file-system "$1"
    fi
}
roots=() # made by this run: dropped on exit, whatever happens
cleanup() {
    local rc=$? r
    for r in "${roots[@]}"; do
        [[ -d "$r" ]] && drop_root "$r"
    done
    return "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

# phase NAME COMMAND...: runs COMMAND (in a subshell with errexit on: a function stops at its
# first failing command) with its output in a log, times it; on failure prints the end of the
# log and exits 1.
phase() {
    local name=$1 log t0=$SECONDS rc
    log="$logs/$(tr -c 'a-zA-Z0-9\n' '-' <<<"$1").log"
    shift
    say "$name ..."
    set +e
    (
        set -e
        "$@"
    ) >"$log" 2>&1
    rc=$?
    set -e
    timings+=("$(printf '%-32s %5d s' "$name" $((SECONDS - t0)))")
    if ((rc != 0)); then
        say "$name failed (exit status $rc); the last 60 lines of its log ($log):"
        tail -n 60 "$log" | sed 's/^/    /'
        finish FAIL "$name failed"
    fi
}
finish() { # PASS|FAIL, what
    say "timings:"
    printf '    %s\n' "${timings[@]}"
    printf '    %-32s %5d s\n' total $((SECONDS - started))
    echo "fresh machine ($suite minbase, HEAD $(git -C "$repo" rev-parse --short HEAD), --command" \
        "$which_command): $1${2:+: $2}"
    if [[ "$1" == PASS ]]; then
        rm -rf "$logs"
        exit 0
    fi
    say "logs in $logs"
    exit 1
}

# The mirror this host's apt uses for Debian (deb822 or one-line sources), for debootstrap.
host_mirror() {
    local uri
    uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
        /^URIs:/ { u = $2 } /^Suites:/ && / bookworm( |$)/ && u != "" { print u; exit }')
    [[ -n "$uri" ]] || uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '$1 == "deb" && $0 ~ / bookworm / { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; exit } }')
    echo "${uri:-http://deb.debian.org/debian}"
}

make_tarball() { # DIR: an empty folder to bootstrap in
    local dir=$1 mirror
    if ! command -v debootstrap >/dev/null; then
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap
    fi
    mirror=$(host_mirror)
    echo "debootstrap --variant=minbase $suite $dir $mirror"
    debootstrap --variant=minbase "$suite" "$dir" "$mirror"
    unmount_under "$dir"
    tar -C "$dir" --numeric-owner -czf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
}

# The host's apt sources (and the Acquire settings that reach them: proxies, date checks), DNS,
# an /etc/hosts (debootstrap writes none, and localhost must resolve), the mounts, the host's
# extra CA certificates (installed with ca-certificates inside the root).
prepare_root() {
    local root=$1 f
    rm -f "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*
    if [[ -f /etc/apt/sources.list ]]; then
        cp /etc/apt/sources.list "$root/etc/apt/"
    fi
    for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        cp "$f" "$root/etc/apt/sources.list.d/"
        # a keyring a source names, if the root lacks it
        { grep -oE '(Signed-By: *|signed-by=)/[^] ]+' "$f" || true; } |
            sed -E 's/^(Signed-By: *|signed-by=)//' | while read -r key; do
                if [[ -f "$key" && ! -f "$root$key" ]]; then
                    install -D -m 644 "$key" "$root$key"
                fi
            done
    done
    for f in /etc/apt/apt.conf.d/*; do
        if [[ -f "$f" ]] && grep -q "Acquire::" "$f"; then
            cp "$f" "$root/etc/apt/apt.conf.d/"
        fi
    done
    rm -f "$root/etc/resolv.conf"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
        "$(cat /proc/sys/kernel/hostname)" >"$root/etc/hosts"
    # / must be a mount point, as on a real machine: `ip -n NS ...` (the host tests' network
    # namespaces) makes / rslave in a new mount namespace, which fails in a chroot whose / is a
    # plain folder ('"mount --make-rslave /" failed: Invalid argument'). So the root is
    # bind-mounted on itself first (rslave: nothing mounted in it reaches the host)
    mount --bind "$root" "$root"
    mount --make-rslave "$root"
    local m
    for m in proc sys dev dev/pts dev/shm; do
        [[ -d "/$m" ]] || continue
        mkdir -p "$root/$m"
        mount --bind "/$m" "$root/$m"
        mount --make-rslave "$root/$m"
    done
    if ((apt_cache)); then
        mkdir -p "$cache/apt-archives" "$root/var/cache/apt/archives"
        mount --bind "$cache/apt-archives" "$root/var/cache/apt/archives"
    fi
    mkdir -p "$root/usr/local/share/ca-certificates"
    if [[ -d /usr/local/share/ca-certificates ]]; then
        cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
    fi
    in_root "$root" apt-get update
    in_root "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y \
        --no-install-recommends ca-certificates
    in_root "$root" update-ca-certificates
}

# in_root ROOT COMMAND...: as a login on a fresh machine would: a clean environment, no stdin
in_root() {
    local root=$1
    shift
    chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@" </dev/null
}

clone_head() {
    local root=$1 head
    head=$(git -C "$repo" rev-parse HEAD)
    git clone --quiet --no-checkout --no-hardlinks "$repo" "$root/root/ctrain"
    git -C "$root/root/ctrain" checkout --quiet --detach "$head"
    git -C "$root/root/ctrain" log --oneline -1
}

say "repository $repo at $(git -C "$repo" log --oneline -1)"
if [[ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]]; then
    say "note: the work tree has uncommitted changes; they are not part of this check"
fi
if ((refresh)) || [[ ! -f "$tarball" ]]; then
    dir=$(mktemp -d "$work/ctrain-fresh-bootstrap.XXXXXX")
    roots+=("$dir")
    phase "debootstrap" make_tarball "$dir"
    drop_root "$dir"
else
    say "using the cached $tarball (--refresh makes it again)"
fi

for c in "${commands[@]}"; do
    root=$(mktemp -d "$work/ctrain-fresh.XXXXXX")
    roots+=("$root")
    phase "$c: unpack the root" tar -C "$root" --numeric-owner -xzf "$tarball"
    # / must be 0755, as on a real machine: a package's postinst that runs as its own user
    # (munge's `su munge -s /bin/sh -c 'mungekey -c'`) fails in a 0700 root with 'su: failed to
    # execute /bin/sh: Permission denied'. Set after the unpack: mktemp makes the folder 0700, and
    # tar gives it the mode of the tarball's ./ entry (0700 too: it was packed from a mktemp folder)
    chmod 755 "$root"
    phase "$c: prepare (apt, hosts, CA)" prepare_root "$root"
    phase "$c: clone HEAD" clone_head "$root"
    script="scripts/$c.sh"
    say "$c: running $script in the fresh root ($root), output follows"
    t0=$SECONDS
    set +e
    in_root "$root" bash -c "cd /root/ctrain && $script" 2>&1 | tee "$logs/$c-command.log" |
        sed -u "s/^/    [$c] /"
    rc=${PIPESTATUS[0]}
    set -e
    timings+=("$(printf '%-32s %5d s' "$c: $script" $((SECONDS - t0)))")
    if ((rc != 0)); then
        finish FAIL "$script exited $rc in the fresh root (its output is above)"
    fi
    if [[ "$c" == test ]] && ! tail -n 1 "$logs/$c-command.log" | grep -qE '^[0-9]+ passed, 0 failed$'; then
        finish FAIL "$script did not end with 'N passed, 0 failed'"
    fi
    drop_root "$root"
done
finish PASS "$(for c in "${commands[@]}"; do printf 'scripts/%s.sh ' "$c"; done)passed"
