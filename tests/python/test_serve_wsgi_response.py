"""shmipc._serve.WSGIResponse (python/shmipc/serve_wsgi.c): PEP 3333's start_response and the
collecting of a body, in C, for both WSGI adapters. Attacked directly: every argument wrong,
edge values of the status and Content-Length, exc_info in each state, writes in each state,
subclasses that skip __init__ or delete members, iterables that fail, and no reference or
memory leaked on the error paths."""
import gc
import subprocess
import sys
import textwrap
import tracemalloc

import pytest

import shmipc._serve as sf
from shmipc.serve import wsgi as _wsgi


def started(method="GET", status="200 OK", headers=None):
    r = sf.WSGIResponse(method)
    r.start_response(status, [("Content-Type", "text/plain")] if headers is None else headers)
    return r


# ---- start_response -----------------------------------------------------------------------

@pytest.mark.parametrize("status", ["200 OK", "599 X", "200 ", "404 Not Found", "204 No Content"])
def test_good_status(status):
    r = started(status=status)
    assert (r.status, r.code) == (status, int(status[:3]))


@pytest.mark.parametrize("status,exc", [
    ("200", ValueError), ("200OK", ValueError), ("2000 OK", ValueError), ("199 X", ValueError),
    ("100 Continue", ValueError), ("101 Switching", ValueError), ("600 X", ValueError),
    ("-20 X", ValueError), ("20x X", ValueError), ("", ValueError), (" 200 OK", ValueError),
    # Digits other than ASCII are refused: the code goes on the wire.
    ("\u0662\u0660\u0660 OK", ValueError), ("２００ OK", ValueError),
    (b"200 OK", TypeError), (200, TypeError), (None, TypeError),
])
def test_bad_status(status, exc):
    r = sf.WSGIResponse("GET")
    with pytest.raises(exc):
        r.start_response(status, [])
    assert r.status is None  # nothing taken: the app may still answer


@pytest.mark.parametrize("headers,exc", [
    ((("A", "b"),), TypeError),             # a tuple, not a list
    ({"A": "b"}, TypeError),
    (None, TypeError),
    ([("A",)], TypeError),
    ([("A", "b", "c")], TypeError),
    ([["A", "b"]], TypeError),              # a list, not a tuple
    ([(b"A", "b")], TypeError),
    (["A: b"], TypeError),
    ([("A", None)], TypeError),
    ([("Content-Length", "x")], ValueError),
    ([("Content-Length", "")], ValueError),
    ([("Content-Length", "-1")], ValueError),
    ([("Content-Length", "+1")], ValueError),
    ([("Content-Length", "1 2")], ValueError),
    ([("Content-Length", "0x10")], ValueError),
    ([("Content-Length", "\u0661\u0663")], ValueError),   # Arabic-Indic digits
    ([("Content-Length", "18446744073709551616")], ValueError),  # 2**64
    ([("Content-Length", "9" * 400)], ValueError),
])
def test_bad_headers(headers, exc):
    r = sf.WSGIResponse("GET")
    with pytest.raises(exc):
        r.start_response("200 OK", headers)
    assert (r.status, r.headers, r.length) == (None, None, None)


def test_hop_by_hop_fields_are_dropped_and_read():
    r = started(headers=[
        ("Content-Type", "text/plain"), ("CONTENT-LENGTH", " 13\t"), ("Connection", "Keep-Alive, CLOSE"),
        ("Keep-Alive", "timeout=5"), ("Transfer-Encoding", "chunked"), ("TE", "x"),
        ("Trailer", "x"), ("Upgrade", "h2c"), ("Proxy-Connection", "x"), ("X-Te", "kept"),
        ("Connections", "kept")])
    assert r.headers == [("Content-Type", "text/plain"), ("X-Te", "kept"), ("Connections", "kept")]
    assert (r.length, r.flags) == (13, sf.RESP_CLOSE)
    assert started(headers=[("Connection", "keep-alive")]).flags == 0
    # Up to 2**63 - 1, ASGI's bound too: the server sends no larger one (test_serve_head.py).
    assert started(headers=[("Content-Length", "9223372036854775807")]).length == 2**63 - 1
    for big in ("9223372036854775808", "18446744073709551615", "9" * 100):
        with pytest.raises(ValueError, match="is more than 9223372036854775807"):
            started(headers=[("Content-Length", big)])
    with pytest.raises(ValueError, match="bad Content-Length"):
        started(headers=[("Content-Length", "9" * 30 + "x")])
    # The last Content-Length counts, as in the Python code before.
    assert started(headers=[("Content-Length", "1"), ("Content-Length", "2")]).length == 2
    assert sf.HOP_FIELDS == frozenset(("connection", "keep-alive", "proxy-connection",
                                       "transfer-encoding", "te", "trailer", "upgrade",
                                       "content-length"))


