"""shmipc.Server: Python route handlers and static responses over the C HTTP server, on both
backends; handler exceptions (500, logged, still serving); handlers on several worker
threads; start/stop/run from threads; Ctrl-C stopping run(); memory over many requests."""
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import python_env, sigint_default

BACKENDS = ["epoll", "io_uring"]


def started(shmipc, setup=None, **kw):
    """A started server on an ephemeral port; io_uring skips where the kernel refuses it."""
    kw.setdefault("port", 0)
    kw.setdefault("workers", 1)
    s = shmipc.Server(**kw)
    if setup:
        setup(s)
    try:
        s.start()
    except shmipc.Error as e:
        s.close()
        if kw.get("backend") == "io_uring" and e.name in ("SHMIPC_ENOTSUP", "SHMIPC_EACCES"):
            pytest.skip(f"io_uring refused here: {e}")
        raise
    return s


def conn(s):
    return http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)


def get(c, method, path, body=None, headers=None):
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def app(s):
    @s.route("GET", "/hello")
    def hello(req):
        return "hello " + req.args.get("name", ["world"])[0]

    @s.route("POST", "/echo")
    def echo(req):
        return shmipc_response(req)

    @s.route("GET", "/items/*")
    def item(req):
        return {"id": req.wildcard, "query": req.query, "path": req.path}

    @s.route(None, "/any")
    def any_method(req):
        return req.method.encode()

    s.static("/", "Hello, World!")
    s.static("/bin", b"\x00\x01\x02", content_type="application/octet-stream", status=203)


def shmipc_response(req):
    import shmipc

    return shmipc.Response(req.body, status=201,
                           headers={"X-Method": req.method,
                                    "X-Agent": req.headers.get("USER-AGENT", "")},
                           content_type=req.headers.get("content-type"))


def test_routes_and_static(shmipc, backend):
    s = started(shmipc, app, backend=backend)
    with s:
        assert s.backend == backend and s.running
        c = conn(s)  # one keep-alive connection for all of it
        assert get(c, "GET", "/hello?name=py")[::2] == (200, b"hello py")
        st, h, body = get(c, "POST", "/echo", b"\x00payload",
                          {"Content-Type": "application/x-test", "User-Agent": "ua/1"})
        assert (st, body) == (201, b"\x00payload")
        assert h["x-method"] == "POST" and h["x-agent"] == "ua/1"
        assert h["content-type"] == "application/x-test"
        st, h, body = get(c, "GET", "/items/42/x?a=1&b=2")
        assert st == 200 and h["content-type"] == "application/json"
        assert json.loads(body) == {"id": "42/x", "query": "a=1&b=2", "path": "/items/42/x"}
        for m in ("GET", "PUT", "DELETE"):
            assert get(c, m, "/any")[::2] == (200, m.encode())
        st, h, body = get(c, "GET", "/")
        assert (st, body, h["content-type"]) == (200, b"Hello, World!", "text/plain; charset=utf-8")
        st, h, body = get(c, "GET", "/bin")
        assert (st, body, h["content-type"]) == (203, b"\x00\x01\x02", "application/octet-stream")
        st, h, body = get(c, "HEAD", "/hello")
        assert st == 200 and body == b"" and h["content-length"] == str(len(b"hello world"))
        c.close()


def test_head_answer_says_gets_length(shmipc, backend):
    """An answer to HEAD may say GET's Content-Length without a body (as Werkzeug answers
    HEAD), from the handler or deferred; on any other answer Content-Length stays the server's
    (the handler's answer is refused: 500)."""
    import threading

    def setup(s):
        @s.route("GET", "/sized")
        def sized(req):
            return b"", 200, [("Content-Length", "4096")]

        @s.route("GET", "/later")
        def later(req):
            p = req.defer(timeout=5)

            def answer():
                try:
                    p.send(200, [("Content-Length", "77")], b"x")
                except ValueError as e:  # GET: refused; the pending is freed unsent (500)
                    refused.append(str(e))
            threading.Thread(target=answer).start()

    refused = []
    s = started(shmipc, setup, backend=backend)
    with s:
        c = conn(s)
        st, h, body = get(c, "HEAD", "/sized")
        assert (st, h["content-length"], body) == (200, "4096", b"")
        st, h, body = get(c, "HEAD", "/later")
        assert (st, h["content-length"], body) == (200, "77", b"")
        assert get(c, "GET", "/sized")[0] == 500
        c.close()
        c = conn(s)
        assert get(c, "GET", "/later")[0] == 500  # the send is refused: answered 500
        c.close()
    assert len(refused) == 1 and "Content-Length" in refused[0]


