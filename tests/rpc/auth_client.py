"""Authorisation rules of an mTLS shard server, from a Python grpcio client
(driven by tests/rpc/test_rpc_tls.c, which makes the certificates, the
stubs and the server: --allow-push trainer --allow-admin ops
--checkpoint-root ROOT).

usage: auth_client.py STUBS ADDR CERTS FINGERPRINT ROOT OUTSIDE

Lookup, Stats, Health and GetTransform are open to both identities; Push and
PushLookup (protobuf's own encoding of it, answered with the Lookup's rows)
only to 'trainer', Checkpoint, Restore and SwapAt only to 'ops' (PERMISSION_DENIED
naming the method otherwise; this server does not follow, so 'ops' SwapAt is
refused FAILED_PRECONDITION saying so); a client of another CA gets nothing. Checkpoint paths
inside ROOT are written; outside it, escaping it through '..' or through a
symlink (ROOT/esc -> OUTSIDE) they are refused PERMISSION_DENIED and nothing
appears in OUTSIDE; a folder that exists is refused ALREADY_EXISTS. A call
refused by the lists counts in Stats as an answered call (push_calls and
failed_calls one more). Prints
one line per check and 'all checks passed' at the end; exits 1 on the first
failure."""
import os
import sys

import grpc

stubs, addr, certs, fp, root, outside = sys.argv[1:7]
sys.path.insert(0, stubs)
from rpc import shardrec_pb2 as pb  # noqa: E402
from rpc import health_pb2 as hp  # noqa: E402

SVC = "/shardrec.v1.EmbeddingShard/"
METHODS = {
    "Lookup": (pb.LookupRequest, pb.LookupResponse),
    "Push": (pb.PushRequest, pb.PushResponse),
    "Checkpoint": (pb.CheckpointRequest, pb.CheckpointResponse),
    "Restore": (pb.RestoreRequest, pb.RestoreResponse),
    "Stats": (pb.StatsRequest, pb.StatsResponse),
    "GetTransform": (pb.GetTransformRequest, pb.GetTransformResponse),
    "SwapAt": (pb.SwapAtRequest, pb.SwapAtResponse),
    "PushLookup": (pb.PushLookupRequest, pb.LookupResponse),
}


def read(name):
    with open(os.path.join(certs, name), "rb") as f:
        return f.read()


def channel(who):
    creds = grpc.ssl_channel_credentials(
        root_certificates=read("ca.pem"),
        private_key=read(who + ".key"),
        certificate_chain=read(who + ".pem"))
    return grpc.secure_channel(addr, creds)


def call(ch, method, req):
    """(status code name, details or response)."""
    if method == "Health":
        f = ch.unary_unary("/grpc.health.v1.Health/Check",
                           request_serializer=hp.HealthCheckRequest.SerializeToString,
                           response_deserializer=hp.HealthCheckResponse.FromString)
    else:
        q, a = METHODS[method]
        f = ch.unary_unary(SVC + method, request_serializer=q.SerializeToString,
                           response_deserializer=a.FromString)
    try:
        return "OK", f(req, timeout=10)
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


def expect(what, got, code, text=None):
    status, detail = got
    ok = status == code and (text is None or text in str(detail))
    print("%s %s: %s %s" % ("ok  " if ok else "FAIL", what, status,
                            detail if status != "OK" else ""))
    if not ok:
        print("expected %s%s" % (code, " with '%s'" % text if text else ""))
        sys.exit(1)


def header(step):
    return pb.RequestHeader(plan_fingerprint=fp, job_id="py-auth", step=step, rank=0,
                            world_size=1)


lookup = pb.LookupRequest(header=header(0))
lookup.tables.add(table_id=0, ids=[1, 2, 3])
push = pb.PushRequest(header=header(0), learning_rate=0.1)
push.tables.add(table_id=0, ids=[1], grads=b"\0" * 16)


def ckpt(path):
    return pb.CheckpointRequest(plan_fingerprint=fp, path=path)


def restore(path):
    return pb.RestoreRequest(plan_fingerprint=fp, path=path)


