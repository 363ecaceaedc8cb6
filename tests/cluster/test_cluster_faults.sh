#!/usr/bin/env bash
# Faults on the 4-host bed, each injected mid-run at a step seen in the
# metrics file, each run ending by itself with the uninterrupted run's final
# losses (the last occurrence of each step), test AUCs, dense state and
# every shard's rows, bit for bit (root only, exit 77 elsewhere).
# Shard servers (rows in memory) on hosts 0 and 1, ranks on hosts 2 and 3
# (mpirun -np 2, sync mode), one epoch of 141 steps, a checkpoint every 40
# steps (and step 0's), a test pass every 30 steps (test batches of 16, so
# a pass lasts long enough to be hit) and at the end; every run against
# fresh servers, with the same command every time (`train --auto-resume`):
# the test's own loop runs it again when mpirun ended it, as a restart
# policy would, and the cases that must recover by themselves assert one
# run (no rerun):
#  1. a link squeezed: host 2's link at 20mbit from step 30 until 10 more
#     steps are seen (tbf counted packets held back), then a link cut
#     shorter than the retry budget: host 3's link down for 3 s from step
#     70, inside the 30 s --rpc-deadline that a call in flight waits for
#     its answer (TCP resends): one run;
#  2. a trainer host killed: kill -9 of every process on host 3 at step 50;
#     mpirun ends the job and the loop runs it again, which resumes from
#     the newest complete checkpoint: two runs;
#  3. a server host killed, its server started again on the same port 2 s
#     later (step 45): the ranks restore every server from the newest
#     checkpoint and carry on: one run;
#  4. a server host killed and restarted after half the recover timeout
#     (--recover-timeout 20, back 10 s after the kill was seen): the
#     ranks wait for it and recover: one run;
#  5. a link cut longer than the retry budget: host 1's link down for 25 s
#     from step 45 with --rpc-deadline 1 (10 tries x 1 s plus backoff,
#     about 16 s): the ranks take it for a lost server (a call past its
#     tries, or the ABORTED of a server that dropped the step meanwhile),
#     wait for it and recover once the link is back: one run;
#  5b. a 5 s cut with --rpc-deadline 1, well within the budget: the
#     retries outlast it, log lines and nothing else (no recovery): one run;
#  6. a server lost during a test pass: the ranks stopped (SIGSTOP) once a
#     pass is due (step 30's line is out, no test line of step 30 yet, so
#     the pass's lookups come next; else the next pass's step), host 1
#     killed, the ranks let go, its server back 2 s later: the recovery
#     names the test pass: one run (the case runs again when the ranks
#     were stopped after the pass's last lookup: its test line out twice);
#  7. a server lost before the first periodic checkpoint (step 5; back 2 s
#     later): the ranks recover from step-0: one run.
set -uo pipefail
source "${SHARDREC_SRC:?SHARDREC_SRC (the source tree) must be set}/tests/cluster/bed.sh"
bed_two_servers cluster_faults 20000
STEPS=141

