"""shmipc-serve's Python worker (python/shmipc/serve, docs/serve.md): the C decode of a
REQUEST_HEAD into a WSGI environ, the response encoders, and the worker serving WSGI apps on
streams. The front is played here by a shmipc client session speaking the frames."""
import array
import logging
import struct
import sys
import threading
import time
import wsgiref.validate

import pytest

import shmipc
from conftest import default_config, unique_address

sf = pytest.importorskip("shmipc._serve")
from shmipc.serve import Worker  # noqa: E402

HDR = struct.Struct("<HBBII")


def frame(typ, payload=b"", arg=0):
    return HDR.pack(0x5653, 1, typ, len(payload), arg) + payload


# ---- the codec --------------------------------------------------------------------------


def head(method=b"GET", target=b"/", headers=(), **kw):
    kw.setdefault("peer", ("127.0.0.1", 40000))
    kw.setdefault("local", ("127.0.0.1", 8080))
    return sf.encode_request_head(method, target, list(headers), **kw)


def test_decode_request_builds_the_environ():
    f = head(b"POST", b"/a%20b/%zz%4?x=1&y=%41",
             [("Host", "example.org:8080"), ("X-A", "1"), ("x-a", "2"), ("Cookie", "a=1"),
              ("cookie", "b=2"), ("Content-Type", "text/plain"), ("Content-Length", "3"),
              ("Accept", "")],
             flags=sf.REQ_KEEP_ALIVE | sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH,
             content_length=3, peer=("::1", 5), local=("10.1.2.3", 8080))
    base = {"wsgi.version": (1, 0)}
    env = sf.decode_request(f, base)
    assert base == {"wsgi.version": (1, 0)}  # a copy
    assert env == {
        "wsgi.version": (1, 0),
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": "/a b/%zz%4",
        "QUERY_STRING": "x=1&y=%41",
        "RAW_URI": "/a%20b/%zz%4?x=1&y=%41",
        "REQUEST_URI": "/a%20b/%zz%4?x=1&y=%41",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "http",
        "CONTENT_LENGTH": "3",
        "CONTENT_TYPE": "text/plain",
        "HTTP_HOST": "example.org:8080",
        "HTTP_X_A": "1, 2",
        "HTTP_COOKIE": "a=1; b=2",
        "HTTP_ACCEPT": "",
        "REMOTE_ADDR": "::1",
        "REMOTE_PORT": "5",
        "SERVER_NAME": "10.1.2.3",
        "SERVER_PORT": "8080",
    }


def test_decode_request_drops_header_names_with_underscores():
    # "X_Forwarded_For" would land on HTTP_X_FORWARDED_FOR, the key of the front's own
    # X-Forwarded-For: dropped, as nginx and gunicorn do.
    env = sf.decode_request(head(headers=[("X_Forwarded_For", "6.6.6.6"),
                                          ("X-Forwarded-For", "1.2.3.4")]))
    assert env["HTTP_X_FORWARDED_FOR"] == "1.2.3.4"


def test_decode_request_percent_decodes_the_path_to_latin1():
    env = sf.decode_request(head(target=b"/caf%C3%A9/%2F%00x%"))
    assert env["PATH_INFO"] == "/caf\xc3\xa9//\x00x%"
    assert env["PATH_INFO"].encode("latin-1").decode("utf-8") == "/café//\x00x%"
    raw = "/\xe9?q=\xe9".encode("latin-1")
    env = sf.decode_request(head(target=raw))
    assert env["PATH_INFO"] == "/\xe9" and env["QUERY_STRING"] == "q=\xe9"


@pytest.mark.parametrize("target,path,query", [
    (b"http://h", "/", ""),
    (b"http://h?q=1", "/", "q=1"),
    (b"http://h:1/p/q?r", "/p/q", "r"),
    (b"HTTPS://h/x", "/x", ""),
    (b"*", "*", ""),
    (b"/?", "/", ""),
])
def test_decode_request_target_forms(target, path, query):
    env = sf.decode_request(head(b"OPTIONS", target))
    assert (env["PATH_INFO"], env["QUERY_STRING"], env["RAW_URI"]) == (
        path, query, target.decode("latin-1"))


def test_decode_request_addresses_unix_none_and_host():
    env = sf.decode_request(head(headers=[("Host", "[::1]:99")], peer="unix", local="unix"))
    assert env["REMOTE_ADDR"] == "unix:" and "REMOTE_PORT" not in env
    assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("[::1]", "99")
    env = sf.decode_request(head(headers=[("Host", "a.b")], peer=None, local=None))
    assert "REMOTE_ADDR" not in env
    assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("a.b", "80")
    env = sf.decode_request(head(peer=None, local=None, scheme=1, version_minor=0))
    assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("localhost", "443")
    assert env["wsgi.url_scheme"] == "https" and env["SERVER_PROTOCOL"] == "HTTP/1.0"


def test_decode_request_chunked_has_no_content_length():
    env = sf.decode_request(head(b"POST", headers=[("Transfer-Encoding", "chunked")],
                                 flags=sf.REQ_HAS_BODY | sf.REQ_CHUNKED))
    assert "CONTENT_LENGTH" not in env and env["HTTP_TRANSFER_ENCODING"] == "chunked"


def test_decode_request_refuses_what_breaks_the_protocol():
    good = head(headers=[("Host", "a")])
    for n in range(len(good)):
        with pytest.raises(sf.FrameError):
            sf.decode_request(good[:n])
    with pytest.raises(sf.FrameError):
        sf.decode_request(good + b"\0")  # bytes after the frame
    bad = bytearray(good)
    bad[2] = 2  # version
    with pytest.raises(sf.FrameError):
        sf.decode_request(bytes(bad))
    bad = bytearray(good)
    bad[12 + 3] = 1  # a reserved byte
    with pytest.raises(sf.FrameError):
        sf.decode_request(bytes(bad))
    with pytest.raises(sf.FrameError, match="not REQUEST_HEAD"):
        sf.decode_request(sf.encode_frame(sf.END))
    with pytest.raises(TypeError):
        sf.decode_request("not bytes")
    with pytest.raises(TypeError):
        sf.decode_request(good, [])
    with pytest.raises(TypeError):
        sf.decode_request()
    assert sf.decode_request(memoryview(good), None)["HTTP_HOST"] == "a"