def test_request_client_is_the_clients_address(shmipc, backend):
    """Request.client: the client's (host, port), its own per connection (the server's request
    API had no peer address before)."""

    def setup(s):
        @s.route("GET", "/who")
        def who(req):
            return {"client": list(req.client)}

    s = started(shmipc, setup, backend=backend)
    with s:
        for _ in range(2):
            c = conn(s)
            c.connect()
            mine = c.sock.getsockname()
            st, _, body = get(c, "GET", "/who")
            assert (st, json.loads(body)) == (200, {"client": [mine[0], mine[1]]})
            c.close()


def _kept_requests(shmipc, backend, address, connect):
    """A server on `address` whose handler keeps every Request it gets and answers its
    .client read twice; `connect()` gives a connected client socket. Returns what each of two
    connections got and its socket's name, with the kept Requests, read after the server is
    closed (the C requests long gone)."""
    kept = []

    def setup(s):
        @s.route("GET", "/who")
        def who(req):
            kept.append(req)
            a, b = req.client, req.client
            return {"equal": a == b, "client": None if a is None else list(a)}

    s = started(shmipc, setup, address=address, backend=backend)
    seen = []
    with s:
        for _ in range(2):
            c = http.client.HTTPConnection("localhost", s.port or 80, timeout=10)
            c.sock = connect(s)
            mine = c.sock.getsockname()
            st, _, body = get(c, "GET", "/who")
            assert st == 200, body
            seen.append((json.loads(body), mine))
            c.close()
    return seen, kept


def test_request_client_is_kept_and_decoded_when_read(shmipc, backend):
    """Request.client: the client's address is copied into the Request (its C half,
    _RequestBase) as the request is made, and decoded into (host, port) when read. Read twice
    it is equal; read from a Request kept after its handler returned, its connection closed
    and the server closed, it is still the client's (the Request's own bytes, never the C
    request's memory), every time."""
    import socket

    def connect(s):
        return socket.create_connection(("127.0.0.1", s.port), timeout=10)

    seen, kept = _kept_requests(shmipc, backend, None, connect)
    for (got, mine), req in zip(seen, kept):
        assert got == {"equal": True, "client": ["127.0.0.1", mine[1]]}
        assert req.client == req.client == ("127.0.0.1", mine[1])
    assert kept[0].client != kept[1].client  # each its own connection's


def test_request_client_on_ipv6(shmipc, backend):
    """Request.client of a client on an IPv6 listener ("::1"): the host as inet_ntop gives it."""
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")

    def connect(s):
        return socket.create_connection(("::1", s.port), timeout=10)

    seen, kept = _kept_requests(shmipc, backend, "::1", connect)
    for (got, mine), req in zip(seen, kept):
        assert got == {"equal": True, "client": ["::1", mine[1]]}
        assert req.client == ("::1", mine[1])


def _unix_connect(path):
    """A connect function for _kept_requests: a client of the unix listener at `path`."""
    import socket

    def connect(s):
        c = socket.socket(socket.AF_UNIX)
        c.settimeout(10)
        c.connect(path)
        return c
    return connect


def test_request_client_on_a_unix_listener_is_none(shmipc, backend, tmp_path):
    """A unix listener's client has no (host, port): Request.client is None, in the handler
    and from the kept Request."""
    path = str(tmp_path / "who.sock")
    seen, kept = _kept_requests(shmipc, backend, f"unix:{path}", _unix_connect(path))
    assert [got for got, _ in seen] == [{"equal": True, "client": None}] * 2
    assert [req.client for req in kept] == [None, None]


