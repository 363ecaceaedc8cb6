#!/usr/bin/env bash
# A private network of K network namespaces on one machine, for tests and
# benchmarks that need a real link between processes (root only).
#
#   netns.sh up K [--rate RATE] [--tag TAG]   make srn-TAG-0 .. srn-TAG-(K-1)
#   netns.sh down [--tag TAG]                 remove everything up made
#   netns.sh exec I [--tag TAG] CMD...        run CMD in namespace I
#   netns.sh addr I                           namespace I's address
#   netns.sh list [--tag TAG]                 the namespaces of TAG that exist
#
# Namespace i has one interface, eth0, with 198.18.0.(i+1)/24 (RFC 2544's
# benchmarking block, 198.18.0.0/15; nothing else is ever used), and lo. Its
# eth0 is one end of a veth pair whose other end, v<i>, is a port of the
# bridge br0 in a namespace of its own, srn-TAG-br: the host's namespace is
# never touched (no interface, route or address is made there), and no
# namespace has a default route or a route beyond 198.18.0.0/24, so nothing
# sent there can leave the machine. --rate RATE (tc's units: 100mbit, 1gbit)
# shapes each link in both directions with a token bucket (tc tbf on eth0
# and on v<i>; this kernel has no netem). TAG (default "c", letters and
# digits, at most 8) keeps runs apart: everything made is named srn-TAG-*,
# and `down` removes those namespaces, which takes their interfaces,
# bridge and qdiscs with them. `up` first removes what an earlier run of
# the same TAG left; if any step of `up` fails, or it is stopped by SIGINT,
# SIGTERM or SIGHUP, a trap removes everything it made and it exits 1
# naming the step (after a SIGKILL the next `up` or `down` of the TAG does).
set -euo pipefail

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "netns.sh: $*" >&2
  exit 2
}

TAG=c
RATE=""
CMD=${1:-}
[ -n "$CMD" ] || usage
shift

# Arguments after the command: a count or index first, then flags; exec's
# command line is whatever follows the flags.
POS=""
case "$CMD" in
  up | exec | addr)
    [ $# -ge 1 ] || usage
    POS=$1
    shift
    [[ "$POS" =~ ^[0-9]+$ ]] || die "$CMD: '$POS' is not a number"
    ;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) [ $# -ge 2 ] || die "--tag needs a value"; TAG=$2; shift 2 ;;
    --rate) [ $# -ge 2 ] || die "--rate needs a value"; RATE=$2; shift 2 ;;
    --) shift; break ;;
    *) [ "$CMD" = exec ] && break; die "$CMD: unknown argument '$1'" ;;
  esac
done
[[ "$TAG" =~ ^[A-Za-z0-9]{1,8}$ ]] || die "--tag '$TAG': letters and digits, 1 to 8 of them"
[ -z "$RATE" ] || [[ "$RATE" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] ||
  die "--rate '$RATE': a tc rate such as 100mbit or 1gbit"
PREFIX="srn-$TAG"

ns_list() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-([0-9]+|br)\$" || true
}

down() {
  local ns
  for ns in $(ns_list); do
    ip netns delete "$ns" 2>/dev/null || true
  done
  # Deleting a namespace returns as the kernel frees it; wait until it is
  # gone from the list (never more than a few seconds).
  local tries=0
  while [ -n "$(ns_list)" ] && [ $tries -lt 100 ]; do
    sleep 0.05
    tries=$((tries + 1))
  done
  [ -z "$(ns_list)" ] || { echo "netns.sh: could not remove $(ns_list | tr '\n' ' ')" >&2; return 1; }
}

addr_of() { echo "198.18.0.$(($1 + 1))"; }

# tc tbf on DEV in NS: RATE, a burst of 64 KiB or a millisecond at the rate,
# at most 50 ms queued.
shape() {
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 64kb latency 50ms
}

STEP=""
up() {
  local k=$1 i
  [ "$k" -ge 1 ] && [ "$k" -le 250 ] || die "up: K must be 1..250 (one /24)"
  down
  trap 'rc=$?; echo "netns.sh: up failed at: $STEP (exit $rc); removing what it made" >&2; down || true; exit 1' ERR
  trap 'echo "netns.sh: up stopped by a signal at: $STEP; removing what it made" >&2; down || true; exit 1' INT TERM HUP
  local br="$PREFIX-br"
  STEP="ip netns add $br"
  ip netns add "$br"
  STEP="bridge br0 in $br"
  ip -n "$br" link set lo up
  ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up
  for ((i = 0; i < k; i++)); do
    local ns="$PREFIX-$i"
    STEP="ip netns add $ns"
    ip netns add "$ns"
    STEP="veth eth0 ($ns) - v$i ($br)"
    ip link add eth0 netns "$ns" type veth peer name "v$i" netns "$br"
    ip -n "$br" link set "v$i" master br0
    ip -n "$br" link set "v$i" up
    STEP="address $(addr_of $i)/24 on $ns eth0"
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(addr_of $i)/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ -n "$RATE" ]; then
      STEP="tc tbf $RATE on $ns eth0 and $br v$i"
      shape "$ns" eth0
      shape "$br" "v$i"
    fi
  done
  trap - ERR INT TERM HUP
  for ((i = 0; i < k; i++)); do
    echo "$PREFIX-$i $(addr_of $i)"
  done
}

case "$CMD" in
  up) up "$POS" ;;
  down) down ;;
  exec)
    [ $# -ge 1 ] || die "exec: no command"
    exec ip netns exec "$PREFIX-$POS" "$@"
    ;;
  addr) addr_of "$POS" ;;
  list) ns_list ;;
  *) usage ;;
esac