def test_start_response_arguments():
    r = sf.WSGIResponse("GET")
    with pytest.raises(TypeError):
        r.start_response()
    with pytest.raises(TypeError):
        r.start_response("200 OK")
    with pytest.raises(TypeError):
        r.start_response("200 OK", [], None, None)
    with pytest.raises(TypeError):
        r.start_response("200 OK", [], bogus=1)
    with pytest.raises(TypeError):
        r.start_response("200 OK", [], status="200 OK")
    w = r.start_response(headers=[], status="201 Created", exc_info=None)
    assert w == r.write and r.code == 201
    with pytest.raises(TypeError):
        sf.WSGIResponse()
    with pytest.raises(TypeError):
        sf.WSGIResponse(b"GET")


def test_twice_without_exc_info_is_an_error_and_exc_info_replaces_the_head():
    r = started()
    with pytest.raises(AssertionError):
        r.start_response("500 X", [])
    assert r.code == 200
    try:
        raise KeyError("boom")
    except KeyError:
        r.start_response("500 Internal", [("X", "y")], sys.exc_info())
    assert (r.code, r.headers) == (500, [("X", "y")])


def test_exc_info_after_the_head_raises_it_again_with_its_traceback():
    r = started()
    r.write(b"x")
    try:
        raise KeyError("boom")
    except KeyError:
        info = sys.exc_info()
    with pytest.raises(KeyError) as e:
        r.start_response("500 X", [], info)
    assert e.value is info[1] and e.value.__traceback__ is not None
    for bad in ((1, 2), "abc", (KeyError, "not an exception", None), None):
        if bad is None:
            continue
        with pytest.raises(TypeError):
            r.start_response("500 X", [], bad)
    assert r.code == 200


# ---- write and collect --------------------------------------------------------------------

def test_write_and_collect():
    r = started(headers=[("Content-Type", "text/plain"), ("Date", "x"), ("server", "y"),
                         ("Content-Type", "second"), ("Connection", "close")])
    r.write(b"ab")
    r.write(bytearray(b"cd"))
    r.write(memoryview(b"0e1f2")[1::2])  # not contiguous
    r.write(b"")
    assert r.collect([b"g", memoryview(b"h")]) == (
        200, [(b"Content-Type", b"text/plain"), (b"Connection", b"close")], b"abcdefgh")
    assert r.sent == 8 and r.head_sent


def test_write_misuse():
    r = sf.WSGIResponse("GET")
    r.write(b"")  # nothing to send: fine before start_response
    with pytest.raises(AssertionError):
        r.write(b"x")
    with pytest.raises(AssertionError):
        r.collect([])
    with pytest.raises(AssertionError):
        sf.WSGIResponse("GET").collect([b"x"])
    r = started()
    for bad in ("text", 1, None, [b"x"]):
        with pytest.raises(TypeError):
            r.write(bad)
    with pytest.raises(TypeError):
        r.collect(None)
    with pytest.raises(TypeError):
        r.collect(["text"])


def test_content_length_is_kept_both_ways():
    r = started(headers=[("Content-Length", "3")])
    r.write(b"ab")
    with pytest.raises(ValueError):
        r.write(b"cd")
    assert r.sent == 2
    with pytest.raises(ValueError):
        r.collect([])
    assert started(headers=[("Content-Length", "2")]).collect([b"a", b"b"])[2] == b"ab"
    # Bodyless answers keep no body and check no length.
    for method, status in (("HEAD", "200 OK"), ("GET", "204 No Content"), ("GET", "304 X")):
        r = started(method, status, [("Content-Length", "5")])
        assert r._bodyless()
        assert r.collect([b"abcdefgh"])[2] == b"" and r.head_sent
    assert not started()._bodyless()


