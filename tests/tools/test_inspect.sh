#!/bin/bash
# shardrec inspect on checkpoints of both layouts: --rows prints the asked
# rows from the in-process store's table files as from RocksDB shard
# databases (the same rows, the same values: the two runs train the same
# bits); a --table the checkpoint's plan (or a data folder's databases) does
# not have is refused, naming it. The data transform is read against the
# fingerprint the manifest records: a transform.bin removed or changed is
# named, exit 1, never "none recorded" or a fingerprint of other bytes.
set -euo pipefail
. "${BASH_SOURCE%/*}/../support/lib.sh"

B=${SHARDREC_BIN:?run through ctest (SHARDREC_BIN)}
W=$(mktemp -d /tmp/shardrec-inspect-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
cd "$W"

run gen "$B" datagen --rows 2000 --seed 1 --test-fraction 0.1 --out d.tsv
run conv "$B" convert --test-fraction 0.1 d.tsv d.bin
TRAIN=(--processed-data-file d.bin --mini-batch-size 64 --print-freq 1000 --test-freq 0
  --dense-threads 1 --dense-isa baseline --num-batches 10)
run tf "$B" train "${TRAIN[@]}" --save-checkpoint tf
run db "$B" train "${TRAIN[@]}" --data-dir live --save-checkpoint db
[ -f tf/step-10/shards/table-2.bin ] && [ -f db/step-10/shards/shard-0/CURRENT ] ||
  fail "tf and db are not table files and RocksDB databases"

# rows LOG: the printed rows, "ROW TABLE VALUES" sorted (where they sit dropped).
rows() { sed -n 's/^  row \([0-9]*\) (table_id \([0-9]*\), [^)]*):/\1 \2/p' "$1.log" | sort; }
ROWS=$(seq -s, 0 40)
for K in tf db; do run "$K-rows" "$B" inspect "$K" --table 2 --rows "$ROWS"; done
rows tf-rows >tf.rows
rows db-rows >db.rows
N=$(wc -l <db.rows)
[ "$N" -ge 20 ] || fail "db: $N of rows 0..40 of table 2 printed"
grep -q '^5 2  *value \[-\?0\.[0-9]' db.rows || fail "db: row 5 of table 2 has no values: $(head -2 db.rows)"
cmp -s tf.rows db.rows || fail "table files' rows differ from the databases': $(diff tf.rows db.rows | head -4)"
has tf-rows "(table_id 2, local): value ["
# Every table: rows of several tables.
run tf-all "$B" inspect tf --rows 1
[ "$(grep -c '^  row 1 (table_id' tf-all.log)" -ge 20 ] || fail "tf: row 1 of fewer than 20 tables"

# A table the plan does not have: refused, naming it, nothing counted.
for K in tf db; do
  refused "$K-999" "$B" inspect "$K" --table 999 --rows 1
  has "$K-999" "--table 999: the checkpoint's plan has no table_id 999 (its 26 tables)"
  ! grep -q "total" "$K-999.log" || fail "$K --table 999: a total printed"
done
refused live-999 "$B" inspect live --table 999
has live-999 "no shard database holds table_id 999"
run live-2 "$B" inspect live --table 2
has live-2 "table_id 2 "

# The data transform: the recorded one, then a removed and a changed file.
run xf "$B" inspect tf
FP=$(sha256sum tf/step-10/transform.bin | cut -d' ' -f1)
has xf "data transform: $FP: dictionary (frequency threshold 1"
cp -r tf/step-10 gone
rm gone/transform.bin
refused gone "$B" inspect gone
has gone "data transform: gone/transform.bin: cannot read"
! grep -q "none recorded" gone.log || fail "a removed transform.bin read as none recorded"
cp -r tf/step-10 changed
python3 - changed/transform.bin <<'PY'
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
b[300] ^= 1
open(sys.argv[1], 'wb').write(b)
PY
refused changed "$B" inspect changed
has changed "data transform: changed/transform.bin: fingerprint "
has changed "the manifest says ${FP:0:12} (file changed)"
! grep -q "^data transform: " changed.log || fail "a changed transform.bin printed: $(grep '^data' changed.log)"
echo "inspect: table files' rows as the databases', unknown tables refused, the transform checked"
