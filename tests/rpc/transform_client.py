"""A serving client with no checkpoint folder: it fetches the served model's
data transform from a shard server and maps raw Criteo rows with it (driven
by tests/rpc/test_rpc_transform.c, which makes the data, the checkpoint,
the stubs and the server).

usage: transform_client.py STUBS ADDR map RAW.tsv CONVERTED.bin
       transform_client.py STUBS ADDR none

map: Stats gives the fingerprint; GetTransform once with the default size,
then in small chunks (4096 bytes; 64 for a transform of a header only),
from an offset inside, at the end (no data) and past
it (OUT_OF_RANGE naming both numbers); the bytes hash to the fingerprint;
they are parsed (datasets/transform.h's layout) and every row of RAW.tsv is
mapped by the rules of README.md, "Serving raw rows": label, dense floats
and ids must be exactly CONVERTED.bin's records (shardrec convert
--mapping-from CKPT RAW.tsv CONVERTED.bin). Prints "fingerprint HEX".
none: Stats gives "" and GetTransform is refused NOT_FOUND.
Prints one line per check and 'all checks passed' at the end; exits 1 on
the first failure."""
import hashlib
import math
import struct
import sys

import grpc

stubs, addr, mode = sys.argv[1:4]
sys.path.insert(0, stubs)
from rpc import shardrec_pb2 as pb  # noqa: E402

SVC = "/shardrec.v1.EmbeddingShard/"
MASK64 = (1 << 64) - 1
CHUNK = 4096


def fail(what):
    print("FAIL " + what)
    sys.exit(1)


def check(ok, what):
    if not ok:
        fail(what)
    print("ok   " + what)


ch = grpc.insecure_channel(addr)
stats = ch.unary_unary(SVC + "Stats", request_serializer=pb.StatsRequest.SerializeToString,
                       response_deserializer=pb.StatsResponse.FromString)
get = ch.unary_unary(SVC + "GetTransform",
                     request_serializer=pb.GetTransformRequest.SerializeToString,
                     response_deserializer=pb.GetTransformResponse.FromString)


def call(offset, max_bytes):
    """(status code name, response or details)."""
    try:
        return "OK", get(pb.GetTransformRequest(offset=offset, max_bytes=max_bytes), timeout=30)
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


if mode == "none":
    fp = stats(pb.StatsRequest(), timeout=30).transform_fingerprint
    check(fp == "", "Stats transform_fingerprint is empty (got '%s')" % fp)
    code, detail = call(0, 0)
    check(code == "NOT_FOUND" and "records no data transform" in str(detail),
          "GetTransform refused NOT_FOUND: %s %s" % (code, detail))
    print("all checks passed")
    sys.exit(0)

tsv_path, bin_path = sys.argv[4:6]

# ---- fetch ----
fp = stats(pb.StatsRequest(), timeout=30).transform_fingerprint
check(len(fp) == 64, "Stats transform_fingerprint %s" % fp)
code, whole = call(0, 0)
if code != "OK":
    fail("GetTransform: %s %s" % (code, whole))
total = whole.total_bytes
check(whole.fingerprint == fp and len(whole.data) == min(total, 1 << 20),
      "the default chunk (1 MiB) is all %d bytes" % total)
# Several chunks: 4096 bytes, or 64 for a transform without dictionaries (its header).
chunk = CHUNK if total >= 3 * CHUNK else 64
data, offset, chunks = b"", 0, 0
while offset < total:
    code, a = call(offset, chunk)
    if code != "OK":
        fail("GetTransform at %d: %s %s" % (offset, code, a))
    if a.fingerprint != fp or a.offset != offset:
        fail("chunk at %d: fingerprint %s offset %d" % (offset, a.fingerprint, a.offset))
    if a.total_bytes != total or len(a.data) != min(chunk, total - offset):
        fail("chunk at %d: %d bytes of %d" % (offset, len(a.data), a.total_bytes))
    data += a.data
    offset += len(a.data)
    chunks += 1
check(chunks >= 3 and data == whole.data,
      "%d bytes in %d chunks of at most %d, the same bytes" % (total, chunks, chunk))
