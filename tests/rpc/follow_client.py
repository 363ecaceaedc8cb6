"""A serving client reading each batch's rows from two following shard
servers (serve --checkpoint ROOT --follow), driven by
tests/rpc/test_serve_follow.sh, which makes the checkpoints, the stubs and
the servers.

usage: follow_client.py STUBS ADDR_A ADDR_B ADDR_FRESH ROOT QUIET_FILE STOP_FILE LOG_A LOG_B ADDR_PLAIN

Loops batches until STOP_FILE exists: each batch asks every table for a
few ids (Zipf-skewed, so that most are rows the checkpoints hold), the
even tables of server A and the odd ones of server B. When the two answers
name different steps, the server at the newer step is asked again for the
older one (LookupRequest.at_step: it holds the steps it served before for
its --follow-grace). Any failed call fails the run. After QUIET_FILE is
written (300 batches, before any swap) the shell starts the trainer.

Then every batch is checked: both halves name the same step, and every row
equals that checkpoint's (ROOT/step-N's chain folded: its full
checkpoint's table files with each increment's laid over; a row no link
holds is the plan's init value, read from ADDR_FRESH, a server of the
plan's fresh rows). Lookup latency is printed for the batches before the
trainer started and for the calls that overlapped a swap on either server
(the "swap" events of the JSON logs LOG_A, LOG_B: the time each swap ended,
its prepare_s and swap_s). ADDR_PLAIN serves ROOT/step-800 without
following: its answers name step 800, and it answers a Lookup asking for
step 800 and refuses one asking for 802. Prints one line per check; exits
1 on the first failure."""
import json
import os
import random
import struct
import sys
import time

import grpc

stubs, addr_a, addr_b, addr_fresh, root, quiet_file, stop_file, log_a, log_b, addr_plain = \
    sys.argv[1:11]
sys.path.insert(0, stubs)
from rpc import shardrec_pb2 as pb  # noqa: E402

SVC = "/shardrec.v1.EmbeddingShard/"
IDS = 6  # ids per table per batch


def fail(what):
    print("FAIL " + what, flush=True)
    sys.exit(1)


def check(ok, what):
    if not ok:
        fail(what)
    print("ok   " + what, flush=True)


def channel(addr):
    ch = grpc.insecure_channel(addr)
    look = ch.unary_unary(SVC + "Lookup", request_serializer=pb.LookupRequest.SerializeToString,
                          response_deserializer=pb.LookupResponse.FromString)
    stats = ch.unary_unary(SVC + "Stats", request_serializer=pb.StatsRequest.SerializeToString,
                           response_deserializer=pb.StatsResponse.FromString)
    return look, stats


look_a, stats_a = channel(addr_a)
look_b, _ = channel(addr_b)
look_f, _ = channel(addr_fresh)
look_p, _ = channel(addr_plain)
fp = stats_a(pb.StatsRequest(), timeout=30).plan_fingerprint
plan = json.load(open(os.path.join(root, "plan.json")))
tables = [(t["table_id"], int(t["rows"]), t["dim"]) for t in plan["tables"]]
rng = random.Random(7)
calls = []  # (start, end) of every Lookup
step_no = [0]


def lookup(look, tabs, at=None):
    """The answer to a Lookup of tabs [(table_id, ids)]; a failure fails the run."""
    step_no[0] += 1
    h = pb.RequestHeader(plan_fingerprint=fp, job_id="follow-client", step=step_no[0], rank=0,
                         world_size=1)
    q = pb.LookupRequest(header=h, tables=[pb.TableIds(table_id=t, ids=ids) for t, ids in tabs])
    if at is not None:
        q.at_step, q.step_asked = at, True
    t0 = time.time()
    try:
        r = look(q, timeout=30)
    except grpc.RpcError as e:
        fail("Lookup%s: %s %s" % ("" if at is None else " at step %d" % at, e.code().name,
                                  e.details()))
    calls.append((t0, time.time()))
    return r


def draw(rows):
    """A Zipf-skewed id below rows."""
    return min(rows - 1, int(rows ** rng.random()) - 1) if rng.random() < 0.8 else rng.randrange(rows)


def batch():
    tabs = [(t, sorted({draw(rows) for _ in range(IDS)})) for t, rows, _ in tables]
    half_a, half_b = tabs[0::2], tabs[1::2]
    ra, rb = lookup(look_a, half_a), lookup(look_b, half_b)
    if not (ra.from_checkpoint and rb.from_checkpoint):
        fail("an answer does not name its checkpoint step")
    if ra.step < rb.step:
        rb = lookup(look_b, half_b, ra.step)
    elif rb.step < ra.step:
        ra = lookup(look_a, half_a, rb.step)
    return tabs, ra, rb


batches = []  # (tabs, answer A, answer B)
quiet = 0
while not os.path.exists(stop_file):
    batches.append(batch())
    if len(batches) == 300:
        quiet = len(calls)
        open(quiet_file, "w").close()
for _ in range(20):  # after the last swap
    batches.append(batch())
print("batches %d, Lookups %d; last step %d" % (len(batches), len(calls), batches[-1][1].step),
      flush=True)


