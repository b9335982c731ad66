"""shmipc-serve's ASGI 3 worker (python/shmipc/serve/asgi.py, docs/serve.md "The ASGI
worker"): the C decode of a REQUEST_HEAD into the HTTP scope, lifespan, and the spec's HTTP
cases, with this test playing the front over a shmipc client session (test_serve_worker's)."""
import asyncio
import logging
import os
import subprocess
import sys
import threading
import time

import pytest

import shmipc
from conftest import unique_address

sf = pytest.importorskip("shmipc._serve")
from shmipc.serve.asgi import ASGIHandler, LifespanFailed  # noqa: E402
from shmipc.serve.asgi_worker import ASGIWorker  # noqa: E402
from shmipc.serve.worker import Worker  # noqa: E402
from test_serve_worker import (  # noqa: E402
    BAD_LEFTOVERS, BODY_LIES, CUT_SHORT, Front, answer_then_trickle, bad_frames_behind_an_answer,
    cut_short_then_next, frame, head, length_bound_is_kept, next_answer)

# ---- the scope --------------------------------------------------------------------------


def test_decode_request_scope_fields():
    f = head(b"POST", b"/a%20b/%E2%82%AC?x=1&y=%20",
             [("Host", "h.example"), ("X-Rep", "1"), ("Cookie", "a"), ("x-rep", "2")],
             flags=sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, content_length=5,
             peer=("10.0.0.7", 5555), local=("::1", 8443), version_minor=0, scheme=1)
    s = sf.decode_request_scope(f)
    assert s["type"] == "http"
    assert s["asgi"] == {"version": "3.0", "spec_version": "2.3"}
    assert s["http_version"] == "1.0"
    assert s["method"] == "POST"
    assert s["scheme"] == "https"
    assert s["path"] == "/a b/\u20ac"
    assert s["raw_path"] == b"/a%20b/%E2%82%AC"
    assert s["query_string"] == b"x=1&y=%20"
    assert s["root_path"] == ""
    # order and repeats kept, names lowercased, all bytes
    assert s["headers"] == [[b"host", b"h.example"], [b"x-rep", b"1"], [b"cookie", b"a"],
                            [b"x-rep", b"2"]]
    assert s["client"] == ["10.0.0.7", 5555]
    assert s["server"] == ["::1", 8443]


def test_decode_request_scope_unix_and_no_peer_are_none():
    s = sf.decode_request_scope(head(peer="unix", local=None))
    assert s["client"] is None and s["server"] is None
    assert s["http_version"] == "1.1" and s["scheme"] == "http"
    assert s["query_string"] == b"" and s["path"] == "/"


@pytest.mark.parametrize("target,path,raw,query", [
    (b"/", "/", b"/", b""),
    (b"/p?", "/p", b"/p", b""),
    (b"http://h:8/x/y?q=1", "/x/y", b"/x/y", b"q=1"),
    (b"http://h", "/", b"/", b""),
    (b"*", "*", b"*", b""),
    (b"/%ff%zz%4", "/\udcff%zz%4", b"/%ff%zz%4", b""),
])
def test_decode_request_scope_targets(target, path, raw, query):
    method = b"OPTIONS" if target == b"*" else b"GET"
    s = sf.decode_request_scope(head(method, target))
    assert (s["path"], s["raw_path"], s["query_string"]) == (path, raw, query)


def test_decode_request_scope_refuses_hostile_frames():
    good = head(b"GET", b"/x", [("A", "b")])
    for bad in (good[:-1], good + b"\0", good[:11], b"", frame(sf.END),
                b"\0" * len(good), good[:4] + b"\xff\xff\xff\x7f" + good[8:]):
        with pytest.raises(sf.FrameError):
            sf.decode_request_scope(bad)
    # every truncation and every single-byte corruption: FrameError or a dict, never a crash
    for i in range(len(good)):
        with pytest.raises(sf.FrameError):
            sf.decode_request_scope(good[:i])
        for v in (0, 0x7f, 0xff):
            b = bytearray(good)
            b[i] = v
            try:
                assert isinstance(sf.decode_request_scope(bytes(b)), dict)
            except sf.FrameError:
                pass
    with pytest.raises(TypeError):
        sf.decode_request_scope("not bytes")


# ---- the worker -------------------------------------------------------------------------


# Both servers of an ASGI app: worker.Worker, one request at a time (its handler's loop run
# per request), and asgi_worker.ASGIWorker, many at once on one loop. Every case of the
# `serve` fixture runs against each.
KINDS = ["one", "loop"]