def test_request_copy_deepcopy_and_pickle_keep_the_client(shmipc, backend, tmp_path):
    """A Request can be copied, deep-copied and pickled, its client kept, as when the address
    was a plain slot: the C half's layout made the default state refuse the type ("cannot
    pickle 'Request' object", copy.copy too). Request._client, which __getstate__ saves, takes
    only None or an IPv4/IPv6 (host, port), the address unchanged after a refusal."""
    import copy
    import pickle
    import socket

    def connect(s):
        return socket.create_connection(("127.0.0.1", s.port), timeout=10)

    seen, kept = _kept_requests(shmipc, backend, None, connect)
    req, mine = kept[0], seen[0][1]
    for dup in (copy.copy(req), copy.deepcopy(req), pickle.loads(pickle.dumps(req))):
        assert type(dup) is type(req)
        assert dup.client == req.client == ("127.0.0.1", mine[1])
        assert (dup.method, dup.path, dup.query, dup.version, dup.body) == (
            req.method, req.path, req.query, req.version, req.body)
        assert dup.headers.raw == req.headers.raw
    dup = copy.copy(req)
    dup._client = ("::ffff:10.1.2.3", 65535)
    assert dup.client == ("::ffff:10.1.2.3", 65535)
    assert req.client == ("127.0.0.1", mine[1])  # the copy has its own address
    for bad, err in ((("nohost", 1), ValueError), (("1.2.3.4", 65536), ValueError),
                     (("1.2.3.4", -1), ValueError), (("1.2.3.4\0", 1), ValueError),
                     (("1.2.3.4",), TypeError), (("1.2.3.4", 1, 2), TypeError),
                     ((b"1.2.3.4", 1), TypeError), ("1.2.3.4:1", TypeError),
                     ((("1.2.3.4", "1")), TypeError), (("1.2.3.4", 2**70), OverflowError)):
        with pytest.raises(err):
            dup._client = bad
        assert dup.client == ("::ffff:10.1.2.3", 65535)
    with pytest.raises(AttributeError):
        del dup._client
    with pytest.raises(AttributeError):
        dup.client = None  # the public one stays read-only
    dup._client = None
    assert dup.client is None
    # A unix listener's client (no address) stays None through a copy.
    path = str(tmp_path / "copy.sock")
    _, kept = _kept_requests(shmipc, backend, f"unix:{path}", _unix_connect(path))
    assert pickle.loads(pickle.dumps(kept[0])).client is None
    assert copy.deepcopy(kept[0]).client is None


def test_request_subclass_copy_keeps_its_own_attributes(shmipc):
    """Regression: Request.__getstate__ gave back the slots and the client but no instance
    dict, so an app's Request subclass lost its own attributes in copy.copy(), deepcopy() and
    pickle (they were kept when the client was a plain slot and the default state ran)."""
    import copy
    import pickle

    class NotedRequest(shmipc.Request):
        pass
    # pickle finds a class by its module and name
    NotedRequest.__qualname__ = NotedRequest.__name__ = "_NotedRequest"
    globals()["_NotedRequest"] = NotedRequest
    try:
        req = NotedRequest("GET", "/n", "q=1", "", "HTTP/1.1", None, b"body")
        req._client = ("10.0.0.9", 4242)
        req.note = {"seen": 1}
        for dup in (copy.copy(req), copy.deepcopy(req), pickle.loads(pickle.dumps(req))):
            assert type(dup) is NotedRequest
            assert dup.note == {"seen": 1}, "the subclass's attribute was lost"
            assert dup.client == ("10.0.0.9", 4242)
            assert (dup.method, dup.path, dup.query, dup.body) == ("GET", "/n", "q=1", b"body")
        assert copy.deepcopy(req).note is not req.note

        class TaggedRequest(shmipc.Request):
            __slots__ = ("tag",)
        tagged = TaggedRequest("GET", "/t", "", "", "HTTP/1.1", None, b"")
        tagged.tag = "mine"
        for dup in (copy.copy(tagged), copy.deepcopy(tagged)):
            assert dup.tag == "mine" and dup.path == "/t"
        plain = shmipc.Request("GET", "/p", "", "", "HTTP/1.1", None, b"")
        assert not hasattr(copy.copy(plain), "__dict__")  # no dict where the class has none
    finally:
        del globals()["_NotedRequest"]


