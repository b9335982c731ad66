"""The in-process ASGI route's Python, and asyncio's own floor under it, without server or
socket (docs/benchmarks.md, "The in-process ASGI adapter without the thread hop"):

- route: ASGIRoute._serve on a decoded scope with bench/serve_app.py's app, the coroutine
  stepped directly (no task), answering a stand-in PendingResponse (no C send);
- floor: what asyncio itself costs per request for a trivial ASGI app (two awaits of a send
  that does nothing): a task per request on a loop (asyncio, and uvloop when installed),
  against the same coroutine stepped without a task, in batches of 64 as a burst arrives.

Prints medians over rounds of µs per request.

    PYTHONPATH=build/python taskset -c 1 /usr/bin/python3 bench/asgi_route.py [--rounds R]
"""
import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import shmipc._serve as sf  # noqa: E402
import serve_app  # noqa: E402
from shmipc.serve.inprocess import ASGIRoute  # noqa: E402


class _Pending:
    """Stands in for shmipc.PendingResponse: takes the answer, sends nothing."""

    sent = False
    reason = None
    on_end = None

    def send(self, *answer):
        self.sent = True
        return True


def route_us(n):
    route = ASGIRoute.__new__(ASGIRoute)
    route.app = serve_app.asgi
    route._taken = set()
    frame = sf.encode_request_head(b"GET", b"/", [(b"Host", b"127.0.0.1:8080")],
                                   flags=sf.REQ_KEEP_ALIVE)
    scope = sf.decode_request_scope(frame)
    t = time.process_time()
    for _ in range(n):
        p = _Pending()
        route._taken.add(p)
        c = route._serve(scope, b"", p)
        try:
            c.send(None)
        except StopIteration:
            pass
    return (time.process_time() - t) / n * 1e6


async def _app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"Hello, World!"})


async def _send(message):
    pass


async def _receive():
    return {"type": "http.request", "body": b"", "more_body": False}


def floor_us(loop, task, rounds=3000, batch=64):
    left = [rounds]
    scope = {"type": "http"}

    def take():
        for _ in range(batch):
            if task:
                loop.create_task(_app(scope, _receive, _send))
            else:
                c = _app(scope, _receive, _send)
                try:
                    c.send(None)
                except StopIteration:
                    pass
        left[0] -= 1
        loop.call_soon(loop.stop if left[0] == 0 else take)

    loop.call_soon(take)
    t = time.process_time()
    loop.run_forever()
    return (time.process_time() - t) / (rounds * batch) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    med = statistics.median
    print(f"ASGIRoute._serve, no task, no C send: "
          f"{med(route_us(100000) for _ in range(args.rounds)):.2f} us")
    loops = [("asyncio", asyncio.new_event_loop)]
    try:
        import uvloop

        loops.append(("uvloop", uvloop.new_event_loop))
    except ImportError:
        pass
    for name, factory in loops:
        loop = factory()
        with_task = med(floor_us(loop, True) for _ in range(args.rounds))
        without = med(floor_us(loop, False) for _ in range(args.rounds))
        print(f"{name}: a task per request {with_task:.2f} us, stepped without a task "
              f"{without:.2f} us (trivial app, batches of 64)")
        loop.close()


if __name__ == "__main__":
    main()
