#!/usr/bin/env bash
# Hosts made of network namespaces on this machine, for trying ctrain across hosts by hand
# (the tests use the same module, tests/integration/netns.py). Needs root.
#   scripts/netns_cluster.sh up 3        # host0..host2 at 10.77.S.1..3; stays up until `down`
#   scripts/netns_cluster.sh exec 1 build/worker/ctrain-worker --job ... --chief host0:7450
#   scripts/netns_cluster.sh down
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
up) exec /usr/bin/python3 tests/integration/netns.py "$@" ;;
down | exec) exec /usr/bin/python3 tests/integration/netns.py "$@" ;;
*)
    echo "usage: scripts/netns_cluster.sh up N | down | exec HOSTINDEX CMD..." >&2
    exit 2
    ;;
esac