class Running:
    def __init__(self, app, kind="one", concurrency=8, **kw):
        self.handler = ASGIHandler(app, lifespan_timeout=5)
        self.handler.startup()
        if kind == "loop":
            self.worker = ASGIWorker(self.handler, unique_address("asgi"),
                                     concurrency=concurrency, **kw)
        else:
            self.worker = Worker(app, unique_address("asgi"), handler=self.handler, **kw)
        self.thread = threading.Thread(target=self.worker.serve_forever)
        self.thread.start()
        self.front = Front(self.worker.address)

    def stop(self):
        self.front.close()
        self.worker.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.handler.shutdown()


@pytest.fixture(params=KINDS)
def serve(request):
    running = []

    def start(app):
        r = Running(app, request.param)
        running.append(r)
        return r.front

    yield start
    for r in running:
        r.stop()


async def read_body(receive):
    parts, events = [], []
    while True:
        m = await receive()
        events.append(m)
        assert m["type"] == "http.request"
        parts.append(m["body"])
        if not m["more_body"]:
            return b"".join(parts), events


def echo(seen=None):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            raise RuntimeError("no lifespan here")
        body, events = await read_body(receive)
        if seen is not None:
            seen.append((scope, events))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream"),
                                (b"x-path", scope["path"].encode())]})
        await send({"type": "http.response.body", "body": body})
    return app


def test_echo_body_in_one_frame_and_headers(serve):
    seen = []
    front = serve(echo(seen))
    status, flags, clen, headers, body, last, _ = front.request(
        b"POST", b"/e?q", [("X-A", "1"), ("X-A", "2")], body=b"hello")
    assert (status, body, last) == (200, b"hello", sf.END)
    assert flags & sf.RESP_CONTENT_LENGTH and clen == 5  # one piece: its length is known
    assert ("x-path", "/e") in [(k.lower(), v) for k, v in headers]
    scope, events = seen[0]
    assert [h for h in scope["headers"] if h[0] == b"x-a"] == [[b"x-a", b"1"], [b"x-a", b"2"]]
    assert scope["client"] == ["127.0.0.1", 40000]


def test_body_in_several_frames_gives_more_body(serve):
    seen = []
    front = serve(echo(seen))
    chunks = [b"a" * 10, b"b" * 70000, b"c"]
    status, _, _, _, body, last, _ = front.request(b"POST", b"/", chunks=chunks)
    assert (status, body, last) == (200, b"".join(chunks), sf.END)
    events = seen[0][1]
    assert [e["more_body"] for e in events][-1] is False
    assert all(e["more_body"] for e in events[:-1]) and len(events) >= 3


def test_receive_waiting_for_the_body_does_not_block_the_loop(serve):
    # receive() read the next BODY frame with a blocking read on the loop thread: while the
    # front had not sent it, no other task of the app ran (a ticker counted 0 ticks).
    ticks = []
    n = [0]  # the ticker's count, which the test watches

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return

        async def ticker():
            while True:
                await asyncio.sleep(0.01)
                n[0] += 1

        t = asyncio.ensure_future(ticker())
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        t.cancel()
        ticks.append(n[0])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    front = serve(app)
    st, _ = front.open(b"POST", b"/", flags=sf.REQ_HAS_BODY | sf.REQ_CHUNKED)
    front.send_body(st, [b"first"], end=False)
    # The rest goes once the ticker ran 10 times (up to 10 s) while the app waits in receive()
    # for it: a fixed 0.4 s could end, on a loaded machine, before the app had begun.
    deadline = time.monotonic() + 10
    while n[0] < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    front.send_body(st, [b"-second"])
    try:
        status, _, _, _, body, last, _ = front.response(st)
    finally:
        st.close()
    assert (status, body, last) == (200, b"first-second", sf.END)
    assert ticks and ticks[0] >= 10, f"the loop ran {ticks} ticks while receive() waited"


@pytest.mark.parametrize("flags,clen,frames", BAD_LEFTOVERS)
def test_bad_frame_behind_a_body_the_app_never_read(serve, flags, clen, frames):
    # As test_serve_worker.py's: the worker reads them after its END; ABORT PROTOCOL, and the
    # worker serves on. Before, the ProtocolViolation escaped the drain: the one-at-a-time
    # worker's session thread died (the session ended), the loop's task died unanswered.
    async def app(scope, receive, send):
        if scope["type"] != "http":
            raise RuntimeError("no lifespan")
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"ok"})

    front = serve(app)
    bad_frames_behind_an_answer(front, flags, clen, frames)
    assert front.request(b"POST", b"/", body=b"again")[4:6] == (b"ok", sf.END)