def test_decode_header():
    assert sf.decode_header(b"SV\x01") is None
    assert sf.decode_header(sf.encode_frame(sf.BODY, b"xyz")) == (sf.BODY, 3, 0)
    with pytest.raises(sf.FrameError):
        sf.decode_header(frame(sf.END, b"", 1))  # END takes no arg
    with pytest.raises(sf.FrameError):
        sf.decode_header(HDR.pack(0x5653, 1, sf.BODY, sf.MAX_CHUNK + 1, 0))


def test_response_head_round_trip_and_refusals():
    f = sf.encode_response_head(201, [("X-A", "b"), (b"X-B", b"\xff")], sf.RESP_CONTENT_LENGTH, 7)
    assert sf.decode_response(f) == (201, sf.RESP_CONTENT_LENGTH, 7,
                                     [("X-A", "b"), ("X-B", "\xff")])
    for bad in ([("Bad Name", "x")], [("X", "a\r\nb")], [("X", " lead")], [("", "x")],
                [("X", "\0")]):
        with pytest.raises(ValueError):
            sf.encode_response_head(200, bad)
    with pytest.raises(ValueError):
        sf.encode_response_head(200, [("X", "1")] * 129)
    with pytest.raises(ValueError):
        sf.encode_response_head(200, [("X", "v" * 16385)])
    with pytest.raises(ValueError):
        sf.encode_response_head(99, [])
    with pytest.raises(ValueError):
        sf.encode_response_head(200, [], 4)  # an unknown flag
    with pytest.raises(UnicodeEncodeError):
        sf.encode_response_head(200, [("X", "\u20ac")])
    with pytest.raises(TypeError):
        sf.encode_response_head(200, [("X",)])
    with pytest.raises(TypeError):
        sf.encode_response_head(200, [("X", 1)])
    with pytest.raises(ValueError):
        sf.encode_frame(sf.BODY, b"")  # BODY carries at least one byte
    with pytest.raises(ValueError):
        sf.encode_frame(sf.ABORT, b"", 99)


def test_encoders_refuse_integers_out_of_their_fields_range():
    """Regression: the encoders read their unsigned fields with PyArg's K and I formats, which
    take any int modulo 2**64 or 2**32 (content_length=2**64 + 5 went out as 5, type 2**32 + 3
    as END), and a peer or local that is not a tuple was a SystemError."""
    post = sf.REQ_CONTENT_LENGTH | sf.REQ_HAS_BODY
    assert sf.decode_request(head(b"POST", flags=post, content_length=2**63 - 1),
                             None)["CONTENT_LENGTH"] == str(2**63 - 1)
    for clen in (2**64, 2**64 + 5, -1):
        with pytest.raises(OverflowError):
            head(b"POST", flags=post, content_length=clen)
        with pytest.raises(OverflowError):
            sf.encode_response_head(200, [], sf.RESP_CONTENT_LENGTH, clen)
    for flags in (2**32, 2**32 + sf.RESP_CONTENT_LENGTH, -1):
        with pytest.raises(OverflowError):
            sf.encode_response_head(200, [], flags)
        with pytest.raises(OverflowError):
            head(flags=flags)
    with pytest.raises(OverflowError):
        sf.encode_frame(2**32 + sf.END)
    with pytest.raises(OverflowError):
        sf.encode_frame(sf.ABORT, b"", 2**32 + 1)
    with pytest.raises(TypeError):
        sf.encode_frame(float(sf.END))
    with pytest.raises(TypeError):
        sf.encode_response_head(200, [], 0, 7.0)
    for bad in (5, [("127.0.0.1", 80)], "127.0.0.1"):
        with pytest.raises(TypeError, match="peer must be"):
            head(peer=bad)
        with pytest.raises(TypeError, match="local must be"):
            head(local=bad)


def head_saying(content_length, target=b"/"):
    """A POST head (HAS_BODY, CONTENT_LENGTH) whose content_length field holds any 64-bit
    value: the encoder writes none past 2^63 - 1, so its 8 bytes are set in the frame."""
    f = bytearray(head(b"POST", target, flags=sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH,
                       content_length=1))
    f[HDR.size + 12:HDR.size + 20] = content_length.to_bytes(8, "little")
    return bytes(f)


def test_request_content_length_over_2_63_is_a_bad_head():
    """Regression: a REQUEST_HEAD's content_length of 2^63 .. 2^64 - 1 decoded (CONTENT_LENGTH
    "18446744073709551615"; the Lua worker's req.content_length, a signed integer, read it as
    -1), though the front's HTTP parser gives at most 2^63 - 1 and a RESPONSE_HEAD past it was
    refused already. Both directions have one bound now: a larger one is a bad frame, and the
    encoders write none."""
    assert sf.decode_request(head_saying(2**63 - 1))["CONTENT_LENGTH"] == str(2**63 - 1)
    for clen in (2**63, 2**63 + 1, 2**64 - 1):
        for decode in (sf.decode_request, sf.decode_request_scope):
            with pytest.raises(sf.FrameError, match="breaks the protocol"):
                decode(head_saying(clen))
        with pytest.raises(ValueError):
            head(b"POST", flags=sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, content_length=clen)


