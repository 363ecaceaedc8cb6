#!/usr/bin/env bash
# The cluster benchmark (root only, not in CI): training samples/s
# of one job on 4 hosts of tests/cluster/netns.sh, 2 with a shard server
# each (srn-b20-0, -1) and 2 with one trainer rank each (srn-b20-2, -3;
# `mpirun -np 2` started in host 2 through the test bed's rsh agent,
# tests/cluster/bed.sh's bed_write_agent), at link rates of
# 1, 5 and 20 Gbit/s by default (--rates; 0.1 reaches the network-bound side) (tc tbf on every host's link, both directions; 20 is
# above what this machine moves: the control), at dim 16 (Kaggle MLPs) and
# dim 128 (MLPerf-like MLPs 13-512-256-128 / 1024-1024-512-256-1), sync
# mode. Each host's eth0 counters, each rank's Prometheus series
# (shardrec_train_*: steps, samples, lookup and push bytes, phase seconds)
# and each server's (shardrec_server_{request,response}_bytes_total) are sampled every 0.25 s from inside its namespace (sample.py); report.py
# takes the steady part of each run (from 20% of its steps to its last step
# before the end), prints samples/s, bytes per step on each link beside its
# capacity, and the model of docs/SCALE.md (tools/scale_model.py) beside it,
# at tc's rate and at the rate TCP reached on the link just before the run
# (tcp_probe.py: the all-reduce's bytes both ways between the rank hosts).
#
#   tests/cluster/bench/run.sh [--steps16 N] [--steps128 N] [--batch N] [--rates 1,5,20] [--out DIR]
#
# SHARDREC_BIN (default build/tools/shardrec) is the binary. Everything it
# sends stays in 198.18.0.0/24 (the namespaces have no other route).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../../.." && pwd)
BIN=${SHARDREC_BIN:-$SRC/build/tools/shardrec}
NETNS="$SRC/tests/cluster/netns.sh"
TAG=b20
STEPS16=300
STEPS128=60
BATCH=256
RATES=1,5,20
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps16) STEPS16=$2; shift 2 ;;
    --steps128) STEPS128=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for v in "$STEPS16" "$STEPS128" "$BATCH"; do
  [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt 0 ] || { echo "run.sh: '$v' is not a positive number" >&2; exit 2; }
done
[ $((BATCH % 2)) -eq 0 ] || { echo "run.sh: --batch $BATCH does not divide by the 2 ranks" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "run.sh: needs root (network namespaces)" >&2; exit 2; }
for c in ip tc mpirun /usr/bin/python3; do
  command -v "$c" >/dev/null || { echo "run.sh: $c is not installed" >&2; exit 2; }
done
[ -x "$BIN" ] || { echo "run.sh: $BIN: no shardrec binary (build first, or set SHARDREC_BIN)" >&2; exit 2; }

WORK=$(mktemp -d /tmp/shardrec-bench-cluster-XXXXXX)
# The test bed's rsh agent for these namespaces (a TMPDIR per host, as on
# separate machines: Open MPI's daemons of one host name race in one /tmp).
SHARDREC_SRC=$SRC SHARDREC_BIN=$BIN source "$SRC/tests/cluster/bed.sh"
BED_DIR=$WORK
BED_TAG=$TAG
bed_write_agent
OUT=${OUT:-$WORK/results}
mkdir -p "$OUT"
PIDS=()
cleanup() {
  touch "$WORK/stop" 2>/dev/null
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  PIDS=()
  "$NETNS" down --tag "$TAG" >/dev/null 2>&1
}
trap 'cleanup; rm -rf "$WORK/data" "$WORK/run" "$WORK/stop" "$WORK/agent" "$WORK"/host-*; rmdir "$WORK" 2>/dev/null' EXIT  # kept if it holds the results
trap 'echo "run.sh: stopped" >&2; exit 1' INT TERM HUP

