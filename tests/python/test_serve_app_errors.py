"""An app that fails after it changed what it was given, through every route an app can take:
the in-process WSGI and ASGI adapters on shmipc.Server, and the shmipc-serve pool (WSGI and
ASGI workers behind the front). The error paths take the request's method and target from our
own decode of the request (the REQUEST_HEAD frame), never from the environ or scope the app
holds, and every route logs the failure the same way: "the app failed on METHOD TARGET", the
target as the client sent it, with its query, as text (no bytes repr).

Regression: the failure's handling read environ["REQUEST_METHOD"], scope["method"] and
scope["raw_path"] at the time of the failure, so an app that had done environ.clear() or
del scope["method"] made the except handler itself raise KeyError. The ASGI routes logged the
target as a bytes repr (b'/x', without the query), the WSGI ones as /x?q."""
import os
import socket
import sys
import time

import pytest

from test_serve_cli import SERVE, Serve
from test_serve_head import ask, in_process, read_body, read_head

from shmipc import _serve as sf
from shmipc.serve import ASGIRoute, WSGIRoute
from shmipc.serve.wsgi import request_line

APP = r'''
class BadStr(Exception):
    """An exception whose message cannot be had: its __str__ raises."""

    def __str__(self):
        raise RuntimeError("no message")


class FormatStr(str):
    """A str that cannot be formatted (an f-string's {}): what BadFormat's __str__ gives."""

    def __format__(self, spec):
        raise RuntimeError("no format")


class BadFormat(Exception):
    """An exception whose __str__ gives a str subclass that raises when formatted."""

    def __str__(self):
        return FormatStr("a message")


def wsgi(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/clear":  # all of it gone, then the failure
        environ.clear()
        raise ValueError("the app failed after environ.clear()")
    if path == "/del-method":
        del environ["REQUEST_METHOD"]
        environ["RAW_URI"] = None
        raise ValueError("the app failed after del REQUEST_METHOD")
    if path == "/after-head":  # the head went (through the pool), then the failure
        start_response("200 OK", [])

        def gen():
            yield b"x"
            environ.clear()
            raise ValueError("the app failed after its head")
        return gen()
    if path == "/bad-str-after-head":
        start_response("200 OK", [])

        def gen():
            yield b"x"
            raise BadStr()
        return gen()
    if path == "/bad-format-after-head":
        start_response("200 OK", [])

        def gen():
            yield b"x"
            raise BadFormat()
        return gen()
    if path == "/input-gone":  # the body left unread, wsgi.input replaced
        environ["wsgi.input"] = None
        environ.clear()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"answered"]
    if path == "/input-no-read":
        environ["wsgi.input"] = object()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"answered"]
    start_response("404 Not Found", [])
    return [b"no such path"]


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/clear":
        scope.clear()
        raise ValueError("the app failed after scope.clear()")
    if path == "/del-method":
        del scope["method"]
        scope["raw_path"] = None
        raise ValueError("the app failed after del method")
    if path == "/after-head":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        scope.clear()
        raise ValueError("the app failed after its head")
    if path == "/bad-str-after-head":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        raise BadStr()
    if path == "/bad-format-after-head":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        raise BadFormat()
    if path == "/after-response":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"whole"})
        scope.clear()
        raise ValueError("the app failed after its response")
    if path == "/input-gone":
        scope.clear()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"answered"})
        return
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"no such path"})
'''

ERROR = b"Internal Server Error\n"