def length_bound_is_kept(front, target=b"/", answer=None):
    """A worker's answers to heads past the bound of content_length and at it (the WSGI, ASGI,
    C and Lua workers' cases share it): 2^63 and 2^64 - 1 are ABORT PROTOCOL, the app never
    runs; 2^63 - 1 reaches the app, which answers `answer` (its view of the length, or what it
    says without reading the body), then the front aborts the body it never sends (its client
    went away). Each time the session serves on."""
    for clen in (2**63, 2**64 - 1, 2**63 - 1):
        st = front.session.open_stream()
        st.read_timeout = 10
        st.write(head_saying(clen, target))
        st.flush()
        if clen > 2**63 - 1:
            assert front.read_frame(st)[:2] == (sf.ABORT, sf.ABORT_PROTOCOL), clen
        else:
            typ, arg, payload = front.read_frame(st)
            assert typ == sf.RESPONSE_HEAD, (typ, arg, payload)
            body = []
            while True:
                typ, arg, payload = front.read_frame(st)
                if typ != sf.BODY:
                    break
                body.append(payload)
            assert typ == sf.END and b"".join(body) == (answer or str(clen).encode()), body
            st.write(frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
            st.flush()
        st.close()
        assert front.request(b"GET")[5] == sf.END, clen


# ---- the worker, with this test as the front -------------------------------------------


class Front:
    """The front's side: one session to a worker; request() sends one exchange."""

    def __init__(self, address, config=None):
        self.session_address = address
        self.session = shmipc.connect(address, config or default_config())

    def open(self, method=b"GET", target=b"/", headers=(), body=None, chunks=None, **kw):
        flags = kw.pop("flags", 0)
        if body is not None:
            flags |= sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH
            kw["content_length"] = len(body)
            chunks = [body] if body else []
        elif chunks is not None:
            flags |= sf.REQ_HAS_BODY | sf.REQ_CHUNKED
        st = self.session.open_stream()
        st.write(head(method, target, headers, flags=flags, **kw))
        return st, chunks

    def send_body(self, st, chunks, end=True):
        for c in chunks or ():
            st.write(frame(sf.BODY, c))
        if end:
            st.write(frame(sf.END))
        st.flush()

    def read_frame(self, st):
        raw = st.readexactly(12)
        typ, length, arg = sf.decode_header(raw)
        return typ, arg, st.readexactly(length) if length else b""

    def response(self, st):
        """(status, flags, content_length, headers, body, last frame type, its arg)."""
        typ, arg, payload = self.read_frame(st)
        if typ == sf.ABORT:
            return None, None, None, None, b"", typ, arg
        assert typ == sf.RESPONSE_HEAD
        status, flags, clen, headers = sf.decode_response(frame(typ, payload, arg))
        body = []
        while True:
            typ, arg, payload = self.read_frame(st)
            if typ != sf.BODY:
                break
            body.append(payload)
        return status, flags, clen, headers, b"".join(body), typ, arg

    def request(self, *a, **kw):
        st, chunks = self.open(*a, **kw)
        self.send_body(st, chunks)
        try:
            return self.response(st)
        finally:
            st.close()

    def close(self):
        self.session.close()


def answer_then_trickle(session, target):
    """A front that keeps a request's body coming after the worker's answer: a chunked POST to
    `target` whose head goes at once, the worker's answer read to its END (or ABORT), then a
    one-byte BODY frame every 0.3 s, never END, for 30 s at most, on a thread. Returns the
    answer's last frame type and arg, and a function that ends the trickle."""
    st = session.open_stream()
    st.read_timeout = 10
    st.write(head(b"POST", target, flags=sf.REQ_HAS_BODY | sf.REQ_CHUNKED))
    st.flush()
    while True:
        typ, length, arg = sf.decode_header(st.readexactly(12))
        if length:
            st.readexactly(length)
        if typ in (sf.END, sf.ABORT):
            break
    stop = threading.Event()

    def trickle():
        deadline = time.monotonic() + 30
        while not stop.wait(0.3) and time.monotonic() < deadline:
            try:
                st.write(frame(sf.BODY, b"x"))
                st.flush()
            except shmipc.Error:
                return

    t = threading.Thread(target=trickle, daemon=True)
    t.start()

    def end():
        stop.set()
        t.join(5)
        st.close()

    return (typ, arg), end


def first_frame_cut_short(what):
    """The bytes of a stream's first frame, cut short: `what` says which frame and where."""
    if what == "half_a_header":
        return head(b"GET", b"/")[:6]
    if what == "head_short_of_its_length":
        return head(b"GET", b"/", [("X-Pad", "p" * 200)])[:100]
    if what == "hello_short_of_its_payload":
        return frame(sf.HELLO, b"\x01\x00\x00\x00\x00\x00\x00\x00")[:14]
    return frame(sf.ABORT, b"a late abort's text", sf.ABORT_CLIENT_GONE)[:16]


CUT_SHORT = ["half_a_header", "head_short_of_its_length", "hello_short_of_its_payload",
             "late_abort_short_of_its_text"]


def cut_short_then_next(session, what):
    """A front that sends a stream's first frame cut short (first_frame_cut_short(`what`)) and
    keeps the stream open, then a GET on a new stream: (its status, the seconds it took). The
    worker must have closed the first stream with nothing sent on it."""
    st = session.open_stream()
    try:
        st.write(first_frame_cut_short(what))
        st.flush()
        status, took = next_answer(session)
        st.read_timeout = 5
        with pytest.raises((shmipc.EndOfStreamError, shmipc.PeerGoneError)):
            st.readexactly(12)
        return status, took
    finally:
        st.close()


def next_answer(session, target=b"/", timeout=15):
    """A GET to `target` on a new stream: (its status, the seconds it took)."""
    t0 = time.monotonic()
    st = session.open_stream()
    st.read_timeout = timeout
    try:
        st.write(head(b"GET", target) + frame(sf.END))
        st.flush()
        raw = st.readexactly(12)
        typ, length, arg = sf.decode_header(raw)
        assert typ == sf.RESPONSE_HEAD, typ
        status = sf.decode_response(raw + st.readexactly(length))[0]
        while typ != sf.END:
            typ, length, _ = sf.decode_header(st.readexactly(12))
            if length:
                st.readexactly(length)
        return status, time.monotonic() - t0
    finally:
        st.close()


class Running:
    def __init__(self, app):
        self.worker = Worker(app, unique_address("serve"))
        self.thread = threading.Thread(target=self.worker.serve_forever)
        self.thread.start()
        self.front = Front(self.worker.address)

    def stop(self):
        self.front.close()
        self.worker.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def serve():
    running = []

    def start(app):
        r = Running(app)
        running.append(r)
        return r.front

    yield start
    for r in running:
        r.stop()


def echo_app(environ, start_response):
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "application/octet-stream"),
                              ("X-Path", environ["PATH_INFO"])])
    return [body]


def test_wsgiref_validate_wrapped_app(serve):
    seen = {}

    def app(environ, start_response):
        seen.update(environ)
        inp = environ["wsgi.input"]
        # wsgiref.validate allows read() with a size only
        first = inp.readline()
        rest = b"".join(iter(lambda: inp.read(2), b""))
        start_response("200 OK", [("Content-Type", "text/plain"),
                                  ("Content-Length", str(len(first) + len(rest)))])
        return [first, rest]

    front = serve(wsgiref.validate.validator(app))
    status, flags, clen, headers, body, last, _ = front.request(
        b"POST", b"/v?a=1", [("Host", "h"), ("Content-Type", "text/plain")],
        body=b"line one\nline two")
    assert (status, body, last) == (200, b"line one\nline two", sf.END)
    assert flags == sf.RESP_CONTENT_LENGTH and clen == 17
    assert headers == [("Content-Type", "text/plain")]
    assert seen["wsgi.multiprocess"] is True and seen["wsgi.input_terminated"] is True
    # A chunked upload across many frames, and a GET without a body.
    status, _, _, _, body, _, _ = front.request(b"PUT", b"/", [("Host", "h")],
                                                chunks=[b"a\nb", b"c\n", b"d"])
    assert (status, body) == (200, b"a\nbc\nd")
    status, _, clen, _, body, _, _ = front.request(b"GET", b"/", [("Host", "h")])
    assert (status, clen, body) == (200, 0, b"")


