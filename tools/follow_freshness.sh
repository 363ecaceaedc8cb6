#!/bin/bash
# The freshness of following servers: how long after a checkpoint completes
# (its DONE written) every server answers from it.
#
# usage: tools/follow_freshness.sh [SHARDREC] [SERVERS] [CHECKPOINTS]
#
# Generated Zipf data (datagen --scale 0.05, 60000 lines), a warm-up of 800
# steps (about 80k rows held), then SERVERS (2) servers following the
# trainer's folder (serve --checkpoint C --follow --follow-every 0.02) while
# it writes CHECKPOINTS (30) checkpoints, one every 2 steps, every 5th full.
# Each server logs a "swap" event per checkpoint with fresh_s (seconds from
# the checkpoint's DONE to the end of its swap: from then on every Lookup
# answers from it); a checkpoint's freshness is the largest over the
# servers. Prints the CPU, then the median, 90th percentile and largest
# freshness over the checkpoints, for increments and full checkpoints
# apart, and the time Lookups were held out by a swap.
set -euo pipefail
B=${1:-build/tools/shardrec}
N=${2:-2}
K=${3:-30}
B=$(realpath "$B")
W=$(mktemp -d /tmp/shardrec-fresh-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
cd "$W"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
"$B" datagen --rows 60000 --scale 0.05 --seed 1 --test-fraction 0.05 --out d.tsv >/dev/null 2>&1
"$B" convert --test-fraction 0.05 d.tsv d.bin >/dev/null
T=(--processed-data-file d.bin --mini-batch-size 64 --arch-mlp-bot 13-32-16 --arch-mlp-top 32-1
   --print-freq 100000 --test-freq 0 --save-checkpoint C)
"$B" train "${T[@]}" --num-batches 800 --checkpoint-every 800 >warm.log 2>&1
for i in $(seq "$N"); do
  "$B" serve --checkpoint C --shard 0 --follow --follow-every 0.02 --log-format json >s$i.log 2>&1 &
  PIDS+=($!)
done
for i in $(seq "$N"); do
  until grep -q '"event":"start"' s$i.log; do sleep 0.05; done
done
last=$((800 + 2 * K))
"$B" train "${T[@]}" --resume C --num-batches $last --checkpoint-every 2 \
  --full-checkpoint-every 5 >train.log 2>&1
for i in $(seq "$N"); do
  until grep -q "\"event\":\"swap\".*\"step\":$last," s$i.log; do sleep 0.05; done
done
/usr/bin/python3 - "$N" <<'EOF'
import json, sys
n = int(sys.argv[1])
fresh, kind, held = {}, {}, []
for i in range(1, n + 1):
    for line in open("s%d.log" % i):
        if '"event":"swap"' in line:
            e = json.loads(line)
            fresh[e["step"]] = max(fresh.get(e["step"], 0), e["fresh_s"])
            kind[e["step"]] = e["kind"]
            held.append(e["swap_s"])
def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))]
for k in ("incremental", "full"):
    v = [fresh[s] for s in fresh if kind[s] == k]
    if v:
        print("%-11s checkpoints %2d: every server answers from it %.3f s after it completed "
              "(median; p90 %.3f s, max %.3f s)" % (k, len(v), q(v, 0.5), q(v, 0.9), max(v)))
print("Lookups held out by a swap: median %.2f ms, max %.2f ms (%d swaps on %d servers)"
      % (1e3 * q(held, 0.5), 1e3 * max(held), len(held), n))
EOF