def test_404_405(shmipc, backend):
    s = started(shmipc, app, backend=backend)
    with s:
        c = conn(s)
        assert get(c, "GET", "/nope")[0] == 404
        st, h, _ = get(c, "GET", "/echo")
        assert st == 405 and "POST" in h["allow"]
        assert get(c, "DELETE", "/")[0] == 405
        assert get(c, "GET", "/hello")[0] == 200  # the connection survived
        c.close()


def test_request_fields(shmipc):
    seen = {}

    def handler(req):
        seen.update(method=req.method, path=req.path, query=req.query, wildcard=req.wildcard,
                    version=req.version, body=req.body, raw=req.headers.raw,
                    one=req.headers["x-one"], all=req.headers.getall("X-TWO"),
                    has=("x-ONE" in req.headers, "nope" in req.headers), names=list(req.headers))
        return b""

    s = started(shmipc, lambda s: s.route("PUT", "/r", handler))
    with s, socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(b"PUT /r HTTP/1.0\r\nX-One: 1\r\nx-two: a\r\nX-Two:  b \r\n"
                     b"Content-Length: 3\r\n\r\nxyz")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200") or reply.startswith(b"HTTP/1.0 200")
    assert seen["method"] == "PUT" and seen["path"] == "/r" and seen["query"] == ""
    assert seen["wildcard"] == "" and seen["version"] == "HTTP/1.0" and seen["body"] == b"xyz"
    assert seen["one"] == "1" and seen["all"] == ["a", "b"] and seen["has"] == (True, False)
    assert ("X-One", "1") in seen["raw"] and seen["names"][:2] == ["X-One", "x-two"]


def test_return_values(shmipc):
    big = os.urandom(1 << 20)  # lent to the C server, not copied

    def setup(s):
        s.route("GET", "/none", lambda r: None)
        s.route("GET", "/list", lambda r: [1, "a"])
        s.route("GET", "/tuple", lambda r: ("made", 201, [("X-A", "b")]))
        s.route("GET", "/tjson", lambda r: ({"k": 1}, 202))
        s.route("GET", "/json", lambda r: shmipc.Response.json({"ok": True}, status=418))
        s.route("GET", "/big", lambda r: big)
        s.route("GET", "/bytearray", lambda r: bytearray(b"ba"))
        s.route("GET", "/bad", lambda r: 3.5)
        s.route("GET", "/badheader", lambda r: shmipc.Response(b"", headers={"Content-Length": "9"}))

    s = started(shmipc, setup)
    with s:
        c = conn(s)
        assert get(c, "GET", "/none")[::2] == (204, b"")
        st, h, body = get(c, "GET", "/list")
        assert (st, json.loads(body), h["content-type"]) == (200, [1, "a"], "application/json")
        st, h, body = get(c, "GET", "/tuple")
        assert (st, body, h["x-a"]) == (201, b"made", "b")
        st, h, body = get(c, "GET", "/tjson")
        assert (st, json.loads(body)) == (202, {"k": 1})
        st, h, body = get(c, "GET", "/json")
        assert (st, json.loads(body), h["content-type"]) == (418, {"ok": True}, "application/json")
        for _ in range(3):
            st, h, body = get(c, "GET", "/big")
            assert st == 200 and body == big
        assert get(c, "GET", "/bytearray")[::2] == (200, b"ba")
        assert get(c, "GET", "/bad")[0] == 500
        c = conn(s)
        assert get(c, "GET", "/badheader")[0] == 500
        c = conn(s)
        assert get(c, "GET", "/none")[0] == 204


