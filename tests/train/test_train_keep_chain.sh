#!/bin/bash
# Incremental checkpoints of a job with bounded tables (train --admit-after
# / --expire-after / --capacity with --full-checkpoint-every): increments
# record the rows removed since their parent (shards/removed-<id>.bin) and
# every reader of a chain honours them in chain order.
#
# Asserts: with --full-checkpoint-every 3 --checkpoint-every 5 step-0 and
# step-15 are full and step-5/10/20/25 incremental, each naming the one
# before; the increments list removed rows in their manifests, and the
# chained run trains as the run whose checkpoints are all full (losses,
# bounded-table counts, test predictions); a resume from the newest
# increment (step-25: a full checkpoint and 2 increments) ends with every
# file of its last checkpoint (dense.bin, table files, keep.bin, manifest)
# equal to the uninterrupted run's, its last losses, AUC and counts the
# same; fold of step-25 equals the full step-25 file for file (so the same
# rows per table); predict of the head scores the test split as training
# did at that step; inspect of an increment counts its removed rows; on
# the RocksDB shard store (3 shards) the increments hold the same files as
# the in-process store's and a resume from step-25 on a fresh data folder
# ends with the uninterrupted run's predictions; a run resumed from the
# head resharded to 3 shards row-wise, and one resumed on 2 fresh shard
# servers from the servers' own chain (each server's increment listing its
# removed rows), end with those predictions too; two ranks with colocated
# shards (mpirun -np 2) resumed from their own chain's step-25 end with
# their uninterrupted run's predictions and counts; serve --checkpoint
# --follow of the chain swaps to each increment past the served step and
# then answers as predict of that step does (removed rows read zeros).
set -euo pipefail
. "${BASH_SOURCE%/*}/../support/lib.sh"

