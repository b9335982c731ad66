"""The shmipc-serve WSGI/ASGI adapters on the in-process shmipc.Server (shmipc.serve.inprocess,
docs/serve.md "One process"): wsgiref.validate passes, the same app sees the same environ and
scope keys as behind the shmipc-serve front, failures are 500s with the traceback logged,
streaming iterables, write(), exc_info and close(); ASGI lifespan and http.disconnect; many
concurrent clients with unique bodies on both backends; misuse."""
import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from wsgiref.validate import validator

import pytest

from conftest import BUILD, kill_tree, python_env, unique_address
from test_server import BACKENDS

import shmipc
from shmipc.serve import ASGIRoute, WSGIRoute, asgi_handler, wsgi_handler
from shmipc.serve.asgi import LifespanFailed

FRONT = os.path.join(BUILD, "tests", "c", "front_run")


def serve(route, backend=None, workers=1, path="/*"):
    kw = {"port": 0, "workers": workers}
    if backend:
        kw["backend"] = backend
    s = shmipc.Server(**kw)
    s.route(None, path, route)
    try:
        s.start()
    except shmipc.Error as e:
        s.close()
        if backend == "io_uring" and e.name in ("SHMIPC_ENOTSUP", "SHMIPC_EACCES"):
            pytest.skip(f"io_uring refused here: {e}")
        raise
    return s


def request(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


# ---- WSGI -----------------------------------------------------------------------------------


def echo_app(environ, start_response):
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("X-Path", environ["PATH_INFO"]),
                              ("X-Query", environ["QUERY_STRING"])])
    return [b"echo:" + body]


def streaming_app(environ, start_response):
    write = start_response("200 OK", [("Content-Type", "text/plain")])
    write(b"w1,")

    def gen():
        for i in range(5):
            yield b"chunk%d," % i
        yield b""
    return gen()


def test_wsgiref_validate_passes(caplog):
    caplog.set_level(logging.ERROR, logger="shmipc.serve")

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/stream":
            return streaming_app(environ, start_response)
        if environ["PATH_INFO"] == "/lines":
            lines = environ["wsgi.input"].readlines()
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"%d" % len(lines)]
        return echo_app(environ, start_response)

    s = serve(WSGIRoute(validator(app)))
    with s:
        st, h, b = request(s.port, "GET", "/a%20b?x=1&y=%41")
        assert (st, b, h["x-path"], h["x-query"]) == (200, b"echo:", "/a b", "x=1&y=%41")
        st, h, b = request(s.port, "POST", "/p", body=b"payload" * 1000)
        assert (st, b) == (200, b"echo:" + b"payload" * 1000)
        st, h, b = request(s.port, "GET", "/stream")
        assert (st, b) == (200, b"w1,chunk0,chunk1,chunk2,chunk3,chunk4,")
        st, h, b = request(s.port, "POST", "/lines", body=b"a\nb\nc")
        assert (st, b) == (200, b"3")
        st, h, b = request(s.port, "HEAD", "/x")
        assert (st, b) == (200, b"")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_app_error_is_500_with_traceback_logged_and_serving_goes_on(caplog):
    caplog.set_level(logging.ERROR, logger="shmipc.serve")
    closed = []

    class Body:
        def __iter__(self):
            yield b"first"
            raise RuntimeError("failed while streaming")

        def close(self):
            closed.append("stream")

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/raise":
            raise ValueError("the app failed")
        if environ["PATH_INFO"] == "/stream":
            start_response("200 OK", [])
            return Body()
        if environ["PATH_INFO"] == "/short":
            start_response("200 OK", [("Content-Length", "10")])
            return [b"abc"]
        if environ["PATH_INFO"] == "/badstatus":
            start_response("OK", [])
            return [b""]
        if environ["PATH_INFO"] == "/badheader":
            start_response("200 OK", [("X-Bad", "a\nb")])
            return [b""]
        return echo_app(environ, start_response)

    s = serve(wsgi_handler(app))
    with s:
        for path in ("/raise", "/stream", "/short", "/badstatus"):
            st, h, b = request(s.port, "GET", path)
            assert (st, b) == (500, b"Internal Server Error\n"), path
        st, h, b = request(s.port, "GET", "/badheader")
        assert st == 500  # the C server refuses the value: its own 500
        st, h, b = request(s.port, "POST", "/ok", body=b"still")
        assert (st, b) == (200, b"echo:still")
    assert closed == ["stream"]
    failed = [r for r in caplog.records if "the app failed on GET /raise" in r.getMessage()]
    assert failed and failed[0].exc_info is not None
    assert "ValueError: the app failed" in caplog.text
    assert "failed while streaming" in caplog.text


def test_exc_info_and_close():
    closed = []

    class Result(list):
        def close(self):
            closed.append(self[0])

    def app(environ, start_response):
        write = start_response("200 OK", [("X-First", "1")])
        try:
            raise KeyError("boom")
        except KeyError:
            if environ["PATH_INFO"] == "/replace":
                # Before any body bytes: the new head replaces the first (PEP 3333).
                start_response("503 Busy", [("X-Second", "2")], sys.exc_info())
                return Result([b"replaced"])
        write(b"body")
        try:
            raise KeyError("again")
        except KeyError:
            # After body bytes the head counts as sent: exc_info re-raises, so a 500.
            start_response("500 Oops", [], sys.exc_info())
        return Result([b"never"])

    s = serve(WSGIRoute(app))
    with s:
        st, h, b = request(s.port, "GET", "/replace")
        assert (st, b, h.get("x-second"), h.get("x-first")) == (503, b"replaced", "2", None)
        st, h, b = request(s.port, "GET", "/after")
        assert st == 500
    assert closed == [b"replaced"]


def test_response_fields_the_server_owns():
    def app(environ, start_response):
        start_response("200 OK", [("Server", "app"), ("Date", "x"), ("Connection", "close"),
                                  ("Content-Type", "a/b"), ("content-type", "c/d"),
                                  ("Transfer-Encoding", "chunked"), ("X-Ok", "1")])
        return [b"x", b"y"]

    s = serve(WSGIRoute(app))
    with s:
        st, h, b = request(s.port, "GET", "/")
        assert (st, b, h["x-ok"], h["content-type"], h["server"]) == (200, b"xy", "1", "a/b",
                                                                          "shmipc")
        assert h["connection"] == "close" and h["content-length"] == "2"


def test_large_bodies_both_ways():
    big = bytes(range(256)) * 4096  # 1 MiB: lent to the C server, not copied
    s = serve(WSGIRoute(echo_app))
    with s:
        st, h, b = request(s.port, "POST", "/big", body=big)
        assert st == 200 and b == b"echo:" + big


def test_misuse():
    with pytest.raises(TypeError):
        WSGIRoute(42)
    with pytest.raises(TypeError):
        ASGIRoute("not an app", lifespan=False)

    def not_a_tuple(frame, body):
        return b"x"
    not_a_tuple._shmipc_frame_route = True
    s = serve(not_a_tuple)
    with s:
        st, h, b = request(s.port, "GET", "/")
        assert st == 500


# ---- ASGI -----------------------------------------------------------------------------------