def test_an_iterable_that_fails_or_lies():
    def gen():
        yield b"a"
        raise RuntimeError("mid-way")

    r = started()
    with pytest.raises(RuntimeError):
        r.collect(gen())

    class Len:
        def __iter__(self):
            return iter([b"x"])

        def __len__(self):
            return 99

    assert started().collect(Len())[2] == b"x"
    with pytest.raises(UnicodeEncodeError):
        started(headers=[("X", "\u20ac")]).collect([])
    assert started(headers=[("X", "\xe9")]).collect([])[1] == [(b"X", b"\xe9")]


def test_subclasses_that_skip_init_or_delete_members():
    class Bare(sf.WSGIResponse):
        def __init__(self):
            pass

    b = Bare()
    assert (b.status, b.method, b.length) == (None, None, None)
    with pytest.raises(AssertionError):
        b.collect([])
    assert b.start_response("200 OK", []) is not None
    assert not b._bodyless()  # no method: not a HEAD
    b.write(b"x")
    del b.length
    assert b.collect([b"y"])[2] == b"xy"
    with pytest.raises(AttributeError):
        b.status = "200 OK"
    r = started(headers=[("Content-Length", "1")])
    r.length = "not an int"
    with pytest.raises(TypeError):
        r.write(b"x")
    r.length = -1
    with pytest.raises(OverflowError):
        r.write(b"x")
    # __init__ again starts over.
    r = started()
    r.write(b"x")
    r.__init__("HEAD")
    assert (r.status, r.sent, r.head_sent, r.method) == (None, 0, False, "HEAD")


def test_the_workers_subclass_keeps_its_slots():
    r = _wsgi._Response("the exchange", "GET")
    assert (r.ex, r.hold, r.status) == ("the exchange", False, None)
    w = r.start_response("200 OK", [("Content-Length", "2")])
    assert w == r.write and type(w).__name__ == "method"  # the subclass's write, which sends
    with pytest.raises(AttributeError):
        r.other = 1


def test_response_fields():
    assert sf.response_fields([], False) == []
    assert sf.response_fields([(b"DATE", b"x"), (b"a", b"b")], 1) == [(b"a", b"b"),
                                                                      (b"Connection", b"close")]
    for bad in ([("a", b"b")], [b"ab"], None, [(b"a",)]):
        with pytest.raises(TypeError):
            sf.response_fields(bad, False)
    with pytest.raises(TypeError):
        sf.response_fields([])


def fresh(*parts):
    """A tuple made at run time (a constant one is shared, and a leaked reference to it
    would hold no new memory)."""
    return tuple(list(parts))


def test_no_reference_kept_or_leaked_on_any_path():
    def refs(objs):
        return [sys.getrefcount(o) for o in objs]

    cases = []
    for status, headers in (("bad", []), ("200 OK", [fresh("A", 1)]),
                            ("200 OK", [fresh("Content-Length", "x")]), ("200 OK", None),
                            ("200 OK", [fresh("A", "b", "c")]), ("200 OK", [fresh("A", "b")])):
        status = "".join([status])
        cases.append((status, headers))
    for status, headers in cases:
        objs = [status, headers] + (headers or [])
        before = refs(objs)
        r = sf.WSGIResponse("GET")
        try:
            r.start_response(status, headers)
        except (TypeError, ValueError):
            pass
        del r
        assert refs(objs) == before
    pieces = [b"a" * 3, bytearray(b"b"), memoryview(bytes(2))]
    r = started(headers=[fresh("Content-Length", "6")])
    before = refs(pieces)
    out = r.collect(pieces)
    del r, out
    assert refs(pieces) == before
    r = started(headers=[fresh("Content-Length", "1")])
    before = refs(pieces)
    with pytest.raises(ValueError):
        r.collect(pieces)
    del r
    assert refs(pieces) == before
    exc = KeyError("x")
    info = fresh(KeyError, exc, None)
    r = started()
    r.write(b"x")
    before = refs([exc, info])
    with pytest.raises(KeyError):
        r.start_response("500 X", [], info)
    assert refs([exc, info]) == before
    pairs = [fresh(b"a", b"b"), fresh(b"Date", b"c")]
    before = refs(pairs)
    out = sf.response_fields(pairs, True)
    del out
    assert refs(pairs) == before


