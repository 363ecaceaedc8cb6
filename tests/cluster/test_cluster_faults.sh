#!/usr/bin/env bash
# Faults on the 4-host bed that the trainer and servers already survive
# (issue 19; root only, exit 77 elsewhere). Shard servers (rows in memory)
# on hosts 0 and 1, ranks on hosts 2 and 3 (mpirun -np 2, sync mode), one
# epoch of 141 steps, a checkpoint every 40 steps; each faulted run against
# fresh servers, each fault injected at a step seen in the metrics file:
#  1. a link squeezed: host 2's link at 20mbit from step 30 until 10 more
#     steps are seen (tbf counted packets held back), then a link cut: host
#     3's link down for 3 s from step 70, far inside the 30 s --rpc-deadline
#     that a call in flight waits for its answer (TCP resends): the run
#     ends by itself with the uninterrupted run's losses, AUC and final
#     checkpoint (dense state and every shard's rows), bit for bit;
#  2. a trainer host killed: kill -9 of every process on host 3 at step 50;
#     mpirun ends the job and the test's own loop runs the job's command
#     again, resuming from the newest complete checkpoint: the last
#     occurrence of each step's loss, the AUC and the final checkpoint are
#     the uninterrupted run's;
#  2b. the same fault as 3 with the 2 ranks (--rpc-deadline 5: the ranks
#     abort one deadline after they see the loss): the job stops and the loop
#     runs it again (or, once several ranks recover, it ends in one run),
#     to the uninterrupted run's bits;
#  3. a server host killed (one rank on host 2, --recover-timeout): kill -9
#     of host 1 at step 45 (clear of the checkpoints at 40 and 80: a server
#     lost during a Checkpoint call still ends the run: the retried call
#     finds the folder its killed first try began, ALREADY_EXISTS), its
#     server started again on the same port 2 s later; the trainer restores
#     every server from its newest checkpoint and carries on, to the
#     uninterrupted one-rank run's losses, AUC and final checkpoint.
set -uo pipefail
source "${SHARDREC_SRC:?SHARDREC_SRC (the source tree) must be set}/tests/cluster/bed.sh"
bed_init cluster_faults 4
bed_data 20000
D=$BED_DIR
CK=$D/ck
mkdir "$CK"
STEPS=141
SERVERS="$(bed_addr 0):7000,$(bed_addr 1):7000"
bed_serve 0 0 7000 --plan "$D/p.json" --checkpoint-root "$CK"
bed_serve 1 1 7000 --plan "$D/p.json" --checkpoint-root "$CK"

# The job on ranks of hosts 2 and 3 (NAME: its metrics NAME.jsonl, output
# NAME.out, checkpoints ck/NAME), then ARGS.
job() {
  local name=$1
  shift
  bed_mpirun 2,3 2 "$BED_BIN" train $BED_JOB --shard-servers "$SERVERS" --metrics-out "$D/$name.jsonl" \
    --save-checkpoint "$CK/$name" --checkpoint-every 40 "$@" >>"$D/$name.out" 2>&1
}
# One rank, on host 2, no mpirun.
job1() {
  local name=$1
  shift
  bed_run 2 "$BED_BIN" train $BED_JOB --shard-servers "$SERVERS" --metrics-out "$D/$name.jsonl" \
    --save-checkpoint "$CK/$name" --checkpoint-every 40 "$@" >>"$D/$name.out" 2>&1
}
# The run NAME's final losses and AUC and its last checkpoint against REF's.
same_as() {
  local name=$1 ref=$2
  bed_final "$D/$name.jsonl" >"$D/$name.final"
  [ "$(grep -vc '^auc' "$D/$name.final")" -eq $STEPS ] ||
    bed_fail "$name: $(grep -vc '^auc' "$D/$name.final") steps, not $STEPS"
  cmp -s "$D/$ref.final" "$D/$name.final" ||
    bed_fail "$name: losses or AUC differ from $ref's ($ref < > $name): $(diff "$D/$ref.final" "$D/$name.final" | head -6)"
  [ -f "$CK/$name/step-$STEPS/DONE" ] || bed_fail "$name: no complete final checkpoint"
  cmp "$CK/$ref/step-$STEPS/dense.bin" "$CK/$name/step-$STEPS/dense.bin" || bed_fail "$name: dense.bin differs"
  diff -r "$CK/$ref/step-$STEPS/shards" "$CK/$name/step-$STEPS/shards" || bed_fail "$name: the shards' rows differ"
}

# The uninterrupted runs.
job ref || bed_fail "ref: $(tail -20 "$D/ref.out")"
bed_final "$D/ref.jsonl" >"$D/ref.final"
[ "$(grep -vc '^auc' "$D/ref.final")" -eq $STEPS ] || bed_fail "ref: not $STEPS steps"
grep -q "^auc $STEPS 0\.[0-9]" "$D/ref.final" || bed_fail "ref: no test AUC at step $STEPS"
[ "$(find "$CK/ref/step-$STEPS/shards" -name 'table-*.bin' | wc -l)" -eq 52 ] || bed_fail "ref: not 2 x 26 table files"
bed_fresh_servers
job1 ref1 || bed_fail "ref1: $(tail -20 "$D/ref1.out")"
bed_final "$D/ref1.jsonl" >"$D/ref1.final"
cmp -s "$D/ref.final" "$D/ref1.final" && bed_fail "one rank gave two ranks' bits (the runs test nothing)"