trainer, ops = channel("cli"), channel("ops")
for name, ch in (("trainer", trainer), ("ops", ops)):
    expect(name + " Lookup", call(ch, "Lookup", lookup), "OK")
    expect(name + " Stats", call(ch, "Stats", pb.StatsRequest()), "OK")
    expect(name + " Health", call(ch, "Health", hp.HealthCheckRequest()), "OK")
    # Open to both (a server of a plan has no transform to give).
    expect(name + " GetTransform", call(ch, "GetTransform", pb.GetTransformRequest()),
           "NOT_FOUND", "records no data transform")
expect("trainer Push", call(trainer, "Push", push), "OK")
before = call(trainer, "Stats", pb.StatsRequest())[1]
expect("ops Push", call(ops, "Push", push), "PERMISSION_DENIED", "Push refused")
# A call refused by the allow lists is counted as any answered call is.
after = call(trainer, "Stats", pb.StatsRequest())[1]
counted = (after.push_calls - before.push_calls, after.failed_calls - before.failed_calls)
print("%s ops Push counted: push_calls +%d, failed_calls +%d" %
      ((("ok  ",) if counted == (1, 1) else ("FAIL",)) + counted))
if counted != (1, 1):
    sys.exit(1)
push_lookup = pb.PushLookupRequest(
    push=pb.PushRequest(header=header(1), learning_rate=0.1, tables=push.tables),
    lookup=pb.LookupRequest(header=header(2), tables=lookup.tables))
got = call(trainer, "PushLookup", push_lookup)
expect("trainer PushLookup", got, "OK")
rows = [len(t.rows) for t in got[1].tables]
if rows != [3 * 4 * 4]:
    print("FAIL the PushLookup's answer has rows of %s bytes, not one table of 3 rows of dim 4"
          % rows)
    sys.exit(1)
expect("ops PushLookup", call(ops, "PushLookup", push_lookup), "PERMISSION_DENIED",
       "PushLookup refused")
expect("trainer Checkpoint", call(trainer, "Checkpoint", ckpt(root + "/t")),
       "PERMISSION_DENIED", "Checkpoint refused")
expect("trainer Restore", call(trainer, "Restore", restore(root + "/t")),
       "PERMISSION_DENIED", "Restore refused")
swap = pb.SwapAtRequest(plan_fingerprint=fp, step=5)
expect("trainer SwapAt", call(trainer, "SwapAt", swap), "PERMISSION_DENIED",
       "SwapAt refused: client")
expect("ops SwapAt", call(ops, "SwapAt", swap), "FAILED_PRECONDITION",
       "does not follow a checkpoint folder")
if os.path.exists(root + "/t"):
    print("FAIL a refused Checkpoint made %s/t" % root)
    sys.exit(1)

expect("ops Checkpoint inside", call(ops, "Checkpoint", ckpt(root + "/c1")), "OK")
if not os.path.isdir(root + "/c1/shard-0"):
    print("FAIL %s/c1/shard-0 not written" % root)
    sys.exit(1)
expect("ops Checkpoint again", call(ops, "Checkpoint", ckpt(root + "/c1")), "ALREADY_EXISTS",
       "exists")
expect("ops Restore inside", call(ops, "Restore", restore(root + "/c1")), "OK")
for what, path in (("outside", outside + "/x1"),
                   ("through ..", root + "/../" + os.path.basename(outside) + "/x2"),
                   ("through a symlink", root + "/esc/x3")):
    expect("ops Checkpoint " + what, call(ops, "Checkpoint", ckpt(path)),
           "PERMISSION_DENIED", "outside the checkpoint root")
    expect("ops Restore " + what, call(ops, "Restore", restore(path)), "PERMISSION_DENIED",
           "outside the checkpoint root")
left = os.listdir(outside)
if left:
    print("FAIL refused Checkpoints wrote %s into %s" % (left, outside))
    sys.exit(1)

other = grpc.secure_channel(addr, grpc.ssl_channel_credentials(
    root_certificates=read("ca.pem"), private_key=read("bad.key"),
    certificate_chain=read("bad.pem")))
status, _ = call(other, "Stats", pb.StatsRequest())
print("%s other CA Stats: %s" % ("ok  " if status != "OK" else "FAIL", status))
if status == "OK":
    sys.exit(1)
print("all checks passed")