def test_echo_unique_bodies_many_requests(serve):
    front = serve(echo_app)
    for i in range(200):
        payload = b"%d:" % i + bytes([i % 256]) * (i * 37 % 5000)
        status, flags, clen, headers, body, last, _ = front.request(
            b"POST", b"/e/%d" % i, body=payload)
        assert (status, body, last, clen) == (200, payload, sf.END, len(payload))
        assert ("X-Path", "/e/%d" % i) in headers


def test_input_readline_readlines_iter_and_sizes(serve):
    got = {}

    def app(environ, start_response):
        inp = environ["wsgi.input"]
        got["a"] = inp.readline(3)
        got["b"] = inp.readline()
        got["c"] = inp.read(4)
        got["d"] = inp.readlines()
        got["e"] = inp.read()
        got["f"] = list(iter(inp))
        start_response("204 No Content", [])
        return []

    front = serve(app)
    status, flags, clen, _, body, last, _ = front.request(
        b"POST", b"/", chunks=[b"hello\nwor", b"ld\n", b"xy\nz"])
    assert (status, body, last) == (204, b"", sf.END)
    assert flags == 0  # a 204 gets no Content-Length
    assert got == {"a": b"hel", "b": b"lo\n", "c": b"worl", "d": [b"d\n", b"xy\n", b"z"],
                   "e": b"", "f": []}


def test_large_response_is_split_into_frames(serve):
    big = bytes(range(256)) * (3 * 4096 + 7)  # over 3 MiB: several BODY frames

    def app(environ, start_response):
        start_response("200 OK", [])
        return [big]

    front = serve(app)
    st, chunks = front.open()
    front.send_body(st, chunks)
    typ, arg, payload = front.read_frame(st)
    assert typ == sf.RESPONSE_HEAD
    sizes = []
    while True:
        typ, arg, payload = front.read_frame(st)
        if typ != sf.BODY:
            break
        sizes.append(len(payload))
    st.close()
    assert typ == sf.END and sum(sizes) == len(big) and max(sizes) == sf.MAX_CHUNK


def test_write_callable_and_streamed_body_without_length(serve):
    def app(environ, start_response):
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"from write, ")
        yield b""
        yield b"then "
        yield bytearray(b"yield")

    front = serve(app)
    status, flags, clen, _, body, last, _ = front.request()
    assert (status, flags, body, last) == (200, 0, b"from write, then yield", sf.END)


def test_memoryview_pieces_are_sent_whole_as_bytes(serve):
    # A memoryview's len() counts its items, not its bytes: the worker sent only the first
    # len() bytes of a view of 4-byte items (and made them the Content-Length of a one-piece
    # list), and refused a view that is not contiguous. The in-process adapter (serve_wsgi.c)
    # takes its bytes whole.
    words = array.array("I", range(1, 7))
    grid = memoryview(bytes(range(12))).cast("B", (3, 4))

    def app(environ, start_response):
        start_response("200 OK", [])
        if environ["PATH_INFO"] == "/one":
            return [memoryview(words)]
        return iter([memoryview(words), memoryview(words)[::2], grid])

    front = serve(app)
    status, flags, clen, _, body, last, _ = front.request(target=b"/one")
    assert (status, clen, body, last) == (200, 24, words.tobytes(), sf.END)
    status, _, _, _, body, last, _ = front.request(target=b"/many")
    assert (status, last) == (200, sf.END)
    assert body == words.tobytes() + words[::2].tobytes() + bytes(range(12))


def test_head_request_sends_no_body_frames(serve):
    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", "5")])
        return [b"hello"] if environ["REQUEST_METHOD"] != "HEAD" else []

    front = serve(app)
    assert front.request(b"HEAD")[:5] == (200, sf.RESP_CONTENT_LENGTH, 5, [], b"")
    assert front.request(b"GET")[:5] == (200, sf.RESP_CONTENT_LENGTH, 5, [], b"hello")


def test_hop_by_hop_headers_become_flags(serve):
    def app(environ, start_response):
        start_response("200 OK", [("Connection", "close"), ("Transfer-Encoding", "chunked"),
                                  ("X-Keep", "1")])
        return [b"a", b"b"]

    front = serve(app)
    status, flags, clen, headers, body, last, _ = front.request()
    # The app's Transfer-Encoding is dropped; the list's length is known, so the worker says it.
    assert (flags, clen, headers, body) == (sf.RESP_CLOSE | sf.RESP_CONTENT_LENGTH, 2,
                                            [("X-Keep", "1")], b"ab")


class Closing:
    """An app iterable that records close() and can fail at a given item."""

    def __init__(self, items, fail_at=None, wait=None):
        self.items, self.fail_at, self.wait = items, fail_at, wait
        self.closed = threading.Event()
        self.yielded = 0

    def __iter__(self):
        for i, x in enumerate(self.items):
            if i == self.fail_at:
                raise RuntimeError("boom in the body")
            if self.wait is not None and i == 1:
                self.wait.wait(10)
            self.yielded += 1
            yield x

    def close(self):
        self.closed.set()


def test_app_raises_before_the_head_gives_500_and_logs_the_traceback(serve, caplog):
    def app(environ, start_response):
        raise KeyError("no such thing")

    front = serve(app)
    with caplog.at_level(logging.ERROR, logger="shmipc.serve"):
        status, flags, clen, headers, body, last, _ = front.request(b"POST", body=b"unread")
    assert (status, body, last) == (500, b"Internal Server Error\n", sf.END)
    assert "KeyError: 'no such thing'" in caplog.text and "Traceback" in caplog.text
    # The worker serves the next request normally.
    assert serve_ok(front)


def serve_ok(front):
    return front.request(b"GET")[5] == sf.END


def test_app_raises_mid_body_aborts_and_closes_the_iterable(serve, caplog):
    it = Closing([b"first", b"second"], fail_at=1)

    def app(environ, start_response):
        start_response("200 OK", [])
        return it

    front = serve(app)
    with caplog.at_level(logging.ERROR, logger="shmipc.serve"):
        status, _, _, _, body, last, arg = front.request()
    assert (status, body, last, arg) == (200, b"first", sf.ABORT, sf.ABORT_WORKER_ERROR)
    assert it.closed.wait(10) and "boom in the body" in caplog.text


