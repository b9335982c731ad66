"""The ASGI worker that runs many requests at once on one loop (python/shmipc/serve/
asgi_worker.py; docs/serve.md, "The ASGI worker"). This test plays the front over a shmipc
client session. Every case of test_serve_asgi.py and test_serve_asgi_ws.py also runs against
this worker (their `serve` fixture); these are the cases only it can pass: requests that wait
for each other, a response that fills shared memory beside others that go on, its bound, stop
and --max-requests with several in progress, and misuse."""
import asyncio
import hashlib
import struct
import threading
import time

import pytest

import shmipc
from conftest import default_config, unique_address

sf = pytest.importorskip("shmipc._serve")
from shmipc.serve.asgi import ASGIHandler  # noqa: E402
from shmipc.serve.asgi_worker import ASGIWorker  # noqa: E402
from test_serve_asgi import Running  # noqa: E402
from test_serve_worker import frame  # noqa: E402


def loop_running(app, **kw):
    return Running(app, "loop", **kw)


def big_piece(i):
    return hashlib.sha256(b"%d" % i).digest() * 2048  # 64 KiB


class Gates:
    """Events of the app's loop, opened by requests or by the test's thread."""

    def __init__(self):
        self.events = {}
        self.loop = None

    def get(self, name):
        if name not in self.events:
            self.events[name] = asyncio.Event()
        return self.events[name]

    def open_from_thread(self, name):
        self.loop.call_soon_threadsafe(lambda: self.get(name).set())


def gated_app(gates, held=None):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            raise RuntimeError("no lifespan")
        gates.loop = asyncio.get_running_loop()
        path = scope["path"]
        body = b""
        while not path.startswith("/bignoread/"):
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        if path.startswith("/wait/"):
            if held is not None:
                held.append(path)
            await gates.get(path[6:]).wait()
            out = b"released " + body
        elif path.startswith("/open/"):
            gates.get(path[6:]).set()
            out = b"opened"
        elif path.startswith("/bignoread/"):  # answers before it reads its body
            n = int(path[11:])
            await send({"type": "http.response.start", "status": 200})
            for i in range(n):
                await send({"type": "http.response.body", "body": big_piece(i),
                            "more_body": i + 1 < n})
            return
        elif path.startswith("/big/"):
            n = int(path[5:])
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(n * 65536).encode())]})
            for i in range(n):
                await send({"type": "http.response.body", "body": big_piece(i),
                            "more_body": i + 1 < n})
            return
        else:
            await asyncio.sleep(0.001 * (len(body) % 5))
            out = b"echo " + path.encode() + b" " + body
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": out})
    return app


def wait_until(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.002)
    return cond()


def test_a_request_waits_for_one_behind_it():
    # /wait/a is answered only once /open/a ran: one at a time, that is a deadlock until the
    # front's read times out; on the loop both run.
    gates = Gates()
    r = loop_running(gated_app(gates))
    try:
        a, _ = r.front.open(target=b"/wait/a", body=b"first")
        r.front.send_body(a, [b"first"])
        b, _ = r.front.open(target=b"/open/a", body=b"")
        r.front.send_body(b, [])
        assert r.front.response(b)[4] == b"opened"
        assert r.front.response(a)[4] == b"released first"
        a.close()
        b.close()
    finally:
        r.stop()
    assert r.worker.counts["ok"] == 2


def test_many_at_once_each_gets_its_own_answer():
    # 48 requests over two sessions, all sent before any answer is read, unique bodies: each
    # answer is its own request's (no cross-talk), in whatever order the tasks finish.
    gates = Gates()
    r = loop_running(gated_app(gates), concurrency=16)
    second = None
    try:
        from test_serve_worker import Front
        second = Front(r.worker.address)
        fronts = [r.front, second]
        sent = []
        for i in range(48):
            f = fronts[i % 2]
            body = b"body-%d-" % i + bytes([i]) * (i * 37)
            st, _ = f.open(method=b"POST", target=b"/e%d" % i, body=body)
            f.send_body(st, [body])
            sent.append((f, st, i, body))
        for f, st, i, body in reversed(sent):
            status, _, _, _, got, last, _ = f.response(st)
            assert (status, last) == (200, sf.END)
            assert got == b"echo /e%d " % i + body
            st.close()
        assert 1 < r.worker.peak <= 16
    finally:
        if second is not None:
            second.close()
        r.stop()
    assert r.worker.counts["ok"] == 48


