#!/bin/bash
# Incremental checkpoints on the in-process store: train --full-checkpoint-every
# K, resume from a chain's head, shardrec fold, the chain verified whole,
# --keep-checkpoints, readers of a head, and a kill -9 while an incremental
# checkpoint is being written.
#
# Asserts: with --full-checkpoint-every 4 --checkpoint-every 5 step-0 and
# step-20 are full and step-5/10/15 incremental, each naming the one before
# and the DONE it had, and holding fewer rows than the full checkpoint of
# its step; a resume from step-15 (a full checkpoint and 3 increments),
# into the same root and into another, ends with every file of its last
# checkpoint (dense.bin, table files, manifest, DONE) equal to the
# uninterrupted run's (every checkpoint full); a resume from step-15 on
# other data into a folder holding the first run's steps 20-40 keeps them,
# says so, writes step-45 full and folds step-50 to what the same resume
# into a folder without them folds to; fold of step-35 equals the
# full step-35 file for file (the same list of files, each cmp-equal), and
# replaces a folder of checkpoints only with --force; --save-model naming
# the --save-checkpoint folder makes the last step's checkpoint full; inspect shows a
# head's kind, parent and chain length; reshard of a head writes what
# reshard of its fold writes; a damaged table file in a link, a missing link and a parent whose manifest
# was rewritten since are refused by fold and by train --resume naming the
# link ("(link K of the chain of step-35)"), nothing written at the output;
# --keep-checkpoints 2 keeps the two newest heads and every link of their
# chains, nothing else; --full-checkpoint-every without --save-checkpoint
# exits 2; predict and eval from a head give what they give
# from its fold (predict's folded rows in a temporary folder, removed), and
# so does predict against serve --checkpoint of the head; a job killed -9
# while it writes an incremental checkpoint (its step's DONE absent after
# the kill) resumes (--auto-resume) from the last complete link, itself
# incremental, and ends with the bits of the uninterrupted run.
set -euo pipefail
. "${BASH_SOURCE%/*}/../support/lib.sh"

