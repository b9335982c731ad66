"""HELLO and TAKEN on the workers' side (docs/serve.md, "HELLO and TAKEN"): every worker kind
(WSGI, ASGI, C, Lua) answers the front's HELLO with the features it grants, and on a request
with TAKEN_WANTED sends TAKEN first, before its application runs."""

import os
import struct
import threading
import time

import pytest

import shmipc

sf = pytest.importorskip("shmipc._serve")
from test_serve_native_worker import WORKER, KINDS, Proc  # noqa: E402
from test_serve_asgi import Running as AsgiRunning  # noqa: E402
from test_serve_worker import Running as WsgiRunning  # noqa: E402
from test_serve_worker import frame  # noqa: E402

HDR = struct.Struct("<HBBII")


def wsgi_echo(environ, start_response):
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return [b"echo:" + body]


async def asgi_echo(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"echo:" + body})


def py_worker(kind, app=None):
    """A Python worker (WSGI or ASGI) on a thread of this process and a front to it: the
    runners of test_serve_worker.py and test_serve_asgi.py."""
    if kind == "wsgi":
        return WsgiRunning(app or wsgi_echo)
    return AsgiRunning(app or asgi_echo)


NATIVE_BUILT = pytest.mark.skipif(not os.path.exists(WORKER), reason="shmipc-serve-worker not built")
ALL = ["wsgi", "asgi"] + [
    pytest.param(*(k.values if hasattr(k, "values") else (k,)),
                 marks=[NATIVE_BUILT, *getattr(k, "marks", ())]) for k in KINDS]


@pytest.fixture(params=ALL)
def any_worker(request):
    kind = request.param
    w = py_worker(kind) if kind in ("wsgi", "asgi") else Proc(kind)
    yield w
    if kind in ("wsgi", "asgi"):
        w.stop()
    else:
        if w.p.poll() is None:
            w.p.terminate()
        w.finish()


def wait_served(worker, n):
    """The worker counts a request once its handle() returned, after the front read the END."""
    deadline = time.monotonic() + 10
    while worker.served < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return worker.served


def hello(offer):
    return frame(sf.HELLO, struct.pack("<II", offer, 0))


def read_frame(st):
    typ, length, arg = sf.decode_header(st.readexactly(12))
    return typ, arg, st.readexactly(length) if length else b""


@pytest.mark.parametrize("offer", [0xFFFFFFFF, sf.FEAT_TAKEN, 0, 0x80000000])
def test_hello_grants_what_the_worker_knows(any_worker, offer):
    front = any_worker.front
    st = front.session.open_stream()
    st.write(hello(offer))
    st.flush()
    typ, arg, payload = read_frame(st)
    assert (typ, arg, len(payload)) == (sf.HELLO, 0, sf.HELLO_SIZE)
    features, concurrency = struct.unpack("<II", payload)
    assert features == offer & sf.FEAT_TAKEN  # only what was offered, only what it knows
    assert concurrency == 1  # every worker here runs one request at a time
    st.close()
    # Not a request: the session serves the next one as before.
    status, _, _, _, _, last, _ = front.request(b"GET", b"/")
    assert (status, last) == (200, sf.END)
    if hasattr(any_worker, "worker"):  # a Python worker: its counts
        assert wait_served(any_worker.worker, 1) == 1
        assert any_worker.worker.counts["hello"] == 1


@pytest.mark.parametrize("bad", [
    HDR.pack(0x5653, 1, sf.HELLO, 7, 0) + b"\0" * 7,   # not 8 bytes
    HDR.pack(0x5653, 1, sf.HELLO, 8, 1) + b"\0" * 8,   # an arg
    HDR.pack(0x5653, 1, sf.TAKEN, 0, 0),               # TAKEN is the worker's to send
])
def test_bad_hello_or_a_taken_from_the_front_is_a_protocol_error(any_worker, bad):
    front = any_worker.front
    st = front.session.open_stream()
    st.write(bad)
    st.flush()
    typ, arg, _ = read_frame(st)
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
    st.close()
    status, _, _, _, _, last, _ = front.request(b"GET", b"/")
    assert (status, last) == (200, sf.END)


