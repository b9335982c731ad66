"""HEAD through every route an app can take: the in-process WSGI and ASGI adapters on
shmipc.Server, and the shmipc-serve pool (WSGI and ASGI workers behind the front). RFC 9110
9.3.2 and 8.6: a HEAD answer carries the header fields GET's would, its Content-Length (when
it has one) being the length of GET's body, and no body.

Regression: the in-process adapters dropped a HEAD answer's body before the server saw it, so
the server said "Content-Length: 0" (also when the app had said its own length, as Flask's
Werkzeug does for HEAD); the pool's workers dropped the body of a one-piece answer too, so the
front answered HEAD with "Transfer-Encoding: chunked" where GET had a Content-Length."""
import os
import socket
import sys

import pytest

from test_serve_cli import SERVE, Serve

import shmipc
from shmipc.serve import ASGIRoute, WSGIRoute

APP = r'''
BODY = b"0123456789"


def wsgi(environ, start_response):
    path, head = environ["PATH_INFO"], environ["REQUEST_METHOD"] == "HEAD"
    if path == "/one":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"hello"]
    if path == "/two":
        start_response("200 OK", [])
        return [b"ab", b"cde"]
    if path == "/own-length":  # as Werkzeug answers HEAD: GET's length, no body
        start_response("200 OK", [("Content-Length", str(len(BODY)))])
        return [] if head else [BODY]
    if path == "/own-length-and-body":  # HEAD answered as GET: the server drops the body
        start_response("200 OK", [("Content-Length", str(len(BODY)))])
        return [BODY]
    if path == "/generator":
        start_response("200 OK", [])
        return (piece for piece in (b"a", b"bb", b"ccc"))
    if path == "/empty":
        start_response("200 OK", [])
        return [b""]
    if path == "/empty-list":
        start_response("200 OK", [])
        return []
    if path == "/204":
        start_response("204 No Content", [])
        return []
    if path == "/304":
        start_response("304 Not Modified", [("ETag", '"x"')])
        return []
    if path.startswith("/length/"):  # the app's Content-Length, whatever it is; one byte
        start_response("200 OK", [("Content-Length", path[8:])])
        return [] if head else [b"x"]
    start_response("404 Not Found", [])
    return [b"no such path"]


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    path, head = scope["path"], scope["method"] == "HEAD"

    async def start(status=200, headers=()):
        await send({"type": "http.response.start", "status": status, "headers": list(headers)})

    async def body(data, more=False):
        await send({"type": "http.response.body", "body": data, "more_body": more})

    if path == "/one":
        await start(200, [(b"content-type", b"text/plain")])
        await body(b"hello")
    elif path == "/two":
        await start()
        await body(b"ab", True)
        await body(b"cde")
    elif path == "/own-length":
        await start(200, [(b"content-length", b"%d" % len(BODY))])
        await body(b"" if head else BODY)
    elif path == "/own-length-and-body":  # as Starlette: the body, whatever the method
        await start(200, [(b"content-length", b"%d" % len(BODY))])
        await body(BODY)
    elif path == "/empty":
        await start()
        await body(b"")
    elif path == "/204":
        await start(204)
        await body(b"")
    elif path == "/304":
        await start(304, [(b"etag", b'"x"')])
        await body(b"")
    elif path.startswith("/length/"):
        await start(200, [(b"content-length", path[8:].encode())])
        await body(b"" if head else b"x")
    else:
        await start(404)
        await body(b"no such path")
'''

PATHS = ["/one", "/two", "/own-length", "/own-length-and-body", "/generator", "/empty",
         "/empty-list", "/204", "/304"]


WSGI_ONLY = {"/generator", "/empty-list"}


def read_head(f):
    status = f.readline()
    assert status.startswith(b"HTTP/1.1 "), status
    fields = {}
    while True:
        line = f.readline()
        assert line, "the connection ended inside a head"
        if line == b"\r\n":
            return int(status.split()[1]), fields
        name, _, value = line.decode("latin-1").partition(":")
        fields.setdefault(name.strip().lower(), []).append(value.strip())


def read_body(f, fields):
    if "content-length" in fields:
        return f.read(int(fields["content-length"][0]))
    if fields.get("transfer-encoding") == ["chunked"]:
        out = b""
        while True:
            n = int(f.readline().split(b";")[0], 16)
            if n == 0:
                assert f.readline() == b"\r\n"
                return out
            out += f.read(n)
            assert f.read(2) == b"\r\n"
    return b""


def framing(fields):
    return {k: v for k, v in fields.items() if k in ("content-length", "transfer-encoding")}


