#!/usr/bin/env bash
# Open MPI's rsh agent for the bench's namespaces (mpirun --mca
# plm_rsh_agent THIS): called as `THIS [options] HOST COMMAND...`, it runs
# COMMAND with /bin/sh inside the namespace whose address is HOST
# (198.18.0.(i+1) is srn-TAG-i of tests/cluster/netns.sh; TAG from
# SRN_BENCH_TAG). Any other host is refused: nothing leaves 198.18.0.0/24.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
[ $# -ge 2 ] || { echo "rsh-agent.sh: usage: rsh-agent.sh HOST COMMAND..." >&2; exit 255; }
host=$1
shift
[[ "$host" =~ ^198\.18\.0\.([0-9]+)$ ]] || { echo "rsh-agent.sh: $host is not a bench host (198.18.0.x)" >&2; exit 255; }
i=$((BASH_REMATCH[1] - 1))
exec ip netns exec "srn-${SRN_BENCH_TAG:?SRN_BENCH_TAG not set}-$i" /bin/sh -c "$*"
