#!/usr/bin/env python3
"""serve_floors.py: the floors under issue 22's CPU bars, measured on this machine.

Issue 22 asks for the in-process ASGI adapter within 1.3x the CPU per request of a native
handler, and for shmipc-serve (front + worker process) at most 0.4x a peer's CPU per request.
Each adapter or hop is built from a few mechanisms whose cost does not depend on our code; this
script times them alone, in one process, with time.process_time (every thread's CPU):

  native      a native handler's Python call (what the in-process server calls per request)
  eager       an ASGI app (receive, start, body) driven to its end with coro.send(None): no
              loop, no task; the least any ASGI adapter can pay per request
  task        the same app as one asyncio task per request on a running loop, ten at a time
              (gather): what running the app on an event loop costs
  hop         one round trip to an event loop on another thread and back: call_soon_threadsafe
              (the loop's self-pipe) and a lock released by the loop (a futex): what each
              request costs when the app's loop runs on its own thread, as in every server that
              hands requests from its own threads to one app loop

Usage: python3 bench/serve_floors.py [--n 200000] [--hops 20000] [--rounds 3]
Prints each figure in µs of CPU per request (median of the rounds) and the load average.
No shmipc import: it measures CPython and the kernel, not us.
"""
import argparse
import asyncio
import os
import statistics
import sys
import threading
import time

_OUT = []


async def app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"Hello, world!"})


async def receive():
    return {"type": "http.request", "body": b"", "more_body": False}


async def send(message):
    _OUT.append(message)


SCOPE = {"type": "http", "method": "GET", "path": "/", "headers": []}


def native(_req):
    return "Hello, world!"


def per_call_us(fn, n):
    t0 = time.process_time()
    fn(n)
    return (time.process_time() - t0) / n * 1e6


def run_native(n):
    for _ in range(n):
        native(None)


def run_eager(n):
    for _ in range(n):
        c = app(SCOPE, receive, send)
        try:
            c.send(None)
        except StopIteration:
            pass
        _OUT.clear()


def run_task(n):
    async def many():
        loop = asyncio.get_running_loop()
        for _ in range(n // 10):
            await asyncio.gather(*[loop.create_task(app(SCOPE, receive, send))
                                   for _ in range(10)])
            _OUT.clear()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(many())
    finally:
        loop.close()


def run_hop(n):
    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    lock = threading.Lock()
    try:
        for _ in range(n):
            lock.acquire()
            loop.call_soon_threadsafe(lock.release)
            lock.acquire()  # the loop released it
            lock.release()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join()
        loop.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200000, help="calls per round (native, eager, task)")
    ap.add_argument("--hops", type=int, default=20000, help="round trips per round (hop)")
    ap.add_argument("--rounds", type=int, default=3)
    o = ap.parse_args()
    if o.n < 10 or o.hops < 1 or o.rounds < 1:
        ap.error("--n must be at least 10, --hops and --rounds at least 1")
    figures = {k: [] for k in ("native", "eager", "task", "hop")}
    load0 = os.getloadavg()
    for _ in range(o.rounds):  # interleaved, so that load drifts hit every figure alike
        figures["native"].append(per_call_us(run_native, o.n))
        figures["eager"].append(per_call_us(run_eager, o.n))
        figures["task"].append(per_call_us(run_task, o.n))
        figures["hop"].append(per_call_us(run_hop, o.hops))
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"python {sys.version.split()[0]}, load average {load0[0]:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end; µs of CPU per request, median of {o.rounds}")
    for k in ("native", "eager", "task", "hop"):
        print(f"  {k:<7} {med[k]:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