def test_no_memory_growth_over_many_rounds():
    def once():
        r = started(headers=[fresh("Content-Type", "t"), fresh("Content-Length", "3")])
        r.collect([bytes(1), bytearray(b"b"), memoryview(b"c")])
        for status, headers in (("bad", []), ("200 OK", [fresh("A", 1)]),
                                ("200 OK", [fresh("Content-Length", "x")]), ("200 OK", None)):
            try:
                sf.WSGIResponse("GET").start_response("".join([status]), headers)
            except (TypeError, ValueError):
                pass
        r = started(headers=[fresh("Content-Length", "1")])
        try:
            r.collect([bytes(2)])
        except ValueError:
            pass
        try:
            r.start_response("500 X", [], fresh(KeyError, KeyError("x"), None))
        except KeyError:
            pass
        try:
            started(headers=[fresh("X", "\u20ac")]).collect([])
        except UnicodeEncodeError:
            pass
        sf.response_fields([fresh(b"a", b"b")], True)

    for _ in range(200):
        once()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20000):
            once()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes more after 20000 rounds"


# ---- regressions: what crashed the interpreter (each case in its own process) ------------

def survives(code):
    """Runs `code` in a fresh interpreter (this one's path): a crash fails the case instead of
    ending the run. Returns the lines it printed."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr[-2000:]}"
    return p.stdout.split()


def test_start_response_after_del_length_does_not_crash():
    # A writable member may be deleted (NULL): start_response released it with Py_SETREF,
    # a Py_DECREF(NULL) (SIGSEGV).
    assert survives("""
        import shmipc._serve as sf
        r = sf.WSGIResponse("GET")
        del r.length
        r.start_response("200 OK", [("Content-Length", "1")])
        print(r.length, r.collect([b"x"])[2])
    """) == ["1", "b'x'"]


@pytest.mark.parametrize("junk", ["None", "(1, 2)", "('A',)", "['A', 'b']", "('A', b'b')", "7"])
def test_collect_refuses_a_header_list_the_app_changed(junk):
    # r.headers is the app's to reach (start_response.__self__) and a mutable list: collect()
    # read its items as (str, str) tuples unchecked (an assertion or SIGSEGV).
    assert survives(f"""
        import shmipc._serve as sf
        r = sf.WSGIResponse("GET")
        r.start_response("200 OK", [("A", "b")])
        r.headers.append({junk})
        try:
            r.collect([b"x"])
        except TypeError as e:
            print("TypeError")
    """) == ["TypeError"]


def test_collect_survives_a_finalizer_that_replaces_the_head():
    # A collection inside collect() (an allocation of the header pairs) runs finalizers, which
    # may call start_response with exc_info and free the header list collect() was reading.
    out = survives("""
        import gc, sys
        import shmipc._serve as sf

        class Bomb:
            def __init__(self, resp):
                self.resp, self.me = resp, self  # a cycle: only the collector frees it
            def __del__(self):
                try:
                    raise RuntimeError("x")
                except RuntimeError:
                    self.resp.start_response("500 Err", [("B", "c")], sys.exc_info())
                for _ in range(50):
                    [("Z" * 10, "y") for _ in range(20)]  # reuses the freed memory

        def body(r):
            Bomb(r)
            return iter(())

        for _ in range(20):
            r = sf.WSGIResponse("GET")
            r.start_response("200 OK", [("H%d" % i, "v" * 40) for i in range(200)])
            gc.collect()
            gc.set_threshold(1)
            try:
                code, fields, _ = r.collect(body(r))
            finally:
                gc.set_threshold(700)
            # One head whole, whichever it was: never the code of one and fields of the other.
            assert (code, len(fields)) in ((200, 200), (500, 1)), (code, len(fields))
        print("ok")
    """)
    assert out == ["ok"]


def test_sent_does_not_overflow():
    r = started()
    r.sent = sys.maxsize
    with pytest.raises(OverflowError):
        r.write(b"x")
    assert r.sent == sys.maxsize
