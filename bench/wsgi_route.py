"""The in-process WSGI route's own cost: shmipc.serve.WSGIRoute called on a REQUEST_HEAD frame
(what shmipc.Server's C side hands it) with bench/serve_app.py's app, no server and no socket.
Prints the median over rounds of the µs per call, and of decode_request alone (the C decoder
inside it). docs/benchmarks.md, "The in-process WSGI adapter under its bar".

    PYTHONPATH=build/python taskset -c 1 python3 bench/wsgi_route.py [--calls N] [--rounds R]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import shmipc._serve as sf  # noqa: E402
import serve_app  # noqa: E402
from shmipc.serve.inprocess import WSGIRoute  # noqa: E402


def per_call(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    frame = sf.encode_request_head(b"GET", b"/", [(b"Host", b"127.0.0.1:8080")],
                                   flags=sf.REQ_KEEP_ALIVE)
    route = WSGIRoute(serve_app.app)
    assert route(frame, b"")[0] == 200
    calls, decodes = [], []
    for _ in range(args.rounds):
        calls.append(per_call(lambda: route(frame, b""), args.calls))
        decodes.append(per_call(lambda: sf.decode_request(frame, route.base), args.calls))
    print(f"WSGIRoute call {statistics.median(calls):.2f} us, "
          f"decode_request {statistics.median(decodes):.2f} us "
          f"(median of {args.rounds} rounds of {args.calls} calls)")


if __name__ == "__main__":
    main()