def test_handler_exception_is_500_logged_and_server_keeps_serving(shmipc, backend, caplog):
    calls = []

    def boom(req):
        calls.append(req.path)
        raise RuntimeError("handler failed on purpose")

    def setup(s):
        s.route("GET", "/boom", boom)
        s.route("GET", "/ok", lambda r: "fine")

    caplog.set_level(logging.ERROR, logger="shmipc.server")
    s = started(shmipc, setup, backend=backend)
    with s:
        c = conn(s)
        for _ in range(5):
            st, _, body = get(c, "GET", "/boom")
            assert st == 500 and b"Internal Server Error" in body
            assert get(c, "GET", "/ok")[::2] == (200, b"fine")  # same connection, still served
        c.close()
    assert len(calls) == 5
    records = [r for r in caplog.records if r.name == "shmipc.server"]
    assert len(records) == 5
    assert "GET /boom" in records[0].getMessage()
    assert records[0].exc_info[0] is RuntimeError
    assert "handler failed on purpose" in caplog.text  # the traceback


def test_handlers_run_on_several_worker_threads(shmipc, backend):
    idents = set()
    lock = threading.Lock()
    barrier = threading.Barrier(2, timeout=5)

    def handler(req):
        with lock:
            idents.add(threading.get_ident())
        if req.query == "meet":
            # Two handlers at once: only possible on two workers, each holding the GIL in turn.
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                return "alone"
        return "ok"

    s = started(shmipc, lambda s: s.route("GET", "/t", handler), backend=backend, workers=2)
    with s:
        # Connections spread over the workers' SO_REUSEPORT sockets by their source ports.
        conns = [conn(s) for _ in range(32)]
        for c in conns:
            assert get(c, "GET", "/t")[0] == 200
        assert len(idents) == 2 and threading.get_ident() not in idents
        # Find two connections on different workers, then make their handlers meet.
        by_worker = {}
        for c in conns:
            idents.clear()
            get(c, "GET", "/t")
            by_worker.setdefault(idents.pop(), c)
        a, b = by_worker.values()
        out = []
        t = threading.Thread(target=lambda: out.append(get(a, "GET", "/t?meet")))
        t.start()
        out.append(get(b, "GET", "/t?meet"))
        t.join(10)
        assert [o[2] for o in out] == [b"ok", b"ok"]
        for c in conns:
            c.close()


def test_start_stop_run_from_threads(shmipc):
    s = shmipc.Server(port=0, workers=1)
    s.route("GET", "/", lambda r: "up")
    t = threading.Thread(target=s.run)
    t.start()
    for _ in range(200):
        if s.running:
            break
        time.sleep(0.01)
    assert get(conn(s), "GET", "/")[::2] == (200, b"up")
    with pytest.raises(RuntimeError):
        s.run()  # already running on the other thread
    s.stop()
    t.join(10)
    assert not t.is_alive() and not s.running
    # A stopped server starts again, and stop() stops a server started with start().
    s.start()
    port = s.port
    assert get(conn(s), "GET", "/")[::2] == (200, b"up")
    s.stop()
    assert not s.running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    # stop() before run(): that run() returns at once.
    s.stop()
    s.run()
    # close() from another thread while run() blocks: run returns, the server is freed.
    t = threading.Thread(target=s.run)
    t.start()
    time.sleep(0.2)
    s.close()
    t.join(10)
    assert not t.is_alive() and s.closed
    s.close()
    with pytest.raises(shmipc.ClosedError):
        s.start()


def test_stop_from_a_handler(shmipc):
    s = shmipc.Server(port=0, workers=1)

    def quit_(req):
        s.stop()
        return "bye"

    s.route("POST", "/quit", quit_)
    t = threading.Thread(target=s.run)
    t.start()
    for _ in range(200):
        if s.running:
            break
        time.sleep(0.01)
    assert get(conn(s), "POST", "/quit", b"")[::2] == (200, b"bye")
    t.join(10)
    assert not t.is_alive()
    s.close()