def test_close_that_raises_after_the_response_still_reads_the_request(caplog):
    # The response went out whole (END) before the iterable's close() raised: the worker must
    # still read the front's side of the exchange (its END) before it closes the stream.
    # Before, it closed at once, so the front's END (here behind the body the app never read)
    # came as a new stream, answered ABORT PROTOCOL.
    class CloseRaises:
        def __iter__(self):
            yield b"ok"

        def close(self):
            raise RuntimeError("boom in close")

    def app(environ, start_response):
        start_response("200 OK", [])
        return CloseRaises()

    r = Running(app)
    try:
        front = r.front
        st, _ = front.open(method=b"POST", body=b"hello")
        st.flush()  # the head only: the body comes after the answer
        st.read_timeout = 10
        with caplog.at_level(logging.ERROR, logger="shmipc.serve"):
            assert front.response(st)[4:6] == (b"ok", sf.END)
            front.send_body(st, [b"hello"])
            with pytest.raises(shmipc.EndOfStreamError):
                front.read_frame(st)  # the worker's close, nothing else
        st.close()
        assert front.request()[4] == b"ok"
        assert "boom in close" in caplog.text
        end = time.monotonic() + 10  # counted once the worker closed the stream
        while r.worker.counts["error"] < 2 and time.monotonic() < end:
            time.sleep(0.005)
        assert r.worker.counts["protocol"] == 0 and r.worker.counts["error"] == 2
    finally:
        r.stop()


def test_start_response_exc_info(serve):
    def app(environ, start_response):
        start_response("200 OK", [("X-A", "1")])
        try:
            raise ValueError("late")
        except ValueError:
            # Before the head is sent, exc_info replaces the status and headers.
            start_response("503 Service Unavailable", [("X-B", "2")], sys.exc_info())
        return [b"sorry"]

    front = serve(app)
    status, _, _, headers, body, last, _ = front.request()
    assert (status, headers, body, last) == (503, [("X-B", "2")], b"sorry", sf.END)


def test_start_response_exc_info_after_the_head_reraises(serve):
    def app(environ, start_response):
        write = start_response("200 OK", [])
        write(b"partial")
        try:
            raise ValueError("after the head")
        except ValueError:
            start_response("500 Oops", [], sys.exc_info())  # re-raises: the head is out
        return [b"never"]

    front = serve(app)
    status, _, _, _, body, last, arg = front.request()
    assert (status, body, last, arg) == (200, b"partial", sf.ABORT, sf.ABORT_WORKER_ERROR)


def test_start_response_twice_without_exc_info_is_an_app_error(serve):
    def app(environ, start_response):
        start_response("200 OK", [])
        start_response("201 Created", [])
        return [b"x"]

    assert serve(app).request()[0] == 500


@pytest.mark.parametrize("headers", [
    [("X-A", 1)], [("X-A",)], "not a list", [("Bad Name", "x")], [("X", "a\nb")],
])
def test_bad_response_headers_give_500(serve, headers):
    def app(environ, start_response):
        start_response("200 OK", headers)
        return [b"x"]

    assert serve(app).request()[:1] == (500,)


# a 1xx too: the protocol carries one only as an interim head before the final one, so a
# 1xx head then END (what the worker sent before) was a bad exchange to the front (502)
@pytest.mark.parametrize("status", ["200", "2000 X", 200, "099 Low", "600 High", "100 Continue",
                                    "101 Switching Protocols", "103 Early Hints"])
def test_bad_status_gives_500(serve, status):
    def app(environ, start_response):
        start_response(status, [])
        return [b"x"]

    assert serve(app).request()[0] == 500


def test_body_as_str_is_an_app_error(serve):
    def app(environ, start_response):
        start_response("200 OK", [])
        return ["text"]

    assert serve(app).request()[0] == 500


@pytest.mark.parametrize("items,declared", [([b"abc", b"def"], 4), ([b"ab"], 3)])
def test_content_length_mismatch_aborts(serve, items, declared):
    it = Closing(items)

    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", str(declared))])
        return it

    status, flags, clen, _, body, last, arg = serve(app).request()
    assert (status, clen, last, arg) == (200, declared, sf.ABORT, sf.ABORT_WORKER_ERROR)
    assert len(body) <= declared and it.closed.wait(10)


def test_client_gone_while_the_app_reads_the_body(serve):
    seen = {}
    got_first = threading.Event()

    def app(environ, start_response):
        if seen:  # serve_ok's request
            start_response("200 OK", [])
            return []
        inp = environ["wsgi.input"]
        seen["first"] = inp.read(3)
        got_first.set()
        try:
            inp.read()
        except OSError as e:
            seen["error"] = e
            raise
        start_response("200 OK", [])
        return [b"never"]

    front = serve(app)
    st, _ = front.open(b"POST", chunks=[])
    front.send_body(st, [b"abc"], end=False)
    assert got_first.wait(10)
    st.write(frame(sf.ABORT, b"client reset", sf.ABORT_CLIENT_GONE))
    st.flush()
    st.close()
    assert serve_ok(front)
    assert seen["first"] == b"abc"
    assert type(seen["error"]).__name__ == "RequestAborted"


