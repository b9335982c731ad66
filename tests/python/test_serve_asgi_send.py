"""shmipc._serve.ASGISend, the in-process ASGI adapter's send() in C (python/shmipc/serve_asgi.c),
alone: every refusal of http.response.start and http.response.body, the hop-by-hop fields, the
Content-Length checks, HEAD and bodyless statuses, the answer handed over once and filtered,
on_complete, and the awaitable it returns. No server: a recording stand-in for the
PendingResponse."""
import asyncio
import sys

import pytest

from shmipc import _serve as sf


class Pending:
    def __init__(self, fail=None):
        self.calls = []
        self.fail = fail

    def send(self, status, fields, body):
        self.calls.append((status, fields, body))
        if self.fail:
            raise self.fail
        return True


def start(status=200, headers=()):
    return {"type": "http.response.start", "status": status, "headers": list(headers)}


def body(b=b"", more=False):
    return {"type": "http.response.body", "body": b, "more_body": more}


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def test_a_whole_answer_once_with_the_servers_fields_filtered():
    p = Pending()
    r = sf.ASGISend("GET", p)

    async def app():
        assert await r.send(start(201, [(b"X-A", b"1"), (b"Date", b"x"), (b"Server", b"y"),
                                        (b"Content-Type", b"a/b"), (b"content-type", b"c/d"),
                                        (bytearray(b"X-B"), bytearray(b"2")),
                                        (b"Connection", b"keep-alive, Close"),
                                        (b"Transfer-Encoding", b"chunked"),
                                        (b"Content-Length", b" 6 ")])) is None
        await r.send(body(b"abc", True))
        await r.send(body(memoryview(b"de"), True))
        await r.send(body(bytearray(b"f")))
    run(app())
    assert r.complete and r.started
    assert p.calls == [(201, [(b"X-A", b"1"), (b"Content-Type", b"a/b"), (b"X-B", b"2"),
                              (b"Connection", b"close")], b"abcdef")]


def test_bodies_of_any_buffer_are_their_bytes():
    # As the pool's worker (test_serve_asgi.py test_bodies_of_any_buffer_are_sent_whole): a
    # memoryview of 4-byte items is its bytes, a strided one too.
    import array
    words = array.array("I", [0x01020304, 0x05060708])
    p = Pending()
    r = sf.ASGISend("GET", p)

    async def app():
        await r.send(start(200))
        await r.send(body(memoryview(words), True))
        await r.send(body(memoryview(b"a-b-")[::2]))
    run(app())
    assert p.calls == [(200, [], words.tobytes() + b"ab")]


@pytest.mark.parametrize("messages,exc", [
    ([42], TypeError),
    ([{"type": "nope"}], ValueError),
    ([{}], ValueError),
    ([body(b"x")], RuntimeError),
    ([start(), start()], RuntimeError),
    ([start(99)], ValueError),
    ([start(600)], ValueError),
    ([start(True)], ValueError),
    ([start("200")], ValueError),
    ([start(200.0)], ValueError),
    ([{"type": "http.response.start"}], KeyError),
    ([start(200, [(b"a", b"b", b"c")])], ValueError),
    ([start(200, [("str-name", b"v")])], TypeError),
    ([start(200, [(b"n", "str-value")])], TypeError),
    ([start(200, [5])], TypeError),
    ([{"type": "http.response.start", "status": 200, "headers": 5}], TypeError),
    ([start(200, [(b"Content-Length", b"abc")])], ValueError),
    ([start(200, [(b"Content-Length", b"99999999999999999999999")])], ValueError),
    ([start(200, [(b"Content-Length", b"")])], ValueError),
    ([start(200, [(b"Content-Length", b"2")]), body(b"abc")], RuntimeError),
    ([start(200, [(b"Content-Length", b"4")]), body(b"abc")], RuntimeError),
    ([start(), body("text")], TypeError),
    ([start(), body(b"x"), body(b"y")], RuntimeError),
])
def test_refusals(messages, exc):
    p = Pending()
    r = sf.ASGISend("GET", p)
    with pytest.raises(exc):
        for m in messages:
            r.send(m)
    if messages[-1] == body(b"y"):  # a message after the complete response
        assert r.complete and p.calls == [(200, [], b"x")]
    else:  # nothing was handed over
        assert not r.complete and p.calls == []