B=${SHARDREC_BIN:?run through ctest (SHARDREC_BIN)}
W=$(mktemp -d /tmp/shardrec-chain-XXXXXX)
JOB=
SRV=
cleanup() {
  [ -z "$JOB" ] || kill -9 "$JOB" 2>/dev/null || true
  [ -z "$SRV" ] || kill "$SRV" 2>/dev/null || true
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
parent_of() { tr -d ' \t\n' <"$1/manifest.json" | sed -n 's/.*"parent":{"step":\([0-9]*\),"manifest_sha256":"\([0-9a-f]*\)".*/\1 \2/p'; }
rows_of() { cat "$1"/shards/table-*.bin | wc -c; }
# nothing_at OUT: no OUT and nothing named OUT.* beside it.
nothing_at() {
  [ ! -e "$1" ] || fail "$1 was written"
  ! compgen -G "$1.*" >/dev/null || fail "$(compgen -G "$1.*") was left"
}
# no_checkpoint ROOT: a refused --resume wrote no checkpoint under ROOT
# (the job's plan.json, written at its start, aside).
no_checkpoint() {
  ! compgen -G "$1/*step-*" >/dev/null || fail "$(compgen -G "$1/*step-*") was written"
}

run gen "$B" datagen --rows 3000 --seed 1 --test-fraction 0.1 --out d.tsv
run conv "$B" convert --test-fraction 0.1 d.tsv d.bin
T=(--processed-data-file d.bin --mini-batch-size 64 --print-freq 1000 --test-freq 0 --num-batches 40
   --checkpoint-every 5)

# ---- the uninterrupted run (every checkpoint full) and the chained one ----
run full "$B" train "${T[@]}" --save-checkpoint U
run chain "$B" train "${T[@]}" --save-checkpoint C --full-checkpoint-every 4
for s in 0 20 40; do [ "$(kind_of C/step-$s)" = full ] || fail "C/step-$s is not full"; done
prev=0
for s in 5 10 15 25 30 35; do
  [ "$(kind_of C/step-$s)" = incremental ] || fail "C/step-$s is not incremental"
  want="$prev $(cut -c1-64 C/step-$prev/DONE)"
  [ "$(parent_of C/step-$s)" = "$want" ] || fail "C/step-$s names '$(parent_of C/step-$s)', not '$want'"
  # (step-0 holds no row: step-5's increment holds every row there is)
  [ $s = 5 ] || [ "$(rows_of C/step-$s)" -lt "$(rows_of U/step-$s)" ] ||
    fail "C/step-$s holds as many bytes of rows as the full U/step-$s"
  cmp -s C/step-$s/dense.bin U/step-$s/dense.bin || fail "C/step-$s/dense.bin differs from U's"
  prev=$s
  [ $s != 15 ] || prev=20
done
same_files U/step-40 C/step-40

# A flag that has no folder to write chains into is a usage error.
set +e
"$B" train "${T[@]}" --full-checkpoint-every 4 >usage.log 2>&1
rc=$?
set -e
[ $rc = 2 ] || fail "--full-checkpoint-every without --save-checkpoint exited $rc, not 2"
has usage "--full-checkpoint-every 4 needs --save-checkpoint DIR"

# --save-model naming the --save-checkpoint folder: its last checkpoint is full,
# the one at the last step too (35 = 5 x 7 would be incremental).
run model-same "$B" train "${T[@]}" --num-batches 35 --save-checkpoint M --save-model M \
  --full-checkpoint-every 4
[ "$(kind_of M/step-35)" = full ] || fail "--save-model M wrote an incremental M/step-35"
[ "$(kind_of M/step-30)" = incremental ] || fail "M/step-30 is not incremental"
same_files U/step-35 M/step-35

# ---- resume from a head: step-15 = step-0 + 3 increments ----
cp -r C R
rm -rf R/step-{20,25,30,35,40}
run resume-same "$B" train "${T[@]}" --save-checkpoint R --full-checkpoint-every 4 --auto-resume
has resume-same "resume R/step-15: step 15"
[ "$(kind_of R/step-20)" = full ] && [ "$(kind_of R/step-25)" = incremental ] ||
  fail "the resumed job did not go on with the chain's count (step-20 full, step-25 incremental)"
[ "$(parent_of R/step-25 | cut -d' ' -f1)" = 20 ] || fail "R/step-25 is not incremental on step-20"
same_files U/step-40 R/step-40
run resume-other "$B" train "${T[@]}" --resume C/step-15 --save-checkpoint R2
same_files U/step-40 R2/step-40
[ "$(kind_of R2/step-20)" = full ] || fail "R2/step-20 (its root's first) is not full"

# ---- a resume from an older step, on other data, into a folder holding
# another run's later steps: those are kept, named, and never a parent ----
run gen-other "$B" datagen --rows 3000 --seed 1 --row-seed 9 --test-fraction 0.1 --out o.tsv
run conv-other "$B" convert --test-fraction 0.1 --mapping-from C o.tsv o.bin
O=(--processed-data-file o.bin --mini-batch-size 64 --print-freq 1000 --test-freq 0
   --num-batches 50 --nepochs 2 --checkpoint-every 5 --full-checkpoint-every 4)
cp -r C Q
cp -r C Q2
rm -rf Q2/step-{20,25,30,35,40}
run resume-older "$B" train "${O[@]}" --resume Q/step-15 --save-checkpoint Q
has resume-older "Q/step-40 was there already: kept as it is; the next checkpoint is full"
same_files C/step-40 Q/step-40
[ "$(kind_of Q/step-45)" = full ] || fail "Q/step-45, after another run's step-40, is not full"
[ "$(parent_of Q/step-50 | cut -d' ' -f1)" = 45 ] || fail "Q/step-50 is not incremental on step-45"
run resume-older-alone "$B" train "${O[@]}" --resume Q2/step-15 --save-checkpoint Q2
run fold-older "$B" fold --from Q/step-50 --to FQ
run fold-older-alone "$B" fold --from Q2/step-50 --to FQ2
same_files FQ2/step-50 FQ/step-50

# ---- fold ----
run fold "$B" fold --from C/step-35 --to F
same_files U/step-35 F/step-35
refused fold-again "$B" fold --from C/step-35 --to F
has fold-again "F: already exists"
run fold-force "$B" fold --from C/step-30 --to F --force
[ "$(ls F)" = step-30 ] || fail "fold --force did not replace F: $(ls F)"
same_files U/step-30 F/step-30
run fold-back "$B" fold --from C/step-35 --to F --force
run inspect "$B" inspect C/step-35
has inspect "kind incremental: the rows changed since its parent step-30; a chain of 4 links"
run inspect-fold "$B" inspect F/step-35
has inspect-fold "  kind full"
# reshard of a head: the reshard of its fold.
run plan2 "$B" plan --processed-data-file d.bin --num-shards 2 --out p2.json
run reshard-head "$B" reshard --from C/step-35 --to RS1 --plan p2.json
run reshard-fold "$B" reshard --from F/step-35 --to RS2 --plan p2.json
same_files RS2/step-35 RS1/step-35
[ "$(ls -A RS1)" = step-35 ] || fail "reshard of a head left $(ls -A RS1) in its output"

# ---- a damaged, missing or changed link is refused, naming it ----
cp -r C D
printf 'x' | dd of=D/step-25/shards/table-3.bin bs=1 seek=200 conv=notrunc 2>/dev/null
refused damaged "$B" fold --from D/step-35 --to F2
has damaged "D/step-25/shards/table-3.bin: checksum mismatch (file damaged) (link 3 of the chain of step-35)"
nothing_at F2
refused damaged-resume "$B" train "${T[@]}" --resume D/step-35 --save-checkpoint R3
has damaged-resume "(link 3 of the chain of step-35)"
no_checkpoint R3
cp C/step-25/shards/table-3.bin D/step-25/shards/
mv D/step-20 D/away
refused missing "$B" fold --from D/step-35 --to F2
has missing "D/step-20: no such checkpoint folder (link 4 of the chain of step-35)"
nothing_at F2
mv D/away D/step-20
# step-30 written again: its manifest and DONE agree, but not with what step-35 names.
sed -i 's/"epoch":/"epoch": /' D/step-30/manifest.json
sha256sum D/step-30/manifest.json | cut -d' ' -f1 >D/step-30/DONE
refused changed "$B" fold --from D/step-35 --to F2
has changed "D/step-30: its manifest's SHA-256 is"
has changed "step-35 names"
has changed "(link 2 of the chain of step-35)"
nothing_at F2
refused changed-resume "$B" train "${T[@]}" --resume D/step-35 --save-checkpoint R3
has changed-resume "(link 2 of the chain of step-35)"
no_checkpoint R3
run fold-30 "$B" fold --from D/step-30 --to F3 # the link itself is whole

# ---- --keep-checkpoints keeps whole chains ----
run keep "$B" train "${T[@]}" --num-batches 35 --save-checkpoint K --full-checkpoint-every 4 \
  --keep-checkpoints 2
[ "$(cd K && ls -d step-* | sort -V | tr '\n' ' ')" = "step-20 step-25 step-30 step-35 " ] ||
  fail "--keep-checkpoints 2 kept $(cd K && ls -d step-* | sort -V | tr '\n' ' ')"

# ---- readers of a head ----
mkdir tmp
TMPDIR=$W/tmp run pred-head "$B" predict --checkpoint C/step-35 --processed-data-file d.bin --out p-head.tsv
[ -z "$(ls -A tmp)" ] || fail "predict left its folded rows behind: $(ls -A tmp)"
run pred-fold "$B" predict --checkpoint F/step-35 --processed-data-file d.bin --out p-fold.tsv
cmp -s p-head.tsv p-fold.tsv || fail "predict from the head differs from predict from its fold"
run pred-30 "$B" predict --checkpoint C/step-30 --processed-data-file d.bin --out p-30.tsv
! cmp -s p-head.tsv p-30.tsv || fail "step-30 and step-35 predict the same: the test proves nothing"
# serve --checkpoint HEAD: its rows folded; predict against it as from the fold.
"$B" serve --listen 127.0.0.1:0 --checkpoint C/step-35 --shard 0 >srv.out 2>srv.log &
SRV=$!
end=$((SECONDS + 20))
until grep -qs '^listening on ' srv.out || ! kill -0 $SRV 2>/dev/null; do
  [ "$SECONDS" -lt "$end" ] || fail "serve --checkpoint C/step-35 did not start: $(cat srv.log)"
  sleep 0.05
done
grep -qs '^listening on ' srv.out || fail "serve --checkpoint C/step-35 stopped: $(cat srv.log)"
ADDR=$(sed -n 's/^listening on //p' srv.out | head -1)
run pred-served "$B" predict --checkpoint C/step-35 --shard-servers "$ADDR" --processed-data-file d.bin \
  --out p-served.tsv
kill $SRV
wait $SRV 2>/dev/null || true
cmp -s p-served.tsv p-fold.tsv || fail "predict against serve --checkpoint of the head differs from the fold's"
run eval-head "$B" eval --checkpoint C/step-35 --processed-data-file d.bin
run eval-fold "$B" eval --checkpoint F/step-35 --processed-data-file d.bin
m_head=$(grep -E 'auc' eval-head.log | sed 's/ in [0-9.]* s.*//' | tail -1)
[ -n "$m_head" ] && [ "$m_head" = "$(grep -E 'auc' eval-fold.log | sed 's/ in [0-9.]* s.*//' | tail -1)" ] ||
  fail "eval from the head ($m_head) differs from eval from its fold"

# ---- kill -9 while an incremental checkpoint is being written ----
KT=(--processed-data-file d.bin --mini-batch-size 64 --print-freq 1000 --test-freq 0 --num-batches 40
    --checkpoint-every 1)
run kill-ref "$B" train "${KT[@]}" --save-checkpoint KU
# kill_mid: start the chained job, kill -9 it as soon as the folder of one of
# its increments 20..29 is there (being written); n: that step, "" when the
# job ended first or the step completed before the kill landed.
kill_mid() {
  rm -rf KK
  "$B" train "${KT[@]}" --save-checkpoint KK --full-checkpoint-every 1000 --auto-resume \
    >kill-1.log 2>&1 &
  JOB=$!
  local f caught=
  shopt -s nullglob
  while kill -0 "$JOB" 2>/dev/null; do # busy: an increment's folder lives milliseconds
    f=(KK/.step-2[0-9].*/shards)
    if [ ${#f[@]} -gt 0 ]; then
      kill -9 "$JOB"
      caught=${f[0]%/shards}
      break
    fi
  done
  shopt -u nullglob
  wait "$JOB" 2>/dev/null || true
  JOB=
  n=
  [ -n "$caught" ] || return 0
  n=${caught#KK/.step-}
  n=${n%%.*}
  [ ! -e "KK/step-$n/DONE" ] || n=
}
for try in 1 2 3; do
  kill_mid
  [ -z "$n" ] || break
done
[ -n "$n" ] || fail "no try caught an incremental checkpoint being written"
[ "$(kind_of KK/step-$((n - 1)))" = incremental ] || fail "KK/step-$((n - 1)) is not incremental"
run kill-resume "$B" train "${KT[@]}" --save-checkpoint KK --full-checkpoint-every 1000 --auto-resume
has kill-resume "resume KK/step-$((n - 1)): step $((n - 1))"
run kill-fold "$B" fold --from KK/step-40 --to KF
same_files KU/step-40 KF/step-40
echo "passed (killed while step-$n was being written)"
