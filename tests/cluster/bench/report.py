#!/usr/bin/python3
"""The cluster benchmark's table (tests/cluster/bench/run.sh writes the runs):

  report.py RESULTS_DIR

For each run (RESULTS_DIR/r<G>g-d<D>/: run.json, host-K.jsonl from
sample.py, K = 0, 1 the servers, 2, 3 the ranks), the steady part: from the
first sample at 20% of the steps to the last sample before the last step
(the start-up and the end's test pass left out). Samples/s over it; bytes a
step on each host's eth0 (interface counters, Ethernet frames, both ways),
from the servers' counters (shardrec_server_{request,response}_bytes_total:
the calls' messages) and from the trainer's (shardrec_train_lookup_bytes_total:
unique rows x dim x 4, its U); each link's utilisation (the busier
direction's bytes a second over the rate). The model (tools/scale_model.py)
predicts each run's samples/s from its inputs: the run's own U and dense
compute (the step outside the lookup, push and all-reduce), and the CPU time
of those three phases from the run at the highest rate of the same dim (the
control: each phase less its wire time there); at tc's rate and at the rate
tcp_probe.py measured; and once more with the control's dense compute in
place of the run's own (the machine's drift between runs then counts as a
miss). Beside it, the bytes the model puts on a rank's link.
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools"))
import scale_model  # noqa: E402

NET_PHASES = ("lookup", "prefetch", "push", "allreduce")


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def interp(samples, key, t):
    """key(sample) at time t, linear between the samples around it."""
    pts = [(s["t"], key(s)) for s in samples if key(s) is not None]
    if not pts:
        raise ValueError("no samples")
    if t <= pts[0][0]:
        return pts[0][1]
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return pts[-1][1]


def metric(name):
    return lambda s: s["m"].get(name) if s.get("m") else None


def analyse(d):
    run = json.load(open(os.path.join(d, "run.json")))
    hosts = [load(os.path.join(d, "host-%d.jsonl" % k)) for k in range(4)]
    steps = run["steps"]
    r0 = [s for s in hosts[2] if s.get("m")]
    first = next((s for s in r0 if s["m"]["shardrec_train_step"] >= max(2, 0.2 * steps)), None)
    last = next((s for s in reversed(r0) if s["m"]["shardrec_train_step"] < steps), None)
    if not first or not last or last["m"]["shardrec_train_step"] - first["m"]["shardrec_train_step"] < 3:
        raise ValueError("%s: fewer than 3 steps sampled between 20%% of the run and its end" % d)
    ta, tb = first["t"], last["t"]
    nstep = last["m"]["shardrec_train_step"] - first["m"]["shardrec_train_step"]
    out = dict(run, name=os.path.basename(d), dir=d, steps_measured=nstep, seconds=tb - ta,
               samples_per_s=run["batch"] * nstep / (tb - ta), step_ms=1e3 * (tb - ta) / nstep)
    out["link"] = []
    for k in range(4):
        tx = (interp(hosts[k], lambda s: s["tx_bytes"], tb) - interp(hosts[k], lambda s: s["tx_bytes"], ta)) / nstep
        rx = (interp(hosts[k], lambda s: s["rx_bytes"], tb) - interp(hosts[k], lambda s: s["rx_bytes"], ta)) / nstep
        out["link"].append({"tx": tx, "rx": rx})
    for k in (0, 1):
        own = {}
        for key, series in (("rx", "shardrec_server_request_bytes_total"), ("tx", "shardrec_server_response_bytes_total")):
            try:
                own[key] = (interp(hosts[k], metric(series), tb) - interp(hosts[k], metric(series), ta)) / nstep
            except ValueError:
                own[key] = float("nan")
        out["link"][k]["own"] = own
    rows = []
    for k in (2, 3):
        lb = interp(hosts[k], metric("shardrec_train_lookup_bytes_total"), tb) - \
            interp(hosts[k], metric("shardrec_train_lookup_bytes_total"), ta)
        rows.append(lb / nstep / (4.0 * run["dim"]))
    out["rows_per_rank_step"] = sum(rows) / len(rows)
    out["phase_ms"] = {p: 1e3 * (interp(hosts[2], metric("phase_" + p), tb) -
                                 interp(hosts[2], metric("phase_" + p), ta)) / nstep
                       for p in ("dedup", "lookup", "prefetch", "pool", "forward", "backward", "scatter",
                                 "push", "allreduce", "dense_opt")}
    return out


def widths(mlp, flag):
    a = mlp.split()
    return [int(x) for x in a[a.index(flag) + 1].split("-")]


def probe_gbit(run):
    """The payload rate tcp_probe.py measured on the run's link."""
    try:
        with open(os.path.join(run["dir"], "probe.json")) as f:
            return json.load(f)["payload_gbit"]
    except OSError:
        return None


def net_phases(run):
    ph = run["phase_ms"]
    return {"lookup": ph["lookup"] + ph["prefetch"], "push": ph["push"], "allreduce": ph["allreduce"]}