def test_a_header_generator_that_raises_leaves_it_unstarted():
    def gen():
        yield (b"a", b"b")
        raise ZeroDivisionError("midway")
    r = sf.ASGISend("GET", Pending())
    with pytest.raises(ZeroDivisionError):
        r.send({"type": "http.response.start", "status": 200, "headers": gen()})
    assert not r.started
    r.send(start())  # still possible


def test_more_body_whose_truth_raises():
    class Bad:
        def __bool__(self):
            raise ZeroDivisionError("bool")
    r = sf.ASGISend("GET", Pending())
    r.send(start())
    with pytest.raises(ZeroDivisionError):
        r.send({"type": "http.response.body", "body": b"x", "more_body": Bad()})
    assert not r.complete


@pytest.mark.parametrize("method,status", [("HEAD", 204), ("GET", 204), ("GET", 304)])
def test_bodyless_answers_drop_the_body_and_skip_the_length_check(method, status):
    p = Pending()
    r = sf.ASGISend(method, p)
    r.send(start(status, [(b"Content-Length", b"100")]))
    r.send(body(b"some bytes"))
    assert p.calls == [(status, [], b"")]


@pytest.mark.parametrize("own,pieces,want", [
    (b"100", [b"some bytes"], b"100"),  # the app's own length, whatever it sends
    (b"10", [], b"10"),                 # as Werkzeug answers HEAD: the length, no body
    (None, [b"ab", b"cde"], b"5"),      # the bytes it gave, as GET's Content-Length
    (None, [], b"0"),
])
def test_head_says_gets_length_and_drops_the_body(own, pieces, want):
    """Regression: the body of an answer to HEAD was dropped with its length, so the server
    said "Content-Length: 0" where GET's answer said the body's length."""
    p = Pending()
    r = sf.ASGISend("HEAD", p)
    r.send(start(200, [(b"Content-Length", own)] if own is not None else []))
    for i, piece in enumerate(pieces):
        r.send(body(piece, more=i < len(pieces) - 1))
    if not pieces:
        r.send(body(b""))
    assert p.calls == [(200, [(b"Content-Length", want)], b"")]


def test_the_pendings_refusal_reaches_the_app_and_the_response_is_complete():
    p = Pending(fail=ValueError("invalid response"))
    r = sf.ASGISend("GET", p)
    r.send(start(200, [(b"X", b"a\r\nb")]))
    with pytest.raises(ValueError, match="invalid response"):
        r.send(body(b"x"))
    assert r.complete and len(p.calls) == 1
    with pytest.raises(RuntimeError, match="complete"):
        r.send(body(b"again"))


def test_on_complete_once_and_its_error_is_unraisable():
    seen, unraisable = [], []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(u.exc_value)
    try:
        r = sf.ASGISend("GET", Pending())
        r.on_complete = lambda: seen.append(1)
        r.send(start())
        r.send(body(b"a", True))
        assert seen == []
        r.send(body(b"b"))
        assert seen == [1] and r.on_complete is None

        r = sf.ASGISend("GET", Pending())
        r.on_complete = lambda: 1 / 0
        r.send(start())
        r.send(body())
    finally:
        sys.unraisablehook = old
    assert len(unraisable) == 1 and isinstance(unraisable[0], ZeroDivisionError)


def test_the_awaitable_is_done():
    r = sf.ASGISend("GET", Pending())
    aw = r.send(start())
    it = aw.__await__()
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(StopIteration):
        it.send(None)
    with pytest.raises(KeyError):
        it.throw(KeyError("k"))
    with pytest.raises(KeyError):
        it.throw(KeyError)
    with pytest.raises(KeyError, match="given"):
        it.throw(KeyError, "given")
    with pytest.raises(TypeError, match="deriving from BaseException"):
        it.throw(1)
    it.close()


