#!/bin/bash
# Training day after day: day 1 converted and trained; day 2 converted with
# day 1's dictionaries extended (convert --mapping-from DAY1
# --extend-dictionaries); training resumed on day 2 from the day-1
# checkpoint with the tables grown, in process, on the shard store and on
# shard servers restarted with the grown plan (shardrec plan --grow-from).
#
# Asserts: day 1's dictionaries are a prefix of day 2's and some grew, and
# a row's ids are the same mapped with or without the extension wherever
# the value was known; the three grown resumes end with the same dense.bin,
# which is also that of a job trained on the grown plan from its first
# step (a new row starts as a never-written row); a resume at the
# checkpoint's own step writes back day 1's rows unchanged; a raw day-2
# file is mapped with the checkpoint's transform (the bits of the file
# converted --mapping-from DAY1); a --plan that is not the grown plan, a
# server still serving day 1's plan and a file mapped with other
# dictionaries are refused, each naming what differs; plan --grow-from
# writes the resumed job's plan and takes no model flag; serve --plan GROWN
# --restore starts from day 1's rows; a grown resume into its own
# --save-checkpoint folder starts its chain anew with a full checkpoint,
# and that chain folds; the day-2 job resumed within day 2 under
# --auto-resume, with day 1's flags and no --plan, takes the grown plan from
# its checkpoint and ends with the bits of the job not stopped, and a seed
# that disagrees is refused.
set -euo pipefail
. "${BASH_SOURCE%/*}/../support/lib.sh"

B=${SHARDREC_BIN:?run through ctest (SHARDREC_BIN)}
W=$(mktemp -d /tmp/shardrec-days-XXXXXX)
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

# start_server NAME PLAN SHARD [ARGS...]: a shard server on loopback; its
# address in $NAME.addr once it listens.
start_server() {
  "$B" serve --listen 127.0.0.1:0 --plan "$2" --shard "$3" --checkpoint-root "$W" "${@:4}" \
    >"$1.out" 2>"$1.log" &
  PIDS+=($!)
  echo $! >"$1.pid"
  wait_for 20 up_or_gone "$1.out" "$!" || fail "server $1 did not start: $(cat "$1.log")"
  listening "$1.out" || fail "server $1 stopped: $(cat "$1.log")"
  sed -n 's/^listening on //p' "$1.out" | head -1 >"$1.addr"
}
stop_server() {
  local p
  p=$(cat "$1.pid")
  kill "$p"
  wait "$p" 2>/dev/null || true
}

dense_sha() { sha256sum "$1"/step-"$2"/dense.bin | cut -d' ' -f1; }
auc_of() { sed -n 's/^test .* auc \([0-9.]*\).*/\1/p' "$1.log" | tail -1; }

# ---- day 1 ----
run gen1 "$B" datagen --rows 4000 --seed 1 --test-fraction 0.1 --out d1.tsv
run conv1 "$B" convert --test-fraction 0.1 d1.tsv d1.bin
run plan1 "$B" plan --processed-data-file d1.bin --num-shards 2 --seed 5 --out p1.json
TRAIN=(--mini-batch-size 64 --print-freq 1000 --test-freq 0)
run day1-local "$B" train --processed-data-file d1.bin --plan p1.json "${TRAIN[@]}" \
  --num-batches 30 --save-checkpoint L1
run day1-shard "$B" train --processed-data-file d1.bin --plan p1.json "${TRAIN[@]}" \
  --num-batches 30 --save-checkpoint S1 --data-dir db
start_server a1 p1.json 0
start_server b1 p1.json 1
SERVERS="$(cat a1.addr),$(cat b1.addr)"
run day1-remote "$B" train --processed-data-file d1.bin --plan p1.json "${TRAIN[@]}" \
  --num-batches 30 --save-checkpoint R1 --shard-servers "$SERVERS"
D1=$(dense_sha L1 30)
[ "$(dense_sha S1 30)" = "$D1" ] && [ "$(dense_sha R1 30)" = "$D1" ] ||
  fail "day 1: the three stores' dense.bin differ"

