#!/bin/bash
# Servers that follow training (serve --checkpoint ROOT --follow): two
# following servers of one model, a Python client (tests/rpc/follow_client.py)
# reading each batch's rows from both while a trainer writes 30 checkpoints
# (every 2 steps, every 5th full) into ROOT.
#
# Asserts: the client's every call succeeds; for every batch both answers
# name the same step and every row equals that step's checkpoint (its chain
# folded from the files, never-written rows against a server of the plan's
# fresh rows); Lookup p50/p99 before the trainer and for calls overlapping
# a swap are printed; both servers end on the last checkpoint, each with
# swaps counted on /metrics; a swap of one step's rows (about 1% of the rows
# held) grows the server's RSS by under 5% of its tables' bytes; a step-N
# folder without DONE and a copy of a checkpoint with a damaged table file
# and a checkpoint of another plan (dim 8) are refused by both servers (a
# text line and a JSON event naming the reason,
# shardrec_serve_checkpoints_refused_total{reason="incomplete"},
# {reason="damaged"} and {reason="plan"} 1), which go on answering from the
# last good step; a Lookup asking for a newer step is refused UNAVAILABLE,
# one never held and one of a plan's server FAILED_PRECONDITION, naming the
# steps; a server of one checkpoint (no --follow) names its step, answers a
# Lookup asking for it and refuses another;
# --follow without --checkpoint and --swap-at-step without --follow exit 2;
# with --swap-at-step a server holds its step until that one is complete,
# and so does one told by the admin call SwapAt (a step not above the
# served one refused FAILED_PRECONDITION naming both).
set -euo pipefail
. "${BASH_SOURCE%/*}/../support/lib.sh"