# ---- asked steps no server holds ----
def refused(look, at, code, text):
    h = pb.RequestHeader(plan_fingerprint=fp, job_id="follow-client", step=1, rank=0, world_size=1)
    q = pb.LookupRequest(header=h, tables=[pb.TableIds(table_id=tables[0][0], ids=[0])],
                         at_step=at, step_asked=True)
    try:
        look(q, timeout=30)
    except grpc.RpcError as e:
        return e.code().name == code and text in (e.details() or "")
    return False


last = batches[-1][1].step
check(refused(look_a, last + 100, "UNAVAILABLE", "step %d asked; this server serves step %d"
              % (last + 100, last)), "a newer step is refused UNAVAILABLE naming both")
check(refused(look_a, 1, "FAILED_PRECONDITION", "step 1 asked; this server serves step %d"
              % last), "a step never held is refused FAILED_PRECONDITION")
check(refused(look_f, last, "FAILED_PRECONDITION", "serves a plan's rows"),
      "a server of a plan holds no step")
one = [(tables[0][0], [0, 1])]
r0, r1 = lookup(look_p, one), lookup(look_p, one, 800)
check(r0.from_checkpoint and r0.step == 800 and r1.step == 800 and r0.tables == r1.tables,
      "a server of one checkpoint names its step and answers a Lookup asking for it")
check(refused(look_p, 802, "UNAVAILABLE", "step 802 asked, this server serves the checkpoint of "
              "step 800 only"), "and refuses another step")

# ---- the checkpoints' rows ----
def table_rows(path):
    """{row_id: bytes of its dim floats} of a table file (SREMBTAB v1)."""
    data = open(path, "rb").read()
    if data[:8] != b"SREMBTAB":
        fail(path + ": not a table file")
    dim, state = struct.unpack_from("<II", data, 20)
    n, rec = struct.unpack_from("<QQ", data, 32)
    out = {}
    for i in range(n):
        at = 256 + i * rec
        out[struct.unpack_from("<Q", data, at)[0]] = data[at + 8:at + 8 + 4 * dim]
    return out


def manifest(step):
    return json.load(open(os.path.join(root, "step-%d" % step, "manifest.json")))


folded = {}


def rows_at(step):
    """{table_id: {row: bytes}} of step's chain folded."""
    if step in folded:
        return folded[step]
    m = manifest(step)
    if m.get("kind", "full") == "full":
        base = {}
    else:
        base = {t: dict(r) for t, r in rows_at(m["parent"]["step"]).items()}
    for t, _, _ in tables:
        f = os.path.join(root, "step-%d" % step, "shards", "table-%d.bin" % t)
        base.setdefault(t, {}).update(table_rows(f))
    folded[step] = base
    return base


def rows_of(answer):
    out = {}
    for tr in answer.tables:
        d = 4 * tr.dim
        out[tr.table_id] = [tr.rows[i:i + d] for i in range(0, len(tr.rows), d)]
    return out


init = {}  # (table, row) -> bytes: the plan's init values, from the fresh server
steps, mixed, wrong, checked = set(), 0, 0, 0
for tabs, ra, rb in batches:
    if ra.step != rb.step:
        mixed += 1
        continue
    steps.add(ra.step)
    want = rows_at(ra.step)
    got = rows_of(ra)
    got.update(rows_of(rb))
    for t, ids in tabs:
        for i, row in enumerate(ids):
            exp = want.get(t, {}).get(row)
            if exp is None:
                if (t, row) not in init:
                    r = lookup(look_f, [(t, [row])])
                    init[(t, row)] = r.tables[0].rows
                exp = init[(t, row)]
            checked += 1
            if got[t][i] != exp:
                wrong += 1
                if wrong < 4:
                    print("row %d of table %d at step %d differs" % (row, t, ra.step))
check(mixed == 0, "every batch's two answers name the same step (%d batches)" % len(batches))
check(wrong == 0, "every row equals its step's checkpoint (%d rows over %d steps: %s)"
      % (checked, len(steps), ",".join(str(s) for s in sorted(steps))))


# ---- latency ----
def swaps(path):
    out = []
    for line in open(path):
        if line.startswith("{"):
            e = json.loads(line)
            if e.get("event") == "swap":
                out.append((e["time"] - e["prepare_s"] - e["swap_s"], e["time"]))
    return out


windows = swaps(log_a) + swaps(log_b)


def p(lat, q):
    lat = sorted(lat)
    return 1e3 * lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")


before = [e - s for s, e in calls[:quiet]]
during = [e - s for s, e in calls[quiet:] if any(s < b and e > a for a, b in windows)]
print("swaps %d; Lookup latency ms: before the trainer p50 %.3f p99 %.3f (%d calls); "
      "overlapping a swap p50 %.3f p99 %.3f (%d calls)"
      % (len(windows), p(before, 0.5), p(before, 0.99), len(before), p(during, 0.5),
         p(during, 0.99), len(during)), flush=True)
check(len(windows) >= 10 and len(during) > 0, "Lookups overlapped swaps")
print("all checks passed", flush=True)
