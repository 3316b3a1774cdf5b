#!/usr/bin/env bash
# Hosts made of network namespaces on this machine, for trying ctrain across hosts by hand
# (the tests use the same module, tests/integration/netns.py). Needs root and iproute2.
#   scripts/netns_cluster.sh up 3        # host0..host2 at 10.77.S.1..3, in the background
#   scripts/netns_cluster.sh exec 1 build/worker/ctrain-worker --job ... --chief host0:7450
#   scripts/netns_cluster.sh mpirun 2 build/worker/ctrain-worker --job ...   # 2 ranks a host
#   scripts/netns_cluster.sh down        # removes it all (also what a crashed run left)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
up | down | exec | mpirun) exec /usr/bin/python3 tests/integration/netns.py "$@" ;;
*)
    echo "usage: scripts/netns_cluster.sh up N | down | exec HOSTINDEX CMD... |" \
        "mpirun RANKS_PER_HOST PROGRAM ARGS..." >&2
    exit 2
    ;;
esac