def test_concurrency_bounds_what_runs_at_once():
    gates = Gates()
    held = []
    r = loop_running(gated_app(gates, held), concurrency=2)
    try:
        streams = []
        for i in range(5):
            st, _ = r.front.open(target=b"/wait/g")
            r.front.send_body(st, [])
            streams.append(st)
        assert wait_until(lambda: len(held) == 2)
        time.sleep(0.1)  # the other three wait for a place
        assert len(held) == 2 and r.worker.in_flight == 2
        gates.open_from_thread("g")
        for st in streams:
            assert r.front.response(st)[4] == b"released "
            st.close()
        assert r.worker.peak == 2
    finally:
        r.stop()


def test_idle_sessions_hold_no_place():
    # The front has a session per reactor thread and counts its requests over all of them:
    # a session waiting for its next stream must not hold one of the worker's places.
    # Concurrency 1: a request on the second session while the first is idle is served;
    # concurrency 2: two requests on one session run together while the other is idle.
    from test_serve_worker import Front
    for conc in (1, 2):
        gates, held = Gates(), []
        r = loop_running(gated_app(gates, held), concurrency=conc)
        other = Front(r.worker.address)
        try:
            assert other.request(target=b"/x")[4] == b"echo /x "
            assert r.front.request(target=b"/y")[4] == b"echo /y "
            if conc == 2:
                streams = []
                for _ in range(2):
                    st, _ = r.front.open(target=b"/wait/i")
                    r.front.send_body(st, [])
                    streams.append(st)
                assert wait_until(lambda: len(held) == 2), held
                gates.open_from_thread("i")
                for st in streams:
                    assert r.front.response(st)[4] == b"released "
                    st.close()
        finally:
            other.close()
            r.stop()


def test_a_frame_whose_payload_is_on_its_way_holds_no_other_request():
    # The front's BODY header came with only part of its payload (a flush cut short, or a
    # hostile front): the request waiting for the rest must not hold the loop. Before, the
    # payload's read waited inside receive(), and every other request of the worker with it.
    # Then the same for an ABORT's text after the body, looked for between response pieces.
    gates = Gates()
    r = loop_running(gated_app(gates), concurrency=4)
    try:
        a, _ = r.front.open(method=b"POST", target=b"/e", flags=sf.REQ_HAS_BODY | sf.REQ_CHUNKED)
        a.write(frame(sf.BODY, b"x" * 100)[:12 + 10])
        a.flush()
        time.sleep(0.2)  # the app's receive() has the header
        b, _ = r.front.open(target=b"/other")
        r.front.send_body(b, [])
        b.read_timeout = 5
        assert r.front.response(b)[4] == b"echo /other "
        a.write(b"y" * 90 + frame(sf.END))
        a.flush()
        a.read_timeout = 5
        assert r.front.response(a)[4] == b"echo /e " + b"x" * 10 + b"y" * 90
        a.close()
        b.close()

        c, _ = r.front.open(target=b"/wait/c")
        r.front.send_body(c, [])
        abort = frame(sf.ABORT, b"t" * 200, sf.ABORT_CLIENT_GONE)
        c.write(abort[:12 + 50])
        c.flush()
        time.sleep(0.1)
        d, _ = r.front.open(target=b"/open/c")  # the app of /wait/c then looks for an ABORT
        r.front.send_body(d, [])
        d.read_timeout = 5
        assert r.front.response(d)[4] == b"opened"
        e, _ = r.front.open(target=b"/other2")
        r.front.send_body(e, [])
        e.read_timeout = 5
        assert r.front.response(e)[4] == b"echo /other2 "
        # /wait/c answered: the front's ABORT was not whole when it looked (nor is it now)
        c.read_timeout = 5
        assert r.front.response(c)[4:6] == (b"released ", sf.END)
        c.close()
        d.close()
        e.close()
    finally:
        r.stop()


def test_hello_says_the_concurrency():
    r = loop_running(gated_app(Gates()), concurrency=7)
    try:
        st = r.front.session.open_stream()
        st.write(frame(sf.HELLO, (sf.FEAT_TAKEN | 0x80).to_bytes(4, "little") + bytes(4)))
        st.flush()
        typ, _, payload = r.front.read_frame(st)
        assert typ == sf.HELLO
        assert int.from_bytes(payload[:4], "little") == sf.FEAT_TAKEN
        assert int.from_bytes(payload[4:8], "little") == 7
        st.close()
        assert r.front.request(target=b"/after")[4] == b"echo /after "
    finally:
        r.stop()
    assert r.worker.counts["hello"] == 1


def small_memory_front(address):
    # 4 MiB of shared memory (the client, the front, sizes it): a 16 MiB answer nobody reads
    # fills it.
    from test_serve_worker import Front
    return Front(address, default_config(buffer_capacity=4 << 20))