# 1. A squeezed link, then a cut one.
bed_fresh_servers
job cut &
pid=$!
bed_wait_step "$D/cut.jsonl" 30 $pid
bed_squeeze 2 20mbit || bed_fail "tc tbf on host 2"
s=$(bed_last_step "$D/cut.jsonl")
bed_wait_step "$D/cut.jsonl" $((s + 10)) $pid
held=$(bed_run 2 tc -s qdisc show dev eth0 | sed -n 's/.*overlimits \([0-9]*\).*/\1/p' | head -1)
bed_unsqueeze 2
[ "${held:-0}" -gt 0 ] || bed_fail "the squeezed link held no packet back (steps $s..$((s + 10)))"
bed_wait_step "$D/cut.jsonl" 70 $pid
bed_cut 3
t0=$(date +%s.%N)
s=$(bed_last_step "$D/cut.jsonl")
sleep 3 # the cut's length
kill -0 $pid 2>/dev/null || bed_fail "cut: the job ended during the cut: $(tail -5 "$D/cut.out")"
s2=$(bed_last_step "$D/cut.jsonl")
bed_mend 3
cut_s=$(awk -v t="$t0" -v n="$(date +%s.%N)" 'BEGIN {printf "%.1f", n - t}')
[ "$s2" -lt $STEPS ] || bed_fail "cut: the job reached step $s2 during the cut (it did not cut)"
wait $pid || bed_fail "cut: the job failed: $(tail -20 "$D/cut.out")"
echo "$BED_NAME: squeeze at 20mbit held $held packets back; link of host 3 cut at step $s for $cut_s s (step $s2 when mended)"
same_as cut ref
echo "$BED_NAME: squeezed and cut links: the uninterrupted run's losses, AUC, dense state and rows"

# 2. A trainer host killed; the job's command run again by this loop.
# The resume flag of each attempt: the newest complete checkpoint, if any.
# (With `train --auto-resume` this function is `echo --auto-resume`.)
resume_flag() { ls "$CK/$1"/step-*/DONE >/dev/null 2>&1 && echo "--resume $CK/$1"; }
# The restart policy, a loop: job NAME until it ends well (3 runs at most),
# FAULT (a function) called once the first run has shown step STEP, then
# ARGS; every run's metrics in NAME.jsonl in order, the runs in tries, the
# last step seen once the fault hit in hit_at.
run_loop() {
  local name=$1 step=$2 fault=$3
  shift 3
  tries=0
  while :; do
    tries=$((tries + 1))
    [ $tries -le 3 ] || bed_fail "$name: still failing after 3 runs: $(tail -20 "$D/$name.out")"
    cat "$D/$name.jsonl" >>"$D/$name.all.jsonl" 2>/dev/null
    rm -f "$D/$name.jsonl"
    job "$name" $(resume_flag "$name") "$@" &
    pid=$!
    if [ $tries -eq 1 ]; then
      bed_wait_step "$D/$name.jsonl" "$step" $pid
      $fault
      hit_at=$(bed_last_step "$D/$name.jsonl")
    fi
    wait $pid && break
  done
  cat "$D/$name.jsonl" >>"$D/$name.all.jsonl"
  mv "$D/$name.all.jsonl" "$D/$name.jsonl"
  [ "$hit_at" -lt $STEPS ] || bed_fail "$name: the fault hit after the last step"
}
kill_trainer() { bed_kill_host 3; }
bed_fresh_servers
run_loop kill 50 kill_trainer
[ $tries -eq 2 ] || bed_fail "kill: $tries runs (the kill at step $hit_at did not end the job)"
grep -q "^resume " "$D/kill.out" || bed_fail "kill: the second run did not resume: $(tail -20 "$D/kill.out")"
echo "$BED_NAME: trainer host 3 killed at step $hit_at; $(grep -m1 '^resume ' "$D/kill.out")"
same_as kill ref
echo "$BED_NAME: a trainer host killed, the job run again: the uninterrupted run's losses, AUC, dense state and rows"

# 2b. A server host killed with 2 ranks, back 2 s later: the job stops
# (recovery with several ranks is still to come; a 5 s --rpc-deadline
# shortens the wait before the ranks abort) and the loop runs it again,
# or, once the ranks recover by themselves, it ends in one run.
kill_server() { bed_kill_host 1; sleep 2; bed_restart_host 1; } # down 2 s
bed_fresh_servers
run_loop srv2 45 kill_server --rpc-deadline 5
echo "$BED_NAME: server host 1 killed at step $hit_at with 2 ranks, back 2 s later; $tries run(s)$(grep -m1 '^resume ' "$D/srv2.out" | sed 's/^/; /')"
same_as srv2 ref
echo "$BED_NAME: a server host killed with 2 ranks: the uninterrupted run's losses, AUC, dense state and rows"

# 3. A server host killed, its server back 2 s later (one rank recovers).
bed_fresh_servers
job1 srv --recover-timeout 60 &
pid=$!
bed_wait_step "$D/srv.jsonl" 45 $pid
bed_kill_host 1
killed_at=$(bed_last_step "$D/srv.jsonl")
sleep 2 # the server host is down this long
bed_restart_host 1
wait $pid || bed_fail "srv: the job failed: $(tail -20 "$D/srv.out")"
[ "$killed_at" -lt $STEPS ] || bed_fail "srv: host 1 was killed after the last step"
grep -q "recover" "$D/srv.out" || bed_fail "srv: no recovery in the output: $(tail -20 "$D/srv.out")"
echo "$BED_NAME: server host 1 killed at step $killed_at, back 2 s later; $(grep -m1 -i 'recover' "$D/srv.out")"
same_as srv ref1
echo "$BED_NAME: a server host killed and restarted: the uninterrupted one-rank run's losses, AUC, dense state and rows"
echo "$BED_NAME: passed"