def test_client_gone_while_the_response_streams_stops_the_app(serve):
    release = threading.Event()
    n = 5000

    def pieces():
        # After the first: one a millisecond, for 5 s at most. The ABORT reaches the worker's
        # stream at some point after its flush (its session's reader takes it in); a worker
        # that looks for it between pieces stops long before the last.
        yield b"one"
        for _ in range(n - 1):
            time.sleep(0.001)
            yield b"more"

    it = Closing(pieces(), wait=release)
    calls = []

    def app(environ, start_response):
        calls.append(1)
        start_response("200 OK", [])
        return it if len(calls) == 1 else []

    front = serve(app)
    st, chunks = front.open()
    front.send_body(st, chunks)
    typ, _, _ = front.read_frame(st)
    assert typ == sf.RESPONSE_HEAD
    typ, _, payload = front.read_frame(st)
    assert (typ, payload) == (sf.BODY, b"one")
    st.write(frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
    st.flush()
    release.set()
    assert it.closed.wait(20)
    st.close()
    assert serve_ok(front)
    assert it.yielded < n  # the worker stopped iterating


@pytest.mark.parametrize("how", ["stream", "session"])
def test_front_ends_the_stream_or_session_mid_request(serve, how):
    # No END, no ABORT: the stream ends (the front closed it) or the whole session does (the
    # front went away). The app's read raises RequestAborted; the worker goes on.
    seen = []

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/ok":
            start_response("200 OK", [])
            return []
        try:
            environ["wsgi.input"].read()
        except OSError as e:
            seen.append(e)
            raise
        start_response("200 OK", [])
        return [b"x"]

    front = serve(app)
    st, _ = front.open(b"POST", chunks=[])
    front.send_body(st, [b"abc"], end=False)
    if how == "stream":
        st.close()
    else:
        front.session.close()
        front.session = shmipc.connect(front.session_address, default_config())
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [type(e).__name__ for e in seen] == ["RequestAborted"]
    assert front.request(b"GET", b"/ok")[5] == sf.END


@pytest.mark.parametrize("bad", [
    b"garbage!garbage!",
    frame(sf.BODY, b"x"),  # a body before the head
    frame(sf.REQUEST_HEAD, b"\0" * 60),  # a head breaking its rules
])
def test_bad_frames_from_the_front_get_abort_protocol(serve, bad):
    front = serve(echo_app)
    st = front.session.open_stream()
    st.write(bad)
    st.flush()
    typ, arg, _ = front.read_frame(st)
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
    st.close()
    assert serve_ok(front)


def test_bad_frame_in_the_body_gets_abort_protocol(serve):
    front = serve(echo_app)
    st, _ = front.open(b"POST", chunks=[])
    st.write(frame(sf.RESPONSE_HEAD, b"\0" * 16))  # wrong direction
    st.flush()
    typ, arg, _ = front.read_frame(st)
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
    st.close()
    assert serve_ok(front)


BODY_LIES = [
    # (flags, content_length, BODY payloads): what the head says against what follows
    (sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, 3, [b"abcde"]),
    (sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, 3, [b"ab", b"cde"]),
    (sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, 3, [b"a"]),
    (sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, 3, []),
    (0, 0, [b"xyz"]),
]


@pytest.mark.parametrize("flags,clen,chunks", BODY_LIES)
def test_body_that_contradicts_its_head_is_a_bad_frame(serve, flags, clen, chunks):
    # content_length is the body's exact length, and without HAS_BODY END follows the head at
    # once (docs/serve.md): a body that says otherwise is a protocol error, never a body the
    # app reads (the app saw 5 bytes of a declared 3, or 1 and a clean end).
    seen = []

    def app(environ, start_response):
        seen.append(environ["wsgi.input"].read())
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    front = serve(app)
    st, _ = front.open(b"POST", flags=flags, content_length=clen)
    front.send_body(st, chunks)
    typ, arg, _ = front.read_frame(st)
    st.close()
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL), (typ, arg, seen)
    assert all(len(b) <= clen for b in seen), seen
    assert serve_ok(front)


def test_request_content_length_over_2_63_is_abort_protocol(serve):
    def app(environ, start_response):
        start_response("200 OK", [])
        return [environ.get("CONTENT_LENGTH", "").encode()]

    length_bound_is_kept(serve(app))


BAD_LEFTOVERS = [
    # (flags, content_length, frames the front sends after the worker's answer)
    (sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, 3, [frame(sf.BODY, b"abcde"), frame(sf.END)]),
    (sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, 3, [frame(sf.BODY, b"a"), frame(sf.END)]),
    (sf.REQ_HAS_BODY | sf.REQ_CHUNKED, 0, [frame(sf.WS_DATA, b"x", 0x101)]),
    (sf.REQ_HAS_BODY | sf.REQ_CHUNKED, 0, [frame(sf.HELLO, bytes(8))]),
]


def bad_frames_behind_an_answer(front, flags, clen, frames, target=b"/", answer=b"ok"):
    """Opens a POST (flags, clen) and sends none of its body; the app answers b"ok" without
    reading it. Then the front sends `frames` behind that answer: the worker answers them
    ABORT PROTOCOL. The WSGI and the ASGI workers' cases share it."""
    st, _ = front.open(b"POST", target, flags=flags, content_length=clen)
    st.flush()
    st.read_timeout = 10
    assert front.response(st)[4:6] == (answer, sf.END)
    for f in frames:
        st.write(f)
    st.flush()
    typ, arg, _ = front.read_frame(st)
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
    st.close()


@pytest.mark.parametrize("flags,clen,frames", BAD_LEFTOVERS)
def test_bad_frame_behind_a_body_the_app_never_read(serve, flags, clen, frames):
    # The app answers without reading its body; the front's frames after the answer break the
    # protocol. The worker reads them after its END (its drain): ABORT PROTOCOL, and the
    # session serves on. Before, the ProtocolViolation escaped the drain and ended the
    # session's thread, and the session with it (every request on it lost).
    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"ok"]

    front = serve(app)
    bad_frames_behind_an_answer(front, flags, clen, frames)
    assert serve_ok(front)


def test_cross_talk_concurrent_streams_over_two_workers(serve):
    fronts = [serve(echo_app), serve(echo_app)]
    errors, mismatches = [], []

    def client(k):
        front = fronts[k % 2]
        try:
            for i in range(25):
                payload = b"client %d request %d " % (k, i) + bytes([k]) * (k * 131 % 3000)
                st, chunks = front.open(b"POST", b"/c/%d/%d" % (k, i), body=payload)
                front.send_body(st, chunks)
                status, _, _, headers, body, last, _ = front.response(st)
                st.close()
                if (status, body, last) != (200, payload, sf.END) or \
                        ("X-Path", "/c/%d/%d" % (k, i)) not in headers:
                    mismatches.append((k, i, status, body[:40]))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == [] and mismatches == []


# ---- the worker as a process (python -m shmipc.serve.worker) ---------------------------

import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402

from conftest import python_env  # noqa: E402

APP = '''
import os, time
def app(environ, start_response):
    if environ["PATH_INFO"] == "/slow":
        open("slow.started", "w").close()
        time.sleep(float(environ["QUERY_STRING"]))
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("X-Pid", str(os.getpid()))])
    return [body]
'''