def test_close_and_misuse(shmipc):
    with shmipc.Server(port=0, workers=1) as s:
        s.route("GET", "/a", lambda r: b"")
        with pytest.raises(shmipc.Error) as e:
            s.route("GET", "/a", lambda r: b"")
        assert e.value.name == "SHMIPC_EEXIST"
        with pytest.raises(TypeError):
            s.route("GET", "/b", "not callable")
        with pytest.raises(RuntimeError):
            s.port  # not started
        assert s.backend is None
        s.start()
        s.start()  # no-op
        with pytest.raises(shmipc.Error) as e:
            s.route("GET", "/c", lambda r: b"")
        assert e.value.name == "SHMIPC_EBUSY"
        with pytest.raises(shmipc.Error):
            s.static("/d", b"x")
    assert s.closed
    s.close()
    with pytest.raises(shmipc.ClosedError):
        s.route("GET", "/x", lambda r: b"")
    with pytest.raises(shmipc.ClosedError):
        s.port
    assert repr(s) == "<shmipc.Server closed>"


def test_unix_socket_address(shmipc, backend, tmp_path):
    """Server(address="unix:...") listens on a unix socket; the file goes at close; a regular
    file at the path is refused and kept; a path over 107 bytes is refused when set."""
    path = tmp_path / "py.sock"
    s = started(shmipc, app, address=f"unix:{path}", backend=backend, workers=2)
    with s:
        assert s.port == 0
        for _ in range(4):
            c = http.client.HTTPConnection("localhost", timeout=10)
            c.sock = socket.socket(socket.AF_UNIX)
            c.sock.settimeout(10)
            c.sock.connect(str(path))
            assert get(c, "GET", "/hello?name=unix")[::2] == (200, b"hello unix")
            c.close()
    assert not os.path.lexists(path)
    path.write_text("keep")
    s = shmipc.Server(address=f"unix:{path}", port=0, backend=backend)
    with pytest.raises(shmipc.Error, match="not a socket"):
        s.start()
    s.close()
    assert path.read_text() == "keep"
    with pytest.raises(shmipc.Error, match="107"):
        shmipc.Server(address="unix:/" + "p" * 107)


def test_config_arguments(shmipc):
    with pytest.raises(shmipc.InvalidArgumentError, match="port"):
        shmipc.Server(port=70000)
    with pytest.raises(shmipc.InvalidArgumentError, match="backend"):
        shmipc.Server(backend="kqueue")
    with pytest.raises(shmipc.InvalidArgumentError, match="workers"):
        shmipc.Server(workers=0)
    with pytest.raises(shmipc.InvalidArgumentError, match="address"):
        shmipc.Server(address="localhost")
    with pytest.raises(shmipc.InvalidArgumentError):
        shmipc.Server(header_timeout=0)
    with pytest.raises(TypeError):
        shmipc.Server(bogus=1)

    def setup(s):
        s.route("POST", "/p", lambda r: str(len(r.body)))

    s = started(shmipc, setup, server_name="pyserver/1", max_body=1000, keepalive_timeout=5.0,
                stop_timeout=1.0, backend="epoll")
    with s:
        c = conn(s)
        st, h, body = get(c, "POST", "/p", b"x" * 1000)
        assert (st, body, h["server"]) == (200, b"1000", "pyserver/1")
        assert get(conn(s), "POST", "/p", b"x" * 1001)[0] == 413
    s = started(shmipc, setup, server_name=None)
    with s:
        assert "server" not in get(conn(s), "POST", "/p", b"")[1]


def test_memory_stable_over_many_requests(shmipc):
    import tracemalloc

    def setup(s):
        s.route("POST", "/m", lambda r: {"n": len(r.body), "q": r.query, "h": r.headers["x-h"]})
        s.route("GET", "/e", lambda r: 1 / 0)

    logging.getLogger("shmipc.server").disabled = True
    s = started(shmipc, setup)
    try:
        c = conn(s)

        def burst(n):
            for i in range(n):
                assert get(c, "POST", f"/m?i={i}", b"y" * 100, {"X-H": "v"})[0] == 200
                if i % 100 == 0:
                    assert get(c, "GET", "/e")[0] == 500

        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

        burst(2000)  # warm up
        tracemalloc.start()
        r0 = rss()
        s0 = tracemalloc.take_snapshot()
        burst(10000)
        grown = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(s0, "filename"))
        tracemalloc.stop()
        assert grown < 256 * 1024, grown
        assert rss() - r0 < 8 * 1024 * 1024
    finally:
        logging.getLogger("shmipc.server").disabled = False
        s.close()