@pytest.mark.parametrize("flags,clen,chunks", BODY_LIES)
def test_body_that_contradicts_its_head_is_a_bad_frame(serve, flags, clen, chunks):
    seen = []

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        body, more = b"", True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        seen.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    front = serve(app)
    st, _ = front.open(b"POST", flags=flags, content_length=clen)
    front.send_body(st, chunks)
    typ, arg, _ = front.read_frame(st)
    st.close()
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL), (typ, arg, seen)
    assert all(len(b) <= clen for b in seen), seen


def test_request_content_length_over_2_63_is_abort_protocol(serve):
    # test_serve_worker.py's case: a head's content_length past 2^63 - 1 is ABORT PROTOCOL
    # (the app never runs); 2^63 - 1 reaches the app, which answers without reading the body.
    async def app(scope, receive, send):
        if scope["type"] != "http":
            raise RuntimeError("no lifespan")
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"ok"})

    length_bound_is_kept(serve(app), answer=b"ok")


def test_unique_bodies_many_sequential_requests(serve):
    front = serve(echo())
    for i in range(300):
        b = os.urandom(i % 50) + f"#{i}".encode()
        status, _, _, _, body, last, _ = front.request(b"PUT", f"/{i}".encode(), body=b)
        assert (status, body, last) == (200, b, sf.END), i


