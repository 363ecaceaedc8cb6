# The cluster test bed: K hosts on one machine, each a network namespace of
# tests/cluster/netns.sh, with shard servers, trainer ranks under mpirun and
# faults. Sourced by the tests/cluster scripts (bash; root only):
#
#   bed_init NAME K            K hosts (0..K-1, 198.18.0.(i+1)) plus a launch
#                              host (K) where mpirun runs; BED_DIR, a fresh
#                              folder every host sees at the same path; skips
#                              (exit 77) when not root or namespaces cannot be
#                              made; a trap removes everything at exit
#   bed_serve H SHARD PORT ARGS...   `shardrec serve --shard SHARD --listen
#                              ADDR(H):PORT --insecure ARGS` on host H, waited
#                              for until it listens (the command is kept, so
#                              bed_restart_host H starts it again)
#   bed_serve_lo H SHARD PORT ARGS...  the same on 127.0.0.1 inside host H
#   bed_kill_host H            kill -9 every process in host H's namespace,
#                              waited for until none is left
#   bed_restart_host H         start H's servers again, same ports and flags
#   bed_fresh_servers          every server stopped and started again (no rows)
#   bed_run H CMD...           CMD in host H's namespace
#   bed_cut H                  cut H's link (its bridge port down: the cable
#                              pulled; H keeps its address and routes)
#   bed_mend H                 restore it
#   bed_squeeze H RATE         shape H's link to RATE both ways (tc tbf)
#   bed_unsqueeze H            remove the shaping
#   bed_mpirun HOSTS NP ARGS...  `mpirun -np NP --host HOSTS ARGS` from the
#                              launch host, ranks started in the namespaces
#                              of HOSTS (host numbers, "1,2") through an rsh
#                              agent; Open MPI over TCP on 198.18.0.0/24 only
#   bed_mpirun_lo H NP ARGS... mpirun inside host H on 127.0.0.1 alone
#   bed_wait_step FILE STEP [PID]  wait until the metrics file FILE has a train
#                              line of step >= STEP (fails if PID exits first)
#   bed_last_step FILE         the last train step in FILE (0: none)
#   bed_final FILE             the last occurrence of each step's last_loss,
#                              one "STEP LOSS" line each, then of each test
#                              pass's AUC, "auc STEP AUC"
#   bed_addr H                 host H's address
#   bed_data ROWS              d.bin and p.json in BED_DIR; BED_JOB, the train
#                              flags every test's job shares
#
# Each host has its own TMPDIR (BED_DIR/host-H, Open MPI's session folders
# go there), as separate machines would; BED_MPIRUN_LIMIT (300 s) ends an
# mpirun that hangs; BED_KEEP=1 keeps BED_DIR after the run, to look at.
#
# Nothing is ever sent outside 198.18.0.0/24 (and 127.0.0.1 inside a host):
# the namespaces have no other route. Every wait is for an event (a line, a
# file, a process gone) with a generous timeout; a fault lasts as long as the
# test says, and is injected at a step the test has seen in the metrics.

BED_SRC=${SHARDREC_SRC:?SHARDREC_SRC (the source tree) must be set}
BED_BIN=${SHARDREC_BIN:?SHARDREC_BIN (the shardrec binary) must be set}
BED_NETNS="$BED_SRC/tests/cluster/netns.sh"
BED_NAME=bed
BED_TAG=""
BED_DIR=""
BED_K=0
BED_BG=()               # background shells of the test (a job's loop): ended first
declare -A BED_SERVE=() # "H SHARD" -> the serve command line (for restarts)
declare -A BED_PID=()   # "H SHARD" -> its pid
declare -A BED_LISTEN=() # "H SHARD" -> its ADDR:PORT
declare -A BED_STARTS=() # "H SHARD" -> how many times started (log N)

bed_skip() {
  echo "$BED_NAME: skipped: $*"
  [ -n "$BED_DIR" ] && rm -rf "$BED_DIR"
  exit 77
}
bed_fail() {
  echo "$BED_NAME: FAILED: $*" >&2
  exit 1
}
bed_ns() { echo "srn-$BED_TAG-$1"; }
bed_addr() { "$BED_NETNS" addr "$1"; }