RUNNER = r"""
import os, signal, sys, threading, time
import shmipc
s = shmipc.Server(port=0, workers=1)
s.route("GET", "/", lambda r: "ok")
if sys.argv[1] == "self":
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
threading.Timer(0.3, lambda: print("port", s.port, flush=True)).start()
t0 = time.monotonic()
try:
    s.run()
except KeyboardInterrupt:
    print("interrupted %.3f running=%s" % (time.monotonic() - t0, s.running), flush=True)
    s.close()
    sys.exit(0)
print("returned", flush=True)
sys.exit(1)
"""


@pytest.mark.parametrize("sender", ["self", "parent"])
def test_ctrl_c_stops_run(sender):
    child = subprocess.Popen([sys.executable, "-c", RUNNER, sender], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=python_env(),
                             preexec_fn=sigint_default)
    try:
        line = child.stdout.readline().split()
        assert line[0] == "port", child.stderr.read()
        c = http.client.HTTPConnection("127.0.0.1", int(line[1]), timeout=10)
        assert get(c, "GET", "/")[::2] == (200, b"ok")
        if sender == "parent":
            child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err
    assert out.startswith("interrupted") and "running=False" in out


@pytest.mark.parametrize("name", ["Server", "WebSocket", "Request", "Response", "Headers"])
def test_stubs_and_docstrings(shmipc, name):
    from test_stubs import runtime_members, stub_members, stub_tree

    members = stub_members(stub_tree("__init__.pyi"))
    cls = getattr(shmipc, name)
    stub = members[name] | members["_ContextManager"]
    runtime = runtime_members(cls)
    if name == "Headers":  # the Mapping mixins come with the base class
        runtime -= {"get", "items", "keys", "values"}
    assert runtime - stub == set(), f"{name}: missing from the stub"
    assert {n for n in stub - runtime if not n.startswith("__")} == set()
    assert cls.__doc__ and len(cls.__doc__) > 100
    if name in ("Server", "WebSocket"):
        import inspect

        for attr in runtime:
            if attr.startswith("__"):
                continue
            doc = getattr(inspect.getattr_static(cls, attr), "__doc__", None)
            assert doc, f"{name}.{attr} has no docstring"
            if callable(getattr(cls, attr)):
                assert doc.startswith(attr + "("), f"{name}.{attr}: {doc[:40]!r}"


def test_worker_thread_states_freed_over_restarts(shmipc):
    """Each worker keeps the Python thread state of its first handler call (creating one per
    call cost ~150 us); it must be deleted when the worker ends, not leak per start/stop."""
    s = shmipc.Server(port=0, workers=2)
    s.route("GET", "/", lambda r: b"x")

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def cycle():
        s.start()
        for _ in range(4):  # new connections spread over both workers
            c = conn(s)
            assert get(c, "GET", "/")[0] == 200
            c.close()
        s.stop()

    with s:
        for _ in range(20):
            cycle()
        r0 = rss()
        for _ in range(200):  # a leak was ~8 KiB per cycle (a 3.11 thread state's data stack)
            cycle()
        assert rss() - r0 < 800 * 1024


def test_refused_in_a_subinterpreter(shmipc, tmp_path):
    """Worker threads take the GIL with PyGILState_Ensure(), which knows the main interpreter
    only: a Server is refused in a subinterpreter (the rest of the module works there)."""
    _testcapi = pytest.importorskip("_testcapi")
    out = tmp_path / "out"
    code = (f"import sys; sys.path[:0] = {sys.path!r}\n"
            "import shmipc\n"
            "try:\n    shmipc.Server(port=0)\n    r = 'created'\n"
            "except RuntimeError as e:\n    r = str(e)\n"
            f"open({str(out)!r}, 'w').write(r)\n")
    assert _testcapi.run_in_subinterp(code) == 0
    assert out.read_text() == "shmipc.Server runs in the main interpreter only"