class LifespanApp:
    def __init__(self, fail=False):
        self.events = []
        self.fail = fail

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                self.events.append(msg["type"])
                if msg["type"] == "lifespan.startup":
                    if self.fail:
                        await send({"type": "lifespan.startup.failed", "message": "no db"})
                        return
                    scope["state"]["db"] = "connected"
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert scope["type"] == "http"
        msg = await receive()
        assert msg["type"] == "http.request" and msg["more_body"] is False
        path = scope["path"]
        if path == "/raise":
            raise RuntimeError("the asgi app failed")
        if path == "/disconnect":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"done"})
            self.events.append((await receive())["type"])
            return
        headers = [(b"content-type", b"text/plain"), (b"x-state", scope["state"]["db"].encode())]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        for piece in (b"echo:", msg["body"]):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def test_asgi_lifespan_http_and_disconnect(caplog):
    caplog.set_level(logging.ERROR, logger="shmipc.serve")
    app = LifespanApp()
    with asgi_handler(app) as route:
        assert app.events == ["lifespan.startup"]
        s = serve(route)
        with s:
            st, h, b = request(s.port, "POST", "/e", body=b"hello")
            assert (st, b, h["x-state"]) == (201, b"echo:hello", "connected")
            st, h, b = request(s.port, "GET", "/disconnect")
            assert (st, b) == (200, b"done")
            st, h, b = request(s.port, "GET", "/raise")
            assert (st, b) == (500, b"Internal Server Error\n")
    assert app.events == ["lifespan.startup", "http.disconnect", "lifespan.shutdown"]
    failed = [r for r in caplog.records if r.getMessage() == "shmipc-serve: the app failed on GET /raise"]
    assert failed and failed[0].exc_info is not None
    route.close()  # twice is fine


def test_asgi_lifespan_failed_and_unsupported():
    with pytest.raises(LifespanFailed, match="no db"):
        ASGIRoute(LifespanApp(fail=True))

    async def no_lifespan(scope, receive, send):
        if scope["type"] != "http":
            raise ValueError("only http")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    route = ASGIRoute(no_lifespan)
    try:
        s = serve(route)
        with s:
            assert request(s.port, "GET", "/")[::2] == (200, b"ok")
    finally:
        route.close()
    # After close(): a 500, not a hang.
    s = serve(route)
    with s:
        assert request(s.port, "GET", "/")[0] == 500


def test_asgi_close_while_a_request_waits_in_the_app_is_500_not_a_hang():
    entered = threading.Event()

    async def app(scope, receive, send):
        if scope["path"] == "/hang":
            entered.set()
            await asyncio.Event().wait()  # never set: only a cancel ends it
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    route = ASGIRoute(app, lifespan=False)
    s = serve(route, workers=2)
    with s:
        got = []
        t = threading.Thread(target=lambda: got.append(request(s.port, "GET", "/hang")))
        t.start()
        assert entered.wait(10)
        route.close()
        t.join(10)
        assert not t.is_alive() and got[0][0] == 500
        assert request(s.port, "GET", "/")[0] == 500  # after close(): a 500, not a hang


def test_asgi_requests_run_at_once_beyond_the_servers_workers(backend):
    # Each request is deferred and runs as a task of the loop: one server worker holds none
    # of them. Before, a request held its worker thread until the app answered, and 20
    # requests that wait for each other on one worker could never all arrive.
    n = 20
    arrived = []
    all_here = None

    async def app(scope, receive, send):
        nonlocal all_here
        if all_here is None:
            all_here = asyncio.Event()
        arrived.append(scope["path"])
        if len(arrived) == n:
            all_here.set()
        await asyncio.wait_for(all_here.wait(), 10)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode()})

    with ASGIRoute(app, lifespan=False) as route:
        s = serve(route, backend=backend, workers=1)
        with s:
            with concurrent.futures.ThreadPoolExecutor(n) as pool:
                got = list(pool.map(lambda i: request(s.port, "GET", f"/r{i}")[::2], range(n)))
    assert got == [(200, f"/r{i}".encode()) for i in range(n)]


def test_asgi_client_that_leaves_is_an_http_disconnect_while_the_app_runs():
    seen = []
    waiting = threading.Event()

    async def app(scope, receive, send):
        assert (await receive())["type"] == "http.request"
        waiting.set()
        seen.append((await asyncio.wait_for(receive(), 10))["type"])
        seen.append("after")

    with ASGIRoute(app, lifespan=False) as route:
        s = serve(route)
        with s:
            c = socket.create_connection(("127.0.0.1", s.port))
            c.sendall(b"GET /poll HTTP/1.1\r\nHost: x\r\n\r\n")
            assert waiting.wait(10)
            c.close()
            deadline = time.monotonic() + 10
            while len(seen) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
    assert seen == ["http.disconnect", "after"]


def test_asgi_max_concurrency_answers_503_beyond_it():
    release = threading.Event()
    entered = []

    async def app(scope, receive, send):
        entered.append(scope["path"])
        while not release.is_set():
            await asyncio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(ValueError):
            ASGIRoute(app, lifespan=False, max_concurrency=bad)
    with ASGIRoute(app, lifespan=False, max_concurrency=2) as route:
        s = serve(route, workers=2)
        with s:
            held = [threading.Thread(target=request, args=(s.port, "GET", f"/h{i}"))
                    for i in range(2)]
            for t in held:
                t.start()
            deadline = time.monotonic() + 10
            while len(entered) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            st, h, b = request(s.port, "GET", "/third")
            assert (st, h["retry-after"]) == (503, "1")
            release.set()
            for t in held:
                t.join(10)
            assert request(s.port, "GET", "/after")[::2] == (200, b"ok")
    assert "/third" not in entered


def test_asgi_protocol_errors_are_500():
    async def app(scope, receive, send):
        p = scope["path"]
        if p == "/nostart":
            return
        if p == "/bodyfirst":
            await send({"type": "http.response.body", "body": b"x"})
        if p == "/badstatus":
            await send({"type": "http.response.start", "status": 99, "headers": []})
        if p == "/twice":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.start", "status": 200, "headers": []})
        if p == "/short":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"9")]})
            await send({"type": "http.response.body", "body": b"abc"})

    with ASGIRoute(app, lifespan=False) as route:
        s = serve(route)
        with s:
            for p in ("/nostart", "/bodyfirst", "/badstatus", "/twice", "/short"):
                assert request(s.port, "GET", p)[0] == 500, p


# ---- both modes -----------------------------------------------------------------------------

KEYS_APP = '''
import json

def app(environ, start_response):
    environ["wsgi.input"].read()
    keys = sorted(k for k in environ)
    vals = {k: environ[k] for k in keys if k.startswith("HTTP_") or k in
            ("PATH_INFO", "QUERY_STRING", "SCRIPT_NAME", "REQUEST_METHOD", "SERVER_PROTOCOL",
             "CONTENT_TYPE", "CONTENT_LENGTH", "RAW_URI", "wsgi.url_scheme")}
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps({"keys": keys, "vals": vals}).encode()]

async def asgi(scope, receive, send):
    await receive()
    out = {"keys": sorted(scope), "vals": {k: scope[k] for k in
           ("type", "http_version", "method", "scheme", "path", "query_string", "root_path")
           if k in scope}}
    out["vals"]["query_string"] = out["vals"]["query_string"].decode()
    out["headers"] = [[n.decode(), v.decode()] for n, v in scope["headers"]]
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": json.dumps(out).encode()})
'''

def ask(port, what):
    hdrs = {"X-Custom": "v", "Cookie": "a=1", "Content-Type": "text/x"}
    st, h, b = request(port, "POST", "/k%41/x?q=1&r=%20", body=b"0123456789", headers=hdrs)
    assert st == 200, (what, b)
    return json.loads(b)


