#!/usr/bin/python3
"""A model of a shardrec training step at scale (docs/SCALE.md): bytes per
step on each link, and where a job of R ranks and S shard servers turns
network-bound. Standard library only (Debian's python3).

  scale_model.py unique --data FILE.tsv[.gz] --batch B [--batches K]
      unique ids per table in batches of B lines (what one rank dedups)
  scale_model.py step --dim D --batch B --ranks R --servers S
      (--rows-per-step U | --data FILE.tsv) [--mlp-bot ...] [--mlp-top ...]
      [--rate-gbit G,...] [--dense-ms T] [--cpu-us-per-row C]
      [--base-ms T --lookup-ms T --push-ms T --allreduce-ms T] [--json]
      one job: bytes per step per link, wire times and samples/s at each rate
  scale_model.py clusters [--data FILE.tsv | --rows-per-table U] [...]
      the representative clusters (16 ranks x 4 servers on 25 Gbit/s,
      128 x 32 on 100 Gbit/s) at dim 16 and 128: the link rate and the
      server count below which each turns network-bound

The step (sync mode, one rank; --batch is the global batch, B/R per rank):
  lookup  the rank sends its U unique ids (varints, --id-bytes each; twice
          with the look-ahead's hints, --prefetch-depth > 0) and gets
          U rows of D float32 back; a server sends R*U/S rows (ids hashed
          evenly over the servers; ranks' ids are fetched separately)
  push    the rank sends U ids and U row gradients; a server takes R*U/S
  dense   the all-reduce of the MLP's P float32 gradients, a ring:
          2(R-1)/R * 4P bytes each way on every rank's link
The three are serial within a step (sync mode: the lookup of step t+1 waits
for the pushes of step t), each on the busier of the rank's and the
servers' links. A phase takes its CPU time plus its wire time (bytes /
(rate x ETA), ETA = TCP payload per Ethernet frame; --overlap max: the
longer of the two). Its CPU time: what it takes on a link that is not the
limit (--lookup-ms --push-ms --allreduce-ms, the trainer's own phase times,
less their wire time there), or a server's CPU a row (--cpu-us-per-row,
`shardrec bench rpc`) x the rows it handles, over its threads.
Samples/s = batch / (dense compute + the phases + latency).
"""
import argparse
import gzip
import json
import math
import sys

N_DENSE, N_SPARSE = 13, 26
ETA = 1448.0 / 1514.0  # TCP payload (MSS, timestamps on) per 1514-byte frame on a 1500 MTU


def mlp_params(widths):
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def dense_params(dim, bot, top, tables=N_SPARSE, interaction="dot"):
    """DLRM's dense parameters: bottom MLP (13-...-dim), top MLP over
    [bottom output, pairwise dots of the tables+1 vectors, strictly lower
    triangle] (dot) or the concatenation (cat)."""
    if bot[-1] != dim:
        raise ValueError("--mlp-bot must end at the dim (%d), not %d" % (dim, bot[-1]))
    n = tables + 1
    top_in = dim + n * (n - 1) // 2 if interaction == "dot" else dim * n
    return mlp_params(bot) + mlp_params([top_in] + top)


def open_text(path):
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def unique_ids(path, batch, batches):
    """Mean unique ids per table in each of the first `batches` batches of
    `batch` lines of a Criteo TSV (raw values; an empty field counts as one
    id, as the trainer's dictionary gives it one; a multi-hot field's ids are
    split on ','). Returns (per-table list, batches read)."""
    sums = [0] * N_SPARSE
    seen = [set() for _ in range(N_SPARSE)]
    got = lines = 0
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) < 1 + N_DENSE:
                raise ValueError("%s:%d: %d fields, need at least %d" % (path, lineno, len(fields), 1 + N_DENSE))
            cats = fields[1 + N_DENSE:] + [""] * (N_SPARSE - len(fields[1 + N_DENSE:]))
            for t in range(N_SPARSE):
                for v in cats[t].split(","):
                    seen[t].add(v)
            lines += 1
            if lines == batch:
                for t in range(N_SPARSE):
                    sums[t] += len(seen[t])
                    seen[t].clear()
                got += 1
                lines = 0
                if got == batches:
                    break
    if got == 0:
        raise ValueError("%s: fewer than %d lines (one batch)" % (path, batch))
    return [s / got for s in sums], got


def widths(s):
    try:
        return [int(x) for x in s.split("-")]
    except ValueError:
        raise argparse.ArgumentTypeError("'%s': widths joined by '-' (13-512-256-64-16)" % s)