def test_taken_comes_first_when_wanted_and_never_otherwise(any_worker):
    front = any_worker.front
    st, chunks = front.open(b"GET", b"/", flags=sf.REQ_TAKEN_WANTED)
    front.send_body(st, chunks)
    typ, arg, payload = read_frame(st)
    assert (typ, arg, payload) == (sf.TAKEN, 0, b"")
    status, _, _, _, _, last, _ = front.response(st)  # asserts RESPONSE_HEAD next
    assert (status, last) == (200, sf.END)
    st.close()
    # Without the flag the first frame is the RESPONSE_HEAD, as before.
    status, _, _, _, _, last, _ = front.request(b"GET", b"/")
    assert (status, last) == (200, sf.END)


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_taken_is_out_before_the_application_runs(kind):
    # The application itself reads the front's side of its own stream: TAKEN must be there
    # already (a worker that sent it after calling the app would leave this read to time out).
    seen = {}
    streams = []
    checked, sent = threading.Event(), threading.Event()

    def check():
        sent.wait(10)  # the test's thread is done writing on the stream
        st = streams[0]
        st.read_timeout = 3
        try:
            seen["first"] = sf.decode_header(st.readexactly(12))[0]
        except shmipc.Error as e:
            seen["first"] = repr(e)
        checked.set()

    def wsgi_app(environ, start_response):
        check()
        start_response("200 OK", [])
        return [b"ok"]

    async def asgi_app(scope, receive, send):
        if scope["type"] != "http":
            return
        check()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    w = py_worker(kind, wsgi_app if kind == "wsgi" else asgi_app)
    try:
        st, chunks = w.front.open(b"GET", b"/", flags=sf.REQ_TAKEN_WANTED)
        streams.append(st)
        w.front.send_body(st, chunks)
        sent.set()
        assert checked.wait(10)  # the stream is the app's until then
        assert seen["first"] == sf.TAKEN
        st.read_timeout = 10
        status, _, _, _, body, last, _ = w.front.response(st)
        assert (status, body, last) == (200, b"ok", sf.END)
    finally:
        w.stop()


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_four_flagged_requests_in_flight_on_one_session(kind):
    # What the front does when it pipelines: four requests sent before any answer; the worker
    # takes them in turn, each TAKEN then its own answer.
    w = py_worker(kind)
    try:
        opened = []
        for i in range(4):
            body = f"unique-{kind}-{i}-{os.getpid()}".encode()
            st, chunks = w.front.open(b"POST", b"/", body=body, flags=sf.REQ_TAKEN_WANTED)
            w.front.send_body(st, chunks)
            opened.append((st, body))
        for st, body in opened:
            typ, _, _ = read_frame(st)
            assert typ == sf.TAKEN
            status, _, _, _, got, last, _ = w.front.response(st)
            assert (status, got, last) == (200, b"echo:" + body, sf.END)
            st.close()
        assert wait_served(w.worker, 4) == 4
    finally:
        w.stop()


def test_a_stopping_worker_refuses_flagged_requests_without_taken():
    entered, release = threading.Event(), threading.Event()

    def app(environ, start_response):
        entered.set()
        release.wait(10)
        start_response("200 OK", [])
        return [b"done"]

    w = py_worker("wsgi", app)
    try:
        st1, c1 = w.front.open(b"GET", b"/", flags=sf.REQ_TAKEN_WANTED)
        w.front.send_body(st1, c1)
        assert entered.wait(10)
        st2, c2 = w.front.open(b"GET", b"/second", flags=sf.REQ_TAKEN_WANTED)
        w.front.send_body(st2, c2)
        w.worker.stop()
        release.set()
        assert read_frame(st1)[0] == sf.TAKEN
        status, _, _, _, body, last, _ = w.front.response(st1)
        assert (status, body, last) == (200, b"done", sf.END)
        # Refused, never taken: the front may give it to another worker.
        typ, arg, _ = read_frame(st2)
        assert (typ, arg) == (sf.ABORT, sf.ABORT_SHUTDOWN)
    finally:
        release.set()
        w.stop()
