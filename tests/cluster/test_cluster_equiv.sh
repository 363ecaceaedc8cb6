#!/usr/bin/env bash
# The 4-host equivalence (root only, exit 77 elsewhere): shard
# servers on hosts 0 and 1, one trainer rank on each of hosts 2 and 3
# (mpirun -np 2 from a fifth, launch host, Open MPI over TCP on the bed's
# link), sync mode, one epoch of 141 steps. The same job on loopback (both
# servers and both ranks in one namespace on 127.0.0.1) first. Per-step
# losses and test AUC are bit-identical, and so are the final checkpoints'
# dense state and every shard's rows; the ranks' hosts received megabytes
# on their links (the run went over them).
set -uo pipefail
source "${SHARDREC_SRC:?SHARDREC_SRC (the source tree) must be set}/tests/cluster/bed.sh"
bed_init cluster_equiv 4
bed_data 20000
D=$BED_DIR
mkdir "$D/ck"

# Loopback: everything inside the launch host, on 127.0.0.1.
bed_serve_lo 4 0 7000 --plan "$D/p.json" --checkpoint-root "$D/ck"
bed_serve_lo 4 1 7001 --plan "$D/p.json" --checkpoint-root "$D/ck"
bed_mpirun_lo 4 2 "$BED_BIN" train $BED_JOB --shard-servers 127.0.0.1:7000,127.0.0.1:7001 \
  --metrics-out "$D/lo.jsonl" --save-checkpoint "$D/ck/lo" >"$D/lo.out" 2>&1 ||
  bed_fail "loopback run: $(tail -20 "$D/lo.out")"
grep -q "^ranks  2 rank(s) (mpirun), 2 on this node" "$D/lo.out" || bed_fail "loopback ranks: $(head -3 "$D/lo.out")"
bed_stop_servers

# The network: servers on hosts 0 and 1, ranks on hosts 2 and 3.
bed_serve 0 0 7000 --plan "$D/p.json" --checkpoint-root "$D/ck"
bed_serve 1 1 7000 --plan "$D/p.json" --checkpoint-root "$D/ck"
rx() { bed_run "$1" cat /sys/class/net/eth0/statistics/rx_bytes; }
rx2=$(rx 2)
rx3=$(rx 3)
bed_mpirun 2,3 2 "$BED_BIN" train $BED_JOB --shard-servers "$(bed_addr 0):7000,$(bed_addr 1):7000" \
  --metrics-out "$D/net.jsonl" --save-checkpoint "$D/ck/net" >"$D/net.out" 2>&1 ||
  bed_fail "4-host run: $(tail -20 "$D/net.out")"
grep -q "^ranks  2 rank(s) (mpirun), 1 on this node" "$D/net.out" || bed_fail "4-host ranks: $(head -3 "$D/net.out")"
grep -q "^shards 2 shard server(s): 198.18.0.1:7000,198.18.0.2:7000" "$D/net.out" ||
  bed_fail "4-host servers: $(grep '^shards' "$D/net.out")"
# Each rank's host got its rows and the all-reduced gradients over its
# link: 141 steps of up to 64 x 26 rows of 64 bytes, and of 24593 floats
# (about 20 MB were measured; a fifth of it is the floor).
got2=$(($(rx 2) - rx2))
got3=$(($(rx 3) - rx3))
[ "$got2" -gt 4000000 ] && [ "$got3" -gt 4000000 ] ||
  bed_fail "the ranks' hosts received $got2 and $got3 bytes on eth0 during the run"
bed_stop_servers

bed_final "$D/lo.jsonl" >"$D/lo.final"
bed_final "$D/net.jsonl" >"$D/net.final"
[ "$(grep -vc '^auc' "$D/lo.final")" -eq 141 ] || bed_fail "loopback: $(grep -vc '^auc' "$D/lo.final") steps, not 141"
auc=$(sed -n 's/^auc 141 //p' "$D/lo.final")
awk -v a="$auc" 'BEGIN {exit !(a > 0.6)}' || bed_fail "the model did not learn (loopback auc '$auc')"
cmp -s "$D/lo.final" "$D/net.final" ||
  bed_fail "losses or AUC differ (loopback < > 4 hosts): $(diff "$D/lo.final" "$D/net.final" | head -6)"
cmp "$D/ck/lo/step-141/dense.bin" "$D/ck/net/step-141/dense.bin" || bed_fail "dense.bin differs"
diff -r "$D/ck/lo/step-141/shards" "$D/ck/net/step-141/shards" || bed_fail "the shards' rows differ"
[ "$(find "$D/ck/net/step-141/shards" -name 'table-*.bin' | wc -l)" -eq 52 ] ||
  bed_fail "not 2 x 26 table files: $(find "$D/ck/net/step-141/shards" | head)"
echo "$BED_NAME: 141 steps, test auc $auc, the ranks' hosts received $got2 and $got3 bytes: losses, AUC, dense state and rows bit-identical on loopback and on 4 hosts"
echo "$BED_NAME: passed"