def test_streaming_response_more_body(serve):
    async def app(scope, receive, send):
        await read_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(5):
            await send({"type": "http.response.body", "body": b"x%d" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    front = serve(app)
    status, flags, _, _, body, last, _ = front.request()
    assert (status, body, last) == (200, b"x0x1x2x3x4", sf.END)
    assert not flags & sf.RESP_CONTENT_LENGTH


@pytest.mark.parametrize("more", [False, True])
def test_bodies_of_any_buffer_are_sent_whole(serve, more):
    """Regression: the body's length was len(body), a memoryview's count of items: one of 4-byte
    items went out cut to a quarter (and its Content-Length said so), a non-contiguous one
    raised. Every bytes-like body now goes as its bytes, as they were at send(). (The bytearray
    changed after its send() below does not reach the case where the send waits for room, where
    the old code sent the app's object: this case passes on it.)"""
    import array
    words = array.array("I", [0x01020304, 0x05060708, 0x090a0b0c])
    strided = memoryview(b"a-b-c-d-")[::2]
    pieces = [memoryview(words), strided, bytearray(b"tail")]
    want = words.tobytes() + b"abcd" + b"tail"

    async def app(scope, receive, send):
        await read_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if more:
            for p in pieces:
                await send({"type": "http.response.body", "body": p, "more_body": True})
                if isinstance(p, bytearray):
                    p[:] = b"XXXX"  # sent already: the change reaches nobody
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.body", "body": memoryview(bytearray(want))})
    front = serve(app)
    status, flags, length, _, body, last, _ = front.request()
    assert (status, body, last) == (200, want, sf.END)
    if not more:
        assert flags & sf.RESP_CONTENT_LENGTH and length == len(want)


@pytest.mark.parametrize("method,status", [(b"HEAD", 200), (b"GET", 204), (b"GET", 304)])
def test_bodyless_responses_send_no_body_frames(serve, method, status):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", b"3")]})
        await send({"type": "http.response.body", "body": b"abc"})
    front = serve(app)
    st, _ = front.open(method, b"/")
    front.send_body(st, None)
    typ, arg, payload = front.read_frame(st)
    assert typ == sf.RESPONSE_HEAD
    assert sf.decode_response(frame(typ, payload, arg))[0] == status
    assert front.read_frame(st)[0] == sf.END  # no BODY frame between
    st.close()


def test_disconnect_on_abort_while_app_waits(serve):
    got = []

    async def app(scope, receive, send):
        await read_body(receive)
        got.append("waiting")
        got.append(await asyncio.wait_for(receive(), 10))
        with pytest.raises(OSError):
            await send({"type": "http.response.start", "status": 200, "headers": []})
        got.append("send raised")
    front = serve(app)
    for _ in range(3):  # and the worker goes on to the next request
        del got[:]
        st, _ = front.open(b"GET", b"/")
        front.send_body(st, None)
        # The ABORT once the app waits (a fixed 0.05 s could send it before the app read its
        # body, which then ended in http.disconnect instead of http.request).
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.005)
        st.write(frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
        st.flush()
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert got == ["waiting", {"type": "http.disconnect"}, "send raised"]
        st.close()


def test_disconnect_on_abort_mid_body(serve):
    got = []

    async def app(scope, receive, send):
        assert scope["type"] == "http"  # no lifespan
        while True:
            m = await receive()
            got.append(m["type"])
            if m["type"] == "http.disconnect":
                return
    front = serve(app)
    st, chunks = front.open(b"POST", b"/", chunks=[])
    front.send_body(st, [b"part"], end=False)
    st.write(frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
    st.flush()
    deadline = time.monotonic() + 10
    while "http.disconnect" not in got and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got == ["http.request", "http.disconnect"]
    st.close()


def test_disconnect_when_the_stream_ends(serve):
    got = []

    async def app(scope, receive, send):
        assert scope["type"] == "http"  # no lifespan
        m = await receive()
        got.append(m["type"])
        got.append((await receive())["type"])
    front = serve(app)
    st, _ = front.open(b"POST", b"/", chunks=[])
    front.send_body(st, [b"x"], end=False)
    deadline = time.monotonic() + 10  # the close once the app has the body's first piece
    while not got and time.monotonic() < deadline:
        time.sleep(0.005)
    st.close()
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got == ["http.request", "http.disconnect"]


def serve_ok(front):
    return front.request(b"POST", b"/ok", body=b"ok")[0] is not None


def test_app_raises_before_start_gives_500_and_logs(serve, caplog):
    async def app(scope, receive, send):
        raise ValueError("boom before start")
    front = serve(app)
    with caplog.at_level(logging.ERROR, logger="shmipc.serve"):
        status, flags, clen, _, body, last, _ = front.request()
    assert (status, body, last) == (500, b"Internal Server Error\n", sf.END)
    assert "boom before start" in caplog.text and "Traceback" in caplog.text


def test_app_raises_after_start_aborts_worker_error(serve):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise ValueError("boom after start")
    front = serve(app)
    st, _ = front.open()
    front.send_body(st, None)
    typ, _, _ = front.read_frame(st)
    assert typ == sf.RESPONSE_HEAD
    assert front.read_frame(st)[:2] == (sf.BODY, 0)
    typ, arg, text = front.read_frame(st)
    assert (typ, arg) == (sf.ABORT, sf.ABORT_WORKER_ERROR) and b"boom after start" in text
    st.close()


@pytest.mark.parametrize("messages,expect", [
    ([{"type": "http.response.body", "body": b"x"}], 500),  # body before start
    ([{"type": "nope"}], 500),
    ([{"status": 200}], 500),  # no type
    ([{"type": "http.response.start"}], 500),  # no status
    ([{"type": "http.response.start", "status": 99}], 500),
    # a 1xx: the protocol carries one only as an interim head before the final one (the
    # worker sent the 1xx head, then END: a bad exchange to the front, 502)
    ([{"type": "http.response.start", "status": 100}], 500),
    ([{"type": "http.response.start", "status": 103},
      {"type": "http.response.body", "body": b"x"}], 500),
    ([{"type": "http.response.start", "status": 200, "headers": [("str", "str")]}], 500),
    ([{"type": "http.response.start", "status": 200}], sf.ABORT),  # returns before the body
    ([{"type": "http.response.start", "status": 200},
      {"type": "http.response.body", "body": "str"}], sf.ABORT),
    ([{"type": "http.response.start", "status": 200},
      {"type": "http.response.start", "status": 200}], sf.ABORT),
    ([{"type": "http.response.start", "status": 200},
      {"type": "http.response.body", "body": b"a"},
      {"type": "http.response.body", "body": b"b"}], 200),  # after complete: raises, logged
    ([{"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]},
      {"type": "http.response.body", "body": b"ab"}], sf.ABORT),  # short of its length
    ([{"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]},
      {"type": "http.response.body", "body": b"ab"}], sf.ABORT),  # over its length
])
def test_wrong_messages_give_500_or_abort(serve, messages, expect):
    async def app(scope, receive, send):
        for m in messages:
            await send(m)
    front = serve(app)
    for _ in range(3):  # the worker goes on, and answers each request the same
        status, _, _, _, body, last, arg = front.request()
        if expect == sf.ABORT:
            assert (last, arg) == (sf.ABORT, sf.ABORT_WORKER_ERROR)
        else:
            assert status == expect and last == sf.END


def test_scope_state_is_a_copy_of_the_lifespan_state(serve):
    seen = []

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                if m["type"] == "lifespan.startup":
                    scope["state"]["db"] = "conn"
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        seen.append(dict(scope["state"]))
        scope["state"]["mine"] = 1
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body"})
    front = serve(app)
    assert front.request()[0] == 200 and front.request()[0] == 200
    assert seen[1] == {"db": "conn"}


# ---- lifespan ----------------------------------------------------------------------------


def lifespan_app(events, fail=None):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                events.append(m["type"])
                if m["type"] == "lifespan.startup":
                    if fail == "startup":
                        await send({"type": "lifespan.startup.failed", "message": "no db"})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif m["type"] == "lifespan.shutdown":
                    if fail == "shutdown":
                        await send({"type": "lifespan.shutdown.failed", "message": "bye"})
                        return
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        events.append("request")
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"ok"})
    return app


def test_lifespan_order_startup_requests_shutdown(serve):
    events = []
    r = Running(lifespan_app(events))
    try:
        assert events == ["lifespan.startup"]
        assert r.front.request()[4] == b"ok"
    finally:
        r.stop()
    assert events == ["lifespan.startup", "request", "lifespan.shutdown"]


def test_lifespan_startup_failed_raises_with_the_message():
    h = ASGIHandler(lifespan_app([], fail="startup"), lifespan_timeout=5)
    with pytest.raises(LifespanFailed, match="no db"):
        h.startup()
    h.shutdown()


def test_lifespan_shutdown_failed_raises():
    h = ASGIHandler(lifespan_app([], fail="shutdown"), lifespan_timeout=5)
    h.startup()
    with pytest.raises(LifespanFailed, match="bye"):
        h.shutdown()


def test_lifespan_unsupported_app_is_accepted(serve):
    front = serve(echo())  # raises on the lifespan scope
    assert front.request(body=b"still")[4] == b"still"


def test_lifespan_startup_that_never_answers_is_bounded():
    async def app(scope, receive, send):
        await asyncio.sleep(3600)
    h = ASGIHandler(app, lifespan_timeout=0.3)
    t = time.monotonic()
    with pytest.raises((TimeoutError, asyncio.TimeoutError)):
        h.startup()
    assert time.monotonic() - t < 10
    h.shutdown()


APP_MODULE = '''
import sys
events = []
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                print("startup", flush=True)
                if "fail" in sys.argv[-1]:
                    await send({"type": "lifespan.startup.failed", "message": "cannot start"})
                    return
                await send({"type": "lifespan.startup.complete"})
            else:
                print("shutdown", flush=True)
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 200})
    await send({"type": "http.response.body", "body": b"from the process"})
'''


def _worker(tmp_path, address):
    (tmp_path / "asgiapp.py").write_text(APP_MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    return subprocess.Popen([sys.executable, "-m", "shmipc.serve.worker", "asgiapp:app",
                             "--asgi", "--address", address], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_worker_process_asgi_startup_ready_serve_sigterm_shutdown(tmp_path):
    address = unique_address("asgiproc")
    p = _worker(tmp_path, address)
    try:
        assert p.stdout.readline().strip() == "startup"  # before "ready on"
        assert "ready on" in p.stdout.readline()
        front = Front(address)
        assert front.request()[4] == b"from the process"
        front.close()
        p.terminate()
        out, err = p.communicate(timeout=20)
        assert p.returncode == 0, err
        assert out.strip() == "shutdown"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_worker_process_startup_failed_exits_3(tmp_path):
    address = unique_address("asgifail")
    assert "fail" in address  # the app module fails its startup on such an address
    p = _worker(tmp_path, address)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 3
    assert "startup" in out and "ready on" not in out
    assert "cannot start" in err


def test_worker_help_mentions_asgi():
    p = subprocess.run([sys.executable, "-m", "shmipc.serve.worker", "--help"],
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 0 and "--asgi" in p.stdout and "ASGI" in p.stdout


def test_send_after_complete_sends_no_abort_after_end(serve, caplog):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"done"})
        await send({"type": "http.response.body", "body": b"late"})
    front = serve(app)
    st, _ = front.open()
    front.send_body(st, None)
    with caplog.at_level(logging.ERROR, logger="shmipc.serve"):
        assert front.read_frame(st)[0] == sf.RESPONSE_HEAD
        assert front.read_frame(st) == (sf.BODY, 0, b"done")
        assert front.read_frame(st)[0] == sf.END
        # Nothing after the END: looked at once the app's late send failed (its log line),
        # not after a fixed 0.3 s, which a loaded machine could end before that send.
        deadline = time.monotonic() + 10
        while "after its response" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            extra = st.readexactly(12, nonblock=True)
        except (shmipc.EndOfStreamError, shmipc.ClosedError):
            extra = None
        assert extra is None, sf.decode_header(extra)
    st.close()
    assert "after its response" in caplog.text


def test_abort_mid_stream_makes_send_raise_and_stops_the_app(serve):
    got = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200})
        try:
            for i in range(100):  # bounded: 100 x 20 ms
                await send({"type": "http.response.body", "body": b"p%d" % i,
                            "more_body": True})
                await asyncio.sleep(0.02)
        except OSError as e:
            got.append(type(e).__name__)
            raise
        await send({"type": "http.response.body", "body": b"end"})
        got.append("never aborted")
    front = serve(app)
    st, _ = front.open()
    front.send_body(st, None)
    assert front.read_frame(st)[0] == sf.RESPONSE_HEAD
    assert front.read_frame(st)[0] == sf.BODY
    st.write(frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
    st.flush()
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got == ["RequestAborted"]
    st.close()
    assert serve_ok_streaming(front)


def serve_ok_streaming(front):
    # the same app on a request the front does not abort: its 100 pieces, then END
    status, _, _, _, body, last, _ = front.request()
    return status == 200 and last == sf.END and body.endswith(b"p99end")


async def trickle_asgi_app(scope, receive, send):
    """Answers without receiving the request's body: /answer 200, /500 raises before its
    head, /abort after it (ABORT WORKER_ERROR); anything else 200 "next"."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/500":
        raise RuntimeError("failing before the head")
    await send({"type": "http.response.start", "status": 200, "headers": []})
    if path == "/abort":
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("failing after the head")
    await send({"type": "http.response.body", "body": b"ok" if path == "/answer" else b"next"})


@pytest.mark.parametrize("target,last", [(b"/answer", sf.END), (b"/500", sf.END),
                                         (b"/abort", sf.ABORT)])
@pytest.mark.parametrize("kind", KINDS)
def test_drain_after_the_answer_ends_though_a_front_trickles(kind, target, last):
    """Regression: after its END (an app that answered without receiving the body, or the 500
    of one that failed before its head) the ASGI worker reads the rest of the request before
    it closes the stream, and did so with no deadline (the one-at-a-time worker after its
    ABORT: 5 s for each read). A front that trickles the body (a BODY frame every 0.3 s, never
    END) held the request's place as long as it liked: with one place (the loop's
    --concurrency 1, or the one-at-a-time worker) the next request waited. The drain now has
    one deadline, 5 s for all of it; then the stream is closed and the next request served."""
    r = Running(trickle_asgi_app, kind, concurrency=1)
    end = None
    try:
        got, end = answer_then_trickle(r.front.session, target)
        assert got[0] == last, got
        status, took = next_answer(r.front.session)
        assert status == 200
        assert took < 12, took
    finally:
        if end is not None:
            end()
        r.stop()


@pytest.mark.parametrize("what", CUT_SHORT)
@pytest.mark.parametrize("kind", KINDS)
def test_first_frame_cut_short_does_not_hold_the_worker(kind, what):
    """Regression: the ASGI worker read a stream's first frame (a REQUEST_HEAD, a HELLO's
    payload) with the stream's read timeout, none in the worker: a front that sent part of it
    (6 bytes of a header, a head short of its length, a HELLO short of its payload) and kept
    the stream open held the request's place as long as it liked: with one place (the loop's
    --concurrency 1, or the one-at-a-time worker) the next request waited. Now the whole first
    frame has one deadline, 5 s from the stream's accept (the loop: from its place); then the
    stream is closed and the next request served. A late ABORT's text is never read."""
    r = Running(trickle_asgi_app, kind, concurrency=1)
    try:
        status, took = cut_short_then_next(r.front.session, what)
        assert status == 200
        assert took < 10, took
    finally:
        r.stop()
