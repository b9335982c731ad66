#!/usr/bin/env python3
# Run: PYTHONPATH=build/python python3 bench/py_pingpong.py [--seconds S] [--rounds N]
#          [--sizes 64,1024,...] [--json FILE] [--md FILE] [--no-warmup] [--spin-us 20,0]
#          [--buffer-mib 256]
#      (from the source tree, after `ninja -C build`)
"""py_pingpong.py: a Python ping-pong benchmark, shmipc streams (V3 over memfd, and V4 with
eventfd wakeups) against Python's own `socket` over a unix socket and `multiprocessing.Pipe`,
in the same run.

For each size a client sends a message (a 4-byte big-endian length and the payload) and waits
for the payload to come back from an echo peer, a second Python process (this script with
--peer for shmipc and the socket, a multiprocessing child for the Pipe, whose framing is its
own). Each transport is used the way a careful Python programmer would use it:

- shmipc: the client writes the message into shared memory (`write`, one copy) and `flush`es,
  then takes the echo with `read_exact_bytes(n)` (in place when it lies in one slice, else one
  copy) and releases it; the peer reads the header, then `forward`s the payload back: the
  slices it arrived in go back untouched (no copy), as the socket peer sends back the buffer
  it received into. `--echo copy` makes the peer copy instead: `read_chunk` pieces written
  back (one copy out of, one into shared memory), flushed once.
- socket: `sendall(message)`, then `recv_into` a preallocated buffer until n bytes came; the
  peer `recv_into`s the whole payload and `sendall`s it back.
- Pipe: `send_bytes(payload)` / `recv_bytes()` on both sides.

Every round trip is timed (time.perf_counter_ns); p50 is the median round trip, throughput the
payload bytes echoed per second of the timed loop (size x round trips / s). Rounds interleave
the transports size by size; each figure is the median of its rounds. It also reports the cost
of one call into the module, timed with timeit. It measures, never judges: every echo is
checked for its length and the last one of each measurement byte for byte.
"""
import argparse
import json
import multiprocessing
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import time
import timeit

import shmipc

HDR = struct.Struct(">I")
SIZES = [64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20]
# 1 MiB slices for the large sizes (as shmipc-bench ipc), 127 of them in 256 MiB. (128 MiB was
# once thought to run out of shared memory at 4 MiB; no message went over the socket: the
# round trips walked the FIFO free list and page-faulted fresh slices, see warm_up.)
BUFFER = 256 << 20
SLICES = "16388:10,65540:15,262148:25,1048580:50"
# How the shmipc peer echoes (--echo): "forward" or "copy".
ECHO = "forward"


def bench_config():
    cfg = shmipc.Config(buffer_capacity=BUFFER, slice_classes=SLICES, read_timeout=30.0)
    return cfg


# ---------------------------------------------------------------------------------------------
# The echo peers. Each prints "ready" once it listens, then echoes until a length of 0.
# ---------------------------------------------------------------------------------------------


def shmipc_peer(address, copy=False):
    with shmipc.Listener(address, bench_config()) as listener:
        print("ready", flush=True)
        with listener.accept(timeout=30) as session, session.accept_stream(timeout=30) as st:
            while True:
                with st.read_exact_bytes(4) as h:
                    n = HDR.unpack(h)[0]
                if n == 0:
                    break
                if copy:
                    while n > 0:
                        chunk = st.read_chunk(n)
                        st.write(chunk)
                        n -= len(chunk)
                        chunk.release()
                else:
                    # The received slices go back as they are (zero copy), as socket_peer
                    # sends back the buffer it received into.
                    st.forward(st, n)
                st.flush()


def recv_exact(sock, view, n):
    got = 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if k == 0:
            raise EOFError("peer closed")
        got += k


def socket_peer(path):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        os.unlink(path)
    srv.bind(path)
    srv.listen(1)
    print("ready", flush=True)
    c, _ = srv.accept()
    srv.close()
    os.unlink(path)
    buf = bytearray(max(SIZES) + 4)
    view = memoryview(buf)
    while True:
        recv_exact(c, view, 4)
        n = HDR.unpack_from(buf)[0]
        if n == 0:
            break
        recv_exact(c, view, n)
        c.sendall(view[:n])
    c.close()


def pipe_peer(conn):
    while True:
        data = conn.recv_bytes()
        if not data:
            break
        conn.send_bytes(data)
    conn.close()


# ---------------------------------------------------------------------------------------------
# Transports: send(msg, payload) then recv(n); close() ends the peer.
# ---------------------------------------------------------------------------------------------


