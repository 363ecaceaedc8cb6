#!/bin/bash
# Bounded tables (train --admit-after / --expire-after / --capacity /
# --evict; the plan's "keep"): the step-boundary decisions do not depend on
# where the rows live.
#
# Asserts: with admission (3 samples), expiry (4 steps) and capacity (60
# rows a table, lru; and lfu) on, the in-process store with 1 and 3 shards,
# the RocksDB shard store with 3 shards table-wise and row-wise (a cache
# smaller than the rows, --prefetch-depth 2) give the same losses, test
# predictions (byte for byte) and the same counts (--metrics-out's "keep":
# rows, admitted, refused, expired and evicted per table, and keep.bin, the
# checkpoint's counts, byte for byte); the bounds are at work (rows
# expired, evicted and refused, no table above 60 rows, and predictions
# other than the unbounded run's); a run resumed from step 10 (in process,
# and on the shard store) and one resumed from that checkpoint resharded to
# 3 shards row-wise end with the uninterrupted run's predictions and
# keep.bin; predict and eval of the saved model, and predict against serve
# --checkpoint of it, score the test split as training did (so ids without a
# row read zeros there too, not fresh init rows); a bad --evict or a
# negative --capacity exits 2, and bounds flags beside --plan are refused;
# /metrics of a running job holds each bounded table's rows (at most the
# capacity) and its admitted ids; a job with bounded tables on shard
# servers is refused at start, naming the store.
set -euo pipefail
. "${BASH_SOURCE%/*}/../support/lib.sh"

B=${SHARDREC_BIN:?run through ctest (SHARDREC_BIN)}
W=$(mktemp -d /tmp/shardrec-keep-XXXXXX)
SRV=
cleanup() {
  [ -z "$SRV" ] || kill "$SRV" 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
cd "$W"

run datagen "$B" datagen --rows 4000 --out d.tsv --seed 3
BOUNDS=(--admit-after 3 --expire-after 4 --capacity 60)
COMMON=(--raw-data-file d.tsv --mini-batch-size 128 --print-freq 3 --seed 5)
# losses NAME: the loss figures of NAME's --metrics-out, one a line.
losses() { grep -o '"loss":[^,]*' "$1.jsonl"; }
keeps() { grep -o '"keep":.*' "$1.jsonl"; }
# same NAME REF: NAME's losses, bounded-table counts and test predictions are REF's.
same() {
  diff <(losses "$2") <(losses "$1") >/dev/null || fail "$1: losses differ from $2's"
  diff <(keeps "$2") <(keeps "$1") >/dev/null || fail "$1: bounded-table counts differ from $2's"
  cmp -s "$2.pred" "$1.pred" || fail "$1: test predictions differ from $2's"
}
# train NAME FLAGS...: a run with the bounds, its metrics and predictions kept.
train() {
  local name=$1
  shift
  run "$name" "$B" train "${COMMON[@]}" "${BOUNDS[@]}" --metrics-out "$name.jsonl" \
    --test-pred-out "$name.pred" "$@"
}
# train_plan NAME FLAGS...: the same with the bounds from the --plan FILE among FLAGS.
train_plan() {
  local name=$1
  shift
  run "$name" "$B" train "${COMMON[@]}" --metrics-out "$name.jsonl" --test-pred-out "$name.pred" "$@"
}

train ref --save-model ref.m
train s3 --num-shards 3
train db3 --num-shards 3 --data-dir db3 --cache-rows 1024 --prefetch-depth 2 --save-model db3.m
run plan "$B" plan --raw-data-file d.tsv --seed 5 --num-shards 3 --row-wise "${BOUNDS[@]}" --out row.json
train_plan row --plan row.json --data-dir row --cache-rows 1024 --prefetch-depth 2
for n in s3 db3 row; do same "$n" ref; done
cmp -s ref.m/step-27/keep.bin db3.m/step-27/keep.bin || fail "keep.bin of the shard store differs"

# The bounds are at work.
python3 - ref.jsonl <<'EOF' || fail "the bounds did nothing: $(keeps ref | tail -1 | head -c 300)"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if '"keep"' in l][-1]["keep"]
assert sum(t["expired"] for t in last.values()) > 0
assert sum(t["evicted"] for t in last.values()) > 0
assert sum(t["refused"] for t in last.values()) > 0
assert max(t["rows"] for t in last.values()) <= 60
EOF
run free "$B" train "${COMMON[@]}" --test-pred-out free.pred
! cmp -s free.pred ref.pred || fail "the bounds changed no prediction"
BOUNDS=(--admit-after 3 --expire-after 4 --capacity 60 --evict lfu)
train lfu
train lfu3 --num-shards 3 --data-dir lfu3 --cache-rows 1024
same lfu3 lfu
! cmp -s lfu.pred ref.pred || fail "lfu evicted as lru did"
BOUNDS=(--admit-after 3 --expire-after 4 --capacity 60)

# Resumed, on each store, and resharded.
train part --save-checkpoint ck --checkpoint-every 10 --num-batches 10
[ -f ck/step-10/keep.bin ] || fail "no keep.bin in the checkpoint"
run resumed "$B" train "${COMMON[@]}" --plan ck/plan.json --resume ck/step-10 \
  --metrics-out resumed.jsonl --test-pred-out resumed.pred --save-model resumed.m