def loop_worker(app, concurrency):
    handler = ASGIHandler(app, lifespan_timeout=5)
    handler.startup()
    w = ASGIWorker(handler, unique_address("asgiloop"), concurrency=concurrency)
    t = threading.Thread(target=w.serve_forever)
    t.start()
    return handler, w, t


def end_worker(handler, w, t, *fronts):
    for f in fronts:
        f.close()
    w.stop()
    t.join(10)
    assert not t.is_alive()
    handler.shutdown()


def read_big(front, st, n):
    typ, _, _ = front.read_frame(st)
    assert typ == sf.RESPONSE_HEAD
    h, want = hashlib.sha256(), hashlib.sha256()
    for i in range(n):
        want.update(big_piece(i))
    while True:
        typ, _, payload = front.read_frame(st)
        if typ != sf.BODY:
            break
        h.update(payload)
    assert typ == sf.END and h.digest() == want.digest()


def test_a_response_that_fills_memory_does_not_stall_other_sessions():
    # The front does not read /big on session A (its client is slow): the worker's writes
    # find A's shared memory full and that task waits on the loop. Requests on session B (the
    # front's other thread) are answered meanwhile: a write that waited inside the library
    # (worker.Worker's) would hold the whole process. Then A's /big is read whole, intact.
    handler, w, t = loop_worker(gated_app(Gates()), 4)
    from test_serve_worker import Front
    a = small_memory_front(w.address)
    b = Front(w.address)
    try:
        big, _ = a.open(target=b"/big/256")  # 16 MiB
        a.send_body(big, [])
        assert wait_until(lambda: w.in_flight == 1)
        time.sleep(0.2)  # the big answer has filled A's memory by now
        for i in range(10):
            assert b.request(target=b"/small%d" % i)[4] == b"echo /small%d " % i
        assert wait_until(lambda: w.in_flight == 1)  # /big still waits for memory
        read_big(a, big, 256)
        big.close()
    finally:
        end_worker(handler, w, t, a, b)
    assert w.counts["ok"] == 11