class WorkerProcess:
    def __init__(self, tmp_path, spec="wapp:app", args=()):
        (tmp_path / "wapp.py").write_text(APP)
        self.address = unique_address("proc")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shmipc.serve.worker", spec, "--address", self.address,
             *args],
            cwd=tmp_path, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)

    def ready(self):
        line = self.proc.stdout.readline()
        assert "ready on" in line, (line, self.proc.stderr.read() if self.proc.poll() else "")
        return Front(self.address)

    def in_slow(self, tmp_path, timeout=30):
        """Waits until the app is in /slow's sleep (it marks it in its directory): a fixed
        wait came before the request on a loaded machine, and a request not yet started at
        SIGTERM is handed back (ABORT_SHUTDOWN), not answered."""
        mark = tmp_path / "slow.started"
        deadline = time.monotonic() + timeout
        while not mark.exists():
            assert time.monotonic() < deadline, "the app never entered /slow"
            assert self.proc.poll() is None, self.proc.stderr.read()
            time.sleep(0.005)

    def finish(self, timeout=10):
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc.stderr.close()


def test_worker_process_serves_and_stops_on_sigterm_after_the_request(tmp_path):
    w = WorkerProcess(tmp_path)
    front = w.ready()
    status, _, _, headers, body, last, _ = front.request(b"POST", b"/", body=b"ping")
    assert (status, body, last) == (200, b"ping", sf.END)
    assert ("X-Pid", str(w.proc.pid)) in headers
    # SIGTERM while a request is at the worker: that request is answered, then it exits 0.
    st, chunks = front.open(b"POST", b"/slow?0.5", body=b"last")
    front.send_body(st, chunks)
    w.in_slow(tmp_path)
    w.proc.send_signal(signal.SIGTERM)
    status, _, _, _, body, last, _ = front.response(st)
    assert (status, body, last) == (200, b"last", sf.END)
    st.close()
    assert w.finish() == 0
    front.close()


def test_worker_process_killed_mid_request_ends_the_front_stream(tmp_path):
    # What the front maps to 502: the worker's death ends the stream and the session at once.
    w = WorkerProcess(tmp_path)
    front = w.ready()
    st, chunks = front.open(b"POST", b"/slow?30", body=b"x")
    front.send_body(st, chunks)
    w.in_slow(tmp_path)
    w.proc.kill()
    t0 = time.monotonic()
    with pytest.raises((shmipc.PeerGoneError, shmipc.EndOfStreamError, shmipc.ClosedError)):
        front.response(st)
    assert time.monotonic() - t0 < 5
    assert w.finish() == -signal.SIGKILL
    front.close()


ASGI_APP = """
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"asgi"})
"""


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_worker_process_ends_on_a_sigterm_at_any_instant(tmp_path, kind):
    # Regression: a worker whose supervisor got SIGKILL lived on. The kernel sent the worker its
    # parent-death SIGTERM twice (once for each supervisor thread that exited holding it), and
    # CPython ran the second handler inside the first one's threading.Event.set(), which held
    # the Event's lock: the nested set() waited for that lock forever. Here, once the idle
    # worker has our SIGTERM, it gets another at each point its main thread passes, in the
    # handler and after it (sigterm_everywhere.py): it must still end, and exit 0, soon.
    from sigterm_everywhere import run_and_stop

    (tmp_path / "wapp.py").write_text(APP)
    (tmp_path / "aapp.py").write_text(ASGI_APP)
    spec = ("--asgi", "aapp:app") if kind == "asgi" else ("wapp:app",)
    run_and_stop(["shmipc.serve.worker", *spec, "--address", unique_address("everywhere"),
                  "--parent-pid", str(os.getpid())],
                 "ready on", "the worker", 10, 3, cwd=tmp_path, env=python_env())


@pytest.mark.parametrize("spec,why", [
    ("wapp", "not module:callable"), ("nosuch:app", "ModuleNotFoundError"),
    ("wapp:missing", "AttributeError"), ("wapp:os", "not callable")])
def test_worker_process_refuses_a_bad_app(tmp_path, spec, why):
    w = WorkerProcess(tmp_path, spec)
    try:
        assert w.proc.wait(20) == 2
        assert why in w.proc.stderr.read()
    finally:
        w.finish()


def test_codec_stub_names_match_the_module():
    import ast

    stub = os.path.join(os.path.dirname(sf.__file__), "_serve.pyi")
    tree = ast.parse(open(stub).read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    runtime = {n for n in dir(sf) if not n.startswith("_")}
    assert {n for n in names if not n.startswith("_")} == runtime


def test_worker_process_exits_0_after_max_requests(tmp_path):
    # --max-requests 3: the third request is answered in full, then the process exits 0 (the
    # supervisor starts a fresh one at once); a request after it is not served.
    w = WorkerProcess(tmp_path, args=("--max-requests", "3"))
    front = w.ready()
    for i in range(3):
        status, _, _, headers, body, last, _ = front.request(b"POST", b"/", body=b"r%d" % i)
        assert (status, body, last) == (200, b"r%d" % i, sf.END)
        assert ("X-Pid", str(w.proc.pid)) in headers
    assert w.finish() == 0
    with pytest.raises((shmipc.PeerGoneError, shmipc.EndOfStreamError, shmipc.ClosedError)):
        front.request(b"GET", b"/")
    front.close()


def test_worker_max_requests_counts_only_requests(tmp_path):
    # A late ABORT (a stream with only ABORT) is not a request: it does not use up the count.
    worker = Worker(lambda e, sr: (sr("200 OK", []), [b"x"])[1], unique_address("maxreq"),
                    max_requests=2)
    t = threading.Thread(target=worker.serve_forever)
    t.start()
    try:
        front = Front(worker.address)
        st = front.session.open_stream()
        st.write(frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
        st.flush()
        status, *_ = front.request(b"GET", b"/")
        assert status == 200
        assert t.is_alive()
        status, *_ = front.request(b"GET", b"/")
        assert status == 200
        t.join(10)
        assert not t.is_alive()
        assert worker.served == 2 and worker.counts["late"] == 1
        front.close()
    finally:
        worker.stop()
        t.join(10)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True, None])
def test_worker_max_requests_refuses_bad_values(bad):
    with pytest.raises(ValueError):
        Worker(lambda e, sr: [], unique_address("maxbad"), max_requests=bad)


@pytest.mark.parametrize("arg", ["-1", "x", ""])
def test_worker_process_refuses_bad_max_requests(tmp_path, arg):
    w = WorkerProcess(tmp_path, args=("--max-requests", arg))
    try:
        assert w.proc.wait(20) == 2
        assert "max-requests" in w.proc.stderr.read()
    finally:
        w.finish()