def start_peer(kind, address):
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--peer", kind, address,
                          "--buffer-mib", str(BUFFER >> 20), "--echo", ECHO],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if line != "ready":
        sys.exit(f"py_pingpong: {kind} peer did not start: {line!r}")
    return p


class ShmipcTransport:
    def __init__(self, address, v4):
        self.peer = start_peer("shmipc", address)
        cfg = bench_config()
        if v4:
            cfg.with_v4_eventfd()
        self.session = shmipc.connect(address, cfg)
        self.st = self.session.open_stream()
        self.name = f"shmipc V{self.session.version}" + (" eventfd" if v4 else "")
        self.key = "shmipc-v4-eventfd" if v4 else "shmipc-v3"

    def roundtrip(self, msg, n):
        st = self.st
        st.write(msg)
        st.flush()
        echo = st.read_exact_bytes(n)
        got = len(echo)
        echo.release()
        return got

    def check(self, msg, payload):
        self.st.write(msg)
        self.st.flush()
        with self.st.read_exact_bytes(len(payload)) as echo:
            return echo == payload

    def close(self):
        self.st.write(HDR.pack(0))
        self.st.flush()
        self.peer.wait(30)
        self.st.close()
        self.session.close()


class SocketTransport:
    name = "socket (unix)"
    key = "socket-unix"

    def __init__(self, path):
        self.peer = start_peer("socket", path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = bytearray(max(SIZES))
        self.view = memoryview(self.buf)

    def roundtrip(self, msg, n):
        self.sock.sendall(msg)
        recv_exact(self.sock, self.view, n)
        return n

    def check(self, msg, payload):
        self.roundtrip(msg, len(payload))
        return self.view[:len(payload)] == payload

    def close(self):
        self.sock.sendall(HDR.pack(0))
        self.peer.wait(30)
        self.sock.close()


class PipeTransport:
    name = "multiprocessing.Pipe"
    key = "mp-pipe"

    def __init__(self):
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.peer = ctx.Process(target=pipe_peer, args=(child,), daemon=True)
        self.peer.start()
        child.close()

    def roundtrip(self, msg, n):
        # The Pipe frames by itself: send the payload alone (msg[4:] is a view, not a copy).
        self.conn.send_bytes(msg, 4)
        return len(self.conn.recv_bytes())

    def check(self, msg, payload):
        self.conn.send_bytes(msg, 4)
        return self.conn.recv_bytes() == payload

    def close(self):
        self.conn.send_bytes(b"")
        self.peer.join(30)
        self.conn.close()


def warm_up(tr):
    """Sends messages that fill a slice of each class before anything is timed, so that the
    slices a ping-pong keeps using have taken their first-touch page faults (each a few µs,
    20 µs on some VMs) in both processes. One stream in lock step never reaches the rest of
    the buffer: each session keeps the slices it read (up to a quarter of every list) and
    writes its next message into them, so the FIFO free lists are not walked (issue 7: with
    at most 3 kept, 4 MiB round trips took a fresh 1 MiB slice each, 5 ms instead of 0.6,
    until all 63 of a 128 MiB buffer had been used). The first round trips of each size are
    untimed as well (measure)."""
    cfg = bench_config()
    for size, _ in cfg.slice_classes:
        payload = b"w" * (size - 64)
        msg = HDR.pack(len(payload)) + payload
        for _ in range(16):
            assert tr.roundtrip(msg, len(payload)) == len(payload)


def measure(tr, size, seconds):
    payload = b"x" * (size - 1) + b"!"
    msg = HDR.pack(size) + payload
    for _ in range(20 if size < (1 << 20) else 3):
        tr.roundtrip(msg, size)
    times = []
    clock = time.perf_counter_ns
    rt = tr.roundtrip
    t0 = clock()
    deadline = t0 + int(seconds * 1e9)
    now = t0
    while now < deadline or len(times) < 5:
        if rt(msg, size) != size:
            raise RuntimeError(f"{tr.name}: short echo at {size}")
        t = clock()
        times.append(t - now)
        now = t
    if not tr.check(msg, payload):
        raise RuntimeError(f"{tr.name}: echo differs at {size}")
    elapsed = (now - t0) / 1e9
    return {"p50_us": statistics.median(times) / 1e3, "round_trips": len(times),
            "mib_s": size * len(times) / elapsed / (1 << 20)}


def call_costs(st):
    """ns per call: a few trivial calls into the module, and Python's own for scale."""
    n = 200000

    def per_call(stmt, glob):
        return min(timeit.repeat(stmt, globals=glob, number=n, repeat=5)) / n * 1e9

    def noop():
        pass

    g = {"st": st, "shmipc": shmipc, "noop": noop}
    return {
        "stream.available (property, one C call)": per_call("st.available", g),
        "stream.fileno() (method, one C call)": per_call("st.fileno()", g),
        "shmipc.errname(-1) (module function)": per_call("shmipc.errname(-1)", g),
        "python: len(b'') (builtin, for scale)": per_call("len(b'')", {}),
        "python: noop() (Python function, for scale)": per_call("noop()", g),
    }


def human(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10} KiB"
    return f"{n} B"


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def main():
    global BUFFER, ECHO
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=0.4, help="timed seconds per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--json", help="write the results as JSON here")
    ap.add_argument("--md", help="write the Markdown report here")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--spin-us", help="comma-separated SHMIPC_SPIN_US values: one whole run "
                    "(every transport) per value, in a child process each; the report has one "
                    "section per value")
    ap.add_argument("--buffer-mib", type=int, default=BUFFER >> 20,
                    help="shmipc buffer capacity in MiB (default %(default)s)")
    ap.add_argument("--echo", choices=("forward", "copy"), default="forward",
                    help="how the shmipc peer answers: forward (default; the received slices "
                    "go back untouched) or copy (read_chunk pieces written into new slices)")
    ap.add_argument("--peer", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    BUFFER = a.buffer_mib << 20
    ECHO = a.echo
    if a.peer:
        if a.peer[0] == "shmipc":
            shmipc_peer(a.peer[1], copy=a.echo == "copy")
        else:
            socket_peer(a.peer[1])
        return
    if a.spin_us:
        return spin_runs(a)
    sizes = [int(s) for s in a.sizes.split(",")]
    load0 = loadavg()
    tag = f"{os.getpid()}-{int(time.time())}"
    pipe = PipeTransport()  # forked first, before any session exists
    transports = [ShmipcTransport(f"unix:@shmipc-py-pingpong-{tag}", False),
                  ShmipcTransport(f"unix:@shmipc-py-pingpong-v4-{tag}", True)]
    if not a.no_warmup:
        for tr in transports:
            warm_up(tr)
    sock = SocketTransport(f"/tmp/shmipc-py-pingpong-{tag}.sock")
    transports += [sock, pipe]
    costs = call_costs(transports[0].st)

    results = {tr.key: {} for tr in transports}
    for size in sizes:
        runs = {tr.key: [] for tr in transports}
        for _ in range(a.rounds):
            for tr in transports:
                runs[tr.key].append(measure(tr, size, a.seconds))
        for tr in transports:
            r = runs[tr.key]
            results[tr.key][size] = {
                "p50_us": statistics.median(x["p50_us"] for x in r),
                "mib_s": statistics.median(x["mib_s"] for x in r),
                "round_trips": sum(x["round_trips"] for x in r),
            }
    names = {tr.key: tr.name for tr in transports}
    for tr in transports:
        tr.close()

    ref = results[sock.key]
    bar = {}
    for key in ("shmipc-v3", "shmipc-v4-eventfd"):
        r = results[key]
        p50 = {s: r[s]["p50_us"] / ref[s]["p50_us"] for s in sizes}
        thr = {s: r[s]["mib_s"] / ref[s]["mib_s"] for s in sizes}
        big = [s for s in sizes if s >= 65536]
        bar[key] = {
            "p50_ratio_64B": p50.get(64),
            "p50_64B_met": p50.get(64) is not None and p50[64] <= 0.8,
            "throughput_ratio_from_64KiB": {s: thr[s] for s in big},
            "throughput_from_64KiB_met": bool(big) and all(thr[s] >= 2.0 for s in big),
        }
    out = {
        "bench": "py_pingpong",
        "command": "PYTHONPATH=build/python python3 bench/py_pingpong.py " + " ".join(sys.argv[1:]),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "shmipc_version": shmipc.__version__,
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "load_average_start": load0,
        "load_average_end": loadavg(),
        "seconds": a.seconds,
        "rounds": a.rounds,
        "shmipc_config": {"buffer_capacity": BUFFER, "slice_classes": SLICES},
        "shmipc_echo": ECHO,
        "transports": names,
        "results": {k: {str(s): v for s, v in r.items()} for k, r in results.items()},
        "call_cost_ns": costs,
        "bar": {k: {**v, "throughput_ratio_from_64KiB":
                    {str(s): x for s, x in v["throughput_ratio_from_64KiB"].items()}}
                for k, v in bar.items()},
    }
    md = report(out, sizes, results, names, costs, bar)
    print(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)


def spin_runs(a):
    """One child run per SHMIPC_SPIN_US value (the library reads it once per process)."""
    import tempfile

    runs, mds = [], []
    for spin in a.spin_us.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            argv = [sys.executable, os.path.abspath(__file__), "--seconds", str(a.seconds),
                    "--rounds", str(a.rounds), "--sizes", a.sizes,
                    "--buffer-mib", str(a.buffer_mib), "--echo", a.echo,
                    "--json", os.path.join(tmp, "r.json"), "--md", os.path.join(tmp, "r.md")]
            if a.no_warmup:
                argv.append("--no-warmup")
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL,
                           env=dict(os.environ, SHMIPC_SPIN_US=spin))
            with open(os.path.join(tmp, "r.json")) as f:
                r = json.load(f)
            with open(os.path.join(tmp, "r.md")) as f:
                md = f.read()
        r["shmipc_spin_us"] = int(spin)
        r["command"] = "PYTHONPATH=build/python python3 bench/py_pingpong.py " + " ".join(sys.argv[1:])
        runs.append(r)
        head, _, rest = md.partition("\n")
        mds.append(f"{head} — SHMIPC_SPIN_US={spin}\n\n- command of the whole report: "
                   f"`{r['command']}` (this section: its child with SHMIPC_SPIN_US={spin})\n"
                   + rest.split("\n", 2)[2].replace("### ", "#### "))
    md = "\n".join(mds)
    print(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bench": "py_pingpong", "runs": runs}, f, indent=2)
            f.write("\n")
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)