@pytest.mark.skipif(not os.path.exists(FRONT), reason="front_run is not built")
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_same_app_same_environ_keys_in_both_modes(tmp_path, kind):
    (tmp_path / "keysapp.py").write_text(KEYS_APP)
    sys.path.insert(0, str(tmp_path))
    try:
        import keysapp
    finally:
        sys.path.remove(str(tmp_path))
    address = unique_address("inproc")
    worker = subprocess.Popen(
        [sys.executable, "-m", "shmipc.serve.worker",
         "keysapp:app" if kind == "wsgi" else "keysapp:asgi", "--address", address]
        + (["--asgi"] if kind == "asgi" else []),
        cwd=tmp_path, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    front = None
    try:
        line = worker.stdout.readline()
        while "does not support lifespan" in line:  # keysapp.asgi has no lifespan
            line = worker.stdout.readline()
        assert "ready on" in line, line
        front = subprocess.Popen([FRONT, address], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        line = front.stdout.readline()
        assert line.startswith("port "), line
        via_front = ask(int(line.split()[1]), "front")
    finally:
        if front is not None:
            front.stdin.close()
            front.wait(timeout=20)
        worker.terminate()
        worker.wait(timeout=10)
    route = WSGIRoute(keysapp.app) if kind == "wsgi" else ASGIRoute(keysapp.asgi)
    try:
        s = serve(route)
        with s:
            in_process = ask(s.port, "in-process")
    finally:
        if kind == "asgi":
            route.close()
    if kind == "wsgi":
        # REMOTE_ADDR and REMOTE_PORT too (regression: in-process, the server's request API
        # had no peer address, and an app logging its clients saw none).
        assert set(via_front["keys"]) == set(in_process["keys"])
        # Host carries the port, which differs; the rest is the same request.
        for d in (via_front, in_process):
            d["vals"].pop("HTTP_HOST")
    else:
        assert via_front["keys"] == in_process["keys"]
        for d in (via_front, in_process):
            d["headers"] = [h for h in d["headers"] if h[0] != "host"]
        assert via_front["headers"] == in_process["headers"]
    assert via_front["vals"] == in_process["vals"]
    assert in_process["vals"]["PATH_INFO" if kind == "wsgi" else "path"] == "/kA/x"


def many_clients(port, n_threads=8, per_thread=40):
    mismatches, errors = [], []

    def client(t):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            for i in range(per_thread):
                body = f"client {t} request {i} {os.urandom(8).hex()}".encode() * (1 + i % 3)
                c.request("POST", f"/u/{t}/{i}", body=body)
                r = c.getresponse()
                got = r.read()
                if r.status != 200 or got != b"echo:" + body or \
                        r.getheader("X-Path") != f"/u/{t}/{i}":
                    mismatches.append((t, i, r.status, got[:60]))
                if i % 10 == 9:  # short connections too
                    c.close()
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return mismatches, errors


async def asgi_echo(scope, receive, send):
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    await asyncio.sleep(0)  # let other requests interleave on the loop
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"x-path", scope["path"].encode())]})
    await send({"type": "http.response.body", "body": b"echo:" + body})


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_many_concurrent_clients_unique_bodies(backend, kind):
    route = WSGIRoute(echo_app) if kind == "wsgi" else ASGIRoute(asgi_echo, lifespan=False)
    try:
        s = serve(route, backend=backend, workers=2)
        with s:
            mismatches, errors = many_clients(s.port)
    finally:
        if kind == "asgi":
            route.close()
    assert errors == []
    assert mismatches == []


def test_imports_and_serves_under_each_interpreter():
    from test_import import interpreters

    code = ("import shmipc, shmipc.serve, http.client\n"
            "def app(e, sr):\n"
            "    sr('200 OK', [])\n"
            "    return [e['PATH_INFO'].encode()]\n"
            "with shmipc.Server(port=0, workers=1) as s:\n"
            "    s.route(None, '/*', shmipc.serve.wsgi_handler(app))\n"
            "    s.start()\n"
            "    c = http.client.HTTPConnection('127.0.0.1', s.port, timeout=10)\n"
            "    c.request('GET', '/hi')\n"
            "    print(c.getresponse().read().decode())\n")
    pkg_parent = os.path.dirname(os.path.dirname(shmipc.__file__))
    for exe in interpreters():
        out = subprocess.run([exe, "-c", code], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, PYTHONPATH=pkg_parent))
        assert out.returncode == 0, (exe, out.stderr)
        assert out.stdout.strip() == "/hi", exe


def test_heads_over_the_protocols_limits_get_the_fronts_answers():
    # The C server may allow more than a REQUEST_HEAD carries: the frame route answers as the
    # front does, 431 for too many fields, 414 for a target over 16 KiB; nothing reaches the app.
    calls = []

    def app(environ, start_response):
        calls.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b"ok"]

    s = shmipc.Server(port=0, workers=1, max_headers=200, max_request_line=32 << 10,
                      max_head_bytes=64 << 10)
    s.route(None, "/*", WSGIRoute(app))
    s.start()
    with s:
        many = {f"X-H{i}": "v" for i in range(140)}
        assert request(s.port, "GET", "/many", headers=many)[0] == 431
        assert request(s.port, "GET", "/" + "a" * (17 << 10))[0] == 414
        assert request(s.port, "GET", "/fine", headers={"X-H": "v" * 3000})[::2] == (200, b"ok")
        big = {f"X-H{i}": "v" * 600 for i in range(100)}  # 60 KB of fields: the larger buffer
        assert request(s.port, "GET", "/big", headers=big)[::2] == (200, b"ok")
    assert calls == ["/fine", "/big"]