check(hashlib.sha256(data).hexdigest() == fp, "SHA-256 of the bytes is the fingerprint")
code, a = call(total - 10, 0)
check(code == "OK" and a.offset == total - 10 and a.data == data[-10:],
      "a chunk from inside: its last 10 bytes")
code, a = call(total, CHUNK)
check(code == "OK" and a.data == b"" and a.total_bytes == total, "offset == total: no data")
code, detail = call(total + 1, CHUNK)
check(code == "OUT_OF_RANGE" and str(total + 1) in detail and str(total) in detail,
      "past the end refused: %s %s" % (code, detail))
print("fingerprint " + fp)

# ---- parse (datasets/transform.h) ----
check(data[:8] == b"SRXFORM1", "magic")
version, id_mode, mir, thr, unseen, dense, ncol = struct.unpack_from("<IIQIIII", data, 8)
kept = struct.unpack_from("<26Q", data, 40)
check(version == 1 and ncol == 26 and dense == 1 and unseen == 0,
      "version %d, %d columns, dense transform %d, unseen id %d" % (version, ncol, dense, unseen))
check(len(data) == 248 + 4 * sum(kept), "%d kept values" % sum(kept))
dicts, at = [], 248
for c in range(26):
    vals = struct.unpack_from("<%dI" % kept[c], data, at)
    at += 4 * kept[c]
    dicts.append({v: i + 1 for i, v in enumerate(vals)})
print("id mode %d, max_ind_range %d, frequency threshold %d" % (id_mode, mir, thr))


def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def map_id(c, v):
    if id_mode == 0:  # dictionary
        if mir > 0:
            v %= mir
        return dicts[c].get(v, unseen)
    if id_mode == 1:  # modulo
        return v % mir
    return mix64(mix64(c + 0x5EED) ^ v)  # hash


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def map_row(line):
    f = line.rstrip("\r\n").split("\t")
    if len(f) != 40:
        fail("a line of %d fields" % len(f))
    dense_vals = [f32(math.log1p(max(0, int(x)))) if x else 0.0 for x in f[1:14]]
    ids = [map_id(c, int(x, 16) if x else 0) for c, x in enumerate(f[14:40])]
    return float(int(f[0])), dense_vals, ids


# ---- compare with convert's records (datasets/binfmt.h) ----
with open(bin_path, "rb") as fh:
    b = fh.read()
check(b[:8] == b"SRCRITEO", "converted file's magic")
flags, = struct.unpack_from("<I", b, 12)
n, = struct.unpack_from("<Q", b, 24)
data_off, = struct.unpack_from("<Q", b, 88)
check(not flags & 1, "one-hot records")
idfmt = "<26Q" if flags & 2 else "<26I"
rec = 56 + struct.calcsize(idfmt)
with open(tsv_path) as fh:
    lines = fh.readlines()
check(len(lines) == n, "%d rows in both" % n)
zeros = nonzero = wide = 0
for i, line in enumerate(lines):
    label, dense_vals, ids = map_row(line)
    at = data_off + i * rec
    got = struct.unpack_from("<14f", b, at)
    got_ids = list(struct.unpack_from(idfmt, b, at + 56))
    if got[0] != label or list(got[1:]) != dense_vals:
        fail("row %d: label and dense %s, convert wrote %s" % (i + 1, [label] + dense_vals, got))
    if got_ids != ids:
        c = next(k for k in range(26) if got_ids[k] != ids[k])
        fail("row %d column C%d: id %d, convert wrote %d" % (i + 1, c + 1, ids[c], got_ids[c]))
    zeros += ids.count(0)
    nonzero += 26 - ids.count(0)
    wide += sum(1 for x in ids if x >= 1 << 32)
print("ids: %d unseen (0), %d others, %d of 64 bits" % (zeros, nonzero, wide))
if id_mode == 0:
    check(zeros > 0 and nonzero > zeros, "dictionary: new values map to 0, most do not")
if id_mode == 2:
    check(wide > nonzero // 2, "hash: 64-bit ids")
print("rows %d mapped as convert mapped them" % n)
print("all checks passed")
