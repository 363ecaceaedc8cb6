#!/bin/bash
# Bounded tables (admission, expiry, capacity) with colocated shards and
# several ranks: every rank decides the same rows from the global batch and
# rank 0 removes them once (the Remove call) at each step boundary.
#
# Asserts: one rank with 2 colocated shards gives the in-process run's
# losses, bounded-table counts and test predictions byte for byte;
# `mpirun -np 2` with colocated shards and `mpirun -np 2` against 2 shard
# servers give each other's losses and predictions byte for byte, the
# one-rank run's counts (--metrics-out "keep": rows, admitted, refused,
# expired, evicted per table) and its keep.bin byte for byte (the same ids
# admitted, expired and evicted per table, whatever the rank count), and
# their saved model holds per table exactly the one-rank run's row count
# (reshard's verification: rows a shard removes are gone from it); the
# bounds are at work (rows expired and evicted); a colocated -np 2 run
# resumed from its step-10 checkpoint ends with the uninterrupted run's
# predictions.
set -euo pipefail
. "${BASH_SOURCE%/*}/../support/lib.sh"

B=${SHARDREC_BIN:?run through ctest (SHARDREC_BIN)}
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
W=$(mktemp -d /tmp/shardrec-keep-ranks-XXXXXX)
SRV=
cleanup() {
  # shellcheck disable=SC2086
  [ -z "$SRV" ] || kill $SRV 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
cd "$W"

run datagen "$B" datagen --rows 4000 --out d.tsv --seed 3
BOUNDS=(--admit-after 3 --expire-after 4 --capacity 60)
COMMON=(--raw-data-file d.tsv --mini-batch-size 128 --print-freq 3 --seed 5)
losses() { grep -o '"loss":[^,]*' "$1.jsonl"; }
keeps() { grep -o '"keep":.*' "$1.jsonl"; }
# same NAME REF: NAME's losses, bounded-table counts and test predictions are REF's.
same() {
  diff <(losses "$2") <(losses "$1") >/dev/null || fail "$1: losses differ from $2's"
  diff <(keeps "$2") <(keeps "$1") >/dev/null || fail "$1: bounded-table counts differ from $2's"
  cmp -s "$2.pred" "$1.pred" || fail "$1: test predictions differ from $2's"
}
# rows NAME MODEL: each table's row count in MODEL's last step, one a line.
rows() {
  run "rs_$1" "$B" reshard --from "$2" --to "rs_$1" --plan two.json
  grep 'verify table_id' "rs_$1.log" | sed 's/, checksum.*//' >"$1.rows"
  [ -s "$1.rows" ] || fail "reshard of $2 printed no table: $(tail -3 "rs_$1.log")"
}

run plan "$B" plan --raw-data-file d.tsv --seed 5 --num-shards 2 "${BOUNDS[@]}" --out two.json
P=(--plan two.json --metrics-out)
run one "$B" train "${COMMON[@]}" "${P[@]}" one.jsonl --test-pred-out one.pred --save-model one.m
run colo1 "$B" train "${COMMON[@]}" "${P[@]}" colo1.jsonl --test-pred-out colo1.pred --colocate-shards
same colo1 one

run colo2 "${MPIRUN[@]}" "$B" train "${COMMON[@]}" "${P[@]}" colo2.jsonl --test-pred-out colo2.pred \
  --colocate-shards --prefetch-depth 2 --save-model colo2.m
for k in 0 1; do
  "$B" serve --listen 127.0.0.1:0 --plan two.json --shard "$k" >"srv$k.out" 2>"srv$k.log" &
  SRV="$SRV $!"
done
# shellcheck disable=SC2086
listening() { [ "$(grep -ls '^listening on ' srv0.out srv1.out | wc -l)" = 2 ] || ! kill -0 $SRV 2>/dev/null; }
wait_for 20 listening || fail "serve --plan two.json did not start: $(cat srv0.log srv1.log)"
addrs=$(sed -n 's/^listening on //p' srv0.out | head -1),$(sed -n 's/^listening on //p' srv1.out | head -1)
run servers2 "${MPIRUN[@]}" "$B" train "${COMMON[@]}" "${P[@]}" servers2.jsonl \
  --test-pred-out servers2.pred --shard-servers "$addrs"
# shellcheck disable=SC2086
kill $SRV
wait 2>/dev/null || true
SRV=
same servers2 colo2
diff <(keeps one) <(keeps colo2) >/dev/null || fail "2 ranks' bounded-table counts differ from one rank's"
cmp -s one.m/step-27/keep.bin colo2.m/step-27/keep.bin || fail "2 ranks' keep.bin differs from one rank's"
rows one one.m/step-27
rows colo2 colo2.m/step-27
diff one.rows colo2.rows >/dev/null || fail "2 ranks' rows per table: $(diff one.rows colo2.rows | head -4)"
python3 - one.jsonl <<'EOF' || fail "the bounds did nothing: $(keeps one | tail -1 | head -c 300)"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if '"keep"' in l][-1]["keep"]
assert sum(t["expired"] for t in last.values()) > 0
assert sum(t["evicted"] for t in last.values()) > 0
EOF

run part "${MPIRUN[@]}" "$B" train "${COMMON[@]}" --plan two.json --colocate-shards \
  --save-checkpoint ck --checkpoint-every 10 --num-batches 10
run resumed "${MPIRUN[@]}" "$B" train "${COMMON[@]}" --plan two.json --resume ck/step-10 \
  --colocate-shards --test-pred-out resumed.pred
cmp -s resumed.pred colo2.pred || fail "the resumed 2-rank run's predictions differ"
echo "ok"