class InProcess:
    """`python -m shmipc.serve --in-process --listen 127.0.0.1:0 ARGS...` run from `cwd`, as
    Serve (test_serve_cli.py) runs shmipc-serve: started here, its port read from the
    "listening on" line of its stdout (a failed start fails the test with what it read). Its
    stderr goes to its stdout unless `stderr` says otherwise; a file descriptor given there
    (a pipe's end) is the process's then, and closed here. As a context manager it kills what
    the test left running, the app's children too (kill_tree)."""

    def __init__(self, *args, cwd=None, env=None, stderr=subprocess.STDOUT, preexec_fn=None):
        try:
            self.p = subprocess.Popen(
                [sys.executable, "-m", "shmipc.serve", "--in-process", "--listen", "127.0.0.1:0",
                 *args], cwd=cwd, env=env or python_env(), stdout=subprocess.PIPE,
                stderr=stderr, text=True, preexec_fn=preexec_fn)
        finally:
            if isinstance(stderr, int) and stderr >= 0:
                os.close(stderr)
        line = self.p.stdout.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if not m:
            self.close()
            pytest.fail(f"python -m shmipc.serve did not listen (exit {self.p.returncode}): "
                        f"{line!r}")
        self.port = int(m.group(1))

    def stop(self, timeout=20, sig=signal.SIGTERM):
        """`sig` (SIGTERM), then its exit status (waiting up to `timeout` s)."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
        return self.p.wait(timeout=timeout)

    def close(self):
        kill_tree(self.p)
        self.p.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


CLI_APP = '''
import os

def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"wsgi " + environ["PATH_INFO"].encode()]

async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            with open(os.environ["LIFESPAN_LOG"], "a") as f:
                f.write(msg["type"] + "\\n")
            await send({"type": msg["type"] + ".complete"})
            if msg["type"] == "lifespan.shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"asgi " + scope["path"].encode()})
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT])
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_cli_in_process(tmp_path, kind, sig):
    # SIGQUIT (Ctrl-\\) stops it as SIGTERM does, as it stops shmipc-serve (nginx's graceful
    # stop); unhandled, it dumped core and skipped the ASGI lifespan shutdown.
    (tmp_path / "cliapp2.py").write_text(CLI_APP)
    log = tmp_path / "lifespan.log"
    args = ["--asgi", "--concurrency", "64"] if kind == "asgi" else []
    with InProcess(*args, "--workers", "2", "cliapp2:" + ("app" if kind == "wsgi" else "asgi"),
                   cwd=tmp_path, env=dict(python_env(), LIFESPAN_LOG=str(log))) as s:
        assert request(s.port, "GET", "/x")[::2] == (200, f"{kind} /x".encode())
        assert s.stop(sig=sig) == 0
    if kind == "asgi":
        assert log.read_text() == "lifespan.startup\nlifespan.shutdown\n"


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_cli_in_process_tiny_graceful_timeout_stops_clean_when_idle(tmp_path, kind):
    """Regression: `--graceful-timeout 1e-9` (valid: > 0) with no request in flight exited 4
    ("requests still in the WSGI app"): the stop itself takes longer than 1 ns, and any stop
    not done at the timeout counted as one with requests left. With none in the app the stop
    is clean whatever the timeout (exit 0), an idle keep-alive connection included."""
    (tmp_path / "cliapp3.py").write_text(CLI_APP)
    log = tmp_path / "lifespan.log"
    args = ["--asgi"] if kind == "asgi" else []
    with InProcess(*args, "--workers", "2", "--graceful-timeout", "1e-9",
                   "cliapp3:" + ("app" if kind == "wsgi" else "asgi"), cwd=tmp_path,
                   env=dict(python_env(), LIFESPAN_LOG=str(log))) as s:
        assert request(s.port, "GET", "/x")[::2] == (200, f"{kind} /x".encode())
        idle = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        try:
            idle.request("GET", "/y")
            assert idle.getresponse().read() == f"{kind} /y".encode()  # left open, idle
            rc = s.stop()
            out = s.p.stdout.read()
            assert rc == 0, out
            assert "still in the" not in out
        finally:
            idle.close()
    if kind == "asgi":
        assert log.read_text() == "lifespan.startup\nlifespan.shutdown\n"


def test_cli_in_process_refusals(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "shmipc.serve", *args], cwd=tmp_path,
                              env=python_env(), capture_output=True, text=True, timeout=60)
    r = run("mod:app")
    assert r.returncode == 2 and "--in-process" in r.stderr
    r = run("--in-process", "nosuchmodule:app")
    assert r.returncode == 2 and "cannot load" in r.stderr
    r = run("--in-process", "--listen", "nowhere", "os:getcwd")
    assert r.returncode == 2 and "HOST:PORT" in r.stderr
    r = run("--in-process", "--workers", "0", "os:getcwd")
    assert r.returncode == 2
    r = run("--in-process", "--concurrency", "4", "os:getcwd")
    assert r.returncode == 2 and "--concurrency is for --asgi" in r.stderr
    r = run("--in-process", "--asgi", "--concurrency", "0", "os:getcwd")
    assert r.returncode == 2 and "--concurrency must be >= 1" in r.stderr


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_cli_in_process_server_refusals_are_one_line(tmp_path, kind):
    # What shmipc.Server() itself refuses (a host that is no address, more worker threads than
    # it takes) was a traceback and exit 1; now one line, as for a port that cannot be bound:
    # exit 1 for the address (an ASGI app's lifespan still shut down), and 2 (usage) for
    # --workers, which argparse checks whole.
    (tmp_path / "cliapp3.py").write_text(CLI_APP)
    log = tmp_path / "lifespan.log"
    asgi = ["--asgi"] if kind == "asgi" else []
    app = "cliapp3:asgi" if kind == "asgi" else "cliapp3:app"

    def run(*args):
        return subprocess.run([sys.executable, "-m", "shmipc.serve", "--in-process", *asgi, *args,
                               app], cwd=tmp_path, env=dict(python_env(), LIFESPAN_LOG=str(log)),
                              capture_output=True, text=True, timeout=60)
    r = run("--listen", "999.1.1.1:0")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "cannot listen on 999.1.1.1:0" in r.stderr, r.stderr
    if kind == "asgi":
        assert log.read_text() == "lifespan.startup\nlifespan.shutdown\n"
    r = run("--listen", "127.0.0.1:0", "--workers", "1025")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "--workers must be 1 .. 1024" in r.stderr, r.stderr


def test_cli_sigterm_right_after_listening_stops_it():
    # A SIGTERM between start() and run() once stopped the server and run() started it again:
    # the process never ended. Sent here as soon as the "listening" line is read.
    for _ in range(5):
        with InProcess("--workers", "1", "os:getcwd") as s:
            assert s.stop() == 0


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_cli_in_process_ends_on_a_sigterm_at_any_instant(tmp_path, kind):
    # Its SIGTERM handler set a threading.Event that the main thread waited on: a SIGTERM handled
    # while that thread held the Event's lock, inside its wait() or inside the set() of the
    # handler of a SIGTERM before, waited for that lock forever. Here, once it has our SIGTERM,
    # it gets another at each point its main thread passes (sigterm_everywhere.py).
    from sigterm_everywhere import run_and_stop

    (tmp_path / "cliapp2.py").write_text(CLI_APP)
    env = dict(python_env(), LIFESPAN_LOG=str(tmp_path / "lifespan.log"))
    run_and_stop(["shmipc.serve", "--in-process", "--listen", "127.0.0.1:0", "--workers", "1",
                  *(("--asgi", "cliapp2:asgi") if kind == "asgi" else ("cliapp2:app",))],
                 "listening on", "python -m shmipc.serve", 3, 2, cwd=tmp_path, env=env)


# ---- regressions (review of 400801d) --------------------------------------------------------

def _run_child(code, timeout=60):
    """Runs `code` in a child Python: a hang there is a failed test, not a wedged pytest."""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=timeout, env=python_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child hung: {e.stdout!r} {e.stderr!r}")
    assert out.returncode == 0, out.stderr
    return out.stdout


_CHILD_HEAD = """
import asyncio, http.client, threading, time, shmipc
from shmipc.serve import ASGIRoute

def get(port, path, out):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=8)
    try:
        c.request("GET", path)
        r = c.getresponse()
        out.append((r.status, r.read()))
    except Exception as e:
        out.append(repr(e))
    finally:
        c.close()

def get_each(port, paths, out):
    # One after the other, each on a thread of its own: a request that hangs fails the child.
    for p in paths:
        t = threading.Thread(target=get, args=(port, p, out), daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), f"{p}: no answer"

def served(route):
    # A started one-worker server on a free port with `route` on every path.
    s = shmipc.Server(port=0, workers=1)
    s.route(None, "/*", route)
    s.start()
    return s
"""


def test_asgi_close_with_a_request_in_flight_does_not_hang_the_worker():
    # close() stopped the loop under a running request: its worker thread waited on the
    # future forever, so the client never got an answer and server.close() never returned.
    out = _run_child(_CHILD_HEAD + """
started = threading.Event()
async def app(scope, receive, send):
    if scope["type"] != "http":
        raise ValueError("no lifespan")
    started.set()
    await asyncio.sleep(30)