def test_constructor_misuse_and_gc():
    with pytest.raises(TypeError):
        sf.ASGISend(b"GET", Pending())
    with pytest.raises(TypeError):
        sf.ASGISend("GET")
    import gc
    import weakref
    r = sf.ASGISend("GET", Pending())
    r.on_complete = r.send  # a cycle through the object
    w = weakref.ref(r)
    del r
    gc.collect()
    assert w() is None


def test_uninitialized_is_an_error_not_a_crash():
    # ASGISend.__new__ without __init__ has no PendingResponse: the last body message called
    # its send() through a NULL pointer (a segfault).
    r = sf.ASGISend.__new__(sf.ASGISend)
    with pytest.raises(RuntimeError, match="no PendingResponse"):
        r.send(start())
    with pytest.raises(RuntimeError, match="no PendingResponse"):
        r.send({"type": "http.response.body", "body": b"x"})
    r.__init__("GET", Pending())
    r.send(start())
    r.send({"type": "http.response.body", "body": b"x"})
    assert r.complete


# shmipc._serve.asgi_start: the same checks of http.response.start for the pool's ASGI worker
# (shmipc/serve/asgi.py, _Http._start), which sends the response itself.

def test_asgi_start_splits_the_hop_by_hop_fields_out():
    status, fields, close, length = sf.asgi_start(start(201, [
        (b"X-A", b"1"), (bytearray(b"X-B"), bytearray(b"2")), (b"Connection", b"keep-alive, Close"),
        (b"Transfer-Encoding", b"chunked"), (b"Content-Length", b" 6 "), (b"Date", b"x")]))
    # Date stays: the worker's fields go to the front, which drops and adds its own.
    assert (status, fields, close, length) == (201, [(b"X-A", b"1"), (b"X-B", b"2"),
                                                     (b"Date", b"x")], True, 6)
    assert sf.asgi_start({"status": 200}) == (200, [], False, None)
    assert sf.asgi_start(start(599, iter([(b"a", b"b")]))) == (599, [(b"a", b"b")], False, None)
    assert sf.asgi_start(start(200, [(b"content-length", b"0")]))[3] == 0


@pytest.mark.parametrize("message,exc", [
    (42, TypeError),
    (None, TypeError),
    ([("status", 200)], TypeError),
    ({}, KeyError),
] + [(m[0], e) for m, e in [
    ([start(99)], ValueError),
    ([start(600)], ValueError),
    ([start(-1)], ValueError),
    ([start(2 ** 64)], ValueError),
    ([start(True)], ValueError),
    ([start("200")], ValueError),
    ([start(200.0)], ValueError),
    ([start(None)], ValueError),
    ([start(200, [(b"a", b"b", b"c")])], ValueError),
    ([start(200, [(b"a",)])], ValueError),
    ([start(200, [("str-name", b"v")])], TypeError),
    ([start(200, [(b"n", "str-value")])], TypeError),
    ([start(200, [(b"n", memoryview(b"v"))])], TypeError),
    ([start(200, [5])], TypeError),
    ([start(200, [None])], TypeError),
    ([{"type": "http.response.start", "status": 200, "headers": 5}], TypeError),
    ([start(200, [(b"Content-Length", b"abc")])], ValueError),
    ([start(200, [(b"Content-Length", b"-1")])], ValueError),
    ([start(200, [(b"Content-Length", b"+1")])], ValueError),
    ([start(200, [(b"Content-Length", b"99999999999999999999999")])], ValueError),
    ([start(200, [(b"Content-Length", b"")])], ValueError),
]])
def test_asgi_start_refusals(message, exc):
    with pytest.raises(exc):
        sf.asgi_start(message)


def test_asgi_start_a_header_generator_that_raises():
    def gen():
        yield (b"a", b"b")
        raise ZeroDivisionError("midway")
    with pytest.raises(ZeroDivisionError):
        sf.asgi_start({"status": 200, "headers": gen()})
    rc = sys.getrefcount(b"a")
    for _ in range(1000):  # nothing kept: the fields made before the error are freed
        with pytest.raises(ValueError):
            sf.asgi_start(start(200, [(b"a", b"b"), (b"Content-Length", b"x")]))
    assert sys.getrefcount(b"a") <= rc + 1