def test_requests_past_max_requests_are_refused_with_abort_shutdown():
    # Two requests sent at once to a worker with --max-requests 1: the first is served, the
    # second is answered ABORT SHUTDOWN ("not processed": the front gives it to another
    # worker), not dropped with the session (which the front had to answer 502).
    worker = Worker(lambda e, sr: (sr("200 OK", []), [e["wsgi.input"].read()])[1],
                    unique_address("maxshut"), max_requests=1)
    t = threading.Thread(target=worker.serve_forever)
    t.start()
    try:
        front = Front(worker.address)
        st1, c1 = front.open(b"POST", b"/", body=b"one")
        st2, c2 = front.open(b"POST", b"/", body=b"two")
        # The first one's head, the second one whole, then the first one's body: the worker
        # has the second before it can finish the first (sent the other way round, a loaded
        # machine let it finish and leave first: the second's flush found the session gone).
        front.send_body(st1, None, end=False)
        front.send_body(st2, c2)
        front.send_body(st1, c1)
        status, _, _, _, body, last, _ = front.response(st1)
        assert (status, body, last) == (200, b"one", sf.END)
        status, _, _, _, _, last, arg = front.response(st2)
        assert (status, last, arg) == (None, sf.ABORT, sf.ABORT_SHUTDOWN)
        st1.close()
        st2.close()
        t.join(10)
        assert not t.is_alive()
        assert worker.served == 1
        front.close()
    finally:
        worker.stop()
        t.join(10)


def test_a_hello_past_max_requests_is_refused_with_abort_shutdown():
    # A new session's HELLO that reaches a worker past --max-requests is answered ABORT
    # SHUTDOWN: the front sends that session nothing more. (The worker closed the stream
    # without a word, which says "I do not know HELLO": the front then sent it uploads
    # without TAKEN, and its refusal after the body was a 503.)
    worker = Worker(lambda e, sr: (sr("200 OK", []), [e["wsgi.input"].read()])[1],
                    unique_address("maxhello"), max_requests=1)
    t = threading.Thread(target=worker.serve_forever)
    t.start()
    try:
        front = Front(worker.address)
        st1, c1 = front.open(b"POST", b"/", body=b"one")
        front.send_body(st1, None, end=False)
        hello = front.session.open_stream()
        hello.write(sf.encode_frame(sf.HELLO, struct.pack("<II", sf.FEAT_TAKEN, 0)))
        hello.flush()
        front.send_body(st1, c1)
        status, _, _, _, body, last, _ = front.response(st1)
        assert (status, body, last) == (200, b"one", sf.END)
        status, _, _, _, _, last, arg = front.response(hello)
        assert (status, last, arg) == (None, sf.ABORT, sf.ABORT_SHUTDOWN)
        st1.close()
        hello.close()
        t.join(10)
        assert not t.is_alive()
        front.close()
    finally:
        worker.stop()
        t.join(10)


def test_stop_refuses_a_request_waiting_behind_the_one_in_progress():
    # SIGTERM (stop()) while a request is served and another waits on the same session: the
    # first finishes, the waiting one is refused with ABORT SHUTDOWN; and the listener is
    # closed before the in-progress request ends, so a front reconnecting meanwhile is
    # refused at once instead of waiting out its handshake timeout.
    entered, release = threading.Event(), threading.Event()

    def app(environ, start_response):
        entered.set()
        release.wait(10)
        start_response("200 OK", [])
        return [b"done"]

    worker = Worker(app, unique_address("stopshut"))
    t = threading.Thread(target=worker.serve_forever)
    t.start()
    try:
        front = Front(worker.address)
        st1, c1 = front.open(b"GET", b"/")
        front.send_body(st1, c1)
        assert entered.wait(10)
        st2, c2 = front.open(b"GET", b"/second")
        front.send_body(st2, c2)
        worker.stop()
        t0 = time.monotonic()
        deadline = t0 + 10
        while time.monotonic() < deadline:
            try:
                # A connect that waited on a listener nobody accepts on would take these 20 s.
                shmipc.connect(worker.address, shmipc.Config(initialize_timeout=20)).close()
            except shmipc.Error:
                break
            time.sleep(0.05)
        assert time.monotonic() - t0 < 10, "a connect waited on a listener nobody accepts on"
        release.set()
        status, _, _, _, body, last, _ = front.response(st1)
        assert (status, body, last) == (200, b"done", sf.END)
        status, _, _, _, _, last, arg = front.response(st2)
        assert (last, arg) == (sf.ABORT, sf.ABORT_SHUTDOWN)
        t.join(10)
        assert not t.is_alive()
        front.close()
    finally:
        release.set()
        worker.stop()
        t.join(10)


def test_stopping_worker_exits_though_a_front_stalls_a_refused_stream():
    # A front (hostile or stuck) that opens a stream and sends only part of a frame header, or
    # a request whose body trickles forever, while the worker stops: the refusal waits for it
    # at most its bound, and the worker exits. Before, refuse() read that header with the
    # stream's read timeout (forever by default) and the stopping worker never exited.
    entered, go = threading.Event(), threading.Event()

    def app(environ, start_response):
        entered.set()
        go.wait(10)
        start_response("200 OK", [])
        return [b"ok"]

    worker = Worker(app, unique_address("stallrefuse"), max_requests=1)
    t = threading.Thread(target=worker.serve_forever)
    t.start()
    stop_trickle = threading.Event()
    try:
        front = Front(worker.address)
        st1, c1 = front.open(b"GET", b"/")
        front.send_body(st1, c1)
        assert entered.wait(10)
        stalled = front.session.open_stream()
        stalled.write(frame(sf.END)[:5])  # 5 of a header's 12 bytes, never the rest
        stalled.flush()
        trickled, _ = front.open(b"POST", b"/", chunks=[])
        trickled.flush()

        def trickle():  # a BODY frame every 0.5 s, never END
            while not stop_trickle.wait(0.5):
                try:
                    trickled.write(frame(sf.BODY, b"x"))
                    trickled.flush()
                except shmipc.Error:
                    return

        tt = threading.Thread(target=trickle, daemon=True)
        tt.start()
        go.set()
        status, _, _, _, body, last, _ = front.response(st1)
        assert (status, body, last) == (200, b"ok", sf.END)
        t0 = time.monotonic()
        t.join(20)
        assert not t.is_alive(), "the stopping worker hangs on a stalled refused stream"
        assert time.monotonic() - t0 < 15
        stop_trickle.set()
        tt.join(5)
        front.close()
    finally:
        go.set()
        stop_trickle.set()
        worker.stop()
        t.join(20)