cmp -s resumed.pred ref.pred || fail "the resumed run's predictions differ"
cmp -s resumed.m/step-27/keep.bin ref.m/step-27/keep.bin || fail "the resumed run's keep.bin differs"
train dpart --num-shards 3 --data-dir dpart --cache-rows 1024 --save-checkpoint dck \
  --checkpoint-every 10 --num-batches 10
run dresumed "$B" train "${COMMON[@]}" --plan dck/plan.json --resume dck/step-10 \
  --data-dir dres --cache-rows 1024 --test-pred-out dresumed.pred
cmp -s dresumed.pred ref.pred || fail "the shard store's resumed run's predictions differ"
run reshard "$B" reshard --from ck/step-10 --to rs --plan row.json
run resharded "$B" train "${COMMON[@]}" --plan row.json --resume rs --test-pred-out resharded.pred
cmp -s resharded.pred ref.pred || fail "the run resumed from the resharded checkpoint differs"

# Scoring reads what training read.
run predict "$B" predict --checkpoint ref.m --raw-data-file d.tsv --data-split test --out p.tsv
cmp -s p.tsv ref.pred || fail "predict scores the test split otherwise than training did"
run predict_db "$B" predict --checkpoint db3.m --raw-data-file d.tsv --data-split test --out pdb.tsv
cmp -s pdb.tsv ref.pred || fail "predict of the shard store's checkpoint differs"
"$B" serve --listen 127.0.0.1:0 --checkpoint ref.m --shard 0 >srv.out 2>srv.log &
SRV=$!
listening() { grep -qs '^listening on ' srv.out || ! kill -0 "$SRV" 2>/dev/null; }
wait_for 20 listening || fail "serve --checkpoint ref.m did not start: $(cat srv.log)"
grep -qs '^listening on ' srv.out || fail "serve --checkpoint ref.m stopped: $(cat srv.log)"
run predict_served "$B" predict --checkpoint ref.m --shard-servers "$(sed -n 's/^listening on //p' srv.out | head -1)" \
  --raw-data-file d.tsv --data-split test --out psrv.tsv
kill "$SRV"
wait "$SRV" 2>/dev/null || true
SRV=
cmp -s psrv.tsv ref.pred || fail "predict against serve --checkpoint differs from training's"
auc=$(grep -o '"auc":[^,]*' ref.jsonl | tail -1 | cut -d: -f2)
run eval "$B" eval --checkpoint ref.m --raw-data-file d.tsv --data-split test
has eval "auc $(printf '%.6f' "$auc")"

# /metrics: each bounded table's rows and ids, while a job runs.
"$B" train "${COMMON[@]}" "${BOUNDS[@]}" --nepochs 1000 --print-freq 1 --metrics-out live.jsonl \
  --metrics-listen 127.0.0.1:0 >live.out 2>&1 &
SRV=$!
has_keep_line() { grep -qs '"keep"' live.jsonl || ! kill -0 "$SRV" 2>/dev/null; }
wait_for 60 has_keep_line || fail "no metrics line with bounded tables: $(tail -3 live.out)"
port=$(sed -n 's/^metrics on [^:]*:\([0-9]*\).*/\1/p' live.out | head -1)
[ -n "$port" ] || fail "no metrics port in: $(head -5 live.out)"
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3
cat <&3 >scrape.txt
exec 3<&-
kill "$SRV"
wait "$SRV" 2>/dev/null || true
SRV=
rows=$(sed -n 's/^shardrec_train_table_rows{.*table="t2"} \([0-9.e+]*\)$/\1/p' scrape.txt)
adm=$(sed -n 's/^shardrec_train_table_ids_total{.*table="t2",event="admitted"} \([0-9.e+]*\)$/\1/p' scrape.txt)
python3 -c "import sys; r, a = float(sys.argv[1]), float(sys.argv[2]); sys.exit(not (0 < r <= 60 and a >= r))" \
  "${rows:-x}" "${adm:-x}" 2>/dev/null || fail "/metrics: t2 rows '$rows', admitted '$adm': $(grep table scrape.txt | head -3)"

# Refusals.
for bad in "--evict mru" "--capacity -1" "--admit-after x"; do
  set +e
  # shellcheck disable=SC2086
  "$B" train "${COMMON[@]}" $bad >bad.log 2>&1
  rc=$?
  set -e
  [ "$rc" = 2 ] || fail "train $bad exited $rc, not 2: $(tail -2 bad.log)"
done
refused planflag "$B" train "${COMMON[@]}" --plan row.json --capacity 5
has planflag '"keep" field'
# Shard servers remove no rows: a job with bounded tables on them is refused at start.
run plan1 "$B" plan --raw-data-file d.tsv --seed 5 "${BOUNDS[@]}" --out one.json
"$B" serve --listen 127.0.0.1:0 --plan one.json --shard 0 >srv1.out 2>srv1.log &
SRV=$!
listening1() { grep -qs '^listening on ' srv1.out || ! kill -0 "$SRV" 2>/dev/null; }
wait_for 20 listening1 || fail "serve --plan one.json did not start: $(cat srv1.log)"
refused remote "$B" train "${COMMON[@]}" --plan one.json \
  --shard-servers "$(sed -n 's/^listening on //p' srv1.out | head -1)"
has remote "the remote store cannot do"
kill "$SRV"
wait "$SRV" 2>/dev/null || true
SRV=
echo "ok"