def test_port_in_use_is_oserror_eaddrinuse(shmipc, backend):
    """Regression (issue 18 item 5): a second server on a port the first serves joined its
    SO_REUSEPORT group silently; now start() raises OSError with errno EADDRINUSE."""
    import errno

    a = started(shmipc, workers=2, backend=backend)
    try:
        for reuse in (None, False):
            b = shmipc.Server(port=a.port, workers=2, backend=backend, reuse_port=reuse)
            with pytest.raises(OSError) as info:
                b.start()
            b.close()
            assert info.value.errno == errno.EADDRINUSE
            assert isinstance(info.value, shmipc.Error)
            assert info.value.name == "SHMIPC_EADDRINUSE"
            assert "in use" in str(info.value)
        # Asked to share: both serve the port.
        b = shmipc.Server(port=a.port, workers=2, backend=backend, reuse_port=True)
        b.static("/", "b")
        b.start()
        try:
            assert b.port == a.port
        finally:
            b.close()
        with pytest.raises(ValueError):
            shmipc.Server(port=0, reuse_port=1)
    finally:
        a.close()


DROP_IN_HANDLER = r"""
import http.client, json, sys
import shmipc

def serve_one(answer):
    srv = shmipc.Server("127.0.0.1", 0, workers=1)
    holder = [srv]

    @srv.route("GET", "/drop")
    def drop(req):
        holder.clear()  # the last reference: the Server's dealloc runs here, on the worker
        return answer()

    srv.start()
    port = srv.port
    del srv
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/drop")
    r = c.getresponse()
    return r.status, r.read()

def fail():
    raise KeyError("after the drop")

print(serve_one(lambda: {"ok": True}))  # the answer goes through the Server's _normalize
print(serve_one(fail))                  # the exception through its _log_error
print("survived")
"""


def test_server_dropped_inside_its_own_handler():
    """Regression: the last reference to a Server dropped inside its handler freed the object
    while the C route context still borrowed it, and the handler's answer then went through
    the freed Server (SIGSEGV). Now the Server is left behind (ResourceWarning), the request
    is answered, and the process exits cleanly."""
    r = subprocess.run([sys.executable, "-W", "always", "-c", DROP_IN_HANDLER],
                       capture_output=True, text=True, env=python_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["(200, b'{\"ok\":true}')",
                                     "(500, b'Internal Server Error\\n')", "survived"]
    assert "ResourceWarning: shmipc.Server dropped inside its own handler" in r.stderr
    assert "KeyError: 'after the drop'" in r.stderr


@pytest.mark.parametrize("backend", ["io_uring", "epoll"])
def test_keepalive_requests(shmipc, backend):
    # nginx's keepalive_requests: the N-th answer on a connection says Connection: close, and
    # what was pipelined behind it is not answered; the next connection starts again.
    def setup(s):
        s.route("GET", "/k", lambda r: "k")

    s = started(shmipc, setup, keepalive_requests=3, backend=backend)
    with s:
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
            c.sendall(b"GET /k HTTP/1.1\r\nHost: x\r\n\r\n" * 5)
            got = b""
            while True:
                b = c.recv(65536)
                if not b:
                    break  # the server closed after the third answer
                got += b
        assert got.count(b"HTTP/1.1 200") == 3, got
        assert got.count(b"Connection: close") == 1 and got.rindex(b"Connection: close") > \
            got.rindex(b"HTTP/1.1 200"), got
        assert get(conn(s), "GET", "/k")[0] == 200
    for bad in (-1, 2 ** 64, "3", 1.5):
        with pytest.raises((shmipc.InvalidArgumentError, TypeError)):
            shmipc.Server(keepalive_requests=bad)
    shmipc.Server(keepalive_requests=None).close()
    shmipc.Server(keepalive_requests=0).close()  # 0: the default