route = ASGIRoute(app, lifespan=False)
s = served(route)
res = []
t = threading.Thread(target=get, args=(s.port, "/slow", res))
t.start()
assert started.wait(5)
route.close()
t.join(10)
assert not t.is_alive(), "the client got no answer"
closer = threading.Thread(target=s.close, daemon=True)
closer.start()
closer.join(10)
assert not closer.is_alive(), "server.close() hung"
print(res)
""")
    assert "(500, b'Internal Server Error\\n')" in out


def test_asgi_app_raising_systemexit_does_not_kill_the_loop():
    # A SystemExit (or KeyboardInterrupt) from the app left asyncio's run_forever(): the loop
    # thread died and every later request waited forever on a loop that no longer ran.
    out = _run_child(_CHILD_HEAD + """
import sys
async def app(scope, receive, send):
    if scope["type"] != "http":
        raise ValueError("no lifespan")
    if scope["path"] == "/exit":
        sys.exit(3)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})

route = ASGIRoute(app, lifespan=False)
s = served(route)
res = []
get_each(s.port, ("/exit", "/after"), res)
print(res)
s.close()
route.close()
""")
    assert "[(500, b'Internal Server Error\\n'), (200, b'ok')]" in out


def _raw_get(port):
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            d = c.recv(65536)
            if not d:
                return data
            data += d
    finally:
        c.close()


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_non_ascii_header_bytes_go_out_as_latin1_not_utf8(kind):
    # The fields went to the C server as str, which sends UTF-8: WSGI's latin-1 "caf\xe9"
    # (and ASGI's raw bytes b"caf\xe9") left as b"caf\xc3\xa9", where a front sends b"\xe9".
    def wapp(environ, start_response):
        start_response("200 OK", [("X-V", "caf\xe9")])
        return [b"ok"]

    async def aapp(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"x-v", b"caf\xe9")]})
        await send({"type": "http.response.body", "body": b"ok"})

    route = wsgi_handler(wapp) if kind == "wsgi" else asgi_handler(aapp, lifespan=False)
    try:
        s = serve(route)
        with s:
            head = _raw_get(s.port).split(b"\r\n\r\n")[0].split(b"\r\n")
        assert [h for h in head if h.lower().startswith(b"x-v:")] in (
            [b"x-v: caf\xe9"], [b"X-V: caf\xe9"])
    finally:
        if kind == "asgi":
            route.close()


def test_a_handler_answering_every_attribute_is_not_a_frame_route():
    # server.c asked hasattr(handler, "_shmipc_frame_route"): a Mock or a proxy with
    # __getattr__ says yes, was called with (frame, body), and every request was a 500.
    from unittest import mock

    class Proxy:
        def __getattr__(self, name):
            return True

        def __call__(self, req):
            return b"proxied"

    for handler, want in ((mock.Mock(return_value=b"mocked"), b"mocked"), (Proxy(), b"proxied")):
        s = serve(handler)
        with s:
            assert request(s.port, "GET", "/")[::2] == (200, want)


def test_content_length_zero_is_in_the_environ_as_behind_a_front():
    # A front sends "Content-Length: 0" on (CONTENT_LENGTH "0", serve_frame.c); the in-process
    # frame left it out, so environ["CONTENT_LENGTH"] was a KeyError in one mode only.
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [repr(environ.get("CONTENT_LENGTH")).encode()]

    s = serve(wsgi_handler(app))
    with s:
        assert request(s.port, "POST", "/", body=b"")[::2] == (200, b"'0'")
        assert request(s.port, "GET", "/")[::2] == (200, b"None")
        assert request(s.port, "POST", "/", body=b"abc")[::2] == (200, b"'3'")


def test_asgi_disconnect_waited_for_before_the_response_ends():
    # A task of the app waits on receive() after the body while the response is still being
    # sent (the route's waiting event is made by that receive(), not per request): it gets
    # http.disconnect once the response is complete, and every request gets its own answer.
    seen = []

    async def app(scope, receive, send):
        await receive()

        async def watch():
            seen.append((scope["path"], (await receive())["type"]))

        w = asyncio.get_running_loop().create_task(watch())
        await asyncio.sleep(0)  # the watcher is waiting now
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode()})
        await w

    with ASGIRoute(app, lifespan=False) as route:
        s = serve(route, workers=2)
        with s:
            for i in range(20):
                assert request(s.port, "GET", f"/d{i}")[::2] == (200, f"/d{i}".encode())
    assert seen == [(f"/d{i}", "http.disconnect") for i in range(20)]


def test_asgi_loop_stopped_under_a_request_is_500_not_a_hang():
    # The loop's thread ends without close() (an app stopped the loop): the waiting worker
    # sees it and answers 500; close() afterwards still returns.
    out = _run_child(_CHILD_HEAD + """
async def app(scope, receive, send):
    if scope["type"] != "http":
        raise ValueError("no lifespan")
    asyncio.get_running_loop().stop()
    await asyncio.sleep(30)

route = ASGIRoute(app, lifespan=False)
s = served(route)
res = []
t = threading.Thread(target=get, args=(s.port, "/stop", res), daemon=True)
t.start()
t.join(10)
assert not t.is_alive(), "no answer"
print(res)
s.close()
route.close()
""")
    assert "[(500, b'Internal Server Error\\n')]" in out


# ---- regressions (attack review: ASGIRoute lifecycles) --------------------------------------

_LIFESPAN_APP = """
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                if STOP_IN_STARTUP:
                    asyncio.get_running_loop().stop()
                    await asyncio.sleep(30)
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/stop":
        asyncio.get_running_loop().stop()
        await asyncio.sleep(30)
    if scope["path"] == "/close":
        route.close()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
"""


def test_asgi_close_after_the_app_stopped_the_loop_does_not_hang():
    # With lifespan, close() submitted lifespan.shutdown to the dead loop and waited on its
    # future without a bound: forever. Later requests each waited a poll (0.5 s) too.
    out = _run_child(_CHILD_HEAD + "STOP_IN_STARTUP = False\n" + _LIFESPAN_APP + """
route = ASGIRoute(app)
s = served(route)
res = []
get_each(s.port, ("/stop",), res)
t0 = time.monotonic()
get_each(s.port, ("/after",), res)
res.append(time.monotonic() - t0 < 0.4)  # the dead route refuses at once
s.close()
closer = threading.Thread(target=route.close, daemon=True)
closer.start()
closer.join(10)
assert not closer.is_alive(), "route.close() hung"
assert route.loop.is_closed()
print(res)
""", timeout=30)
    assert "[(500, b'Internal Server Error\\n'), (500, b'Internal Server Error\\n'), True]" in out


def test_asgi_lifespan_startup_that_stops_the_loop_fails_the_constructor_not_hangs():
    out = _run_child(_CHILD_HEAD + "STOP_IN_STARTUP = True\n" + _LIFESPAN_APP + """
try:
    ASGIRoute(app, lifespan_timeout=60)
except RuntimeError as e:
    print("raised", e)
""", timeout=30)
    assert "raised" in out


def test_asgi_close_from_the_apps_own_loop_raises_not_deadlocks():
    # route.close() inside a request waited on a future of its own loop: the loop, and every
    # request after it, hung for good.
    out = _run_child(_CHILD_HEAD + "STOP_IN_STARTUP = False\n" + _LIFESPAN_APP + """
