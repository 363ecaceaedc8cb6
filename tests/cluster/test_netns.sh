#!/usr/bin/env bash
# tests/cluster/netns.sh end to end (root only; ctest reports it skipped,
# exit 77, when not root or when network namespaces cannot be made here):
#  1. `up 2 --rate 20mbit`: two namespaces with their addresses, no route
#     beyond 198.18.0.0/24, nothing new in the host's namespace;
#  2. `shardrec serve --insecure` in namespace 1, `shardrec bench rpc --part
#     client` in namespace 0: every row it looks up is bit for bit an
#     in-process store's, and the link is shaped: the client's Lookup and
#     plain TCP figures stay under 1.5x the rate, and tbf on the server's
#     eth0 (bytes sent toward the client) counted the answers' bytes and
#     held packets back (overlimits);
#  3. `down` leaves no namespace, veth or bridge of the tag behind;
#  4. an `up` stopped by SIGTERM in the middle removes what it made; one
#     killed by SIGKILL leaves namespaces that the next `up` removes first.
set -uo pipefail

SRC=${SHARDREC_SRC:?SHARDREC_SRC (the source tree) must be set}
BIN=${SHARDREC_BIN:?SHARDREC_BIN (the shardrec binary) must be set}
NETNS="$SRC/tests/cluster/netns.sh"
TAG="t$(($$ % 100000))"
DIR=$(mktemp -d /tmp/shardrec-test-netns-XXXXXX)
PIDS=()

skip() {
  echo "test_netns: skipped: $*"
  rm -rf "$DIR"
  exit 77
}
fail() {
  echo "test_netns: FAILED: $*" >&2
  exit 1
}
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  "$NETNS" down --tag "$TAG" >/dev/null 2>&1
  "$NETNS" down --tag "${TAG}k" >/dev/null 2>&1
  rm -rf "$DIR"
}

[ "$(id -u)" -eq 0 ] || skip "not root (network namespaces need root)"
command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || skip "'ip netns' is not available"
command -v tc >/dev/null || skip "tc is not installed"
trap cleanup EXIT

# Probe: can this kernel make a namespace at all (a container may refuse)?
if ! out=$("$NETNS" up 1 --tag "$TAG" 2>&1); then
  skip "netns.sh up 1 failed here: $out"
fi
"$NETNS" down --tag "$TAG" || fail "down after the probe"

host_links_before=$(ip -o link show | awk -F': ' '{print $2}' | sort)

