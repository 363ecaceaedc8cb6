#!/usr/bin/env bash
# A server host lost during a Checkpoint call (root only, exit 77
# elsewhere). One rank on host 2 against servers (rows in memory) on hosts
# 0 and 1, --save-checkpoint, --checkpoint-every 40, --recover-timeout 60.
# As soon as server 1's folder of step 40's checkpoint appears (a busy wait
# on the folder, which catches it while it writes its 26 table files, each
# fsync'ed), the server is stopped (SIGSTOP: it has not answered, since it
# answers once every file is written), then every process on host 1 is
# killed -9 and its server started again on the same port 2 s later. The
# trainer's retried Checkpoint reaches the restarted server, which finds
# the folder its killed first try began and answers ALREADY_EXISTS; the
# remote store takes that for a lost server (a restarted one would write
# its new, empty rows), so the trainer restores every server from its
# newest complete checkpoint (step-0 here: step 40's never completed) and
# writes step 40 again. (On a loaded machine the Checkpoint's tries can
# run out before the server is back: UNAVAILABLE, a lost server too; the
# test says so.) The run must end by itself, having recovered
# ("recovered from .../step-0"), with the uninterrupted one-rank run's
# losses, AUC and final checkpoint.
set -uo pipefail
source "${SHARDREC_SRC:?SHARDREC_SRC (the source tree) must be set}/tests/cluster/bed.sh"
bed_two_servers cluster_ckpt_loss 20000
STEPS=141
job1() {
  local name=$1
  shift
  bed_run 2 "$BED_BIN" train $BED_JOB --shard-servers "$SERVERS" --metrics-out "$D/$name.jsonl" \
    --save-checkpoint "$CK/$name" --checkpoint-every 40 --recover-timeout 60 "$@" >>"$D/$name.out" 2>&1
}
job1 ref || bed_fail "ref: $(tail -20 "$D/ref.out")"
bed_final "$D/ref.jsonl" >"$D/ref.final"
bed_fresh_servers

job1 lost &
pid=$!
shopt -s nullglob
srv=${BED_PID["1 1"]}
while :; do # busy: the folder lives a few milliseconds
  f=("$CK"/lost/.step-40.*/shards/shard-1)
  [ ${#f[@]} -gt 0 ] && break
  kill -0 $pid 2>/dev/null || bed_fail "the job ended before step 40's checkpoint: $(tail -5 "$D/lost.out")"
done
kill -STOP "$srv"
shopt -u nullglob
n=$(find "${f[0]}" -name 'table-*.bin' | wc -l)
[ "$n" -lt 26 ] || bed_skip "server 1 had written its 26 table files when stopped (too late to be mid-call)"
bed_kill_host 1
sleep 2 # the server host is down this long
bed_restart_host 1
echo "$BED_NAME: server host 1 stopped after $n of 26 table files of step 40's checkpoint, killed, back 2 s later"
wait $pid || bed_fail "the job failed: $(grep -v '^train  step' "$D/lost.out" | tail -5)"
rec=$(grep "^recovered from $CK/lost/step-0 after: " "$D/lost.out") ||
  bed_fail "no recovery from step-0: $(grep -E '^recovered|trying again|lost' "$D/lost.out" | tail -4) ... $(grep -v '^train  step' "$D/lost.out" | tail -3)"
case "$rec" in
  *ALREADY_EXISTS*) ;; # the retried Checkpoint reached the restarted server
  *) # on a loaded machine its tries can end before the server is back
    echo "$BED_NAME: the retried Checkpoint did not reach the restarted server: $rec" ;;
esac
bed_final "$D/lost.jsonl" >"$D/lost.final"
cmp -s "$D/ref.final" "$D/lost.final" ||
  bed_fail "losses or AUC differ from the uninterrupted run's: $(diff "$D/ref.final" "$D/lost.final" | head -6)"
cmp "$CK/ref/step-$STEPS/dense.bin" "$CK/lost/step-$STEPS/dense.bin" || bed_fail "dense.bin differs"
diff -r "$CK/ref/step-$STEPS/shards" "$CK/lost/step-$STEPS/shards" || bed_fail "the shards' rows differ"
echo "$BED_NAME: passed"