B=${SHARDREC_BIN:?run through ctest (SHARDREC_BIN)}
S=${SHARDREC_SRC:?run through ctest (SHARDREC_SRC)}
PY=/usr/bin/python3
W=$(mktemp -d /tmp/shardrec-follow-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
cd "$W"
T0=$SECONDS

# serve NAME ARGS...: a server in the background (log NAME.log); its
# address once it listens into NAME.addr, its metrics port into NAME.mport.
serve() {
  local name=$1
  shift
  "$B" serve --shard 0 --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 "$@" >"$name.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$name.pid"
  wait_for 60 grep -qE '"event":"start"|^listening on' "$name.log" ||
    fail "$name did not start: $(tail -3 "$name.log")"
  grep -oE '"listen":"127.0.0.1:[0-9]+","plan|^listening on 127.0.0.1:[0-9]+' "$name.log" |
    grep -oE '127.0.0.1:[0-9]+' >"$name.addr"
  grep -oE 'metrics on 127.0.0.1:[0-9]+|"listen":"127.0.0.1:[0-9]+"}' "$name.log" | head -1 |
    grep -oE '[0-9]+$|[0-9]+"}$' | tr -d '"}' >"$name.mport"
}
# metric NAME SERIES: the value of SERIES (a line's start) on NAME's /metrics.
metric() {
  "$PY" -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
    "http://127.0.0.1:$(cat "$1.mport")/metrics" | awk -v s="$2" 'index($0, s" ") == 1 {print $2}'
}
serving() { [ "$(metric "$1" shardrec_serve_checkpoint_step)" = "$2" ]; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$(cat "$1.pid")/status"; }

run gen "$B" datagen --rows 60000 --scale 0.05 --seed 1 --test-fraction 0.05 --out d.tsv
run conv "$B" convert --test-fraction 0.05 d.tsv d.bin
T=(--processed-data-file d.bin --mini-batch-size 64 --arch-mlp-bot 13-32-16 --arch-mlp-top 32-1
   --print-freq 100000 --test-freq 0 --save-checkpoint C)
echo "data: $((SECONDS - T0)) s"
run warm "$B" train "${T[@]}" --num-batches 800 --checkpoint-every 800

echo "warm-up: $((SECONDS - T0)) s"
# ---- flags ----
refused nofollow "$B" serve --plan C/plan.json --shard 0 --follow
[ "$(tail -1 nofollow.log)" = "shardrec serve: --follow needs --checkpoint, without --data-dir" ] ||
  fail "--follow without --checkpoint: $(cat nofollow.log)"
set +e
"$B" serve --checkpoint C --shard 0 --swap-at-step 5 >swapat.log 2>&1
[ $? = 2 ] || fail "--swap-at-step without --follow did not exit 2"
set -e
has swapat "--swap-at-step needs --follow"

# ---- two following servers, a fresh one, the client ----
serve a --checkpoint C --follow --follow-every 0.02 --log-format json
serve b --checkpoint C --follow --follow-every 0.02 --log-format json
serve fresh --plan C/plan.json --read-only
serve plain --checkpoint C/step-800 --read-only
# A third follower held at step 806 until it is complete.
serve held --checkpoint C --follow --follow-every 0.02 --swap-at-step 806
protoc -I"$S" --python_out=. "$S/rpc/shardrec.proto"
# A fourth told by the admin call SwapAt to hold until step 810.
serve told --checkpoint C --follow --follow-every 0.02
"$PY" - "$(cat told.addr)" >swap.log 2>&1 <<'EOF' || fail "SwapAt: $(cat swap.log)"
import sys, grpc
from rpc import shardrec_pb2 as pb
ch = grpc.insecure_channel(sys.argv[1])
st = ch.unary_unary("/shardrec.v1.EmbeddingShard/Stats", pb.StatsRequest.SerializeToString,
                    pb.StatsResponse.FromString)(pb.StatsRequest(), timeout=30)
swap = ch.unary_unary("/shardrec.v1.EmbeddingShard/SwapAt", pb.SwapAtRequest.SerializeToString,
                      pb.SwapAtResponse.FromString)
r = swap(pb.SwapAtRequest(plan_fingerprint=st.plan_fingerprint, step=810), timeout=30)
assert r.served_step == 800, r
try:
    swap(pb.SwapAtRequest(plan_fingerprint=st.plan_fingerprint, step=800), timeout=30)
    sys.exit("SwapAt(800) answered")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
    assert "step 800 is not above step 800, the one served" in e.details(), e.details()
EOF
"$PY" "$S/tests/rpc/follow_client.py" . "$(cat a.addr)" "$(cat b.addr)" "$(cat fresh.addr)" C \
  quiet stop a.log b.log "$(cat plain.addr)" >client.log 2>&1 &
CLIENT=$!
PIDS+=($CLIENT)
echo "servers up: $((SECONDS - T0)) s"
wait_for 120 test -e quiet || fail "client: $(tail -3 client.log)"

# ---- 30 checkpoints (steps 802..860; 810, 820, ... full) while the client reads ----
run train "$B" train "${T[@]}" --resume C --num-batches 860 --checkpoint-every 2 \
  --full-checkpoint-every 5
[ "$(ls -d C/step-8[0-9][0-9] | wc -l)" = 31 ] || fail "the trainer wrote $(ls C)"
for s in a b; do
  wait_for 60 serving $s 860 || fail "$s serves step $(metric $s shardrec_serve_checkpoint_step), not 860"
done
grep -q '^checkpoint C/step-806: step 806 served (was 800' held.log ||
  fail "held: $(grep '^checkpoint' held.log | head -3)"
[ "$(grep -m1 '^checkpoint .* served' told.log | cut -c1-48)" = \
  "checkpoint C/step-810: step 810 served (was 800;" ] ||
  fail "told: $(grep '^checkpoint' told.log | head -3)"
[ "$(grep -c '^checkpoint .* served' held.log)" -ge 1 ] || fail "held never swapped"

echo "30 checkpoints followed: $((SECONDS - T0)) s"
# ---- one step more: about 1% of the rows changed ----
BEFORE=$(rss_kb a)
BYTES=$(metric a shardrec_store_bytes)
run step "$B" train "${T[@]}" --resume C --num-batches 861 --checkpoint-every 1 \
  --full-checkpoint-every 100
for s in a b; do wait_for 60 serving $s 861 || fail "$s did not swap to step 861"; done
AFTER=$(rss_kb a)
SWAP=$(grep '"step":861' a.log)
CHANGED=$(echo "$SWAP" | grep -oE '"rows_changed":[0-9]+' | cut -d: -f2)
HELD=$(echo "$SWAP" | grep -oE '"rows_held":[0-9]+' | cut -d: -f2)
echo "step 861: $CHANGED of $HELD rows changed; RSS ${BEFORE} kB -> ${AFTER} kB; tables ${BYTES%.*} bytes"
[ $((CHANGED * 100)) -le $((HELD * 2)) ] || fail "step 861 changed $CHANGED of $HELD rows (over 2%)"
[ $(((AFTER - BEFORE) * 1024 * 20)) -lt "${BYTES%.*}" ] ||
  fail "RSS grew by $((AFTER - BEFORE)) kB over a swap of $CHANGED rows: 5% of the tables is $((${BYTES%.*} / 20 / 1024)) kB"

# ---- a half-written and a damaged checkpoint are refused ----
# (each made beside ROOT and moved in whole)
cp -r C/step-861 half
rm half/DONE
mv half C/step-870
cp -r C D
run next "$B" train "${T[@]/#C/D}" --resume D --num-batches 880 --checkpoint-every 19
f=$(ls D/step-880/shards/table-*.bin | head -1)
printf '\x55' | dd of="$f" bs=1 seek=300 conv=notrunc status=none
mv D/step-880 C/step-880
# (a checkpoint of another plan: dim 8)
run other "$B" train --processed-data-file d.bin --mini-batch-size 64 --arch-mlp-bot 13-32-8 \
  --arch-mlp-top 32-1 --arch-sparse-feature-size 8 --print-freq 100000 --test-freq 0 \
  --save-checkpoint E --num-batches 5 --checkpoint-every 5
mv E/step-5 C/step-890
for s in a b; do
  wait_for 60 grep -q '"event":"checkpoint_refused".*"step":890,"reason":"plan"' $s.log ||
    fail "$s: no plan refusal: $(tail -2 $s.log)"
  wait_for 60 grep -q '"event":"checkpoint_refused".*"step":870,"reason":"incomplete"' $s.log ||
    fail "$s: no incomplete refusal: $(tail -2 $s.log)"
  wait_for 60 grep -q '"event":"checkpoint_refused".*"step":880,"reason":"damaged".*checksum mismatch' $s.log ||
    fail "$s: no damaged refusal: $(tail -2 $s.log)"
  [ "$(metric $s 'shardrec_serve_checkpoints_refused_total{reason="incomplete"}')" = 1 ] ||
    fail "$s: incomplete not counted once"
  [ "$(metric $s 'shardrec_serve_checkpoints_refused_total{reason="damaged"}')" = 1 ] ||
    fail "$s: damaged not counted once"
  [ "$(metric $s 'shardrec_serve_checkpoints_refused_total{reason="plan"}')" = 1 ] ||
    fail "$s: another plan not counted once"
  serving $s 861 || fail "$s left step 861"
  [ "$(metric $s shardrec_serve_swaps_total)" -ge 3 ] || fail "$s: swaps not counted"
done
wait_for 60 grep -q "^checkpoint C/step-880 refused (damaged): .*checksum mismatch.*still serving step 861" held.log ||
  fail "held: no damaged refusal in the text log: $(tail -2 held.log)"

echo "refusals seen: $((SECONDS - T0)) s"
touch stop
wait "$CLIENT" || fail "client: $(tail -5 client.log)"
cat client.log
has client "all checks passed"
grep -q "last step 861" client.log || fail "the client's last answers were not step 861's"
echo "test_serve_follow: $((SECONDS - T0)) s"