# 1. Up, addresses, routes.
RATE_MBIT=20
out=$("$NETNS" up 2 --rate ${RATE_MBIT}mbit --tag "$TAG" 2>&1) || fail "up 2: $out"
[ "$out" = "srn-$TAG-0 198.18.0.1
srn-$TAG-1 198.18.0.2" ] || fail "up 2 printed: $out"
[ "$("$NETNS" list --tag "$TAG" | sort | tr '\n' ' ')" = "srn-$TAG-0 srn-$TAG-1 srn-$TAG-br " ] ||
  fail "namespaces after up: $("$NETNS" list --tag "$TAG" | tr '\n' ' ')"
for i in 0 1; do
  routes=$("$NETNS" exec $i --tag "$TAG" ip -4 route show table all | grep -v '^local\|^broadcast' || true)
  [ "$routes" = "198.18.0.0/24 dev eth0 proto kernel scope link src 198.18.0.$((i + 1)) " ] ||
    [ "$routes" = "198.18.0.0/24 dev eth0 proto kernel scope link src 198.18.0.$((i + 1))" ] ||
    fail "namespace $i routes: $routes"
  "$NETNS" exec $i --tag "$TAG" ip route get 192.0.2.1 >/dev/null 2>&1 &&
    fail "namespace $i has a route to 192.0.2.1"
done
[ "$(ip -o link show | awk -F': ' '{print $2}' | sort)" = "$host_links_before" ] ||
  fail "up changed the host's interfaces"

# 2. A server in namespace 1, a client in namespace 0.
cat >"$DIR/plan.json" <<EOF
{"format": 1, "seed": "3", "n_shards": 1, "tables": [
 {"table_id": 0, "name": "t0", "rows": 16384, "dim": 16, "pooling": "sum",
  "optimizer": {"name": "sgd"}, "placement": {"kind": "table", "shards": [0]}}]}
EOF
"$NETNS" exec 1 --tag "$TAG" "$BIN" serve --plan "$DIR/plan.json" --shard 0 \
  --listen 198.18.0.2:0 --insecure >"$DIR/serve.out" 2>"$DIR/serve.err" &
PIDS+=($!)
"$NETNS" exec 1 --tag "$TAG" "$BIN" bench rpc --part tcp-peer --listen 198.18.0.2:0 \
  >"$DIR/peer.out" 2>"$DIR/peer.err" &
PIDS+=($!)
wait_line() { # FILE PATTERN: the first matching line, waited for up to 60 s
  for _ in $(seq 600); do
    l=$(grep -m1 "$2" "$1" 2>/dev/null) && { echo "$l"; return 0; }
    sleep 0.1
  done
  return 1
}
srv=$(wait_line "$DIR/serve.out" "listening on ") || fail "serve did not listen: $(cat "$DIR/serve.err")"
peer=$(wait_line "$DIR/peer.out" "listening on ") || fail "tcp peer did not listen: $(cat "$DIR/peer.err")"
srv=${srv#listening on }
srv=${srv%% *}
peer=${peer#listening on }
sent0=$("$NETNS" exec 1 --tag "$TAG" tc -s qdisc show dev eth0 | awk '/Sent/ {print $2; exit}')
out=$("$NETNS" exec 0 --tag "$TAG" "$BIN" bench rpc --part client --plan "$DIR/plan.json" \
  --server "$srv" --tcp "$peer" --ids 1024 --seconds 0.2 2>&1) || fail "client: $out"
echo "$out"
grep -q "^client: 3072 rows looked up from $srv, identical to the in-process store's" <<<"$out" ||
  fail "the client's rows check: $out"
limit=$(awk -v r=$RATE_MBIT 'BEGIN {print r / 8 * 1.5}') # MB/s
for what in "Lookup gRPC" "Lookup plain TCP"; do
  mbs=$(awk -v w="  $what" 'index($0, w) == 1 {for (i = 1; i < NF; i++) if ($(i + 1) == "MB/s") print $i}' <<<"$out")
  [ -n "$mbs" ] || fail "no $what figure in: $out"
  awk -v m="$mbs" -v l="$limit" 'BEGIN {exit !(m > 0 && m <= l)}' ||
    fail "$what ran at $mbs MB/s over a ${RATE_MBIT}mbit link (at most $limit expected)"
done
stats=$("$NETNS" exec 1 --tag "$TAG" tc -s qdisc show dev eth0)
grep -q "qdisc tbf" <<<"$stats" || fail "no tbf on namespace 1's eth0: $stats"
sent1=$(awk '/Sent/ {print $2; exit}' <<<"$stats")
over=$(sed -n 's/.*overlimits \([0-9]*\).*/\1/p' <<<"$stats" | head -1)
# The fill alone reads nothing back, but the 3 checked windows and at least 5
# timed Lookups of 1024 x 64 bytes do: more than 500 KB toward the client.
[ $((sent1 - sent0)) -gt 500000 ] || fail "tbf counted $((sent1 - sent0)) bytes from the server"
[ "${over:-0}" -gt 0 ] || fail "tbf never held a packet back: $stats"
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
PIDS=()

# 3. Down leaves nothing.
"$NETNS" down --tag "$TAG" || fail "down"
[ -z "$("$NETNS" list --tag "$TAG")" ] || fail "left after down: $("$NETNS" list --tag "$TAG")"
ip netns list | grep -q "srn-$TAG-" && fail "ip netns still lists srn-$TAG-*"
[ "$(ip -o link show | awk -F': ' '{print $2}' | sort)" = "$host_links_before" ] ||
  fail "the host's interfaces changed"

# 4. Stopped in the middle: SIGTERM (the trap cleans up), SIGKILL (the next up does).
for sig in TERM KILL; do
  "$NETNS" up 60 --tag "${TAG}k" >"$DIR/up.out" 2>"$DIR/up.err" &
  up=$!
  for _ in $(seq 600); do
    [ "$("$NETNS" list --tag "${TAG}k" | wc -l)" -ge 3 ] && break
    sleep 0.05
  done
  [ "$("$NETNS" list --tag "${TAG}k" | wc -l)" -ge 3 ] || fail "up 60 made no namespaces: $(cat "$DIR/up.err")"
  kill -$sig $up
  wait $up
  rc=$?
  [ $rc -ne 0 ] || fail "up 60 finished before SIG$sig (make it slower)"
  if [ $sig = TERM ]; then
    grep -q "stopped by a signal" "$DIR/up.err" || fail "up's trap said: $(cat "$DIR/up.err")"
    [ -z "$("$NETNS" list --tag "${TAG}k")" ] ||
      fail "left after SIGTERM: $("$NETNS" list --tag "${TAG}k" | tr '\n' ' ')"
  else
    [ -n "$("$NETNS" list --tag "${TAG}k")" ] || fail "SIGKILL left nothing to clean (cannot test)"
    out=$("$NETNS" up 1 --tag "${TAG}k" 2>&1) || fail "up 1 after a SIGKILL: $out"
    [ "$("$NETNS" list --tag "${TAG}k" | sort | tr '\n' ' ')" = "srn-${TAG}k-0 srn-${TAG}k-br " ] ||
      fail "up 1 kept leftovers: $("$NETNS" list --tag "${TAG}k" | tr '\n' ' ')"
    "$NETNS" down --tag "${TAG}k" || fail "down after SIGKILL"
    [ -z "$("$NETNS" list --tag "${TAG}k")" ] || fail "left after down"
  fi
done
[ "$(ip -o link show | awk -F': ' '{print $2}' | sort)" = "$host_links_before" ] ||
  fail "the host's interfaces changed"
echo "test_netns: passed"
