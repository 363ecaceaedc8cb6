#!/usr/bin/python3
"""Run inside one namespace: every INTERVAL seconds, one JSON line with the
monotonic time, this namespace's eth0 byte counters
(/sys/class/net/eth0/statistics/{tx,rx}_bytes) and, with --metrics URL,
the trainer's Prometheus series (unlabelled but for rank, plus the phase
totals) or a server's request and answer bytes (summed over methods),
until the file STOP exists.

  sample.py OUT STOP [--metrics URL] [--interval S]
"""
import json
import sys
import time
import urllib.request

WANT = ("shardrec_train_step", "shardrec_train_samples_total", "shardrec_train_lookup_bytes_total",
        "shardrec_train_push_bytes_total", "shardrec_train_phase_seconds_total",
        "shardrec_server_request_bytes_total", "shardrec_server_response_bytes_total")


def counters():
    out = {}
    for k in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets"):
        with open("/sys/class/net/eth0/statistics/" + k) as f:
            out[k] = int(f.read())
    return out


def scrape(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    m = {}
    for line in text.splitlines():
        if not line.startswith(WANT):
            continue
        name, _, value = line.rpartition(" ")
        if "phase=" in name:
            name = "phase_" + name.split('phase="')[1].split('"')[0]
        else:
            name = name.split("{")[0]  # a server's series by method: summed
        m[name] = m.get(name, 0.0) + float(value)
    return m


def main():
    import os
    out, stop = sys.argv[1], sys.argv[2]
    url = sys.argv[sys.argv.index("--metrics") + 1] if "--metrics" in sys.argv else None
    interval = float(sys.argv[sys.argv.index("--interval") + 1]) if "--interval" in sys.argv else 0.25
    with open(out, "w") as f:
        while not os.path.exists(stop):
            rec = {"t": time.monotonic(), **counters()}
            if url:
                rec["m"] = scrape(url)
                rec["t_after"] = time.monotonic()
            f.write(json.dumps(rec) + "\n")
            f.flush()
            time.sleep(interval)


if __name__ == "__main__":
    main()
