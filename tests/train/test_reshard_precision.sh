#!/bin/bash
# reshard --precision converts a checkpoint's embedding weights, both
# layouts (the in-process store's table files and the shard store's RocksDB
# rows), onto a plan of 2 shards: every weight of the new checkpoint is the
# source's weight rounded to the nearest value of the new precision (bf16,
# fp16), read back as such by inspect; its plan says the precision, so
# predict scores it (close to the fp32 model, not the same bits) and a
# training run of that precision resumes from it; converted back to fp32,
# the weights are the 16-bit values exactly. The same fp16 rows as table
# files and as RocksDB rows verify with the same checksums. Without
# --precision a plan of another precision is refused naming the precision,
# and a bad --precision value is a usage error (exit 2).
set -euo pipefail
. "${BASH_SOURCE%/*}/../support/lib.sh"

B=${SHARDREC_BIN:?run through ctest (SHARDREC_BIN)}
W=$(mktemp -d /tmp/shardrec-rsprec-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
cd "$W"

run gen "$B" datagen --rows 4000 --seed 1 --test-fraction 0.1 --out d.tsv
run conv "$B" convert --test-fraction 0.1 d.tsv d.bin
TRAIN=(--processed-data-file d.bin --mini-batch-size 128 --print-freq 1000 --test-freq 0
  --dense-threads 1 --dense-isa baseline)
PRED=(--dense-threads 1 --dense-isa baseline --processed-data-file d.bin --data-split test)
run tf "$B" train "${TRAIN[@]}" --num-batches 20 --save-checkpoint tf --test-pred-out tf.pred
run db "$B" train "${TRAIN[@]}" --num-batches 20 --data-dir db --save-checkpoint db
run plan "$B" plan --processed-data-file d.bin --num-shards 2 --out p2.json
run plan16 "$B" plan --processed-data-file d.bin --num-shards 2 --arch-embedding-precision bf16 \
  --out p2-bf16.json
ROWS="$(seq -s, 0 255)"

# near SRC_LOG DST_LOG PREC: every weight inspect printed in DST_LOG is the
# nearest PREC value of the one in SRC_LOG (rows matched by table and id).
near() {
  python3 - "$@" <<'PY'
import re, struct, sys
src, dst, prec = sys.argv[1:4]
def rows(path):
    out = {}
    for line in open(path):
        m = re.search(r'row (\d+) \(table_id (\d+).*value \[([^\]]*)\]', line)
        if m:
            out[(m.group(2), m.group(1))] = [float(x) for x in m.group(3).split()]
    return out
def nearest(v):
    if prec == 'fp16':
        return struct.unpack('<e', struct.pack('<e', v))[0]
    if prec == 'fp32':
        return v
    u = struct.unpack('<I', struct.pack('<f', v))[0]
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000
    return struct.unpack('<f', struct.pack('<I', u))[0]
a, b = rows(src), rows(dst)
assert len(a) >= 150 and sorted(a) == sorted(b), (len(a), len(b))
changed = 0
for k in a:
    for x, y in zip(a[k], b[k]):
        # inspect prints 9 digits: a float within 1e-8 relative of its value
        assert abs(nearest(x) - y) <= 1e-7 * abs(y), (k, x, y, nearest(x))
        changed += x != y
assert changed > 0 or prec == 'fp32', 'no weight changed'
PY
}

# near_files SRC DST PREC: table 2's file (dim 16, no state) in checkpoint
# DST holds each row of SRC's with every weight the nearest PREC value of
# SRC's, bit for bit (records: u64 row id, then the weights, after a
# 256-byte header, before a 32-byte trailer).
near_files() {
  python3 - "$@" <<'PY'
import struct, sys
src, dst, prec = sys.argv[1:4]
def recs(path, wb):
    b = open(path + '/step-20/shards/table-2.bin', 'rb').read()[256:-32]
    n = 8 + 16 * wb
    assert len(b) % n == 0, (path, len(b))
    return {struct.unpack_from('<Q', b, i)[0]: b[i + 8:i + n] for i in range(0, len(b), n)}
a = recs(src, 4)
b = recs(dst, 4 if prec == 'fp32' else 2)
assert len(a) > 100 and sorted(a) == sorted(b), (len(a), len(b))
for k, v in a.items():
    for j in range(16):
        x = struct.unpack_from('<f', v, 4 * j)[0]
        if prec == 'fp16':
            want = struct.pack('<e', x)
        else:
            u = struct.unpack_from('<I', v, 4 * j)[0]
            want = struct.pack('<H', ((u + 0x7fff + ((u >> 16) & 1)) >> 16) & 0xffff)
        got = b[k][2 * j:2 * j + 2]
        assert got == want, (k, j, x, got.hex(), want.hex())
PY
}

for K in tf db; do
  run "$K-rows" "$B" inspect "$K" --table 2 --rows "$ROWS"
  for P in bf16 fp16; do
    run "$K-$P" "$B" reshard --from "$K" --to "$K-$P" --plan p2.json --precision "$P"
    if [ "$K" = tf ]; then
      near_files tf "tf-$P" "$P" || fail "tf -> $P: a weight is not the nearest $P value"
    else
      run "db-$P-rows" "$B" inspect "db-$P" --table 2 --rows "$ROWS"
      near db-rows.log "db-$P-rows.log" "$P" || fail "db -> $P: a weight is not the nearest $P value"
    fi
    has "$K-$P" "verified 26/26 tables ok"
    run "$K-$P-pred" "$B" predict "${PRED[@]}" --checkpoint "$K-$P" --out "$K-$P.pred"
    ! cmp -s tf.pred "$K-$P.pred" || fail "$K -> $P: predictions are fp32's bits"
    python3 - tf.pred "$K-$P.pred" <<'PY' || fail "$K -> $P: predictions far from fp32's"
import sys
a = [float(x) for x in open(sys.argv[1])]
b = [float(x) for x in open(sys.argv[2])]
assert len(a) == len(b) == 400 and max(abs(x - y) for x, y in zip(a, b)) < 0.01
PY
  done
  [ "$K" = db ] && has "db-bf16-rows" "row layout v2: dim 16 bf16"
  # Back to fp32: exactly the 16-bit values, the same predictions.
  run "$K-back" "$B" reshard --from "$K-bf16" --to "$K-back" --plan p2.json --precision fp32
  if [ "$K" = db ]; then
    run db-back-rows "$B" inspect db-back --table 2 --rows "$ROWS"
    near db-bf16-rows.log db-back-rows.log fp32 || fail "db: bf16 -> fp32 changed a weight"
  else
    python3 - <<'PY' || fail "tf: bf16 -> fp32 changed a weight"
import struct
def body(p):
    return open(p + '/step-20/shards/table-2.bin', 'rb').read()[256:-32]
h, f = body('tf-bf16'), body('tf-back')
assert len(h) // 40 == len(f) // 72 > 100
for r in range(len(h) // 40):
    assert h[40 * r:40 * r + 8] == f[72 * r:72 * r + 8]
    for j in range(16):
        (x,) = struct.unpack_from('<H', h, 40 * r + 8 + 2 * j)
        (y,) = struct.unpack_from('<I', f, 72 * r + 8 + 4 * j)
        assert y == x << 16, (r, j, hex(x), hex(y))
PY
  fi
done
# The same fp16 rows in both layouts (the two runs trained the same rows)
# give each table the same checksum, converted to fp16 and resharded again
# onto 3 shards: a 16-bit row is hashed as its 16-bit values in both.
run plan3-fp16 "$B" plan --processed-data-file d.bin --num-shards 3 --arch-embedding-precision fp16 \
  --out p3-fp16.json
for K in tf db; do
  run "$K-fp16-3" "$B" reshard --from "$K-fp16" --to "$K-fp16-3" --plan p3-fp16.json
  for L in "$K-fp16" "$K-fp16-3"; do grep '^verify table_id' "$L.log" >"$L.sums" || true; done
done
[ -f tf-fp16-3/step-20/shards/table-0.bin ] && [ -f db-fp16-3/step-20/shards/shard-2/CURRENT ] ||
  fail "tf-fp16-3 and db-fp16-3 are not table files and RocksDB databases"
for L in fp16 fp16-3; do
  [ "$(wc -l <"tf-$L.sums")" = 26 ] || fail "tf-$L: $(wc -l <"tf-$L.sums") tables verified, not 26"
  cmp -s "tf-$L.sums" "db-$L.sums" ||
    fail "the same fp16 rows as table files and as RocksDB rows: other checksums: $(diff "tf-$L.sums" "db-$L.sums" | head -4)"
done

N=$(grep -o '"precision":[[:space:]]*"bf16"' tf-bf16/step-20/manifest.json | wc -l)
[ "$N" = 26 ] || fail "the converted checkpoint's plan gives $N of 26 tables bf16"

# A bf16 run resumes from the converted checkpoint.
run resume "$B" train "${TRAIN[@]}" --num-batches 25 --resume tf-bf16 --plan p2-bf16.json \
  --save-checkpoint resumed
[ -f resumed/step-25/DONE ] || fail "no step-25 checkpoint after resuming from tf-bf16"

refused plan-prec "$B" reshard --from tf --to x --plan p2-bf16.json
has plan-prec "precision"
[ ! -e x ] || fail "a refused reshard left x"
RC=0
"$B" reshard --from tf --to y --plan p2.json --precision fp8 >bad.out 2>bad.log || RC=$?
[ "$RC" = 2 ] || fail "--precision fp8: exit $RC, not 2"
has bad "--precision: 'fp8' is not fp32, fp16 or bf16"
[ ! -e y ] || fail "a bad --precision left y"
echo "reshard --precision: bf16 and fp16 conversions of table files and RocksDB rows checked"