def report(out, sizes, results, names, costs, bar):
    keys = list(names)
    sock = "socket-unix"
    lines = [
        "## py_pingpong: Python ping-pong, shmipc vs socket (unix) vs multiprocessing.Pipe",
        "",
        f"- command: `{out['command']}`",
        f"- Python {out['python']} ({out['executable']}), shmipc {out['shmipc_version']}, "
        f"kernel {out['kernel']}, {out['cpus']} CPUs, no pinning",
        f"- load average {out['load_average_start']} at the start, {out['load_average_end']} "
        "at the end",
        f"- {out['rounds']} rounds of {out['seconds']} s per size and transport, interleaved; "
        "medians of the rounds",
        f"- shmipc config: buffer {BUFFER >> 20} MiB, slice classes {SLICES}; sessions warmed "
        "up (16 round trips per slice class) before the rounds",
        f"- shmipc echo peer: {out.get('shmipc_echo', 'copy')} (forward: the payload's slices "
        "go back untouched, as the socket peer sends back the buffer it received into; copy: "
        "read_chunk pieces written into new slices)",
        "",
        "### Round trip p50 in µs (in parentheses: / the unix socket's; below 1 is faster)",
        "",
        "| size | " + " | ".join(names[k] for k in keys) + " |",
        "|---:|" + "---:|" * len(keys),
    ]
    for s in sizes:
        row = [human(s)]
        for k in keys:
            v = results[k][s]["p50_us"]
            row.append(f"{v:.1f}" if k == sock else
                       f"{v:.1f} ({v / results[sock][s]['p50_us']:.2f}x)")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "### Throughput in MiB/s of payload echoed (in parentheses: / the unix "
              "socket's; above 1 is faster)", "",
              "| size | " + " | ".join(names[k] for k in keys) + " |",
              "|---:|" + "---:|" * len(keys)]
    for s in sizes:
        row = [human(s)]
        for k in keys:
            v = results[k][s]["mib_s"]
            row.append(f"{v:.1f}" if k == sock else
                       f"{v:.1f} ({v / results[sock][s]['mib_s']:.2f}x)")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "### Cost of one call (ns, best of 5 x 200000, timeit)", "",
              "| call | ns |", "|---|---:|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in costs.items()]
    lines += ["", "### Against the bar of issue 7", "",
              "Bar: 64 B p50 at most 0.8x the unix socket's; from 64 KiB up at least 2x its "
              "throughput.", ""]
    for k, b in bar.items():
        thr = ", ".join(f"{human(s)} {x:.2f}x" for s, x in b["throughput_ratio_from_64KiB"].items())
        p50 = b["p50_ratio_64B"]
        lines.append(f"- {names[k]}: 64 B p50 " +
                     (f"{p50:.2f}x ({'met' if b['p50_64B_met'] else 'NOT met'})" if p50 else "n/a")
                     + f"; throughput {thr} ("
                     + ("met" if b["throughput_from_64KiB_met"] else "NOT met") + ")")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