B=${SHARDREC_BIN:?run through ctest (SHARDREC_BIN)}
W=$(mktemp -d /tmp/shardrec-keepchain-XXXXXX)
SRV=
cleanup() {
  # shellcheck disable=SC2086
  [ -z "$SRV" ] || kill $SRV 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
cd "$W"

# same_files A B: the same files under folders A and B, each byte for byte.
same_files() {
  (cd "$1" && find . -type f | sort) >files.a
  (cd "$2" && find . -type f | sort) >files.b
  diff -q files.a files.b >/dev/null || fail "$1 and $2 hold other files: $(diff files.a files.b | head -4)"
  while read -r f; do cmp -s "$1/$f" "$2/$f" || fail "$1/$f differs from $2/$f"; done <files.a
}
kind_of() { tr -d ' \t\n' <"$1/manifest.json" | sed -n 's/.*"kind":"\([a-z]*\)".*/\1/p'; }
parent_of() { tr -d ' \t\n' <"$1/manifest.json" | sed -n 's/.*"parent":{"step":\([0-9]*\),.*/\1/p'; }
losses() { grep -o '"loss":[^,]*' "$1.jsonl"; }
keeps() { grep -o '"keep":.*' "$1.jsonl"; }
aucs() { grep -o '"auc":[^,]*' "$1.jsonl"; }

run datagen "$B" datagen --rows 4000 --out d.tsv --seed 3
BOUNDS=(--admit-after 3 --expire-after 4 --capacity 60)
T=(--raw-data-file d.tsv --mini-batch-size 128 --print-freq 3 --seed 5 --checkpoint-every 5)
# train_plan NAME FLAGS...: a run, its metrics and test predictions kept.
train_plan() {
  local name=$1
  shift
  run "$name" "$B" train "${T[@]}" --metrics-out "$name.jsonl" --test-pred-out "$name.pred" "$@"
}
# train NAME FLAGS...: the same with the bounds given as flags.
train() { train_plan "$@" "${BOUNDS[@]}"; }

# ---- the uninterrupted run (every checkpoint full) and the chained one ----
train full --save-checkpoint U
train chain --save-checkpoint C --full-checkpoint-every 3 --num-batches 25
for s in 0 15; do [ "$(kind_of C/step-$s)" = full ] || fail "C/step-$s is not full"; done
prev=0
for s in 5 10 20 25; do
  [ "$(kind_of C/step-$s)" = incremental ] || fail "C/step-$s is not incremental"
  [ "$(parent_of C/step-$s)" = $prev ] || fail "C/step-$s names parent '$(parent_of C/step-$s)', not $prev"
  grep -q '"shards/removed-[0-9]*\.bin"' C/step-$s/manifest.json ||
    fail "C/step-$s lists no removed rows: $(find C/step-$s/shards -name "removed-*" | head -3)"
  prev=$s
  [ $s != 10 ] || prev=15
done
# (the lines up to step 24: the chained run's last, at step 25, is the uninterrupted run's step 27's)
diff <(losses full | head -8) <(losses chain | head -8) >/dev/null || fail "the chained run's losses differ"
diff <(keeps full | head -8) <(keeps chain | head -8) >/dev/null || fail "the chained run's counts differ"

# ---- resume from the newest increment ----
cp -r C R
train resumed --save-checkpoint R --full-checkpoint-every 3 --auto-resume
has resumed "resume R/step-25: step 25"
same_files U/step-27 R/step-27
cmp -s resumed.pred full.pred || fail "the resumed run's test predictions differ"
[ "$(losses resumed | tail -1)" = "$(losses full | tail -1)" ] || fail "the resumed run's last loss differs"
[ "$(aucs resumed)" = "$(aucs full | tail -1)" ] || fail "the resumed run's AUC differs: $(aucs resumed)"
[ "$(keeps resumed | tail -1)" = "$(keeps full | tail -1)" ] || fail "the resumed run's counts differ"

# ---- fold, predict, inspect ----
run fold "$B" fold --from C/step-25 --to F
same_files U/step-25 F/step-25
run predict "$B" predict --checkpoint C/step-25 --raw-data-file d.tsv --data-split test --out p.tsv
cmp -s p.tsv chain.pred || fail "predict of C/step-25 scores otherwise than training did"
run inspect "$B" inspect C/step-25
n=$(find C/step-25/shards -name 'removed-*.bin' | wc -l)
has inspect "removed rows since its parent: "
grep -q "in $n tables" inspect.log || fail "inspect does not count $n tables of removed rows: $(grep removed inspect.log)"

# ---- the RocksDB shard store ----
train db --save-checkpoint D --full-checkpoint-every 3 --num-batches 25 \
  --num-shards 3 --data-dir db --cache-rows 1024
for s in 5 10 20 25; do
  [ "$(kind_of D/step-$s)" = incremental ] || fail "D/step-$s is not incremental"
  same_files C/step-$s/shards D/step-$s/shards
done
train dbres --num-shards 3 --data-dir dbres --cache-rows 1024 --resume D/step-25
cmp -s dbres.pred full.pred || fail "the shard store's resumed run's predictions differ"

# ---- reshard of the chain's head ----
run plan3 "$B" plan --raw-data-file d.tsv --seed 5 --num-shards 3 --row-wise "${BOUNDS[@]}" --out row.json
run reshard "$B" reshard --from C/step-25 --to RS --plan row.json
train_plan resharded --plan row.json --resume RS
cmp -s resharded.pred full.pred || fail "the run resumed from the resharded head differs"

# ---- two shard servers (Checkpoint and Restore over RPC) ----
run plan2 "$B" plan --raw-data-file d.tsv --seed 5 --num-shards 2 --row-wise "${BOUNDS[@]}" --out two.json
mkdir ckr
# servers2: 2 fresh in-memory servers of two.json (addresses in $addrs); servers2_down ends them.
servers2() {
  rm -f srv0.out srv1.out
  for k in 0 1; do
    "$B" serve --listen 127.0.0.1:0 --plan two.json --shard "$k" --checkpoint-root "$W/ckr" \
      >"srv$k.out" 2>"srv$k.log" &
    SRV="$SRV $!"
  done
  # shellcheck disable=SC2086
  listening2() { [ "$(grep -ls '^listening on ' srv0.out srv1.out | wc -l)" = 2 ] || ! kill -0 $SRV 2>/dev/null; }
  wait_for 20 listening2 || fail "serve --plan two.json did not start: $(cat srv0.log srv1.log)"
  addrs=$(sed -n 's/^listening on //p' srv0.out | head -1),$(sed -n 's/^listening on //p' srv1.out | head -1)
}
servers2_down() {
  # shellcheck disable=SC2086
  kill $SRV
  wait 2>/dev/null || true
  SRV=
}
servers2
train_plan remote --plan two.json --shard-servers "$addrs" --save-checkpoint "$W/ckr/R" \
  --full-checkpoint-every 3 --num-batches 25
servers2_down
[ "$(kind_of ckr/R/step-25)" = incremental ] || fail "the servers' step-25 is not incremental"
compgen -G 'ckr/R/step-25/shards/shard-*/removed-*.bin' >/dev/null ||
  fail "the servers' step-25 lists no removed rows: $(find ckr/R/step-25/shards | head -4)"
servers2
train_plan remote_res --plan two.json --shard-servers "$addrs" --resume "$W/ckr/R/step-25"
servers2_down
cmp -s remote_res.pred full.pred || fail "the run resumed on the servers from their step-25 differs"

# ---- two ranks with colocated shards (mpirun) ----
if command -v mpirun >/dev/null; then
  MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
  run colo "${MPIRUN[@]}" "$B" train "${T[@]}" --plan two.json --colocate-shards \
    --metrics-out colo.jsonl --test-pred-out colo.pred
  run colo_chain "${MPIRUN[@]}" "$B" train "${T[@]}" --plan two.json --colocate-shards \
    --save-checkpoint K --full-checkpoint-every 3 --num-batches 25
  [ "$(kind_of K/step-25)" = incremental ] || fail "the colocated run's step-25 is not incremental"
  run colo_res "${MPIRUN[@]}" "$B" train "${T[@]}" --plan two.json --colocate-shards \
    --save-checkpoint K --full-checkpoint-every 3 --auto-resume --metrics-out colo_res.jsonl \
    --test-pred-out colo_res.pred
  has colo_res "resume K/step-25: step 25"
  cmp -s colo_res.pred colo.pred || fail "the colocated run resumed from its step-25 differs"
  [ "$(keeps colo_res | tail -1)" = "$(keeps colo | tail -1)" ] || fail "the colocated resumed run's counts differ"
else
  echo "no mpirun: the colocated ranks' chain not checked"
fi

# ---- serve --checkpoint --follow of the chain ----
# serve NAME ARGS...: a following server of FW in the background (log NAME.log),
# its address once it listens in NAME.addr.
serve() {
  local name=$1
  shift
  "$B" serve --shard 0 --listen 127.0.0.1:0 --checkpoint FW --follow --follow-every 0.02 "$@" \
    >"$name.log" 2>&1 &
  SRV="$SRV $!"
  wait_for 20 grep -q '^listening on' "$name.log" || fail "$name did not start: $(tail -3 "$name.log")"
  sed -n 's/^listening on //p' "$name.log" | head -1 >"$name.addr"
}
# served NAME STEP: wait until NAME serves step STEP.
served() {
  wait_for 20 grep -q "step $2 served" "$1.log" || fail "$1 did not swap to step $2: $(tail -3 "$1.log")"
}
# scores NAME STEP: predict against NAME equals predict of C/step-STEP.
scores() {
  run "p$1$2" "$B" predict --checkpoint "C/step-$2" --shard-servers "$(cat "$1.addr")" \
    --raw-data-file d.tsv --data-split test --out "srv$1$2.tsv"
  run "pc$2" "$B" predict --checkpoint "C/step-$2" --raw-data-file d.tsv --data-split test --out "c$2.tsv"
  cmp -s "srv$1$2.tsv" "c$2.tsv" || fail "$1 at step $2 scores otherwise than C/step-$2"
}
# publish STEP: C/step-STEP into FW whole (copied beside, renamed in).
publish() { cp -r "C/step-$1" "FW/.step-$1.tmp" && mv "FW/.step-$1.tmp" "FW/step-$1"; }
mkdir FW
publish 0
publish 5
serve a
publish 10 # one increment past the served step
served a 10
scores a 10
publish 15 # a full checkpoint: the rows it no longer holds go
served a 15
scores a 15
serve h --swap-at-step 25 # from step 15 to 25 in one swap: two increments
publish 20
publish 25
served a 25
served h 25
scores a 25
scores h 25
cmp -s srva25.tsv chain.pred || fail "the follower at step 25 scores otherwise than training did"
# shellcheck disable=SC2086
kill $SRV
wait 2>/dev/null || true
SRV=
echo ok