say() { echo "run.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# Wait up to 60 s for LINE at the start of a line of FILE while PID lives.
wait_line() {
  local file=$1 line=$2 pid=$3 i
  for ((i = 0; i < 600; i++)); do
    grep -q "^$line" "$file" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$file" >&2; return 1; }
    sleep 0.1
  done
  cat "$file" >&2
  return 1
}

mkdir -p "$WORK/data"
say "data: 120000 generated lines (1% test), converted; plans of 2 row-wise shards at dim 16 and 128"
"$BIN" datagen --rows 120000 --test-fraction 0.01 --seed 7 --out "$WORK/data/d.tsv" >/dev/null || die "datagen"
"$BIN" convert --test-fraction 0.01 "$WORK/data/d.tsv" "$WORK/data/d.bin" >/dev/null || die "convert"
for d in 16 128; do
  "$BIN" plan --out "$WORK/data/plan$d.json" --processed-data-file "$WORK/data/d.bin" --num-shards 2 \
    --row-wise --arch-sparse-feature-size "$d" >/dev/null || die "plan dim $d"
done

MLP16=(--arch-mlp-bot 13-512-256-64-16 --arch-mlp-top 512-256-1)
MLP128=(--arch-mlp-bot 13-512-256-128 --arch-mlp-top 1024-1024-512-256-1)

# run_one RATE DIM STEPS: servers, samplers, the job, then everything stopped.
run_one() {
  local rate=$1 dim=$2 steps=$3 name="r${1}g-d$2" k
  local dir="$OUT/$name"
  mkdir -p "$dir"
  rm -f "$WORK/stop"
  local mlp=("${MLP16[@]}")
  [ "$dim" -eq 128 ] && mlp=("${MLP128[@]}")
  for k in 0 1; do
    rm -rf "$WORK/run/s$k"
    "$NETNS" exec $k --tag "$TAG" "$BIN" serve --plan "$WORK/data/plan$dim.json" --shard $k \
      --listen "198.18.0.$((k + 1)):7000" --insecure --metrics-listen 127.0.0.1:9400 >"$dir/serve-$k.log" 2>&1 &
    PIDS+=($!)
    wait_line "$dir/serve-$k.log" "listening on" "$!" || die "$name: server $k did not start"
  done
  for k in 0 1 2 3; do
    local m=(--metrics http://127.0.0.1:9400/metrics)
    [ $k -ge 2 ] && m=(--metrics http://127.0.0.1:9500/metrics)
    "$NETNS" exec $k --tag "$TAG" /usr/bin/python3 "$HERE/sample.py" "$dir/host-$k.jsonl" "$WORK/stop" "${m[@]}" &
    PIDS+=($!)
  done
  # The link's own rate now (a busy machine moves less than tc's rate):
  # the all-reduce's bytes both ways between the rank hosts.
  local ar
  ar=$(/usr/bin/python3 -c "import sys; sys.path.insert(0, '$SRC/tools'); import scale_model as m; \
print(4 * m.dense_params($dim, [int(x) for x in '${mlp[1]}'.split('-')], [int(x) for x in '${mlp[3]}'.split('-')]))") ||
    die "$name: the all-reduce's size"
  "$NETNS" exec 3 --tag "$TAG" /usr/bin/python3 "$HERE/tcp_probe.py" serve 198.18.0.4 $ar 7 >"$dir/probe-serve.log" 2>&1 &
  local probe=$!
  PIDS+=($probe)
  wait_line "$dir/probe-serve.log" "listening" "$probe" || die "$name: tcp probe did not start"
  "$NETNS" exec 2 --tag "$TAG" /usr/bin/python3 "$HERE/tcp_probe.py" probe 198.18.0.4 $ar 7 0.3 "$dir/probe.json" >&2 ||
    say "$name: the tcp probe failed (its server: $(tr '\n' ' ' <"$dir/probe-serve.log")); the model's TCP-rate column is left empty"
  kill $probe 2>/dev/null
  wait $probe 2>/dev/null
  say "$name: training $steps steps of $BATCH at ${rate} Gbit/s, dim $dim"
  mkdir -p "$WORK/host-2"
  TMPDIR="$WORK/host-2" "$NETNS" exec 2 --tag "$TAG" mpirun --allow-run-as-root \
    --mca plm_rsh_agent "$WORK/agent" --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include 198.18.0.0/24 \
    --mca btl_tcp_if_include 198.18.0.0/24 --mca btl tcp,self --host 198.18.0.3,198.18.0.4 -np 2 \
    "$BIN" train --processed-data-file "$WORK/data/d.bin" --plan "$WORK/data/plan$dim.json" \
    --arch-sparse-feature-size "$dim" "${mlp[@]}" \
    --shard-servers 198.18.0.1:7000,198.18.0.2:7000 --mini-batch-size "$BATCH" --num-batches "$steps" \
    --print-freq "$steps" --dense-threads 1 --metrics-listen 127.0.0.1:9500 >"$dir/train.log" 2>&1
  local rc=$?
  cleanup
  [ $rc -eq 0 ] || { cat "$dir/train.log" >&2; die "$name: train exited $rc"; }
  printf '{"rate_gbit": %s, "dim": %d, "batch": %d, "steps": %d, "mlp": "%s"}\n' \
    "$rate" "$dim" "$BATCH" "$steps" "${mlp[*]}" >"$dir/run.json"
}

IFS=, read -r -a rates <<<"$RATES"
for r in "${rates[@]}"; do
  out=$("$NETNS" up 4 --rate "${r}gbit" --tag "$TAG" 2>&1) || die "netns.sh up 4 --rate ${r}gbit: $out"
  run_one "$r" 16 "$STEPS16"
  out=$("$NETNS" up 4 --rate "${r}gbit" --tag "$TAG" 2>&1) || die "netns.sh up 4 --rate ${r}gbit: $out"
  run_one "$r" 128 "$STEPS128"
done
/usr/bin/python3 "$HERE/report.py" "$OUT" | tee "$OUT/table.txt"
say "results in $OUT"