route = ASGIRoute(app)
s = served(route)
res = []
get_each(s.port, ("/close", "/after"), res)
s.close()
route.close()
print(res)
""", timeout=30)
    assert "[(500, b'Internal Server Error\\n'), (200, b'ok')]" in out


def test_asgi_close_from_several_threads_at_once():
    # Each close() ran lifespan shutdown: the second waited out the lifespan timeout for an
    # answer the app had given the first, then raised LifespanFailed, or hit a closed loop.
    events = []

    async def app(scope, receive, send):
        while True:
            m = await receive()
            events.append(m["type"])
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await asyncio.sleep(0.3)  # the other close() calls come meanwhile
                await send({"type": "lifespan.shutdown.complete"})
                return

    route = ASGIRoute(app, lifespan_timeout=5)
    errors = []

    def close():
        try:
            route.close()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=close) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads)
    assert errors == [] and route.loop.is_closed()
    assert events == ["lifespan.startup", "lifespan.shutdown"]


LONG_POLL_APP = '''
import os

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            with open(os.environ["LIFESPAN_LOG"], "a") as f:
                f.write(m["type"] + "\\n")
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    # A long poll: answers when the client leaves, which the in-process server never says.
    while (await receive())["type"] != "http.disconnect":
        pass
'''


@contextlib.contextmanager
def _cli_with_a_request_in_the_app(tmp, module, text, *args, env=None):
    """`python -m shmipc.serve --in-process ARGS... --graceful-timeout 1 module:app` in tmp
    (InProcess), with one GET under way from a thread of ours: (InProcess, thread, [its
    status or error])."""
    with open(os.path.join(tmp, module + ".py"), "w") as f:
        f.write(text)
    with InProcess(*args, "--workers", "2", "--graceful-timeout", "1", module + ":app", cwd=tmp,
                   env=env) as s:
        got = []

        def ask():
            try:
                got.append(request(s.port, "GET", "/")[0])
            except OSError as e:
                got.append(repr(e))

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        yield s, t, got


def test_cli_asgi_request_that_never_ends_does_not_hold_the_stop(tmp_path):
    # server.stop() waited for the request in the app for good, and SIGTERM and SIGINT were
    # only flags: the process had to be killed. Past --graceful-timeout it is cancelled.
    log = str(tmp_path / "lifespan.log")
    with _cli_with_a_request_in_the_app(str(tmp_path), "longpoll", LONG_POLL_APP, "--asgi",
                                        env=dict(python_env(), LIFESPAN_LOG=log)) as (s, t, got):
        t.join(0.5)  # the request is in the app now
        assert s.stop(timeout=15) == 0
        t.join(10)
        assert not t.is_alive() and got == [500]
    with open(log) as f:
        assert f.read() == "lifespan.startup\nlifespan.shutdown\n"


def test_cli_asgi_app_that_ignores_the_cancel_does_not_hold_the_stop(tmp_path):
    # Past --graceful-timeout the request still in the app is cancelled; an app that swallows
    # the cancel held route.close() for the route's lifespan timeout plus one (31 s), whatever
    # --graceful-timeout said. The cancelled requests now have 1 s, then get their 500.
    with _cli_with_a_request_in_the_app(str(tmp_path), "deaf", (
        "import asyncio\n"
        "async def app(scope, receive, send):\n"
        "    if scope['type'] != 'http':\n"
        "        return\n"
        "    print('in the app', flush=True)\n"
        "    while True:\n"
        "        try:\n"
        "            await asyncio.sleep(60)\n"
        "        except asyncio.CancelledError:\n"
        "            pass\n"), "--asgi") as (s, t, got):
        assert "in the app" in s.p.stdout.readline()
        began = time.monotonic()
        s.p.send_signal(signal.SIGTERM)
        try:
            out, _ = s.p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("an ASGI app that ignores the cancel held SIGTERM past 20 s")
        took = time.monotonic() - began
        assert s.p.returncode == 0, out
        assert took < 8, (took, out)  # 1 s graceful + 1 s for the cancel, with room for CI
        assert "ignored the cancel" in out, out
        t.join(10)
        assert not t.is_alive() and got == [500], got


def test_cli_wsgi_request_that_never_returns_does_not_hold_the_stop(tmp_path):
    # Past --graceful-timeout only ASGI requests were dealt with: a WSGI call that never
    # returns held server.stop(), and the process, for good; a second SIGTERM was only the
    # flag again. Now the process ends past the timeout (exit 4), as the pool's SIGKILL would.
    with _cli_with_a_request_in_the_app(str(tmp_path), "stuck", (
            "import threading\n"
            "def app(environ, start_response):\n"
            "    print('in the app', flush=True)\n"
            "    threading.Event().wait()\n")) as (s, t, _):
        assert "in the app" in s.p.stdout.readline()
        s.p.send_signal(signal.SIGTERM)
        try:
            out, _ = s.p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("a WSGI request that never returns held SIGTERM past the timeout")
        assert s.p.returncode == 4, out
        assert "still in the WSGI app after --graceful-timeout 1 s" in out
        t.join(10)
        assert not t.is_alive()  # the client sees the connection end


def test_asgi_loop_closes_an_unstarted_server_of_its_own_at_once():
    # The route's loop thread is a handler's for good (_shmipc._handler_thread()), and from a
    # handler close() only asked and dropping the server resurrected it for good: a Server
    # the app made and closed there (in lifespan startup, here) stayed behind until exit, with
    # a ResourceWarning saying to close() it. A server never started has no workers to wait
    # for: it is freed at once from any thread.
    out = _run_child("""
import gc, warnings, weakref, shmipc
from shmipc.serve import ASGIRoute
warnings.simplefilter("error", ResourceWarning)
res = {}
async def app(scope, receive, send):
    while True:
        m = await receive()
        if m["type"] == "lifespan.startup":
            side = shmipc.Server(port=0, workers=1)
            side.close()
            res["gone"] = weakref.ref(side)
            del side
            gc.collect()
        await send({"type": m["type"] + ".complete"})
        if m["type"] == "lifespan.shutdown":
            return
route = ASGIRoute(app)
route.close()
print("freed" if res["gone"]() is None else "kept")
""", timeout=30)
    assert out.strip() == "freed"


# An app whose requests swallow their cancel (for the child's code, after _CHILD_HEAD).
_DEAF_APP = """
started = threading.Event()
async def app(scope, receive, send):
    started.set()
    while True:  # ignores the cancel
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass
"""


def test_asgi_close_interrupted_still_answers_the_waiting_requests():
    # close() took the waiting requests out of the route's set, then was interrupted (Ctrl-C)
    # while the loop cancelled them: nobody answered them, their workers waited for good on a
    # loop that was still alive, and server.close() (or the exit's) hung.
    out = _run_child(_CHILD_HEAD + _DEAF_APP + """
import signal
route = ASGIRoute(app, lifespan=False, lifespan_timeout=2)
s = served(route)
res = []
t = threading.Thread(target=get, args=(s.port, "/", res), daemon=True)
t.start()
assert started.wait(5)

def interrupt(*a):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
signal.setitimer(signal.ITIMER_REAL, 0.3)
try:
    route.close()
except KeyboardInterrupt:
    res.append("interrupted")
t.join(6)
assert not t.is_alive(), "the client got no answer"
closer = threading.Thread(target=s.close, daemon=True)
closer.start()
closer.join(6)
assert not closer.is_alive(), "server.close() hung"
route.close()  # the interrupted close completes
assert route.loop.is_closed()
print(res)
""", timeout=40)
    assert "['interrupted', (500, b'Internal Server Error\\n')]" in out


def test_asgi_close_cancel_timeout_bounds_an_app_that_ignores_the_cancel():
    # close() waited the lifespan timeout (30 s here) for a request that swallows its cancel;
    # close(cancel_timeout=) bounds that wait, answers 500 and says how many were left.
    out = _run_child(_CHILD_HEAD + _DEAF_APP + """
