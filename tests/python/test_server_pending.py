"""Answers from any thread on shmipc.Server (Request.defer(), shmipc.PendingResponse;
docs/python.md "Answers from any thread"), attacked: answers from other threads and from other
requests' handlers (long polling), the client leaving first, the deadline, a handle dropped or
closed unsent, sent twice, invalid answers, misuse of defer() (outside its handler, twice, bad
timeouts, a handler that still returns an answer or raises), on_end's reasons exactly once,
the server closed with answers outstanding, and many clients answered after random delays by a
thread pool on both backends: every response is its own request's."""
import concurrent.futures
import gc
import http.client
import random
import socket
import sys
import threading
import time
import weakref

import pytest

from test_server import BACKENDS

import shmipc


def start(routes, backend=None, workers=1, **kw):
    s = shmipc.Server(port=0, workers=workers, **({"backend": backend} if backend else {}), **kw)
    for path, fn in routes.items():
        s.route("GET", path, fn)
    try:
        s.start()
    except shmipc.Error as e:
        s.close()
        if backend == "io_uring" and e.name in ("SHMIPC_ENOTSUP", "SHMIPC_EACCES"):
            pytest.skip(f"io_uring refused here: {e}")
        raise
    return s


def get(port, path, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


class Ends:
    """on_end's calls, by request."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen = []
        self.cv = threading.Condition(self.lock)

    def cb(self, tag):
        def on_end(reason):
            with self.lock:
                self.seen.append((tag, reason))
                self.cv.notify_all()
        return on_end

    def wait(self, n, timeout=5):
        with self.lock:
            assert self.cv.wait_for(lambda: len(self.seen) >= n, timeout), self.seen
            return list(self.seen)


def test_answer_from_another_thread_and_on_end_once():
    ends = Ends()
    big = bytes(range(256)) * 1024  # 256 KiB: lent to the server, not copied

    def later(req):
        p = req.defer(timeout=5, on_end=ends.cb(req.path))
        assert p.waiting and p.reason is None and not p.sent
        kind = req.query

        def answer():
            body = {"bytes": b"later", "bytearray": bytearray(b"later"),
                    "memoryview": memoryview(b"xlaterx")[1:6], "big": big, "none": None}[kind]
            assert p.send(201, [("X-Kind", kind), [b"X-Raw", b"\xe9"]], body) is True
            assert p.sent
        threading.Thread(target=answer).start()

    with start({"/later": later}) as s:
        for kind in ("bytes", "bytearray", "memoryview", "big", "none"):
            status, h, body = get(s.port, "/later?" + kind)
            assert status == 201 and h["x-kind"] == kind
            assert h["x-raw"] == "\xe9"  # latin-1 on the wire, as given
            assert body == {"big": big, "none": b""}.get(kind, b"later")
    assert ends.wait(5) == [("/later", shmipc.PENDING_SENT)] * 5


def test_long_poll_answered_by_another_requests_handler():
    waiting = []
    got = threading.Event()

    def wait(req):
        waiting.append(req.defer())
        got.set()

    def publish(req):
        p = waiting.pop()
        return "published" if p.send(200, [("Content-Type", "text/plain")], req.query) else "gone"

    with start({"/wait": wait, "/publish": publish}) as s:
        out = []
        t = threading.Thread(target=lambda: out.append(get(s.port, "/wait")))
        t.start()
        assert got.wait(5)
        assert get(s.port, "/publish?hello")[2] == b"published"
        t.join(5)
        assert out[0][0] == 200 and out[0][2] == b"hello"


def test_the_request_stops_waiting_first():
    ends = Ends()
    held = {}
    arrived = threading.Event()

    def hold(req):
        held[req.query] = req.defer(timeout=0.2 if req.query == "short" else None,
                                    on_end=ends.cb(req.query))
        arrived.set()

    with start({"/hold": hold}) as s:
        # The client leaves.
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(b"GET /hold?gone HTTP/1.1\r\nHost: x\r\n\r\n")
        assert arrived.wait(5)
        c.close()
        assert ends.wait(1) == [("gone", shmipc.PENDING_CLIENT_GONE)]
        p = held["gone"]
        assert not p.waiting and p.reason == shmipc.PENDING_CLIENT_GONE
        assert p.send(200, [], b"too late") is False
        # The deadline: 504.
        t0 = time.monotonic()
        status, h, _ = get(s.port, "/hold?short")
        assert status == 504 and time.monotonic() - t0 >= 0.19
        assert ends.wait(2)[1] == ("short", shmipc.PENDING_TIMEOUT)
        assert held["short"].send() is False
        with pytest.raises(RuntimeError):
            held["short"].send()  # given up already


def test_dropped_or_closed_unsent_is_500_and_send_after_is_refused():
    ends = Ends()

    def drop(req):
        req.defer(on_end=ends.cb("drop"))  # the object goes with the handler's frame

    def close(req):
        p = req.defer(on_end=ends.cb("close"))
        p.close()
        p.close()  # twice is nothing
        with pytest.raises(RuntimeError):
            p.send(200)

    def twice(req):
        p = req.defer(on_end=ends.cb("twice"))
        assert p.send(200, [], b"once")
        with pytest.raises(RuntimeError, match="sent or closed already"):
            p.send(200, [], b"twice")

    with start({"/drop": drop, "/close": close, "/twice": twice}) as s:
        assert get(s.port, "/drop")[0] == 500
        assert get(s.port, "/close")[0] == 500
        assert get(s.port, "/twice")[2] == b"once"
        assert sorted(ends.wait(3)) == [("close", shmipc.PENDING_ABANDONED),
                                        ("drop", shmipc.PENDING_ABANDONED),
                                        ("twice", shmipc.PENDING_SENT)]


@pytest.mark.parametrize("status,headers,body", [
    (199, [], b""), (1000, [], b""), (200, [("Content-Length", "3")], b"abc"),
    (200, [("X", "a\r\nInjected: 1")], b""), (200, [("Bad Name", "x")], b""),
    (200, [("Connection", "keep-alive")], b""), (200, [("X", 1)], b""), (200, [("X",)], b""),
    (200, [["X", "y", "z"]], b""), (200, ["ab"], b""), (200, [5], b""),
    (200, 5, b""), (200, [("X", "a\0b")], b""), (200, [], "\ud800"), (200, [], 5),
    ("200", [], b""),
])
def test_an_invalid_answer_raises_and_the_client_gets_500(status, headers, body):
    raised = []

    def bad(req):
        p = req.defer()

        def answer():
            try:
                p.send(status, headers, body)
            except (ValueError, TypeError) as e:
                raised.append(type(e))
        t = threading.Thread(target=answer)
        t.start()

    with start({"/bad": bad}) as s:
        st = get(s.port, "/bad")[0]
    if isinstance(status, str):
        assert raised == [TypeError] and st == 500  # the arguments, before anything is built
    else:
        assert raised and st == 500


def test_defer_misuse():
    kept = []
    outcomes = {}

    def misuse(req):
        for bad in (0, -1, 3601, float("nan"), "1", True):
            with pytest.raises((TypeError, ValueError)):
                req.defer(timeout=bad)
        with pytest.raises(TypeError):
            req.defer(on_end=5)
        kept.append(req)
        p = req.defer()
        with pytest.raises(RuntimeError, match="deferred already"):
            req.defer()
        p.on_end = None
        with pytest.raises(TypeError):
            p.on_end = 5
        p.send(200, [], b"ok")

    def returns_an_answer(req):
        outcomes["value"] = req.defer()
        return b"an answer it can no longer give"

    def raises(req):
        outcomes["raised"] = req.defer()
        raise KeyError("after defer")

    def elsewhere(req):
        box = []
        t = threading.Thread(target=lambda: box.append(_try(lambda: req.defer())))
        t.start()
        t.join()
        return repr(box[0])

    with start({"/misuse": misuse, "/value": returns_an_answer, "/raises": raises,
                "/elsewhere": elsewhere}) as s:
        assert get(s.port, "/misuse")[2] == b"ok"
        with pytest.raises(RuntimeError, match="own route handler"):
            kept[0].defer()  # after its handler returned
        assert get(s.port, "/value")[0] == 500
        assert get(s.port, "/raises")[0] == 500
        for key in ("value", "raised"):
            p = outcomes[key]
            assert p.reason == shmipc.PENDING_FAILED
            assert p.send(200) is False
        assert b"RuntimeError" in get(s.port, "/elsewhere")[2]
    with pytest.raises(TypeError):
        shmipc.PendingResponse()


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        return e


def test_on_end_that_raises_is_reported_and_serving_goes_on():
    hooked = []
    unraisable = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(u.exc_value)

    def boom(reason):
        raise ZeroDivisionError("in on_end")

    def later(req):
        p = req.defer(on_end=boom)
        hooked.append(p)
        p.send(200, [], b"fine")

    try:
        with start({"/later": later}) as s:
            for _ in range(3):
                assert get(s.port, "/later")[2] == b"fine"
            deadline = time.monotonic() + 5
            while len(unraisable) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        sys.unraisablehook = old_hook
    assert len(unraisable) == 3 and all(isinstance(e, ZeroDivisionError) for e in unraisable)


def test_server_closed_with_answers_outstanding():
    held = []
    arrived = threading.Event()

    def hold(req):
        held.append(req.defer())
        arrived.set()

    s = start({"/hold": hold}, stop_timeout=0.2)
    c = socket.create_connection(("127.0.0.1", s.port))
    c.settimeout(5)
    c.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
    assert arrived.wait(5)
    s.close()
    assert c.recv(100) == b""  # closed at the stop timeout, unanswered
    c.close()
    p = held[0]
    assert p.reason == shmipc.PENDING_CLIENT_GONE
    assert p.send(200, [], b"x" * 100000) is False  # the server is gone: refused, no crash
    del held[:]
    gc.collect()


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_clients_answered_by_a_pool_no_crosstalk(backend):
    ends = Ends()
    pool = concurrent.futures.ThreadPoolExecutor(4)

    def work(p, n):
        time.sleep(random.random() * 0.002)
        p.send(200, [("X-N", n)], f"answer {n}".encode())

    def route(req):
        n = req.query
        pool.submit(work, req.defer(timeout=10, on_end=ends.cb(n)), n)

    wrong = []
    with start({"/n": route}, backend=backend, workers=2) as s:
        def client(k):
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
            for i in range(40):
                n = f"{k}-{i}"
                c.request("GET", "/n?" + n)
                r = c.getresponse()
                body = r.read()
                if r.status != 200 or body != f"answer {n}".encode() or r.getheader("X-N") != n:
                    wrong.append((n, r.status, body))
            c.close()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seen = ends.wait(320, timeout=10)
    pool.shutdown()
    assert wrong == []
    assert len(seen) == 320 and {r for _, r in seen} == {shmipc.PENDING_SENT}
    assert len({tag for tag, _ in seen}) == 320


def test_a_cycle_through_on_end_is_collected_once_the_request_ended():
    # on_end was never visited by the GC, even after the request ended and the C callback
    # had let it go: a PendingResponse whose on_end referred back to it (a closure, a bound
    # method of an object that holds it) leaked for good, with everything it held.
    refs = []

    def handler(req):
        p = req.defer(timeout=5)
        p.on_end = lambda reason, p=p: None  # p -> on_end -> p
        refs.append(weakref.ref(p))
        assert p.send(200, [], b"ok")

    with start({"/": handler}) as s:
        assert get(s.port, "/")[2] == b"ok"
        deadline = time.monotonic() + 5
        while refs[0]() is not None and time.monotonic() < deadline:
            gc.collect()  # until the worker's on_end has run and let the state go
            time.sleep(0.01)
    assert refs[0]() is None


def test_a_send_nested_in_another_send_does_not_mix_the_two_answers():
    # send() used to build on the handle it still held while the headers iterator ran: a
    # send() (or close()) from that Python code, or from another thread meanwhile, sent an
    # answer with the first one's status and fields (X-A here) and the outer send() failed
    # on a NULL handle. The handle is taken first now: the nested send() finds it sent.
    seen = {}

    def handler(req):
        p = req.defer(timeout=5)

        def fields():
            yield ("X-A", "a")
            try:
                seen["inner"] = p.send(201, [("X-B", "b")], b"inner")
            except RuntimeError as e:
                seen["inner"] = e
                raise
            yield ("X-C", "c")

        try:
            p.send(404, fields(), b"outer")
        except RuntimeError as e:
            seen["outer"] = e

    with start({"/": handler}) as s:
        status, headers, body = get(s.port, "/")
    assert isinstance(seen["inner"], RuntimeError) and isinstance(seen["outer"], RuntimeError)
    assert status == 500 and "x-a" not in headers and "x-b" not in headers