def floats(s):
    try:
        return [float(x) for x in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("'%s': numbers joined by ','" % s)


def step_bytes(dim, rows, ranks, servers, params, id_bytes, hints=True):
    """Payload bytes of one step, per rank link and per server link, each
    direction, by phase. rows: one rank's unique rows (all tables). hints:
    the look-ahead sends each step's ids once more, a step ahead
    (--prefetch-depth > 0)."""
    row = 4.0 * dim
    srv_rows = ranks * rows / servers
    ids = (2.0 if hints else 1.0) * id_bytes
    ring = 2.0 * (ranks - 1) / ranks * 4.0 * params if ranks > 1 else 0.0
    return {
        "lookup": {"rank_tx": rows * ids, "rank_rx": rows * row,
                   "server_rx": srv_rows * ids, "server_tx": srv_rows * row},
        "push": {"rank_tx": rows * (row + id_bytes), "rank_rx": 0.0,
                 "server_rx": srv_rows * (row + id_bytes), "server_tx": 0.0},
        "allreduce": {"rank_tx": ring, "rank_rx": ring, "server_rx": 0.0, "server_tx": 0.0},
    }


def wire_seconds(b, rate_bps):
    """A phase's wire time: its request then its answer, each on the busier
    of the rank's and the server's side of that direction."""
    cap = rate_bps / 8.0 * ETA
    if b["rank_tx"] and b["rank_rx"] and b["server_tx"] == 0 and b["server_rx"] == 0:
        return max(b["rank_tx"], b["rank_rx"]) / cap  # the all-reduce: both ways at once
    return (max(b["rank_tx"], b["server_rx"]) + max(b["rank_rx"], b["server_tx"])) / cap


def model_step(a, rows):
    params = dense_params(a.dim, a.mlp_bot, a.mlp_top, interaction=a.interaction)
    by = step_bytes(a.dim, rows, a.ranks, a.servers, params, a.id_bytes, not a.no_hints)
    srv_rows = a.ranks * rows / a.servers
    # CPU floor of each phase: measured on a fast link, or the servers' CPU.
    floor = {"lookup": a.lookup_ms / 1e3, "push": a.push_ms / 1e3, "allreduce": a.allreduce_ms / 1e3}
    if a.cpu_us_per_row:
        cl, cp = a.cpu_us_per_row
        floor["lookup"] = max(floor["lookup"], srv_rows * cl / 1e6 / a.server_threads)
        floor["push"] = max(floor["push"], srv_rows * cp / 1e6 / a.server_threads)
    base = (a.base_ms if a.base_ms is not None else a.dense_ms) / 1e3
    out = {"dim": a.dim, "batch": a.batch, "ranks": a.ranks, "servers": a.servers,
           "rows_per_rank_step": rows, "dense_params": params, "bytes": by,
           "rank_link_bytes": sum(p["rank_tx"] + p["rank_rx"] for p in by.values()),
           "server_link_bytes": sum(p["server_tx"] + p["server_rx"] for p in by.values()),
           "base_s": base, "cpu_floor_s": floor, "rates": []}
    # Latency: a round trip for the lookup and for the push, 2(R-1) hops of the ring.
    lat = a.latency_us / 1e6 * (2 * 2 + (2 * (a.ranks - 1) if a.ranks > 1 else 0))
    busy = sum(wire_seconds(b, 1.0) for b in by.values())  # seconds at 1 bit/s
    rest = base + sum(floor.values()) - lat
    out["network_bound_below_gbit"] = busy / rest / 1e9 if rest > 0 else math.inf
    for g in a.rate_gbit:
        join = max if getattr(a, "overlap", "serial") == "max" else (lambda x, y: x + y)
        ph = {k: join(floor[k], wire_seconds(b, g * 1e9)) for k, b in by.items()}
        t = base + sum(ph.values()) + lat
        wire = sum(wire_seconds(b, g * 1e9) for b in by.values()) + lat
        parts = {"dense compute": base, "CPU (servers, RPCs)": sum(floor.values()), "network": wire}
        out["rates"].append({"gbit": g, "step_s": t, "phases_s": ph, "wire_s": wire,
                             "samples_per_s": a.batch / t, "network_bound": wire > base + sum(floor.values()),
                             "bound_by": max(parts, key=parts.get)})
    return out


def print_step(m):
    print("dim %d, global batch %d, %d rank(s), %d server(s): %.0f unique rows a rank a step, %d dense parameters"
          % (m["dim"], m["batch"], m["ranks"], m["servers"], m["rows_per_rank_step"], m["dense_params"]))
    for k, b in m["bytes"].items():
        print("  %-9s rank link  tx %10.0f B  rx %10.0f B   server link  tx %10.0f B  rx %10.0f B"
              % (k, b["rank_tx"], b["rank_rx"], b["server_tx"], b["server_rx"]))
    print("  a step moves %.2f MB over each rank's link, %.2f MB over each server's (payload; / %.3f on the wire)"
          % (m["rank_link_bytes"] / 1e6, m["server_link_bytes"] / 1e6, ETA))
    f = m["cpu_floor_s"]
    print("  dense compute %.2f ms; CPU floors: lookup %.2f ms, push %.2f ms, all-reduce %.2f ms"
          % (1e3 * m["base_s"], 1e3 * f["lookup"], 1e3 * f["push"], 1e3 * f["allreduce"]))
    for r in m["rates"]:
        print("  %6g Gbit/s: step %8.2f ms (wire %7.2f ms) %10.0f samples/s, bound by %s"
              % (r["gbit"], 1e3 * r["step_s"], 1e3 * r["wire_s"], r["samples_per_s"], r["bound_by"]))
    print("  network-bound below %.2f Gbit/s (the step's wire time > its compute and CPU time)"
          % m["network_bound_below_gbit"])


def rows_from(a, batch_per_rank):
    if a.rows_per_step is not None:
        return a.rows_per_step
    if a.data:
        per_table, _ = unique_ids(a.data, batch_per_rank, a.batches)
        return sum(per_table)
    return a.rows_per_table * N_SPARSE


def cmd_unique(a):
    per_table, got = unique_ids(a.data, a.batch, a.batches)
    print("%s: %d batch(es) of %d lines: unique ids per table %s; %.1f in all (%.1f%% of the %d ids)"
          % (a.data, got, a.batch, " ".join("%.0f" % x for x in per_table), sum(per_table),
             100.0 * sum(per_table) / (a.batch * N_SPARSE), a.batch * N_SPARSE))


def cmd_step(a):
    if a.batch % a.ranks:
        sys.exit("scale_model.py: --batch %d does not divide by --ranks %d" % (a.batch, a.ranks))
    m = model_step(a, rows_from(a, a.batch // a.ranks))
    if a.json:
        print(json.dumps(m))
    else:
        print_step(m)


CLUSTERS = [(16, 4, 25.0), (128, 32, 100.0)]
SHAPES = [("Kaggle", 16, [13, 512, 256, 64, 16], [512, 256, 1]),
          ("MLPerf-like", 128, [13, 512, 256, 128], [1024, 1024, 512, 256, 1])]


def cmd_clusters(a):
    if len(a.dense_ms_shapes) != 2:
        sys.exit("scale_model.py: --dense-ms K,M: the dense compute of the Kaggle and the MLPerf-like step")
    rows = rows_from(a, a.batch_per_rank)
    if len(a.cpu_us_per_row) != 4:
        sys.exit("scale_model.py: --cpu-us-per-row L16,P16,L128,P128: a lookup's and a push's CPU a row at dim 16 and 128")
    print("representative clusters: %d samples a rank a step, %.0f unique rows a rank a step; dense compute "
          "%.1f / %.1f ms a step (Kaggle / MLPerf-like, --dense-ms); server CPU a row (lookup + push, "
          "--cpu-us-per-row) %.3f + %.3f us at dim 16, %.3f + %.3f us at dim 128, on %d thread(s)"
          % (a.batch_per_rank, rows, a.dense_ms_shapes[0], a.dense_ms_shapes[1], *a.cpu_us_per_row,
             a.server_threads))
    cpus = (a.cpu_us_per_row[:2], a.cpu_us_per_row[2:])
    for (name, dim, bot, top), dense, cpu in zip(SHAPES, a.dense_ms_shapes, cpus):
        for ranks, servers, gbit in CLUSTERS:
            s = argparse.Namespace(**vars(a))
            s.dim, s.mlp_bot, s.mlp_top, s.ranks, s.servers = dim, bot, top, ranks, servers
            s.batch, s.rate_gbit, s.dense_ms, s.cpu_us_per_row = a.batch_per_rank * ranks, [gbit], dense, cpu
            m = model_step(s, rows)
            r = m["rates"][0]
            s_net = _fewest_servers(s, rows, lambda t: not t["rates"][0]["network_bound"])
            s_cpu = _fewest_servers(s, rows, lambda t: _server_cpu(t, s) <= t["base_s"])
            print("%-11s dim %3d  %3d ranks x %2d servers, %3.0f Gbit/s: rank link %6.2f MB, server link %6.2f MB a step;"
                  " wire %6.2f ms, step %7.2f ms, %9.0f samples/s, %s; network-bound below %.1f Gbit/s;"
                  " at this rate %s, %s"
                  % (name, dim, ranks, servers, gbit, m["rank_link_bytes"] / 1e6, m["server_link_bytes"] / 1e6,
                     1e3 * r["wire_s"], 1e3 * r["step_s"], r["samples_per_s"],
                     "bound by " + r["bound_by"],
                     m["network_bound_below_gbit"],
                     "network-bound at no S" if s_net == 1 else "network-bound below S = %s" % s_net
                     if s_net else "network-bound at any S (the ranks' links)",
                     "servers CPU-bound at no S" if s_cpu == 1 else "servers CPU-bound below S = %s" % s_cpu
                     if s_cpu else "servers CPU-bound at any S up to 4R"))


def _server_cpu(m, s):
    srv_rows = s.ranks * m["rows_per_rank_step"] / m["servers"]
    return srv_rows * (s.cpu_us_per_row[0] + s.cpu_us_per_row[1]) / 1e6 / s.server_threads


def _fewest_servers(s, rows, ok):
    """The fewest servers (up to 4R) for which ok(model) holds, else None."""
    for k in range(1, 4 * s.ranks + 1):
        t = argparse.Namespace(**vars(s))
        t.servers = k
        if ok(model_step(t, rows)):
            return k
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("unique", help="unique ids per table per batch, from a TSV")
    u.add_argument("--data", required=True)
    u.add_argument("--batch", type=int, required=True)
    u.add_argument("--batches", type=int, default=20)
    for name in ("step", "clusters"):
        s = sub.add_parser(name)
        g = s.add_mutually_exclusive_group()
        g.add_argument("--rows-per-step", type=float, help="one rank's unique rows a step (the trainer's "
                       "shardrec_train_lookup_bytes_total / (dim x 4) / steps)")
        g.add_argument("--data", help="a Criteo TSV (datagen's): unique ids measured from it")
        g.add_argument("--rows-per-table", type=float, default=600.0,
                       help="unique ids per table a rank a step when neither is given (600)")
        s.add_argument("--batches", type=int, default=20, help="batches of --data read (20)")
        s.add_argument("--id-bytes", type=float, default=3.0, help="bytes of a packed varint id (3: ids < 2^21)")
        s.add_argument("--interaction", choices=("dot", "cat"), default="dot")
        s.add_argument("--no-hints", action="store_true", help="train --prefetch-depth 0: ids sent once a step")
        s.add_argument("--latency-us", type=float, default=10.0,
                       help="one hop's latency: 2 round trips a step and 2(R-1) ring hops (10)")
        s.add_argument("--cpu-us-per-row", type=floats, default=None,
                       help="L,P: a server's CPU microseconds a looked-up and a pushed row (bench rpc)")
        s.add_argument("--server-threads", type=int, default=2)
        s.add_argument("--lookup-ms", type=float, default=0.0, help="the lookup phase on a fast link (floor)")
        s.add_argument("--push-ms", type=float, default=0.0)
        s.add_argument("--allreduce-ms", type=float, default=0.0)
        s.add_argument("--json", action="store_true")
        s.add_argument("--overlap", choices=("serial", "max"), default="serial",
                       help="a phase's CPU and wire time: added (serial) or the longer (max)")
        if name == "step":
            s.add_argument("--dim", type=int, required=True)
            s.add_argument("--batch", type=int, required=True, help="the global batch")
            s.add_argument("--ranks", type=int, required=True)
            s.add_argument("--servers", type=int, required=True)
            s.add_argument("--mlp-bot", type=widths, default=[13, 512, 256, 64, 16])
            s.add_argument("--mlp-top", type=widths, default=[512, 256, 1])
            s.add_argument("--rate-gbit", type=floats, default=[1.0, 5.0, 20.0])
            s.add_argument("--dense-ms", type=float, default=0.0, help="dense compute a step (forward, backward, optimizer)")
            s.add_argument("--base-ms", type=float, default=None,
                           help="the step's time outside lookup, push and all-reduce (measured; else --dense-ms)")
        else:
            s.add_argument("--batch-per-rank", type=int, default=2048)
            s.add_argument("--dense-ms", dest="dense_ms_shapes", type=floats, default=[20.0, 60.0],
                           help="K,M: dense compute a step of the Kaggle and the MLPerf-like shape (20,60)")
    a = p.parse_args()
    try:
        if a.cmd == "unique":
            cmd_unique(a)
        elif a.cmd == "step":
            cmd_step(a)
        else:
            if a.cpu_us_per_row is None:
                a.cpu_us_per_row = [0.106, 0.162, 0.664, 0.969]  # bench rpc --part lookup, this machine
            a.base_ms = None
            cmd_clusters(a)
    except (OSError, ValueError) as e:
        sys.exit("scale_model.py: %s" % e)


if __name__ == "__main__":
    main()