# ---- day 2: converted with day 1's dictionaries, extended ----
run gen2 "$B" datagen --rows 4000 --seed 1 --row-seed 2 --test-fraction 0.1 --out d2.tsv
run conv2 "$B" convert --test-fraction 0.1 --mapping-from L1 --extend-dictionaries d2.tsv d2.bin
run conv2x "$B" convert --test-fraction 0.1 --mapping-from L1 d2.tsv d2x.bin
run conv2o "$B" convert --test-fraction 0.1 d2.tsv d2o.bin
python3 - d1.bin d2.bin d2x.bin <<'EOF' || fail "day 2's dictionaries or ids"
import struct, sys
N = 26
def read(path):
    b = open(path, 'rb').read()
    assert b[:8] == b'SRCRITEO', path
    flags, = struct.unpack_from('<I', b, 12)
    assert flags == 0, (path, 'one-hot 32-bit ids expected')
    n, = struct.unpack_from('<Q', b, 24)
    dict_off, = struct.unpack_from('<Q', b, 72)
    data_off, = struct.unpack_from('<Q', b, 88)
    dict_n = struct.unpack_from('<26Q', b, 112 + 8 * N)
    dicts, o = [], dict_off
    for c in range(N):
        dicts.append(struct.unpack_from('<%dI' % dict_n[c], b, o))
        o += 4 * dict_n[c]
    rec = 56 + 4 * N
    ids = [struct.unpack_from('<26I', b, data_off + i * rec + 56) for i in range(n)]
    return dicts, ids
d1, _ = read(sys.argv[1])
d2, ids2 = read(sys.argv[2])
_, ids2x = read(sys.argv[3])
grew = 0
for c in range(N):
    assert d2[c][:len(d1[c])] == d1[c], 'C%d: day 1 dictionary is not a prefix of day 2' % (c + 1)
    grew += len(d2[c]) > len(d1[c])
assert grew > 0, 'no dictionary grew'
assert len(ids2) == len(ids2x) == 4000
known = new = 0
for r, (ra, rb) in enumerate(zip(ids2, ids2x)):
    for c in range(N):
        a, b = ra[c], rb[c]
        if b:
            assert a == b, 'row %d C%d: id %d extended, %d not' % (r, c + 1, a, b)
            known += 1
        elif a:
            assert a > len(d1[c]), 'row %d C%d: new value got an old id %d' % (r, c + 1, a)
            new += 1
assert known > 0 and new > 0, (known, new)
print('day 2: %d columns grew; %d ids kept, %d new' % (grew, known, new))
EOF

# A file mapped with other dictionaries is refused, naming both mappings.
FP1=$(sed -n 's/^ *mapping \([0-9a-f]\{12\}\)$/\1/p' conv1.log)
FPO=$(sed -n 's/^ *mapping \([0-9a-f]\{12\}\)$/\1/p' conv2o.log)
[ -n "$FP1" ] && [ -n "$FPO" ] || fail "convert printed no mapping"
refused differs "$B" train --resume L1 --processed-data-file d2o.bin "${TRAIN[@]}" --num-batches 50
has differs "$FP1"
has differs "$FPO"
has differs "--mapping-from L1"

# ---- resumed on day 2, tables grown ----
STEPS=50
run day2-local "$B" train --resume L1 --processed-data-file d2.bin "${TRAIN[@]}" \
  --num-batches $STEPS --save-checkpoint L2 --plan-out p2-local.json
has day2-local "extends the checkpoint's $FP1"
# Day 2 is other data than day 1's: read from its beginning, the steps going on.
has day2-local "was trained on other data (bin data crc32"
has day2-local "read d2.bin from its beginning (epoch 0)"
grep -q "^resume .*: step 30, epoch 0, sample 0$" day2-local.log ||
  fail "day 2 is not read from its first sample: $(grep '^resume' day2-local.log)"
# A grown resume into its own --save-checkpoint folder with incremental
# checkpoints: the first one after is full (the folder's table files are
# day 1's plan's, which a restore of the grown plan refuses), and the chain
# after it restores.
cp -r L1 G
run grown-chain "$B" train --resume G --processed-data-file d2.bin "${TRAIN[@]}" \
  --num-batches 42 --save-checkpoint G --checkpoint-every 5 --full-checkpoint-every 3
