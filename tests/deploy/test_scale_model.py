#!/usr/bin/python3
"""tools/scale_model.py against the things it models:

1. its dense parameter count equals the trainer's own ("N dense
   parameters" of `shardrec train`) at the Kaggle and the MLPerf-like shapes;
2. its unique ids per table of a hand-made TSV are the counts by hand
   (empty fields one id, multi-hot bags split, a short last batch left out);
3. its bytes per step: rows x dim x 4 looked up, rows x (dim x 4 + id
   bytes) pushed, 4P x 2(R-1)/R each way for the all-reduce, a server
   R/S x a rank's rows;
4. the step command's samples/s at a rate follows from those bytes.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

SRC = os.environ["SHARDREC_SRC"]
BIN = os.environ["SHARDREC_BIN"]
sys.path.insert(0, os.path.join(SRC, "tools"))
import scale_model as sm  # noqa: E402

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg)


def trainer_params(d, dim, bot, top):
    r = subprocess.run([BIN, "train", "--processed-data-file", d + "/d.bin", "--num-batches", "1",
                        "--mini-batch-size", "32", "--arch-sparse-feature-size", str(dim),
                        "--arch-mlp-bot", "-".join(map(str, bot)), "--arch-mlp-top", "-".join(map(str, top)),
                        "--dense-threads", "1"], capture_output=True, text=True)
    m = re.search(r"(\d+) dense parameters", r.stdout)
    check(r.returncode == 0 and m, "train at dim %d: exit %d, %s" % (dim, r.returncode, r.stdout[-300:] + r.stderr[-300:]))
    return int(m.group(1)) if m else None


def main():
    with tempfile.TemporaryDirectory() as d:
        for cmd in ([BIN, "datagen", "--rows", "2000", "--out", d + "/d.tsv"],
                    [BIN, "convert", "--test-fraction", "0.1", d + "/d.tsv", d + "/d.bin"]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            check(r.returncode == 0, "%s: %s" % (" ".join(cmd), r.stderr))
        for name, dim, bot, top in sm.SHAPES:
            got = trainer_params(d, dim, bot, top)
            want = sm.dense_params(dim, bot, top)
            check(got == want, "%s: the model's %d dense parameters, the trainer's %s" % (name, want, got))
            print("%s dim %d: %d dense parameters, as the trainer" % (name, dim, want))

        # 2 batches of 3 lines and a short third; table 0: a a b | c c c;
        # table 1: '' x,y x | z z z; the rest empty (one id each).
        rows = [("a", ""), ("a", "x,y"), ("b", "x"), ("c", "z"), ("c", "z"), ("c", "z"), ("q", "q")]
        path = d + "/u.tsv"
        with open(path, "w") as f:
            for t0, t1 in rows:
                f.write("\t".join(["0"] + ["1"] * 13 + [t0, t1] + [""] * 24) + "\n")
        per, got = sm.unique_ids(path, 3, 10)
        check(got == 2, "unique_ids: %d batches, want 2" % got)
        check(per[0] == 1.5 and per[1] == 2.0 and per[2] == 1.0,
              "unique_ids: tables 0, 1, 2: %s, want 1.5 2.0 1.0" % per[:3])
        print("unique ids by hand: %s" % per[:3])

    p = sm.dense_params(16, [13, 512, 256, 64, 16], [512, 256, 1])
    b = sm.step_bytes(16, 100, 4, 2, p, 3.0, hints=False)
    check(b["lookup"]["rank_rx"] == 6400 and b["lookup"]["server_tx"] == 12800,
          "lookup bytes %s" % b["lookup"])
    check(b["push"]["rank_tx"] == 6700 and b["push"]["server_rx"] == 13400, "push bytes %s" % b["push"])
    check(b["allreduce"]["rank_tx"] == 4 * p * 2 * 3 / 4, "all-reduce bytes %s" % b["allreduce"])
    check(sm.step_bytes(16, 100, 4, 2, p, 3.0, hints=True)["lookup"]["rank_tx"] == 600, "hinted ids")

    a = argparse.Namespace(dim=16, batch=256, ranks=2, servers=2, mlp_bot=[13, 512, 256, 64, 16],
                           mlp_top=[512, 256, 1], interaction="dot", id_bytes=3.0, no_hints=True,
                           lookup_ms=0.0, push_ms=0.0, allreduce_ms=0.0, cpu_us_per_row=None, server_threads=2,
                           base_ms=10.0, dense_ms=0.0, latency_us=0.0, rate_gbit=[1.0], overlap="serial")
    m = sm.model_step(a, 1000)
    by = sm.step_bytes(16, 1000, 2, 2, p, 3.0, hints=False)
    cap = 1e9 / 8 * sm.ETA
    wire = (1000 * 3 + 1000 * 64) / cap + 1000 * 67 / cap + 4 * p / cap
    check(abs(m["rates"][0]["wire_s"] - wire) < 1e-12, "wire %.6f s, want %.6f" % (m["rates"][0]["wire_s"], wire))
    check(abs(m["rates"][0]["samples_per_s"] - 256 / (0.010 + wire)) < 1e-6, "samples/s %s" % m["rates"][0])
    print("bytes and wire time of a step as computed by hand (%.3f ms at 1 Gbit/s)" % (1e3 * wire))
    if failures:
        print("test_scale_model: %d failure(s)" % len(failures))
        return 1
    print("test_scale_model: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
