#!/usr/bin/env python3
"""py_rtt64.py: p50 of a 64 B round trip through `import shmipc`, nothing else.

A child process (this script with --peer) echoes every message back; the parent times each
round trip with time.perf_counter_ns and prints p50, p90 and p99. Both ends use blocking reads,
so the spin phase of a waiting read is what `--spin-us` (Config.spin_us) sets.

Run (from the source tree, after `ninja -C build`):
  PYTHONPATH=build/python python3 bench/py_rtt64.py [--trips 20000] [--spin-us N] [--v4-eventfd]
      [--pin]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import shmipc


def config(o):
    kw = {"read_timeout": 30.0}
    if o.spin_us is not None:
        kw["spin_us"] = o.spin_us
    cfg = shmipc.Config(**kw)
    if o.v4_eventfd:
        cfg.set_protocol("v4", fallback=False)
        cfg.set_wakeup("eventfd")
    return cfg


def peer(o):
    if o.pin:
        os.sched_setaffinity(0, {1})
    listener = shmipc.Listener(o.address, config(o))
    print("ready", flush=True)
    session = listener.accept(timeout=30)
    st = session.accept_stream(timeout=30)
    while True:
        try:
            data = st.readexactly(64)
        except shmipc.Error:
            break
        st.write(data)
        st.flush()
    session.close()
    listener.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trips", type=int, default=20000)
    ap.add_argument("--spin-us", type=int, default=None)
    ap.add_argument("--v4-eventfd", action="store_true")
    ap.add_argument("--pin", action="store_true", help="parent on CPU 0, peer on CPU 1")
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--address", default=None, help=argparse.SUPPRESS)
    o = ap.parse_args()
    if o.peer:
        return peer(o)
    o.address = "unix:" + os.path.join(tempfile.mkdtemp(prefix="py-rtt64-"), "s.sock")
    args = [sys.executable, os.path.abspath(__file__), "--peer", "--address", o.address]
    args += ["--spin-us", str(o.spin_us)] if o.spin_us is not None else []
    args += ["--v4-eventfd"] if o.v4_eventfd else []
    args += ["--pin"] if o.pin else []
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    if o.pin:
        os.sched_setaffinity(0, {0})
    session = shmipc.connect(o.address, config(o))
    st = session.open_stream()
    msg = bytes(range(64))
    times = []
    for i in range(o.trips + o.trips // 10):
        t0 = time.perf_counter_ns()
        st.write(msg)
        st.flush()
        back = st.readexactly(64)
        t1 = time.perf_counter_ns()
        if i >= o.trips // 10:  # the first tenth warms up
            times.append(t1 - t0)
    assert back == msg
    session.close()
    child.wait(timeout=30)
    times.sort()
    pct = lambda p: times[min(len(times) - 1, len(times) * p // 1000)] / 1000
    print(f"shmipc {'V4 eventfd' if o.v4_eventfd else 'V3'}, 64 B, {len(times)} round trips, "
          f"spin cap {o.spin_us if o.spin_us is not None else shmipc.Config().spin_us} µs: "
          f"p50 {pct(500):.2f} µs, p90 {pct(900):.2f} µs, p99 {pct(990):.2f} µs")


if __name__ == "__main__":
    main()