def test_front_abort_ends_a_response_waiting_for_memory():
    # The client of /big went away: the front's ABORT ends the task that waits for memory,
    # and its place is free again (concurrency 1: the next request is served).
    handler, w, t = loop_worker(gated_app(Gates()), 1)
    from test_serve_worker import Front
    a = small_memory_front(w.address)
    b = Front(w.address)
    try:
        big, _ = a.open(target=b"/big/256")
        a.send_body(big, [])
        assert wait_until(lambda: w.in_flight == 1)
        time.sleep(0.2)
        big.write(frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
        big.flush()
        assert wait_until(lambda: w.in_flight == 0)
        big.close()
        assert b.request(target=b"/next")[4] == b"echo /next "
    finally:
        end_worker(handler, w, t, a, b)
    assert (w.counts["aborted"], w.counts["ok"]) == (1, 1), w.counts


def test_front_close_ends_a_memory_wait_with_the_body_unread():
    # The app answers before it reads its body, so a BODY frame is read ahead and the front's
    # ABORT behind it is not looked at; the front then closes the stream (after its drain):
    # the task that waits for memory ends, freeing its place. (Here the session's accept
    # loop also watches the session; the next case has no other watcher.)
    handler, w, t = loop_worker(gated_app(Gates()), 1)
    from test_serve_worker import Front
    a = small_memory_front(w.address)
    b = Front(w.address)
    try:
        big, chunks = a.open(method=b"POST", target=b"/bignoread/256", body=b"x" * 1000)
        a.send_body(big, chunks, end=False)
        assert wait_until(lambda: w.in_flight == 1)
        time.sleep(0.2)
        big.write(frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
        big.flush()
        big.close()
        # This front (no memory_wait) sent its ABORT over the socket, so the worker's stream
        # went there too (shmipc keeps both directions of a stream on it). When the worker
        # wrote on before it read the close, and filled a socket this front does not read,
        # its write ends with the session at the connection write timeout (10 s): the task
        # ends then (aborted), not in the 10 s this waited before (2 runs in 60 under load).
        assert wait_until(lambda: w.in_flight == 0, timeout=25), w.counts
        assert b.request(target=b"/next")[4] == b"echo /next "
    finally:
        end_worker(handler, w, t, a, b)
    assert (w.counts["aborted"], w.counts["ok"]) == (1, 1), w.counts


def test_a_memory_wait_sees_the_close_with_nothing_else_watching():
    # A write that waits for shared memory, a BODY frame read ahead (so the ABORT check looks
    # at nothing), and no read or accept waiting on the session: the wait itself must process
    # the session to see the front's close (before: still waiting after 5 s).
    from shmipc.serve.asgi_worker import _LoopExchange
    address = unique_address("asgipoke")
    listener = shmipc.Listener(address, default_config(memory_wait=True))
    box = {}
    t = threading.Thread(target=lambda: box.__setitem__("c", shmipc.connect(
        address, default_config(buffer_capacity=4 << 20))))
    t.start()
    server = listener.accept(timeout=10)
    t.join(10)
    client = box["c"]
    loop = asyncio.new_event_loop()
    try:
        front = client.open_stream()
        front.write(b"x" * 12)
        front.flush()
        st = server.accept_stream(timeout=10)
        ex = _LoopExchange(st, loop)
        ex.pending = b"read ahead"

        def closer():
            time.sleep(0.3)
            front.close()

        threading.Thread(target=closer).start()

        async def main():
            with pytest.raises((shmipc.Error, OSError)):
                await asyncio.wait_for(ex.asend(*[b"y" * 65536] * 256), 5)

        t0 = time.monotonic()
        loop.run_until_complete(main())
        assert time.monotonic() - t0 < 4
        st.close()
    finally:
        loop.close()
        client.close()
        server.close()
        listener.close()


def test_a_flood_of_streams_is_bounded_per_session():
    # A front that opens far more streams than the concurrency: the worker accepts at most
    # `concurrency` per session (the rest stay in the library's accept queue, whose bound ends
    # a session that floods it), so another session is still served at once.
    gates, held = Gates(), []
    r = loop_running(gated_app(gates, held), concurrency=2)
    from test_serve_worker import Front
    other = Front(r.worker.address)
    try:
        streams = []
        for _ in range(200):
            st, _ = r.front.open(target=b"/wait/f")
            r.front.send_body(st, [])
            streams.append(st)
        assert wait_until(lambda: len(held) == 2)
        time.sleep(0.2)
        assert len(asyncio.all_tasks(r.worker.loop)) < 20
        gates.open_from_thread("f")
        for st in streams[:20]:
            assert r.front.response(st)[4] == b"released "
        t0 = time.monotonic()
        assert other.request(target=b"/other")[4] == b"echo /other "
        assert time.monotonic() - t0 < 5
        for st in streams:
            st.close()
    finally:
        other.close()
        r.stop()


def test_stop_refuses_at_once_a_stream_waiting_for_a_place():
    # Concurrency 1, one request held and a second one (from a front that does not count)
    # waiting for the place: stop() refuses the second at once (ABORT SHUTDOWN: the front gives
    # it to another worker), not when the first ends.
    gates, held = Gates(), []
    r = loop_running(gated_app(gates, held), concurrency=1)
    from test_serve_worker import Front
    other = Front(r.worker.address)
    try:
        a, _ = r.front.open(target=b"/wait/w")
        r.front.send_body(a, [])
        assert wait_until(lambda: len(held) == 1)
        b, _ = other.open(target=b"/queued")
        other.send_body(b, [])
        time.sleep(0.1)
        r.worker.stop()
        t0 = time.monotonic()
        assert other.response(b)[5:] == (sf.ABORT, sf.ABORT_SHUTDOWN)
        # At the stop, not when the first ends (never before the gate opens below: the read
        # would time out after 10 s). 5 s, not 2: a loaded machine (pytest-xdist beside the
        # C suites) may take more than 2 s to run the worker's stop.
        assert time.monotonic() - t0 < 5
        b.close()
        gates.open_from_thread("w")
        assert r.front.response(a)[4] == b"released "
        a.close()
    finally:
        other.close()
        r.front.close()
        r.thread.join(10)
        assert not r.thread.is_alive()
        r.handler.shutdown()


def test_stop_finishes_what_runs_and_refuses_what_comes():
    gates = Gates()
    held = []
    r = loop_running(gated_app(gates, held), concurrency=4)
    a, _ = r.front.open(target=b"/wait/s")
    r.front.send_body(a, [])
    b, _ = r.front.open(target=b"/wait/s")
    r.front.send_body(b, [])
    assert wait_until(lambda: len(held) == 2)
    r.worker.stop()
    time.sleep(0.05)
    late, _ = r.front.open(target=b"/late")
    r.front.send_body(late, [])
    assert r.front.response(late)[5:] == (sf.ABORT, sf.ABORT_SHUTDOWN)
    late.close()
    assert r.thread.is_alive()  # the two in progress hold it
    gates.open_from_thread("s")
    assert r.front.response(a)[4] == b"released "
    assert r.front.response(b)[4] == b"released "
    a.close()
    b.close()
    r.thread.join(10)
    assert not r.thread.is_alive()
    r.front.close()
    r.handler.shutdown()
    assert r.worker.counts["ok"] == 2


def test_max_requests_counts_those_that_arrive_together():
    # --max-requests 2 with three at once: two served, the third refused (ABORT SHUTDOWN:
    # the front gives it to another worker), then the worker returns.
    gates = Gates()
    held = []
    r = loop_running(gated_app(gates, held), concurrency=4, max_requests=2)
    streams = []
    for _ in range(3):
        st, _ = r.front.open(target=b"/wait/m")
        r.front.send_body(st, [])
        streams.append(st)
    outcomes = []
    assert wait_until(lambda: len(held) == 2)
    gates.open_from_thread("m")
    for st in streams:
        outcomes.append(r.front.response(st)[4:6])
        st.close()
    assert sorted(outcomes) == sorted([(b"released ", sf.END)] * 2 + [(b"", sf.ABORT)])
    r.thread.join(10)
    assert not r.thread.is_alive()
    r.front.close()
    r.handler.shutdown()
    assert r.worker.served == 2


def test_a_hello_past_max_requests_is_refused_with_abort_shutdown():
    # A new session's HELLO that reaches a worker past --max-requests is answered ABORT
    # SHUTDOWN, as a request is: the front sends that session nothing more (closed without a
    # word, the front took the worker for one that does not know HELLO).
    gates = Gates()
    held = []
    r = loop_running(gated_app(gates, held), concurrency=4, max_requests=1)
    st, _ = r.front.open(target=b"/wait/h")
    r.front.send_body(st, [])
    assert wait_until(lambda: len(held) == 1)
    hello = r.front.session.open_stream()
    hello.write(sf.encode_frame(sf.HELLO, struct.pack("<II", sf.FEAT_TAKEN, 0)))
    hello.flush()
    gates.open_from_thread("h")
    assert r.front.response(st)[4:6] == (b"released ", sf.END)
    assert r.front.response(hello)[5:7] == (sf.ABORT, sf.ABORT_SHUTDOWN)
    st.close()
    hello.close()
    r.thread.join(10)
    assert not r.thread.is_alive()
    r.front.close()
    r.handler.shutdown()
    assert r.worker.served == 1


@pytest.mark.parametrize("bad", [0, -1, 257, 10**9, True, 2.0, "4", None])
def test_concurrency_misuse_is_a_clear_error(bad):
    handler = ASGIHandler(gated_app(Gates()))
    try:
        with pytest.raises(ValueError, match="concurrency"):
            ASGIWorker(handler, unique_address("asgiloop"), concurrency=bad)
        with pytest.raises(ValueError, match="max_requests"):
            ASGIWorker(handler, unique_address("asgiloop"), max_requests=-1)
    finally:
        handler.loop.close()


def test_stop_before_serve_forever_returns_at_once():
    handler = ASGIHandler(gated_app(Gates()))
    w = ASGIWorker(handler, unique_address("asgiloop"))
    w.stop()
    t0 = time.monotonic()
    w.serve_forever()
    assert time.monotonic() - t0 < 5
    handler.loop.close()


def test_places_bound_order_and_a_cancelled_waiter_passes_its_place_on():
    # The worker's count of free places (_Places, in place of asyncio.Semaphore on its path per
    # request): a bound, first come first served, and no place lost or made by a cancel.
    from shmipc.serve.asgi_worker import _Places
    loop = asyncio.new_event_loop()
    try:
        async def main():
            p = _Places(2, loop)
            assert p.try_take() and p.try_take() and not p.try_take()
            order = []

            async def waiter(i):
                await p.take()
                order.append(i)
            ts = [loop.create_task(waiter(i)) for i in range(4)]
            await asyncio.sleep(0)
            assert order == [] and len(p.waiters) == 4 and not p.try_take()
            p.give()  # to waiter 0, which is cancelled before it runs: waiter 1 gets it
            ts[0].cancel()
            ts[2].cancel()  # cancelled while waiting: takes nothing
            for _ in range(3):
                await asyncio.sleep(0)
            assert order == [1] and ts[0].cancelled() and ts[2].cancelled()
            assert list(p.waiters) != [] and p.free == 0
            p.give()  # to waiter 3
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert order == [1, 3] and not p.waiters
            for _ in range(3):  # the two taken first, and waiter 1's; waiter 3 keeps its own
                p.give()
            assert p.free == 3
            assert p.try_take() and p.try_take() and p.try_take() and not p.try_take()
        loop.run_until_complete(main())
    finally:
        loop.close()