# The job on ranks of hosts 2 and 3 (NAME: its metrics NAME.jsonl, output
# NAME.out, checkpoints ck/NAME), then ARGS; the same command for every run
# of NAME (--auto-resume: from ck/NAME's newest complete checkpoint, if any).
job() {
  local name=$1
  shift
  bed_mpirun 2,3 2 "$BED_BIN" train $BED_JOB --shard-servers "$SERVERS" --metrics-out "$D/$name.jsonl" \
    --save-checkpoint "$CK/$name" --checkpoint-every 40 --test-freq 30 --test-mini-batch-size 16 \
    --auto-resume "$@" >>"$D/$name.out" 2>&1
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

# The uninterrupted run.
job ref || bed_fail "ref: $(tail -20 "$D/ref.out")"
bed_final "$D/ref.jsonl" >"$D/ref.final"
[ "$(grep -vc '^auc' "$D/ref.final")" -eq $STEPS ] || bed_fail "ref: not $STEPS steps"
[ "$(grep -c '^auc \(30\|60\|90\|120\|141\) 0\.[0-9]' "$D/ref.final")" -eq 5 ] ||
  bed_fail "ref: not 5 test passes (steps 30, 60, 90, 120, 141): $(grep '^auc' "$D/ref.final")"
[ "$(find "$CK/ref/step-$STEPS/shards" -name 'table-*.bin' | wc -l)" -eq 52 ] || bed_fail "ref: not 2 x 26 table files"
grep -q "^resume " "$D/ref.out" && bed_fail "ref: --auto-resume resumed from an empty folder"

# The restart policy, a loop: job NAME until it ends well (3 runs at most),
# FAULT (a function; it sets hit_at, the last step seen as it hit) called
# once the first run has shown step STEP, then ARGS; every run's metrics in
# NAME.jsonl in order (RUN_M: the current run's), the runs in tries, the
# fault's length in fault_s.
run_loop() {
  local name=$1 step=$2 fault=$3
  shift 3
  tries=0
  RUN_M=$D/$name.jsonl
  while :; do
    tries=$((tries + 1))
    [ $tries -le 3 ] || bed_fail "$name: still failing after 3 runs: $(tail -20 "$D/$name.out")"
    cat "$RUN_M" >>"$D/$name.all.jsonl" 2>/dev/null
    rm -f "$RUN_M"
    job "$name" "$@" &
    pid=$!
    if [ $tries -eq 1 ]; then
      bed_wait_step "$RUN_M" "$step" $pid
      local t0
      t0=$(date +%s.%N)
      $fault
      fault_s=$(awk -v t="$t0" -v n="$(date +%s.%N)" 'BEGIN {printf "%.1f", n - t}')
    fi
    wait $pid && break
  done
  cat "$RUN_M" >>"$D/$name.all.jsonl"
  mv "$D/$name.all.jsonl" "$RUN_M"
  [ "$hit_at" -lt $STEPS ] || bed_fail "$name: the fault hit after the last step"
}
# NAME recovered by itself, in one run, from its checkpoint step-N (N a
# pattern) after WHY (a pattern); its recovery line (cut short) in rec.
recovered_once() {
  local name=$1 n=$2 why=$3
  [ $tries -eq 1 ] || bed_fail "$name: $tries runs (the job did not recover by itself): $(grep -v '^train  step' "$D/$name.out" | tail -8)"
  grep -q "^recovered from $CK/$name/step-$n after: $why" "$D/$name.out" ||
    bed_fail "$name: no recovery from step-$n after '$why': $(grep -E '^recovered from|^test   step|lost|failed' "$D/$name.out" | head -8 | cut -c1-300)"
  rec=$(grep -m1 "^recovered from" "$D/$name.out" | cut -c1-160)
}

# 1. A squeezed link, then a link cut shorter than the retry budget.
squeeze_cut() {
  bed_squeeze 2 20mbit || bed_fail "tc tbf on host 2"
  local s
  s=$(bed_last_step "$RUN_M")
  bed_wait_step "$RUN_M" $((s + 10)) $pid
  held=$(bed_run 2 tc -s qdisc show dev eth0 | sed -n 's/.*overlimits \([0-9]*\).*/\1/p' | head -1)
  bed_unsqueeze 2
  [ "${held:-0}" -gt 0 ] || bed_fail "the squeezed link held no packet back (steps $s..$((s + 10)))"
  bed_wait_step "$RUN_M" 70 $pid
  bed_cut 3
  hit_at=$(bed_last_step "$RUN_M")
  sleep 3 # the cut's length
  kill -0 $pid 2>/dev/null || bed_fail "cut: the job ended during the cut: $(tail -5 "$D/cut.out")"
  s2=$(bed_last_step "$RUN_M")
  bed_mend 3
  [ "$s2" -lt $STEPS ] || bed_fail "cut: the job reached step $s2 during the cut (it did not cut)"
}
bed_fresh_servers
run_loop cut 30 squeeze_cut
[ $tries -eq 1 ] || bed_fail "cut: $tries runs (the job did not ride through)"
echo "$BED_NAME: squeeze at 20mbit held $held packets back; link of host 3 cut at step $hit_at for 3 s (step $s2 when mended)"
same_as cut ref
echo "$BED_NAME: squeezed and cut links: the uninterrupted run's losses, AUC, dense state and rows"

# 2. A trainer host killed; the job's command run again by the loop.
kill_trainer() { bed_kill_host 3; hit_at=$(bed_last_step "$RUN_M"); }
bed_fresh_servers
run_loop kill 50 kill_trainer
[ $tries -eq 2 ] || bed_fail "kill: $tries runs (the kill at step $hit_at did not end the job)"
grep -q "^resume $CK/kill/step-" "$D/kill.out" || bed_fail "kill: the second run did not resume: $(tail -20 "$D/kill.out")"
echo "$BED_NAME: trainer host 3 killed at step $hit_at; $(grep -m1 '^resume ' "$D/kill.out")"
same_as kill ref
echo "$BED_NAME: a trainer host killed, the job run again: the uninterrupted run's losses, AUC, dense state and rows"

# 3. A server host killed, back 2 s later.
kill_server() { bed_kill_host 1; hit_at=$(bed_last_step "$RUN_M"); sleep 2; bed_restart_host 1; }
bed_fresh_servers
run_loop srv 45 kill_server
recovered_once srv '[0-9]*' ''
echo "$BED_NAME: server host 1 killed at step $hit_at, back 2 s later; $rec"
same_as srv ref
echo "$BED_NAME: a server host killed and restarted: the uninterrupted run's losses, AUC, dense state and rows"

# 4. A server host killed, back after half the recover timeout.
kill_half() { bed_kill_host 1; hit_at=$(bed_last_step "$RUN_M"); sleep 10; bed_restart_host 1; }
bed_fresh_servers
run_loop half 45 kill_half --recover-timeout 20
grep -q "restoring every shard server from .*(waiting up to 20 s" "$D/half.out" ||
  bed_fail "half: no restore waiting for the servers: $(grep -v '^train  step' "$D/half.out" | tail -8)"
recovered_once half '[0-9]*' ''
echo "$BED_NAME: server host 1 killed at step $hit_at, back $fault_s s later (--recover-timeout 20); $rec"
same_as half ref
echo "$BED_NAME: a server host back after half the recover timeout: the uninterrupted run's losses, AUC, dense state and rows"

# 5. A link cut longer than the retry budget: 10 tries, each up to
# --rpc-deadline 1 plus its backoff (0.05 s doubling to 1 s), about 16 s.
# (Measured: the tries outlast the 25 s, slower than that while the
# channel reconnects; the server, its Watch from the rank broken, drops the
# step, and the retried call's ABORTED is what the job recovers from.)
cut_long() {
  bed_cut 1
  hit_at=$(bed_last_step "$RUN_M")
  sleep "$cut_len" # the cut's length
  s2=$(bed_last_step "$RUN_M")
  bed_mend 1
  [ "$s2" -lt $STEPS ] || bed_fail "cut: the job reached step $s2 during the cut (it did not cut)"
}
cut_len=25
bed_fresh_servers
run_loop longcut 45 cut_long --rpc-deadline 1
grep -q "trying again" "$D/longcut.out" || bed_fail "longcut: no call tried again: $(grep -v '^train  step' "$D/longcut.out" | tail -8)"
recovered_once longcut '[0-9]*' ''
echo "$BED_NAME: link of host 1 cut at step $hit_at for $cut_len s (step $s2 when mended); $rec"
same_as longcut ref
echo "$BED_NAME: a link cut longer than the retry budget: the uninterrupted run's losses, AUC, dense state and rows"

# 5b. A 5 s cut with --rpc-deadline 1, within the budget: the retries
# outlast it and the job carries on, nothing but log lines: the Lookups
# given up at their deadlines reach the server cancelled once the link is
# back, and the server, the rank's Watch still open there, forgets them
# instead of taking the rank for gone. What comes back is what TCP resends,
# and it resends with a doubling timeout (0.2 s, 0.4, ... 6.4 s): a cut of
# L seconds is over for the calls up to about 2L later, so a cut within the
# ~15 s budget is one of at most ~6 s. (A 15 s cut was ridden through in
# some runs and recovered from in others.)
cut_len=5
bed_fresh_servers
run_loop midcut 45 cut_long --rpc-deadline 1
grep -q "trying again" "$D/midcut.out" || bed_fail "midcut: no call tried again: $(grep -v '^train  step' "$D/midcut.out" | tail -8)"
[ $tries -eq 1 ] || bed_fail "midcut: $tries runs (the job stopped): $(grep -v '^train  step' "$D/midcut.out" | tail -8)"
grep -q "call(s) answered only after retries" "$D/midcut.out" ||
  bed_fail "midcut: no 'answered only after retries' line: $(grep -v '^train  step' "$D/midcut.out" | tail -8)"
! grep -q "^recovered from" "$D/midcut.out" ||
  bed_fail "midcut: a cut the retries outlast was recovered from (only log lines expected): $(grep -m1 -B3 '^recovered from' "$D/midcut.out" | cut -c1-300)"
echo "$BED_NAME: link of host 1 cut at step $hit_at for $cut_len s (step $s2 when mended); $(grep -m1 'answered only after retries' "$D/midcut.out" | cut -c1-160)"
same_as midcut ref
echo "$BED_NAME: a 5 s cut within the retry budget: the uninterrupted run's losses, AUC, dense state and rows"

# 6. A server lost during a test pass. The ranks (the shardrec processes
# on hosts 2 and 3) are stopped once a pass's step (30, 60, ...) is out;
# if no test line of that step is out yet, the pass's lookups are their
# next calls: host 1 is killed before they go on. Else the next pass.
rank_pids() {
  local h p
  for h in 2 3; do
    for p in $(ip netns pids "$(bed_ns $h)"); do
      [ "$(cat /proc/$p/comm 2>/dev/null)" = shardrec ] && echo "$p"
    done
  done
}
kill_in_pass() {
  local p pids
  pids=$(rank_pids)
  [ "$(echo $pids | wc -w)" -eq 2 ] || bed_fail "eval: not 2 ranks on hosts 2 and 3: $pids"
  for p in 30 60 90 120; do
    while [ "$(bed_last_step "$RUN_M")" -lt $p ]; do # busy: a pass lasts a fraction of a second
      kill -0 $pid 2>/dev/null || bed_fail "eval: the job ended before step $p"
    done
    kill -STOP $pids
    if [ "$(bed_last_step "$RUN_M")" -eq $p ] && ! grep -q "\"kind\":\"test\",\"step\":$p," "$RUN_M"; then
      bed_kill_host 1
      kill -CONT $pids
      hit_at=$p
      sleep 2
      bed_restart_host 1
      return 0
    fi
    kill -CONT $pids
  done
  bed_fail "eval: the ranks were never stopped inside a test pass"
}
# The ranks can be stopped after the pass's last lookup, its test line not
# yet out (a window of the last batch's gathers and the AUC): the pass then
# ends well and the next step's lookups meet the lost server, and the
# pass's test line is out twice, before the recovery and after the replay.
# That case is not the one under test: it runs again (two runs at most).
for try in 1 2; do
  rm -rf "$CK/eval" "$D/eval.out" "$D/eval.jsonl"
  bed_fresh_servers
  run_loop eval 1 kill_in_pass
  [ "$(grep -c "^test   step $hit_at " "$D/eval.out")" -ge 2 ] || break
  [ $try -eq 1 ] || bed_fail "eval: the fault landed after the test pass's lookups in both runs"
  echo "$BED_NAME: host 1 killed after the last lookup of step $hit_at's test pass ($(grep -m1 '^recovered from' "$D/eval.out" | cut -c1-160)): the case runs again"
done
recovered_once eval '[0-9]*' "test pass at step $hit_at: "
echo "$BED_NAME: server host 1 killed in the test pass of step $hit_at, back 2 s later; $rec"
same_as eval ref
echo "$BED_NAME: a server lost during a test pass: the uninterrupted run's losses, AUC, dense state and rows"

# 7. A server lost before the first periodic checkpoint (step 40).
bed_fresh_servers
run_loop early 5 kill_server
[ "$hit_at" -lt 40 ] || bed_fail "early: host 1 killed at step $hit_at, not before step 40"
recovered_once early 0 ''
echo "$BED_NAME: server host 1 killed at step $hit_at, back 2 s later; $rec"
same_as early ref
echo "$BED_NAME: a server lost before the first periodic checkpoint: the uninterrupted run's losses, AUC, dense state and rows"
echo "$BED_NAME: passed"
