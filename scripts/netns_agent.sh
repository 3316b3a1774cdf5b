#!/usr/bin/env bash
# Open MPI's rsh agent for hosts made of network namespaces (tests/integration/netns.py):
# called as ssh would be (options, the host name, then the command line as words), it runs
# the command in that host's namespace under its host name. CT_NETNS_MAP names the file that
# maps host names to namespaces ("host1 ctn123h1" per line).
#   mpirun --mca plm_rsh_agent scripts/netns_agent.sh --host host0:1,host1:1 ...
set -euo pipefail
while [[ $# -gt 0 && "$1" == -* ]]; do
    case "$1" in
    -o | -p | -l | -i | -F) shift 2 ;; # ssh options with a value
    *) shift ;;
    esac
done
if [[ $# -lt 2 ]]; then
    echo "netns_agent: usage: netns_agent.sh [ssh options] HOST COMMAND..." >&2
    exit 2
fi
host="$1"
shift
map="${CT_NETNS_MAP:?netns_agent: CT_NETNS_MAP is not set (tests/integration/netns.py sets it)}"
ns=$(awk -v h="$host" '$1 == h { print $2 }' "$map")
if [[ -z "$ns" ]]; then
    echo "netns_agent: host '$host' is not in $map" >&2
    exit 2
fi
exec ip netns exec "$ns" unshare --uts sh -c "hostname $host && $*"