def predict(run, ctrl, measured_rate, own_base=True):
    """The model's step for run. Each network phase's CPU time comes from
    ctrl (the same dim at the highest rate): ctrl's phase less its wire time
    at ctrl's rate. The base (the step outside the lookup, push and
    all-reduce: the dense compute, an input of the model like U) is the
    run's own (own_base), or ctrl's (then the machine's drift between runs
    is in the comparison too). The rates: tc's (nominal), or with
    measured_rate the payload rate tcp_probe.py measured on each run's link
    (a busy machine moves less)."""
    net = net_phases(ctrl)
    base = run if own_base else ctrl
    a = argparse.Namespace(dim=run["dim"], batch=run["batch"], ranks=2, servers=2,
                           mlp_bot=widths(run["mlp"], "--arch-mlp-bot"), mlp_top=widths(run["mlp"], "--arch-mlp-top"),
                           interaction="dot", id_bytes=3.0, latency_us=0.0, dense_ms=0.0, cpu_us_per_row=None,
                           server_threads=2, no_hints=False, overlap="serial",
                           base_ms=base["step_ms"] - sum(net_phases(base).values()))
    params = scale_model.dense_params(a.dim, a.mlp_bot, a.mlp_top)
    by = scale_model.step_bytes(a.dim, ctrl["rows_per_rank_step"], 2, 2, params, a.id_bytes)
    eta = scale_model.ETA
    ctrl_bps = (probe_gbit(ctrl) / eta if measured_rate else ctrl["rate_gbit"]) * 1e9
    floor = {k: max(0.0, net[k] - 1e3 * scale_model.wire_seconds(by[k], ctrl_bps)) for k in net}
    a.lookup_ms, a.push_ms, a.allreduce_ms = floor["lookup"], floor["push"], floor["allreduce"]
    a.rate_gbit = [probe_gbit(run) / eta if measured_rate else run["rate_gbit"]]
    return scale_model.model_step(a, run["rows_per_rank_step"])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RESULTS_DIR")
    runs = []
    for d in sorted(glob.glob(os.path.join(sys.argv[1], "r*g-d*"))):
        if os.path.exists(os.path.join(d, "run.json")):
            runs.append(analyse(d))
    if not runs:
        sys.exit("report.py: no runs in %s" % sys.argv[1])
    runs.sort(key=lambda r: (r["dim"], r["rate_gbit"]))
    ctrl = {}
    for r in runs:
        if r["dim"] not in ctrl or r["rate_gbit"] > ctrl[r["dim"]]["rate_gbit"]:
            ctrl[r["dim"]] = r
    eta = scale_model.ETA
    print("cluster bench: 2 server hosts, 2 rank hosts (mpirun -np 2), sync mode, global batch %d; "
          "bytes a step per link from eth0's counters (frames, both ways) and the servers'; the model: "
          "tools/scale_model.py, given each run's U and dense compute, the CPU time of lookup, push and "
          "all-reduce from the run at the highest rate of each dim" % runs[0]["batch"])
    print("%6s %4s %5s | %9s | %-16s | %6s %-16s | %-16s | %-17s %-17s %-17s | %-17s | %5s %7s | %s"
          % ("Gbit/s", "dim", "steps", "samples/s", "model (tc rate)", "TCP", "model (TCP rate)", "control's base",
             "rank 0 eth0 tx/rx", "server 0 eth0", "server 0 counted", "model: rank link", "util", "cap",
             "rows a rank a step; ms a step: step, network phases"))
    print("%6s %4s %5s | %9s | %-16s | %6s %-16s | %-16s | %-17s %-17s %-17s | %-17s | %5s %7s |"
          % ("", "", "", "measured", "samples/s  diff", "Gbit/s", "samples/s  diff", "samples/s  diff", "MB a step",
             "tx / rx MB a step", "tx / rx MB a step", "tx / rx MB a step", "", "MB/step"))
    for r in runs:
        pc = predict(r, ctrl[r["dim"]], False, own_base=False)["rates"][0]["samples_per_s"]
        pn = predict(r, ctrl[r["dim"]], False)["rates"][0]["samples_per_s"]
        probed = probe_gbit(r) is not None and probe_gbit(ctrl[r["dim"]]) is not None
        m = predict(r, ctrl[r["dim"]], probed)
        pm = m["rates"][0]["samples_per_s"] if probed else float("nan")
        r["predicted_tc_rate"], r["predicted_tcp_rate"], r["tcp_gbit"] = pn, pm, probe_gbit(r)
        r["predicted_tc_rate_control_base"] = pc
        by = m["bytes"]
        mtx = sum(b["rank_tx"] for b in by.values()) / eta / 1e6
        mrx = sum(b["rank_rx"] for b in by.values()) / eta / 1e6
        rk = [(l["tx"] / 1e6, l["rx"] / 1e6) for l in r["link"]]
        cap = r["rate_gbit"] * 1e9 / 8 * r["step_ms"] / 1e3 / 1e6  # MB the link moves in one step
        util = max(max(x) for x in rk) / cap
        ph = r["phase_ms"]
        diff = lambda p: 100.0 * (p - r["samples_per_s"]) / r["samples_per_s"]
        own = r["link"][0]["own"]
        print("%6g %4d %5d | %9.0f | %9.0f %+5.0f%% | %6.2f %9.0f %+5.0f%% | %9.0f %+5.0f%% | %7.3f / %7.3f %7.3f / %7.3f %7.3f / %7.3f | %7.3f / %7.3f | "
              "%4.0f%% %7.2f | %.0f; %.1f: lookup %.1f, prefetch %.1f, push %.1f, all-reduce %.1f"
              % (r["rate_gbit"], r["dim"], r["steps_measured"], r["samples_per_s"], pn, diff(pn),
                 r["tcp_gbit"] or float("nan"), pm, diff(pm), pc, diff(pc), rk[2][0], rk[2][1], rk[0][0], rk[0][1],
                 own["tx"] / 1e6, own["rx"] / 1e6, mtx, mrx,
                 100 * util, cap, r["rows_per_rank_step"], r["step_ms"], ph["lookup"], ph["prefetch"], ph["push"],
                 ph["allreduce"]))
    json.dump(runs, open(os.path.join(sys.argv[1], "runs.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