python3 - G <<'EOF' || fail "the checkpoints after a grown resume into its folder"
import json, sys
kind = lambda s: json.load(open('%s/step-%d/manifest.json' % (sys.argv[1], s)))
assert kind(35)['kind'] == 'full', kind(35).get('parent')
assert kind(40)['kind'] == 'incremental' and kind(40)['parent']['step'] == 35, kind(40)
assert kind(42)['kind'] == 'incremental' and kind(42)['parent']['step'] == 40, kind(42)
EOF
run grown-fold "$B" fold --from G --to GF
# Without --num-batches, --nepochs (1) counts day 2's epochs from the step
# day 2 began at: day 1 stopped at step 30 and day 2's epoch is 57 steps of
# 64 of its 3600 train lines, so the job ends at step 87; resumed within
# day 2 (from a copy of its step-60) it ends there too, with the same bits.
run day2-epoch "$B" train --resume L1 --processed-data-file d2.bin --mini-batch-size 64 \
  --print-freq 1000 --test-freq 0 --save-checkpoint E2 --checkpoint-every 20
[ "$(cd E2 && ls -d step-* | sort -V | tail -1)" = step-87 ] ||
  fail "day 2's epoch did not end at step 87: $(cd E2 && ls -d step-* | sort -V | tr '\n' ' ')"
# That resume (--auto-resume, as a restart policy runs it) needs no --plan:
# the flags say seed and shards as day 1's plan did, and the grown plan's
# init ranges and placement, which a plan made from day 2's sizes would not
# give, come from the checkpoint; a flag that disagrees is still refused.
mkdir E3 && cp -r E2/step-60 E3/
refused day2-other-seed "$B" train --auto-resume --processed-data-file d2.bin --seed 6 \
  --num-shards 2 --mini-batch-size 64 --print-freq 1000 --test-freq 0 --save-checkpoint E3
has day2-other-seed "written for model fingerprint"
run day2-epoch-again "$B" train --auto-resume --processed-data-file d2.bin --seed 5 --num-shards 2 \
  --mini-batch-size 64 --print-freq 1000 --test-freq 0 --save-checkpoint E3
has day2-epoch-again "resume E3/step-60: step 60"
cmp -s E2/plan.json E3/plan.json || fail "the resume within day 2 has not the grown plan"
cmp -s E2/step-87/dense.bin E3/step-87/dense.bin ||
  fail "day 2 resumed within its epoch does not end at step 87 with the same bits"
run day2-shard "$B" train --resume S1 --processed-data-file d2.bin "${TRAIN[@]}" \
  --num-batches $STEPS --save-checkpoint S2 --data-dir db
run grow "$B" plan --grow-from R1 --processed-data-file d2.bin --out p2.json
cmp -s p2.json p2-local.json || fail "plan --grow-from and the resumed job's plan differ"
# The model is the checkpoint's: a model flag beside --grow-from is a usage error.
set +e
"$B" plan --grow-from R1 --processed-data-file d2.bin --seed 4 --out p2-seed.json >grow-seed.log 2>&1
st=$?
set -e
[ "$st" = 2 ] && [ ! -e p2-seed.json ] || fail "plan --grow-from --seed: exit $st"
has grow-seed "no --seed"
# The grown plan is the day-1 plan with more rows: seed, init ranges and
# placement kept.
python3 - p1.json p2.json <<'EOF' || fail "the grown plan"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a['seed'] == b['seed'] and a['n_shards'] == b['n_shards']
more = 0
for x, y in zip(a['tables'], b['tables']):
    assert y['rows'] >= x['rows'], (x['name'], x['rows'], y['rows'])
    more += y['rows'] > x['rows']
    x['rows'] = y['rows']
    assert x == y, (x, y)
assert more > 0
EOF
refused wrong-plan "$B" train --resume R1 --processed-data-file d2.bin --plan p1.json \
  "${TRAIN[@]}" --num-batches $STEPS --shard-servers "$SERVERS"
has wrong-plan "--plan p1.json"
has wrong-plan "rows in it"
# The servers still serve day 1's plan: the resume names one of them.
refused old-servers "$B" train --resume R1 --processed-data-file d2.bin --plan p2.json \
  "${TRAIN[@]}" --num-batches $STEPS --shard-servers "$SERVERS"