import logging
import sys
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
route = ASGIRoute(app, lifespan=False)
for bad, exc in ((-1, ValueError), (float("nan"), ValueError), (86401, ValueError),
                 ("1", TypeError), (True, TypeError)):
    try:
        route.close(cancel_timeout=bad)
    except exc:
        pass
    else:
        raise AssertionError(bad)
assert not route.loop.is_closed()
s = served(route)
res = []
t = threading.Thread(target=get, args=(s.port, "/", res), daemon=True)
t.start()
assert started.wait(5)
began = time.monotonic()
route.close(cancel_timeout=0.3)
took = time.monotonic() - began
t.join(6)
assert not t.is_alive(), "the client got no answer"
s.close()
print(res, took < 5)
""", timeout=40)
    assert "[(500, b'Internal Server Error\\n')] True" in out, out
    assert "1 request(s) ignored the cancel for 0.3 s" in out, out


@pytest.mark.parametrize("op", ["stop", "close"])
def test_asgi_app_stopping_its_server_does_not_deadlock(op):
    # An ASGI app's "/shutdown" calling server.stop() or close(): on its loop's thread, which
    # shmipc.Server did not know for a handler's, the call waited for the graceful stop, the
    # stop for the request, and the request for the loop: the whole process hung.
    out = _run_child(_CHILD_HEAD + f"""
async def app(scope, receive, send):
    if scope["type"] != "http":
        raise ValueError("no lifespan")
    s.{op}()
    await send({{"type": "http.response.start", "status": 200, "headers": []}})
    await send({{"type": "http.response.body", "body": b"bye"}})

