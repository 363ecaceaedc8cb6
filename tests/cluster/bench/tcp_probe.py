#!/usr/bin/python3
"""The link's own rate, measured beside each bench run: N bytes sent both
ways at once over one TCP connection between two rank hosts (the
all-reduce's pattern), ROUNDS times with GAP seconds idle between (as
between steps); prints the median exchange's payload rate.

  tcp_probe.py serve ADDR N ROUNDS           (in one namespace)
  tcp_probe.py probe ADDR N ROUNDS GAP OUT   (in another: JSON to OUT)
"""
import json
import socket
import statistics
import sys
import threading
import time

PORT = 7100


def recv_all(c, n):
    got = 0
    while got < n:
        b = c.recv(min(1 << 20, n - got))  # never into the next round's bytes
        if not b:
            raise SystemExit("tcp_probe.py: the peer closed after %d of %d bytes" % (got, n))
        got += len(b)


def exchange(c, buf):
    t = threading.Thread(target=c.sendall, args=(buf,))
    t.start()
    recv_all(c, len(buf))
    t.join()


def main():
    mode, addr, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    buf = b"\0" * n
    if mode == "serve":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, PORT))
        s.listen(1)
        print("listening", flush=True)
        c, _ = s.accept()
        for i in range(rounds):
            exchange(c, buf)
            print("round %d done" % i, flush=True)
        c.shutdown(socket.SHUT_WR)
        while c.recv(1 << 16):  # until the prober closes: nothing of ours is cut short
            pass
        return
    gap, out = float(sys.argv[5]), sys.argv[6]
    for _ in range(100):
        try:
            c = socket.create_connection((addr, PORT), timeout=30)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit("tcp_probe.py: cannot connect to %s:%d" % (addr, PORT))
    times = []
    for _ in range(rounds):
        t0 = time.monotonic()
        exchange(c, buf)
        times.append(time.monotonic() - t0)
        time.sleep(gap)
    c.close()
    med = statistics.median(times)
    with open(out, "w") as f:
        json.dump({"bytes": n, "seconds": times, "median_s": med, "payload_gbit": n * 8 / med / 1e9}, f)
    print("tcp probe: %d bytes both ways, median %.1f ms: %.2f Gbit/s of payload" % (n, 1e3 * med, n * 8 / med / 1e9))


if __name__ == "__main__":
    main()