# Every process left in the bed's namespaces, the namespaces, the folder.
bed_cleanup() {
  local i p
  for p in "${BED_BG[@]}"; do kill "$p" 2>/dev/null; done
  for ((i = 0; i <= BED_K; i++)); do
    for p in $(ip netns pids "$(bed_ns $i)" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  wait 2>/dev/null
  "$BED_NETNS" down --tag "$BED_TAG" >/dev/null 2>&1
  [ -n "$BED_DIR" ] && [ -z "${BED_KEEP:-}" ] && rm -rf "$BED_DIR"
}

bed_init() {
  BED_NAME=$1
  BED_K=$2
  # One tag per test name: a run killed outright leaves namespaces that
  # the next run of the same test removes first (netns.sh up does).
  BED_TAG=$(echo "$BED_NAME" | tr -cd 'a-z0-9' | tail -c 8)
  [ "$(id -u)" -eq 0 ] || bed_skip "not root (network namespaces need root)"
  command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || bed_skip "'ip netns' is not available"
  command -v tc >/dev/null || bed_skip "tc is not installed"
  command -v mpirun >/dev/null || bed_skip "mpirun is not installed"
  local old p
  # What an earlier run killed outright left: its processes (netns.sh's
  # `up` would only unname their namespaces), then its folder.
  for old in $("$BED_NETNS" list --tag "$BED_TAG"); do
    for p in $(ip netns pids "$old" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  for old in /tmp/shardrec-$BED_NAME-*; do
    [ -d "$old" ] && rm -rf "$old"
  done
  BED_DIR=$(mktemp -d "/tmp/shardrec-$BED_NAME-XXXXXX")
  trap bed_cleanup EXIT
  local out
  out=$("$BED_NETNS" up $((BED_K + 1)) --tag "$BED_TAG" 2>&1) || bed_skip "netns.sh up failed here: $out"
  bed_write_agent
}

# Open MPI's rsh agent is run as `AGENT HOST CMD...`, CMD for a remote shell
# (orted with its environment set first): run it in HOST's namespace.
bed_write_agent() {
  cat >"$BED_DIR/agent" <<EOF
#!/bin/sh
# rsh agent of the test bed $BED_TAG: AGENT HOST CMD... runs CMD in HOST's namespace.
host=\$1
shift
case "\$host" in
  198.18.0.*) i=\$((\${host##*.} - 1)) ;;
  *) echo "agent: \$host is not a host of the test bed" >&2; exit 1 ;;
esac
# Each host its own temporary folder (Open MPI's session folders), as on
# separate machines: in one /tmp, daemons of one host name raced at start
# and exit. (TMPDIR, not orte_tmpdir_base, which mpirun hands every daemon.)
TMPDIR=$BED_DIR/host-\$i
export TMPDIR
mkdir -p "\$TMPDIR"
exec ip netns exec srn-$BED_TAG-\$i sh -c "\$*"
EOF
  chmod +x "$BED_DIR/agent"
}

# bed_wait_for SECS CMD...: until CMD succeeds (1 if SECS pass first).
bed_wait_for() {
  local n=$(($1 * 20))
  shift
  while [ $n -gt 0 ]; do
    "$@" && return 0
    sleep 0.05
    n=$((n - 1))
  done
  return 1
}

bed__start_server() {
  local key="$1 $2" n=$((${BED_STARTS["$1 $2"]:-0} + 1))
  BED_STARTS[$key]=$n
  local log="$BED_DIR/serve-h$1-s$2.$n.log"
  # shellcheck disable=SC2086
  "$BED_NETNS" exec "$1" --tag "$BED_TAG" ${BED_SERVE[$key]} >"$log" 2>&1 &
  BED_PID[$key]=$!
  disown $! # not a job of this shell: a kill -9 prints no "Killed" line (bed__gone waits)
  bed_wait_for 60 bed__listening "$log" "listening on ${BED_LISTEN[$key]}" "${BED_PID[$key]}" ||
    bed_fail "server host $1 shard $2 did not listen: $(tail -5 "$log")"
}
bed__listening() {
  grep -qs "^$2" "$1" && return 0
  kill -0 "$3" 2>/dev/null || bed_fail "server exited: $(tail -5 "$1")"
  return 1
}

bed_serve() {
  local h=$1 shard=$2 port=$3
  shift 3
  bed__serve_at "$h" "$shard" "$(bed_addr "$h")" "$port" "$@"
}
bed_serve_lo() {
  local h=$1 shard=$2 port=$3
  shift 3
  bed__serve_at "$h" "$shard" 127.0.0.1 "$port" "$@"
}
bed__serve_at() {
  local h=$1 shard=$2 addr=$3 port=$4
  shift 4
  BED_SERVE["$h $shard"]="$BED_BIN serve --shard $shard --listen $addr:$port --insecure $*"
  BED_LISTEN["$h $shard"]=$addr:$port
  bed__start_server "$h" "$shard"
}

bed__ns_empty() { [ -z "$(ip netns pids "$(bed_ns "$1")" 2>/dev/null)" ]; }
bed_kill_host() {
  local p key
  for p in $(ip netns pids "$(bed_ns "$1")"); do kill -9 "$p" 2>/dev/null; done
  bed_wait_for 30 bed__ns_empty "$1" || bed_fail "host $1 still runs $(ip netns pids "$(bed_ns "$1")")"
  for key in "${!BED_PID[@]}"; do
    [ "${key%% *}" = "$1" ] && unset "BED_PID[$key]"
  done
  return 0
}

bed_restart_host() {
  local key
  for key in "${!BED_SERVE[@]}"; do
    [ "${key%% *}" = "$1" ] && bed__start_server "$1" "${key#* }"
  done
  return 0
}

# Wait (up to 60 s) until process PID is gone.
bed__dead() { ! kill -0 "$1" 2>/dev/null; }
bed__gone() { bed_wait_for 60 bed__dead "$1" || bed_fail "process $1 did not stop"; }

# Every server stopped (SIGTERM) and started again with the same flags:
# fresh rows for the next job.
bed_fresh_servers() {
  local key
  for key in "${!BED_PID[@]}"; do kill "${BED_PID[$key]}" 2>/dev/null; done
  for key in "${!BED_PID[@]}"; do bed__gone "${BED_PID[$key]}"; done
  for key in "${!BED_SERVE[@]}"; do bed__start_server "${key%% *}" "${key#* }"; done
}

# Stop every server cleanly (SIGTERM) and wait for it; forget them.
bed_stop_servers() {
  local key
  for key in "${!BED_PID[@]}"; do kill "${BED_PID[$key]}" 2>/dev/null; done
  for key in "${!BED_PID[@]}"; do bed__gone "${BED_PID[$key]}"; done
  BED_PID=()
  BED_SERVE=()
  BED_LISTEN=()
}

# bed_run H CMD...: CMD in host H's namespace.
bed_run() {
  local h=$1
  shift
  "$BED_NETNS" exec "$h" --tag "$BED_TAG" "$@"
}

bed_cut() { ip -n "srn-$BED_TAG-br" link set "v$1" down; }
bed_mend() { ip -n "srn-$BED_TAG-br" link set "v$1" up; }

bed_squeeze() {
  ip netns exec "$(bed_ns "$1")" tc qdisc replace dev eth0 root tbf rate "$2" burst 16kb latency 200ms &&
    ip netns exec "srn-$BED_TAG-br" tc qdisc replace dev "v$1" root tbf rate "$2" burst 16kb latency 200ms
}
bed_unsqueeze() {
  ip netns exec "$(bed_ns "$1")" tc qdisc del dev eth0 root 2>/dev/null
  ip netns exec "srn-$BED_TAG-br" tc qdisc del dev "v$1" root 2>/dev/null
  return 0
}

# A hung mpirun (a daemon that never reported) ends at this limit, exit 124.
BED_MPIRUN_LIMIT=${BED_MPIRUN_LIMIT:-300}
bed_mpirun() {
  local hosts="" h np=$2 IFS_=$IFS
  IFS=,
  for h in $1; do hosts="$hosts${hosts:+,}$(bed_addr "$h")"; done
  IFS=$IFS_
  shift 2
  mkdir -p "$BED_DIR/host-$BED_K"
  TMPDIR="$BED_DIR/host-$BED_K" timeout -k 10 "$BED_MPIRUN_LIMIT" \
    "$BED_NETNS" exec "$BED_K" --tag "$BED_TAG" mpirun --allow-run-as-root \
      --mca plm_rsh_agent "$BED_DIR/agent" --mca plm_rsh_no_tree_spawn 1 \
      --mca oob_tcp_if_include 198.18.0.0/24 --mca btl_tcp_if_include 198.18.0.0/24 \
      --mca btl tcp,self --host "$hosts" -np "$np" "$@"
}

# The job every test trains: d.bin (ROWS rows of `datagen --seed 3`, a
# tenth of them test rows: at ROWS 20000, 141 steps of 128) and p.json (2
# shards) in BED_DIR; BED_JOB, the train flags besides the deployment's.
bed_data() {
  (cd "$BED_DIR" && "$BED_BIN" datagen --rows "$1" --seed 3 --out d.tsv &&
    "$BED_BIN" convert --test-fraction 0.1 d.tsv d.bin && rm d.tsv &&
    "$BED_BIN" train --processed-data-file d.bin --num-batches 1 --num-shards 2 $BED_ARCH \
      --plan-out p.json) >"$BED_DIR/prep.log" 2>&1 || bed_fail "data: $(cat "$BED_DIR/prep.log")"
  BED_JOB="--processed-data-file $BED_DIR/d.bin --plan $BED_DIR/p.json $BED_ARCH --mini-batch-size 128
    --optimizer adagrad --learning-rate 0.01 --sparse-learning-rate 0.1 --dense-threads 1 --print-freq 1"
}
BED_ARCH="--arch-mlp-bot 13-32-16 --arch-mlp-top 64-1"

# bed_two_servers NAME ROWS: the usual bed: 4 hosts (bed_init NAME 4), ROWS
# lines of data (bed_data), the checkpoint folder every host sees,
# CK=$BED_DIR/ck (D=$BED_DIR), and a shard server at port 7000 on hosts 0
# and 1 rooted there (SERVERS: their addresses, in shard order).
bed_two_servers() {
  bed_init "$1" 4
  bed_data "$2"
  D=$BED_DIR
  CK=$D/ck
  mkdir "$CK"
  SERVERS="$(bed_addr 0):7000,$(bed_addr 1):7000"
  bed_serve 0 0 7000 --plan "$D/p.json" --checkpoint-root "$CK"
  bed_serve 1 1 7000 --plan "$D/p.json" --checkpoint-root "$CK"
}

# bed_mpirun_lo H NP ARGS...: mpirun -np NP inside host H alone, Open MPI's
# TCP on 127.0.0.1 only (the loopback run the network runs are held to).
bed_mpirun_lo() {
  local h=$1 np=$2
  shift 2
  mkdir -p "$BED_DIR/host-$h"
  TMPDIR="$BED_DIR/host-$h" \
    "$BED_NETNS" exec "$h" --tag "$BED_TAG" mpirun --allow-run-as-root --oversubscribe \
      --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -np "$np" "$@"
}

bed_last_step() {
  local s
  s=$(grep '"kind":"train"' "$1" 2>/dev/null | tail -1 | sed -n 's/.*"step":\([0-9]*\).*/\1/p')
  echo "${s:-0}"
}
bed__reached() {
  [ "$(bed_last_step "$1")" -ge "$2" ] && return 0
  [ -z "$3" ] || kill -0 "$3" 2>/dev/null || bed_fail "the job ended before step $2 (step $(bed_last_step "$1"))"
  return 1
}
bed_wait_step() { bed_wait_for 300 bed__reached "$1" "$2" "${3:-}" || bed_fail "no step $2 in $1 in 300 s"; }

bed_final() {
  awk '/"kind":"train"/ {
         s = $0; sub(/.*"step":/, "", s); sub(/[,}].*/, "", s)
         l = $0; sub(/.*"last_loss":/, "", l); sub(/[,}].*/, "", l)
         if (!(s in loss)) order[n++] = s
         loss[s] = l
       }
       /"kind":"test"/ {
         s = $0; sub(/.*"step":/, "", s); sub(/[,}].*/, "", s)
         a = $0; sub(/.*"auc":/, "", a); sub(/[,}].*/, "", a)
         if (!(s in auc)) torder[m++] = s
         auc[s] = a
       }
       END {
         for (i = 0; i < n; i++) print order[i], loss[order[i]]
         for (i = 0; i < m; i++) print "auc", torder[i], auc[torder[i]]
       }' "$1"
}