route = ASGIRoute(app, lifespan=False)
s = shmipc.Server(port=0, workers=2)
s.route(None, "/*", route)
s.start()
res = []
t = threading.Thread(target=get, args=(s.port, "/shutdown", res), daemon=True)
t.start()
t.join(10)
assert not t.is_alive(), "no answer"
closer = threading.Thread(target=s.close, daemon=True)
closer.start()
closer.join(10)
assert not closer.is_alive(), "server.close() hung"
route.close()
print(res)
""", timeout=30)
    assert "[(200, b'bye')]" in out


# ---- hostile apps (attack review): what held, kept so ----------------------------------------


def test_header_injection_never_reaches_the_wire(caplog):
    # CR/LF (or NUL) in a field name or value from either adapter, or from a frame route's
    # own answer, is a 500; nothing the app smuggled is on the wire, status line included.
    caplog.set_level(logging.CRITICAL)
    evil = [("X-A", "v\r\nSet-Cookie: evil=1"), ("X-A\r\nSet-Cookie", "evil=1"),
            ("X-A", "v\nSet-Cookie: evil=1"), ("X-A", "v\x00")]

    def wapp(environ, start_response):
        i = int(environ["PATH_INFO"][1:])
        if i == len(evil):
            start_response("200 OK\r\nSet-Cookie: evil=1", [])
        else:
            start_response("200 OK", [evil[i]])
        return [b"ok"]

    async def aapp(scope, receive, send):
        i = int(scope["path"][1:])
        name, value = evil[min(i, len(evil) - 1)]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(name.encode(), value.encode())]})
        await send({"type": "http.response.body", "body": b"ok"})

    class Frame:
        _shmipc_frame_route = True

        def __call__(self, frame, body):
            from shmipc import _serve
            i = int(_serve.decode_request(frame, {})["PATH_INFO"][1:])
            name, value = evil[min(i, len(evil) - 1)]
            return (200, [(name.encode(), value.encode())], b"ok")

    for route in (WSGIRoute(wapp), ASGIRoute(aapp, lifespan=False), Frame()):
        try:
            s = serve(route, workers=2)
            with s:
                for i in range(len(evil) + 1):
                    c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
                    try:
                        c.sendall(b"GET /%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % i)
                        data = b""
                        while (d := c.recv(65536)):
                            data += d
                    finally:
                        c.close()
                    # The reason phrase is the server's own (as behind a front): a status
                    # line with CR/LF loses it, and nothing else.
                    assert data.startswith(b"HTTP/1.1 500 ") or \
                        (i == len(evil) and isinstance(route, WSGIRoute)), (route, i, data)
                    assert b"evil" not in data.lower(), (route, i, data)
        finally:
            if isinstance(route, ASGIRoute):
                route.close()


@pytest.mark.parametrize("backend_", BACKENDS)
def test_many_clients_on_four_workers_in_rounds_no_crosstalk_no_leak(backend_):
    # Both adapters, four server workers, twelve clients, several rounds of server and route
    # made and closed: every answer is its own client's, and no thread or fd is left behind.
    def count():
        return threading.active_count(), len(os.listdir("/proc/self/fd"))

    before = None
    for rnd in range(3):
        for kind in ("wsgi", "asgi"):
            route = WSGIRoute(echo_app) if kind == "wsgi" else ASGIRoute(asgi_echo,
                                                                         lifespan=False)
            try:
                s = serve(route, backend=backend_, workers=4)
                with s:
                    mismatches, errors = many_clients(s.port, n_threads=12, per_thread=20)
            finally:
                if kind == "asgi":
                    route.close()
            assert (errors, mismatches) == ([], [])
        if before is None:
            before = count()
    assert count() == before


def test_queue_route_registration_and_queue_misuse():
    # A class that asks for a queue route must carry a shmipc._RouteQueue: anything else is
    # refused at route(), never a crash at the first request.
    from shmipc import _shmipc

    class Bad:
        _shmipc_frame_route = "queue"

        def __init__(self, q):
            self._shmipc_queue = q

        def __call__(self, *a):
            return None

    s = shmipc.Server(port=0, workers=1)
    try:
        for q in (None, 5, object()):
            with pytest.raises(TypeError, match="_RouteQueue"):
                s.route(None, "/x", Bad(q))
        with pytest.raises(TypeError):
            s.route(None, "/y", type("NoQueue", (), {"_shmipc_frame_route": "queue",
                                                     "__call__": lambda self: None})())
    finally:
        s.close()
    with pytest.raises(TypeError):
        _shmipc._RouteQueue(1)
    q = _shmipc._RouteQueue()
    assert q.take() == [] and not q.closed and q.fileno() >= 0
    q.close()
    q.close()
    assert q.closed and q.take() == []
    with pytest.raises(TypeError):
        ASGIRoute.__call__(None, b"frame", b"body", None)


def test_asgi_app_that_ends_on_http_disconnect_is_no_error(caplog):
    # An app that returns (or raises) once it got http.disconnect, its client gone, was
    # logged as "the app failed" with a traceback, for every client that left a long poll;
    # the pool's worker (asgi.py) logs nothing for the one and info for the other.
    done = []
    waiting = threading.Event()

    async def app(scope, receive, send):
        assert (await receive())["type"] == "http.request"
        waiting.set()
        try:
            assert (await asyncio.wait_for(receive(), 10))["type"] == "http.disconnect"
            if scope["path"] == "/raise":
                raise OSError("the client went away")
        finally:
            done.append(scope["path"])

    caplog.set_level(logging.INFO, logger="shmipc.serve")
    with ASGIRoute(app, lifespan=False, max_concurrency=1) as route:
        s = serve(route)
        with s:
            for path in ("/return", "/raise"):
                waiting.clear()
                c = socket.create_connection(("127.0.0.1", s.port))
                c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert waiting.wait(10)
                c.close()
                deadline = time.monotonic() + 10
                while path not in done and time.monotonic() < deadline:
                    time.sleep(0.01)
            deadline = time.monotonic() + 10
            while route._taken and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not route._taken  # the slot of max_concurrency=1 is free again
    assert done == ["/return", "/raise"]
    errors = [r for r in caplog.records if r.name == "shmipc.serve" and r.levelno >= logging.ERROR]
    assert errors == []
    assert any("went away" in r.getMessage() for r in caplog.records)


LOGGING_APP = '''
import logging

log = logging.getLogger("cliapp.requests")
LINE = "x" * 300

def app(environ, start_response):
    log.warning("GET %s %s", environ["PATH_INFO"], LINE)
    environ["wsgi.errors"].write("wsgi.errors %s\\n" % LINE)
    if environ["PATH_INFO"] == "/raise":
        raise RuntimeError("the app failed " + LINE)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]

async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            await send({"type": msg["type"] + ".complete"})
            if msg["type"] == "lifespan.shutdown":
                return
    log.warning("GET %s %s", scope["path"], LINE)
    if scope["path"] == "/raise":
        raise RuntimeError("the app failed " + LINE)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
'''


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_cli_in_process_stderr_nobody_reads_stalls_no_request(tmp_path, kind):
    """Regression: `python -m shmipc.serve --in-process` logged (logging's handler, the app's
    tracebacks, wsgi.errors) with blocking writes to stderr: a stderr pipe nobody read filled
    after a few hundred lines, and the server's threads then waited in write() for a reader:
    no request was answered any more. As the C front's writers do, stderr is written through a
    non-blocking description of its own now: a line without room waits 20 ms at most, then it
    is dropped and counted, and a line says how many once there is room again. 1200 requests
    that log ~700 bytes each (a tenth raising: a traceback) into an unread pipe are all
    answered; then the pipe is read, and the next line says what was dropped."""
    import fcntl

    (tmp_path / "logapp.py").write_text(LOGGING_APP)
    args = ["--asgi"] if kind == "asgi" else []
    r, w = os.pipe()
    try:
        with InProcess(*args, "--workers", "2", "logapp:" + ("app" if kind == "wsgi" else "asgi"),
                       cwd=tmp_path, stderr=w) as s:
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
            deadline = time.monotonic() + 300
            for i in range(1200):
                assert time.monotonic() < deadline
                path = "/raise" if i % 10 == 9 else "/x"
                try:
                    c.request("GET", path)
                    resp = c.getresponse()
                    resp.read()
                except OSError as e:  # a timeout: the server waits for stderr's reader
                    pytest.fail(f"request {i} got no answer: {e!r}")
                assert resp.status == (500 if path == "/raise" else 200), i
            c.close()
            # Someone reads now: the next line that comes says how much was dropped.
            fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_NONBLOCK)
            got = b""

            def drain():
                nonlocal got
                while True:
                    try:
                        chunk = os.read(r, 65536)
                    except BlockingIOError:
                        return
                    if not chunk:
                        return
                    got += chunk

            drain()
            assert request(s.port, "GET", "/x")[0] == 200
            end = time.monotonic() + 10
            while b"dropped" not in got and time.monotonic() < end:
                time.sleep(0.05)
                drain()
            text = got.decode(errors="replace")
            assert re.search(r"python -m shmipc\.serve\[\d+\]: \d+ lines? \(\d+ bytes\) of "
                             r"stderr dropped: nobody read them", text), text[-2000:]
            assert s.stop(timeout=30) == 0
    finally:
        os.close(r)


CHILD_APP = '''
import subprocess
import sys


def app(environ, start_response):
    # A child of the app inherits the server's stderr, as any program's children do.
    rc = subprocess.run([sys.executable, "-c", "import os; os.fstat(2)"]).returncode
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"child=%d" % rc]
'''


def test_cli_in_process_children_of_the_app_keep_stderr(tmp_path):
    """Regression: the non-blocking stderr of `python -m shmipc.serve --in-process` was put on
    fd 2 close-on-exec, so a program the app started had no fd 2 (its next open() got it, and
    its error messages went into that file)."""
    (tmp_path / "childapp.py").write_text(CHILD_APP)
    r, w = os.pipe()
    try:
        with InProcess("childapp:app", cwd=tmp_path, stderr=w) as s:
            assert request(s.port, "GET", "/")[::2] == (200, b"child=0")
            s.stop(timeout=30)
    finally:
        os.close(r)



@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_cli_in_process_with_stderr_closed_serves_and_logs_nowhere(tmp_path, kind):
    """Regression: `python -m shmipc.serve --in-process` started with fd 2 closed (a service
    manager's 2>&-; Python's sys.stderr is None then) ended at once with exit 1: main() called
    sys.stderr.flush() on None before anything was served. And the non-blocking stderr writer,
    finding no fd 2, wrote every log line to fd 2 anyway, which the next open() took (the wake
    pipe, a client's socket). fd 2 is /dev/null now: the app's log lines and tracebacks go
    nowhere, and every request is answered with its own bytes."""
    (tmp_path / "logapp.py").write_text(LOGGING_APP)
    args = ["--asgi"] if kind == "asgi" else []
    with InProcess(*args, "--workers", "2", "logapp:" + ("app" if kind == "wsgi" else "asgi"),
                   cwd=tmp_path, stderr=subprocess.DEVNULL,
                   preexec_fn=lambda: os.close(2)) as s:
        assert os.readlink(f"/proc/{s.p.pid}/fd/2") == os.devnull
        for i in range(20):
            path = "/raise" if i % 4 == 3 else "/x"
            status, _, body = request(s.port, "GET", path)
            if path == "/x":
                assert (status, body) == (200, b"ok"), i
            else:
                assert status == 500 and b"the app failed" not in body, i
        assert s.stop(timeout=30) == 0


ADDR_APP = '''
import json


def app(environ, start_response):
    start_response("200 OK", [])
    return [json.dumps({k: environ.get(k) for k in
                        ("REMOTE_ADDR", "REMOTE_PORT", "SERVER_NAME", "SERVER_PORT")}).encode()]


async def asgi(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body",
                "body": json.dumps({"client": scope["client"], "server": scope["server"]}).encode()})
'''


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_in_process_apps_see_the_clients_address(tmp_path, kind, backend):
    """Regression: the in-process adapters had no peer address (the server's request API had
    none): REMOTE_ADDR and REMOTE_PORT were missing and the ASGI scope's "client" was None,
    where behind the shmipc-serve front an app sees them. Now from
    shmipc_http_request_peer() / _local(), per connection."""
    (tmp_path / "addrapp.py").write_text(ADDR_APP)
    sys.path.insert(0, str(tmp_path))
    try:
        import addrapp
    finally:
        sys.path.remove(str(tmp_path))
    route = WSGIRoute(addrapp.app) if kind == "wsgi" else ASGIRoute(addrapp.asgi, lifespan=False)
    try:
        with serve(route, backend=backend) as s:
            for _ in range(2):  # the second on its own connection: each its own port
                with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
                    mine = c.getsockname()[1]
                    c.sendall(b"GET / HTTP/1.1\r\nHost: example:1\r\nConnection: close\r\n\r\n")
                    data = b""
                    while True:
                        chunk = c.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                got = json.loads(data.split(b"\r\n\r\n", 1)[1])
                if kind == "wsgi":
                    assert got == {"REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": str(mine),
                                   "SERVER_NAME": "127.0.0.1", "SERVER_PORT": str(s.port)}
                else:
                    assert got == {"client": ["127.0.0.1", mine], "server": ["127.0.0.1", s.port]}
    finally:
        if kind == "asgi":
            route.close()