def check_head_matches_get(port, paths, streamed=()):
    """HEAD, GET and HEAD again for each path, pipelined on one connection: each HEAD answer
    has GET's status and framing fields and no body (a stray body byte would break the next
    answer's status line). For a path in `streamed` (a body in several ASGI messages, or a
    WSGI generator, through the front: the worker learns its length only at its end), GET's
    framing depends on whether the pieces reach the front at once (Content-Length) or not
    (chunked): HEAD's may be chunked."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
        f = c.makefile("rb")
        for path in paths:
            c.sendall(b"".join(b"%s %s HTTP/1.1\r\nHost: x\r\n\r\n" % (m, path.encode())
                               for m in (b"HEAD", b"GET", b"HEAD")))
            answers = []
            for method in ("HEAD", "GET", "HEAD"):
                status, fields = read_head(f)
                body = read_body(f, fields) if method == "GET" else b""
                answers.append((status, framing(fields), body))
            (hs, hf, _), (gs, gf, gb), again = answers
            assert again == answers[0], path
            if path in streamed and hf == {"transfer-encoding": ["chunked"]}:
                hf = gf
            assert (path, hs, hf) == (path, gs, gf), f"HEAD {path}: {hf}, GET: {gf}"
            if gs in (204, 304):
                assert gf == {} and gb == b"", path
            elif "content-length" in gf:
                assert int(gf["content-length"][0]) == len(gb), path


def in_process(route):
    s = shmipc.Server(port=0, workers=1)
    s.route(None, "/*", route)
    s.start()
    return s


@pytest.fixture
def app_module(tmp_path, monkeypatch):
    (tmp_path / "headapp.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("headapp", None)
    import headapp
    return headapp


def test_head_in_process_wsgi(app_module):
    with in_process(WSGIRoute(app_module.wsgi)) as s:
        check_head_matches_get(s.port, PATHS)


def test_head_in_process_asgi(app_module):
    route = ASGIRoute(app_module.asgi, lifespan=False)
    try:
        with in_process(route) as s:
            check_head_matches_get(s.port, [p for p in PATHS if p not in WSGI_ONLY])
    finally:
        route.close()


@pytest.mark.skipif(not os.path.exists(SERVE), reason="shmipc-serve is not built")
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_head_through_the_pool(tmp_path, kind):
    (tmp_path / "headapp.py").write_text(APP)
    flags = ["--asgi"] if kind == "asgi" else []
    s = Serve(tmp_path, *flags, workers=1, app=(f"headapp:{kind}",))
    try:
        if kind == "wsgi":  # a generator's pieces may reach the front at once, or not
            check_head_matches_get(s.port, PATHS, {"/generator"})
        else:
            check_head_matches_get(s.port, [x for x in PATHS if x not in WSGI_ONLY], {"/two"})
    finally:
        s.stop()


# Content-Lengths an app may not say: more than 9223372036854775807 (the C server sends 19
# digits at most, and the front takes the largest 64-bit one for "no length").
TOO_LONG = ["9223372036854775808", "10000000000000000000", "18446744073709551615"]


def ask(port, method, path):
    """(status, framing fields, body) of one request on its own connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
        c.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                  % (method.encode(), path.encode()))
        f = c.makefile("rb")
        status, fields = read_head(f)
        return status, framing(fields), f.read()


def check_too_long_is_the_apps_error(port, logged):
    """An app's Content-Length over the largest the server sends is the app's error, as a
    Content-Length that is no number: a whole 500 for GET and HEAD alike, before anything of
    the answer went out, the log saying why (`logged(text)`); the largest one is said to
    HEAD; the server serves on."""
    for value in TOO_LONG:
        for method in ("GET", "HEAD"):
            got = ask(port, method, "/length/" + value)
            want = b"" if method == "HEAD" else b"Internal Server Error\n"
            assert got == (500, {"content-length": ["22"]}, want), (method, value, got)
            assert logged(f"the app failed on {method} /length/{value}\n"), (method, value)
            assert logged(f"{value}' is more than 9223372036854775807, the largest the "
                          "server sends"), (method, value)
    assert ask(port, "HEAD", "/length/9223372036854775807") == (
        200, {"content-length": ["9223372036854775807"]}, b"")
    assert ask(port, "GET", "/length/1") == (200, {"content-length": ["1"]}, b"x")


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_content_length_over_the_largest_in_process(app_module, caplog, kind):
    """Regression: in-process, a WSGI app's Content-Length of 20 digits (up to 2**64 - 1)
    passed start_response; the server refused it for HEAD (1 .. 19 digits), logged as the
    server's "invalid response", and GET failed on the app's short body. Through the pool the
    same app's GET went out as 200 with that length and one byte, then the connection closed,
    and HEAD with 2**64 - 1 was answered "Transfer-Encoding: chunked" (the front's "no
    length"). Now start_response refuses it in both modes (ASGI's http.response.start did
    already, over 2**63 - 1, saying only "bad Content-Length")."""
    route = (WSGIRoute(app_module.wsgi) if kind == "wsgi"
             else ASGIRoute(app_module.asgi, lifespan=False))
    try:
        with in_process(route) as s:
            check_too_long_is_the_apps_error(s.port, lambda text: text in caplog.text)
    finally:
        if kind == "asgi":
            route.close()


@pytest.mark.skipif(not os.path.exists(SERVE), reason="shmipc-serve is not built")
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_content_length_over_the_largest_through_the_pool(tmp_path, kind):
    """test_content_length_over_the_largest_in_process, through the shmipc-serve pool."""
    (tmp_path / "headapp.py").write_text(APP)
    flags = ["--asgi"] if kind == "asgi" else []
    s = Serve(tmp_path, *flags, workers=1, app=(f"headapp:{kind}",))
    try:
        check_too_long_is_the_apps_error(s.port, s.wait_err)
    finally:
        s.stop()