grep -qE "$(cat a1.addr)|$(cat b1.addr)" old-servers.log ||
  fail "old-servers: no server address in: $(tail -3 old-servers.log)"
P1FP=$(sed -n 's/^plan fingerprint *//p' plan1.log | cut -c1-12)
P2FP=$(sed -n 's/^plan fingerprint *//p' grow.log | cut -c1-12)
has old-servers "$P1FP"
has old-servers "$P2FP"
stop_server a1
stop_server b1
start_server a2 p2.json 0
start_server b2 p2.json 1
run day2-remote "$B" train --resume R1 --processed-data-file d2.bin --plan p2.json \
  "${TRAIN[@]}" --num-batches $STEPS --save-checkpoint R2 \
  --shard-servers "$(cat a2.addr),$(cat b2.addr)"
echo "day 2 test AUC: in process $(auc_of day2-local), shard store $(auc_of day2-shard)," \
  "servers $(auc_of day2-remote)"
D2=$(dense_sha L2 $STEPS)
# The resumed job's checkpoints record the grown plan and day 2's mapping.
FP2=$(sed -n 's/^ *mapping \([0-9a-f]\{12\}\)$/\1/p' conv2.log)
MFP2=$(sed -n 's/^model fingerprint *//p' grow.log)
python3 - L2/step-$STEPS/manifest.json "$FP2" "$MFP2" <<'EOF' ||
import json, sys
m = json.load(open(sys.argv[1]))
assert sys.argv[2] and m['transform']['fingerprint'].startswith(sys.argv[2]), (m['transform'], sys.argv[2])
assert m['model_fingerprint'] == sys.argv[3], (m['model_fingerprint'], sys.argv[3])
EOF
  fail "the resumed job's checkpoint does not record the grown plan and day 2's mapping"
[ "$(dense_sha S2 $STEPS)" = "$D2" ] || fail "day 2: the shard store's dense.bin differs"
[ "$(dense_sha R2 $STEPS)" = "$D2" ] || fail "day 2: the servers' dense.bin differs"

# serve --plan GROWN --restore: day 1's rows in a server of the grown plan.
start_server c2 p2.json 0 --restore "$W/R1/step-30/shards"
stop_server c2

# The same job on the grown plan from its first step: the same bits.
run whole1 "$B" train --processed-data-file d1.bin --plan p2.json "${TRAIN[@]}" \
  --num-batches 30 --save-checkpoint U1
run whole2 "$B" train --resume U1 --processed-data-file d2.bin --plan p2.json "${TRAIN[@]}" \
  --num-batches $STEPS --save-checkpoint U2
[ "$(dense_sha U2 $STEPS)" = "$D2" ] || fail "the grown plan from the first step gives other bits"

# Resumed at the checkpoint's own step: day 1's rows come back as they were.
run at-step "$B" train --resume L1 --processed-data-file d2.bin "${TRAIN[@]}" \
  --num-batches 30 --save-checkpoint G1
python3 - L1/step-30/shards G1/step-30/shards <<'EOF' || fail "day 1's rows after the resume"
import os, sys
a, b = sys.argv[1:3]
names = sorted(n for n in os.listdir(a) if n.endswith('.bin'))
assert names and names == sorted(n for n in os.listdir(b) if n.endswith('.bin')), names
for n in names:
    x, y = open(os.path.join(a, n), 'rb').read(), open(os.path.join(b, n), 'rb').read()
    # 256-byte header (its model fingerprint is the plan's), records, 32-byte SHA-256
    assert len(x) == len(y) and x[256:-32] == y[256:-32], n
EOF

# A raw day-2 file is mapped with the checkpoint's dictionaries: the bits of
# the file converted --mapping-from L1.
run raw "$B" train --resume L1 --raw-data-file d2.tsv --test-fraction 0.1 --plan p1.json "${TRAIN[@]}" \
  --num-batches $STEPS --save-checkpoint X2
run mapped "$B" train --resume L1 --processed-data-file d2x.bin --plan p1.json "${TRAIN[@]}" \
  --num-batches $STEPS --save-checkpoint M2
[ "$(dense_sha X2 $STEPS)" = "$(dense_sha M2 $STEPS)" ] ||
  fail "a raw file resumed is not mapped as --mapping-from maps it"
echo "ok"