@pytest.fixture
def app_module(tmp_path, monkeypatch):
    (tmp_path / "errapp.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("errapp", None)
    import errapp
    return errapp


def post(port, path, body):
    """(status, body) of a POST whose body the app never reads, on its own connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
        c.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                  % (path.encode(), len(body)) + body)
        f = c.makefile("rb")
        status, fields = read_head(f)
        return status, read_body(f, fields)


def cut(port, path):
    """The answer to a GET whose response fails after its head: (status, body) when the
    client got a whole answer, else ("cut", the bytes it got)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
        c.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
        f = c.makefile("rb")
        status, fields = read_head(f)
        if "content-length" in fields:
            return status, read_body(f, fields)
        return "cut", f.read()


def check_failures(port, logged, logtext, kind, pool):
    """Each failure is the app's: a whole 500 (no body to HEAD) while nothing went out, a cut
    answer once the head went, the
    log saying "the app failed on METHOD TARGET" with the target as sent, and the traceback
    the app's own ValueError, not a KeyError of our handler. The server serves on."""
    for path in ("/clear", "/del-method"):
        for method in ("GET", "HEAD"):
            target = f"{path}?q=1&r=%41"
            got = ask(port, method, target)
            want = b"" if method == "HEAD" else ERROR
            assert got == (500, {"content-length": ["22"]}, want), (method, target, got)
            assert logged(f"the app failed on {method} {target}\n"), (method, target)
    # A backslash the client sent is logged doubled: its own "\x85" (visible ASCII, which
    # the HTTP parser lets through) does not read as the byte 0x85, which request_line
    # escapes so (test_request_line_reads_one_way).
    assert ask(port, "GET", "/clear?p=\\x85")[0] == 500
    assert logged("the app failed on GET /clear?p=\\\\x85\n")
    # Through the pool the front may have sent the head before the worker's ABORT came
    # (a cut answer) or not (its 500); in-process nothing goes before the app's end.
    after_head = {("cut", b"1\r\nx\r\n"), (500, ERROR)} if pool else {(500, ERROR)}
    assert cut(port, "/after-head?x") in after_head
    assert logged("the app failed on GET /after-head?x\n")
    # An exception whose str() raises: the ABORT's text is its type alone.
    assert cut(port, "/bad-str-after-head") in after_head
    assert logged("the app failed on GET /bad-str-after-head\n")
    # One whose str() gives a str subclass that cannot be formatted: the type alone too.
    assert cut(port, "/bad-format-after-head") in after_head
    assert logged("the app failed on GET /bad-format-after-head\n")
    if kind == "asgi":
        assert ask(port, "GET", "/after-response?y")[0] == 200
        assert logged("the app failed after its response on GET /after-response?y\n")
    assert post(port, "/input-gone", b"b" * 100000) == (200, b"answered")
    if kind == "wsgi":
        assert post(port, "/input-no-read", b"b" * 1000) == (200, b"answered")
    assert ask(port, "GET", "/nothing") == (404, {"content-length": ["12"]}, b"no such path")
    text = logtext()
    assert "KeyError" not in text and "AttributeError" not in text, text
    assert "b'/" not in text, text
    # No error escaped the failure's handling: it ended the WSGI worker's session thread
    # (every request on the session 502) or the ASGI request's task (no answer: 502).
    assert "Exception in thread" not in text and "never retrieved" not in text, text
    assert "session ended" not in text, text


def test_request_line_reads_one_way():
    """Regression: request_line escaped what latin-1 holds and is not printable as \\xNN
    (a REQUEST_HEAD may carry 0x80-0xFF: a front not ours, a local process on a worker's
    address) but left a backslash as it was, so a client's own visible-ASCII "\\x85" and the
    byte 0x85 were the same log text. A backslash is doubled now; the method is a token."""
    def line(target):
        return request_line(sf.encode_request_head(b"GET", target, []))

    assert line(b"/a\x85b") == "GET /a\\x85b"
    assert line(b"/a\\x85b") == "GET /a\\\\x85b"
    assert line(b"/a\\x85b\x85") == "GET /a\\\\x85b\\x85"
    assert line(b"/\xa0\xad\x9f\xe9\xff?q=%41") == "GET /\\xa0\\xad\\x9f\xe9\xff?q=%41"
    assert line(b"/plain?q=1&r=%41") == "GET /plain?q=1&r=%41"


def logged(caplog, text, timeout=10):
    """Whether a log record holds `text`, waiting up to `timeout` s: an ASGI app that fails
    after its response logs it after the client has the answer."""
    deadline = time.monotonic() + timeout
    while text not in caplog.text:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_app_errors_in_process(app_module, caplog, kind):
    route = (WSGIRoute(app_module.wsgi) if kind == "wsgi"
             else ASGIRoute(app_module.asgi, lifespan=False))
    try:
        with in_process(route) as s:
            check_failures(s.port, lambda text: logged(caplog, text), lambda: caplog.text, kind,
                           pool=False)
    finally:
        if kind == "asgi":
            route.close()


@pytest.mark.skipif(not os.path.exists(SERVE), reason="shmipc-serve is not built")
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_app_errors_through_the_pool(tmp_path, kind):
    (tmp_path / "errapp.py").write_text(APP)
    flags = ["--asgi"] if kind == "asgi" else []
    s = Serve(tmp_path, *flags, workers=1, app=(f"errapp:{kind}",))
    try:
        pid = s.worker_pids(1)
        check_failures(s.port, s.wait_err, lambda: "".join(s.err), kind, pool=True)
        assert s.worker_pids(1) == pid, "the worker died: " + "".join(s.err)
    finally:
        s.stop()
