#!/bin/bash
# 16-bit embedding weights (--arch-embedding-precision fp16 and bf16) give
# the same bits wherever the rows live and however the step is computed:
# for each precision, the dense.bin and test AUC of one run (in process, one
# shard, one dense thread, baseline kernels) are those of runs with 3
# shards, with 2 shard servers, with the RocksDB shard store under a cache
# of a tenth of the rows the run touches, with 2 dense threads, and of a run
# resumed from its step-30 checkpoint; with the AVX2 kernels (where the CPU
# has them), a run on 3 shards and 2 threads is that of 1 shard and 1.
# Asserts too that the precision is in effect (fp16, bf16 and fp32 runs
# differ), that every weight in RocksDB is a value of its format (row
# layout v2), that the table files of a checkpoint hold 2 bytes a weight,
# and that predict scores a 16-bit checkpoint as train did: in process,
# from the shard store's checkpoint, from both resharded onto 2 shards and
# through serve --checkpoint.
set -euo pipefail
. "${BASH_SOURCE%/*}/../support/lib.sh"

B=${SHARDREC_BIN:?run through ctest (SHARDREC_BIN)}
W=$(mktemp -d /tmp/shardrec-half-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
cd "$W"

listening() { grep -qs '^listening on ' "$1"; }
up_or_gone() { listening "$1" || ! kill -0 "$2" 2>/dev/null; }

# start_server NAME PLAN SHARD: a shard server on loopback; its address in
# $NAME.addr once it listens.
start_server() {
  "$B" serve --listen 127.0.0.1:0 --plan "$2" --shard "$3" --checkpoint-root "$W" \
    >"$1.out" 2>"$1.log" &
  PIDS+=($!)
  wait_for 20 up_or_gone "$1.out" "$!" || fail "server $1 did not start: $(cat "$1.log")"
  listening "$1.out" || fail "server $1 stopped: $(cat "$1.log")"
  sed -n 's/^listening on //p' "$1.out" | head -1 >"$1.addr"
}

dense_sha() { sha256sum "$1"/step-"$2"/dense.bin | cut -d' ' -f1; }
auc_of() { sed -n 's/^test .* auc \([0-9.]*\).*/\1/p' "$1.log" | tail -1; }

run gen "$B" datagen --rows 12000 --seed 1 --test-fraction 0.1 --out d.tsv
run conv "$B" convert --test-fraction 0.1 d.tsv d.bin
STEPS=60
TRAIN=(--processed-data-file d.bin --mini-batch-size 128 --print-freq 1000 --test-freq 0)
ONE=(--dense-threads 1 --dense-isa baseline)
AVX2=0
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && AVX2=1

run fp32 "$B" train "${TRAIN[@]}" "${ONE[@]}" --num-batches $STEPS --save-checkpoint F32

# same NAME BASE [DIR]: run NAME's dense.bin at step $STEPS (in its
# checkpoint DIR, NAME by default) and test AUC are run BASE's.
same() {
  [ "$(dense_sha "${3:-$1}" $STEPS)" = "$(dense_sha "$2" $STEPS)" ] ||
    fail "$1: dense.bin differs from $2's"
  [ "$(auc_of "$1")" = "$(auc_of "$2")" ] && [ -n "$(auc_of "$1")" ] ||
    fail "$1: test AUC $(auc_of "$1"), $2's $(auc_of "$2")"
}

for P in fp16 bf16; do
  T=("${TRAIN[@]}" --arch-embedding-precision "$P")
  run "$P" "$B" train "${T[@]}" "${ONE[@]}" --num-batches $STEPS --save-checkpoint "$P" \
    --test-pred-out "$P.pred"
  [ "$(dense_sha "$P" $STEPS)" != "$(dense_sha F32 $STEPS)" ] || fail "$P: the same bits as fp32"
  run "$P-shards3" "$B" train "${T[@]}" "${ONE[@]}" --num-batches $STEPS --num-shards 3 \
    --save-checkpoint "$P-shards3"
  same "$P-shards3" "$P"

  run "$P-plan" "$B" plan --processed-data-file d.bin --num-shards 2 --arch-embedding-precision "$P" \
    --out "$P-plan.json"
  start_server "$P-s0" "$P-plan.json" 0
  start_server "$P-s1" "$P-plan.json" 1
  run "$P-remote" "$B" train "${T[@]}" "${ONE[@]}" --num-batches $STEPS --plan "$P-plan.json" \
    --shard-servers "$(cat "$P-s0.addr"),$(cat "$P-s1.addr")" --save-checkpoint "$P-remote"
  same "$P-remote" "$P"

  # The shard store: first with room for every row (to count the rows the
  # run touches), then with a cache of a tenth of them.
  run "$P-db" "$B" train "${T[@]}" "${ONE[@]}" --num-batches $STEPS --data-dir "$P-db" \
    --save-checkpoint "$P-db-ck"
  same "$P-db" "$P" "$P-db-ck"
  run "$P-inspect" "$B" inspect "$P-db"
  TOUCHED=$(sed -n 's/^total *\([0-9]*\) rows.*/\1/p' "$P-inspect.log")
  [ "${TOUCHED:-0}" -ge 10240 ] || fail "$P: $TOUCHED rows touched, too few for a cache of a tenth"
  has "$P-inspect" "row layout v2: dim 16 $P, optimizer state 0"
  run "$P-cache" "$B" train "${T[@]}" "${ONE[@]}" --num-batches $STEPS --data-dir "$P-cdb" \
    --cache-rows $((TOUCHED / 10)) --save-checkpoint "$P-cache"
  same "$P-cache" "$P"

  run "$P-threads" "$B" train "${T[@]}" --dense-threads 2 --dense-isa baseline \
    --num-batches $STEPS --save-checkpoint "$P-threads"
  same "$P-threads" "$P"
  # The AVX2 kernels round the dot interaction otherwise than the baseline
  # (fp32 runs differ too: DESIGN.md, "Threads change speed, never bits"):
  # under them, 1 shard and 1 thread against 3 shards and 2 threads.
  if [ $AVX2 = 1 ]; then
    run "$P-avx2" "$B" train "${T[@]}" --dense-threads 1 --dense-isa avx2 \
      --num-batches $STEPS --save-checkpoint "$P-avx2"
    run "$P-avx2-b" "$B" train "${T[@]}" --dense-threads 2 --dense-isa avx2 --num-shards 3 \
      --num-batches $STEPS --save-checkpoint "$P-avx2-b"
    same "$P-avx2-b" "$P-avx2"
  fi

  run "$P-half" "$B" train "${T[@]}" "${ONE[@]}" --num-batches 30 --save-checkpoint "$P-r"
  run "$P-resume" "$B" train "${T[@]}" "${ONE[@]}" --num-batches $STEPS --resume "$P-r/step-30" \
    --save-checkpoint "$P-r"
  same "$P-resume" "$P" "$P-r"

  # Every stored weight is a value of the format (the shard store's rows,
  # as inspect prints them).
  run "$P-rows" "$B" inspect "$P-db" --table 2 --rows "$(seq -s, 0 199)"
  python3 - "$P" "$P-rows.log" <<'PY' || fail "$P: a stored weight is not of its format"
import re, struct, sys
prec, path = sys.argv[1], sys.argv[2]
def nearest(v):  # the nearest value of the format
    if prec == 'fp16':
        return struct.unpack('<e', struct.pack('<e', v))[0]
    u = struct.unpack('<I', struct.pack('<f', v))[0]
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000
    return struct.unpack('<f', struct.pack('<I', u))[0]
n = 0
for line in open(path):
    m = re.search(r'value \[([^\]]*)\]', line)
    if not m:
        continue
    for s in m.group(1).split():
        v = float(s)  # printed to 8 digits: within 1e-8 of the weight
        assert abs(nearest(v) - v) <= 1e-7 * abs(v), (s, nearest(v))
        n += 1
assert n >= 16 * 100, n
PY

  # The checkpoints hold 16-bit weights: the in-process store's table files
  # (2 bytes a weight against 4: records of 8 + 32 bytes against 8 + 64),
  # and they score as the trainer did, in process, from the shard store's
  # checkpoint and through a server serving the checkpoint.
  python3 - "F32/step-$STEPS/shards" "$P/step-$STEPS/shards" <<'PY' || fail "$P: table file sizes"
import os, sys
def size(d):
    fs = [f for f in os.listdir(d) if f.startswith('table-')]
    assert len(fs) == 26, fs
    return sum(os.path.getsize(os.path.join(d, f)) - 256 - 32 for f in fs)
a, b = size(sys.argv[1]), size(sys.argv[2])
assert a % 72 == 0 and b % 40 == 0 and a // 72 == b // 40 > 0, (a, b)
print('table files: %d bytes of records in fp32, %d in 16 bits' % (a, b))
PY
  run "$P-predict" "$B" predict "${ONE[@]}" --checkpoint "$P/step-$STEPS" --processed-data-file d.bin \
    --data-split test --out "$P-predict.tsv"
  cmp -s "$P.pred" "$P-predict.tsv" || fail "$P: predict from the checkpoint differs from train's"
  run "$P-predict-db" "$B" predict "${ONE[@]}" --checkpoint "$P-db-ck/step-$STEPS" --processed-data-file d.bin \
    --data-split test --out "$P-predict-db.tsv"
  cmp -s "$P.pred" "$P-predict-db.tsv" || fail "$P: predict from the shard store's checkpoint differs"
  # Resharded onto the 2-shard plan (RocksDB rows and table files moved as
  # they are, 16 bits): the same predictions.
  for K in db-ck tf; do
    SRC="$P-db-ck"
    [ $K = tf ] && SRC="$P"
    run "$P-reshard-$K" "$B" reshard --from "$SRC/step-$STEPS" --to "$P-rs-$K" --plan "$P-plan.json"
    run "$P-predict-rs-$K" "$B" predict "${ONE[@]}" --checkpoint "$P-rs-$K" --processed-data-file d.bin \
      --data-split test --out "$P-predict-rs-$K.tsv"
    cmp -s "$P.pred" "$P-predict-rs-$K.tsv" || fail "$P: predict from the resharded $K checkpoint differs"
  done
  "$B" serve --listen 127.0.0.1:0 --checkpoint "$P/step-$STEPS" --shard 0 --read-only \
    >"$P-cs.out" 2>"$P-cs.log" &
  PIDS+=($!)
  wait_for 20 up_or_gone "$P-cs.out" "$!" && listening "$P-cs.out" ||
    fail "$P: serve --checkpoint did not start: $(cat "$P-cs.log")"
  run "$P-predict-rpc" "$B" predict "${ONE[@]}" --checkpoint "$P/step-$STEPS" --processed-data-file d.bin \
    --data-split test --out "$P-predict-rpc.tsv" \
    --shard-servers "$(sed -n 's/^listening on //p' "$P-cs.out" | head -1)"
  cmp -s "$P.pred" "$P-predict-rpc.tsv" || fail "$P: predict through a server differs"
done
[ "$(dense_sha fp16 $STEPS)" != "$(dense_sha bf16 $STEPS)" ] || fail "fp16 and bf16: the same bits"
echo "test AUC at step $STEPS: fp32 $(auc_of fp32), fp16 $(auc_of fp16), bf16 $(auc_of bf16)"
