"""The WSGI worker's request in C (shmipc._serve.WSGIWorker, python/shmipc/serve_wsgi_worker.c)
against its Python route (wsgi.py's _Exchange and _Response, WSGIHandler._worker = None): the
same request, the same app, and the front must see the same frames, byte for byte, the worker
count the same outcome and log the same lines. A request with a body, or a first frame that is
not a REQUEST_HEAD, goes to the Python route in both (handed back before anything was sent).
Hostile frames, app misuse, aborts mid-response, threads: each case runs on both routes."""
import array
import gc
import logging
import struct
import threading
import time

import pytest

import shmipc
from conftest import default_config, unique_address
from test_misuse import run_child

sf = pytest.importorskip("shmipc._serve")
from shmipc.serve import Worker  # noqa: E402
from shmipc.serve import wsgi as wsgi_mod  # noqa: E402
from shmipc.serve.wsgi import WSGIHandler  # noqa: E402

from test_serve_worker import (CUT_SHORT, answer_then_trickle, cut_short_then_next,  # noqa: E402
                               frame, head, next_answer)


class FakeStream:
    """A stream over `data` for WSGIHandler.handle, without a session: reads take from
    `data`, write() keeps what it is given in `out` (a bytes copy, or with keep=True the
    object itself, as a stream that buffers would)."""

    id = 1

    def __init__(self, data, keep=False):
        self.data, self.out, self.keep = bytearray(data), [], keep

    def readexactly(self, n, nonblock=False):
        if len(self.data) < n:
            if nonblock:
                return None
            raise shmipc.EndOfStreamError("the end")
        out = bytes(self.data[:n])
        del self.data[:n]
        return out

    def write(self, b):
        self.out.append(b if self.keep else bytes(b))

    def flush(self):
        pass

    close = flush_close = flush


class Route:
    """A worker (in a thread) on one route, and a front session to it."""

    def __init__(self, app, c_route):
        self.handler = WSGIHandler(app)
        if not c_route:
            self.handler._worker = None
        self.worker = Worker(app, unique_address("wsgic"), handler=self.handler)
        self.thread = threading.Thread(target=self.worker.serve_forever)
        self.thread.start()
        self.session = shmipc.connect(self.worker.address, default_config())

    def total(self):
        return sum(self.worker.counts.values())

    def wait_total(self, n):
        deadline = time.monotonic() + 10
        while self.total() < n and time.monotonic() < deadline:
            time.sleep(0.002)
        return dict(self.worker.counts)

    def stop(self):
        self.session.close()
        self.worker.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


def read_all(st):
    """Every frame the worker sends on `st` until it closes it: (type, arg, payload) each."""
    st.read_timeout = 10
    out = []
    while True:
        try:
            raw = st.readexactly(12)
        except shmipc.EndOfStreamError:
            return out
        typ, length, arg = sf.decode_header(raw)
        out.append((typ, arg, st.readexactly(length) if length else b""))


def plain(send=(), flags=0, method=b"GET", target=b"/"):
    """A front that sends the head, then `send` (default: END), and reads to the end."""

    def script(session, ctl):
        st = session.open_stream()
        st.write(head(method, target, flags=flags))
        for f in send if send else (frame(sf.END),):
            st.write(f)
        st.flush()
        try:
            return read_all(st)
        finally:
            st.close()

    return script


def run(app, script, ctl_factory=lambda: None):
    """(frames, outcome counts, log lines, what the app saw) on each route."""
    results = []
    for c_route in (True, False):
        seen = []
        ctl = ctl_factory()

        def wrapped(environ, start_response):
            if environ["PATH_INFO"] == "/__next__":
                start_response("200 OK", [])
                return [b"next"]
            return app(environ, start_response, seen, ctl)

        r = Route(wrapped, c_route)
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        log = logging.getLogger("shmipc.serve")
        log.addHandler(handler)
        old = log.level
        log.setLevel(logging.DEBUG)
        try:
            frames = script(r.session, ctl)
            counts = r.wait_total(1)
            # The next request is served normally.
            st = r.session.open_stream()
            st.write(head(target=b"/__next__") + frame(sf.END))
            st.flush()
            nxt = read_all(st)
            st.close()
        finally:
            log.removeHandler(handler)
            log.setLevel(old)
            r.stop()
        lines = [(x.levelname, x.getMessage(), x.exc_info[0].__name__ if x.exc_info else None)
                 for x in records if "stream" not in x.getMessage() or x.levelno > logging.DEBUG]
        results.append((frames, counts, lines, seen, nxt[0][0] if nxt else None))
    assert results[0] == results[1]
    return results[0]


# ---- responses ------------------------------------------------------------------------------


def ok_list(body=(b"Hello",), headers=(("Content-Type", "text/plain"),), status="200 OK"):
    def app(environ, start_response, seen, ctl):
        start_response(status, list(headers))
        return list(body)

    return app


def test_simple_list_response_with_and_without_taken():
    frames, counts, lines, _, nxt = run(ok_list(), plain())
    assert [f[0] for f in frames] == [sf.RESPONSE_HEAD, sf.BODY, sf.END]
    assert counts["ok"] == 1 and lines == [] and nxt == sf.RESPONSE_HEAD
    frames, counts, _, _, _ = run(ok_list(), plain(flags=sf.REQ_TAKEN_WANTED))
    assert [f[0] for f in frames] == [sf.TAKEN, sf.RESPONSE_HEAD, sf.BODY, sf.END]


@pytest.mark.parametrize("status,method", [("200 OK", b"HEAD"), ("204 No Content", b"GET"),
                                           ("304 Not Modified", b"GET"),
                                           ("304 Not Modified", b"HEAD")])
def test_bodyless_responses(status, method):
    frames, counts, _, _, _ = run(ok_list([b"abc", b"de"], status=status), plain(method=method))
    assert [f[0] for f in frames] == [sf.RESPONSE_HEAD, sf.END] and counts["ok"] == 1


@pytest.mark.parametrize("body", [
    [], [b""], [b"a", b"", b"bc"], (b"x" * 70000,), [bytearray(b"ab"), memoryview(b"cd")],
    [memoryview(array.array("I", [1, 2, 3]))], [memoryview(b"abcdef")[::2]],
    [b"x" * (sf.MAX_CHUNK + 5)],
])
def test_list_and_tuple_bodies(body):
    frames, counts, _, _, _ = run(ok_list(body), plain())
    assert counts["ok"] == 1
    got = b"".join(p for t, _, p in frames if t == sf.BODY)
    assert got == b"".join(bytes(x) for x in body)


class LyingBytes(bytes):
    """A bytes subclass whose len() and slices say something else than its bytes."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return b"?"


class LyingByteArray(bytearray):
    def __len__(self):
        return 1000


class ZeroBytes(bytes):
    def __len__(self):
        return 0


@pytest.mark.parametrize("pieces,declared,as_list", [
    ([LyingBytes(b"hello")], None, True), ([LyingBytes(b"hello"), b"!"], None, True),
    ((b"<", LyingByteArray(b"world"), memoryview(b">")), None, True),
    ([ZeroBytes(b"abc")], None, True),
    ([ZeroBytes(b"abc"), LyingBytes(b"hello")], "8", False),  # the app's own Content-Length
    ([LyingByteArray(b"abc")], "3", False),
])
def test_bytes_subclass_whose_len_lies_is_counted_by_its_bytes(pieces, declared, as_list):
    # The Python route took a body piece's length from len(), which a bytes or bytearray
    # subclass may override: [LyingBytes(b"hello")] got Content-Length 2 with its five bytes
    # sent (a response the front's framing cannot carry), a piece whose len() said 0 was not
    # sent at all, and the app's own Content-Length was checked against the lie. The C route
    # counts the object's bytes; both routes now send the same head and body.
    real = b"".join(bytes(memoryview(x)) for x in pieces)

    def app(environ, start_response, seen, ctl):
        start_response("200 OK", [("Content-Length", declared)] if declared else [])
        return pieces if as_list else iter(pieces)

    frames, counts, lines, _, _ = run(app, plain())
    assert counts["ok"] == 1 and lines == []
    assert [f[0] for f in frames if f[0] != sf.BODY] == [sf.RESPONSE_HEAD, sf.END]
    typ, flags, payload = frames[0]
    _, flags, length, _ = sf.decode_response(frame(typ, payload, flags))
    assert flags & sf.RESP_CONTENT_LENGTH and length == len(real)
    assert b"".join(p for t, _, p in frames if t == sf.BODY) == real


def test_generator_with_close_write_callable_and_content_length():
    closed = []

    def app(environ, start_response, seen, ctl):
        write = start_response("200 OK", [("Content-Length", "6")])
        write(b"ab")

        class It:
            def __iter__(self):
                yield b"cd"
                yield b"ef"

            def close(self):
                closed.append(1)

        return It()

    frames, counts, _, _, _ = run(app, plain())
    assert counts["ok"] == 1 and len(closed) == 2  # one per route
    assert [f[0] for f in frames] == [sf.RESPONSE_HEAD, sf.BODY, sf.BODY, sf.BODY, sf.END]


def test_wsgi_input_of_a_get_reads_empty():
    def app(environ, start_response, seen, ctl):
        inp = environ["wsgi.input"]
        seen.append((inp.read(), inp.read(0), inp.readline(), inp.readlines(), list(inp)))
        start_response("200 OK", [])
        return [b"ok"]

    _, counts, _, seen, _ = run(app, plain())
    assert seen == [(b"", b"", b"", [], [])] and counts["ok"] == 1


# ---- app misuse -----------------------------------------------------------------------------


def misuse(kind):
    def app(environ, start_response, seen, ctl):
        if kind == "raise":
            raise KeyError("no such thing")
        if kind == "no_start":
            return [b"x"]
        if kind == "no_start_empty":
            return []
        if kind == "str_piece":
            start_response("200 OK", [])
            return ["text"]
        if kind == "str_pieces":
            start_response("200 OK", [])
            return [b"a", "text"]
        if kind == "int_piece":
            start_response("200 OK", [])
            return [5]
        if kind == "too_long":
            start_response("200 OK", [("Content-Length", "2")])
            return [b"abc"]
        if kind == "too_long_later":
            start_response("200 OK", [("Content-Length", "3")])
            return iter([b"ab", b"cd"])
        if kind == "too_short":
            start_response("200 OK", [("Content-Length", "5")])
            return iter([b"ab"])
        if kind == "bad_header":
            start_response("200 OK", [("X", 1)])
            return [b"x"]
        if kind == "mid_body":
            start_response("200 OK", [])

            def gen():
                yield b"first"
                raise RuntimeError("boom in the body")

            return gen()
        if kind == "exc_info":
            start_response("200 OK", [("X-A", "1")])
            try:
                raise ValueError("late")
            except ValueError:
                import sys

                start_response("500 Oops", [("X-B", "2")], sys.exc_info())
            return [b"replaced"]
        if kind == "exc_info_after_head":
            write = start_response("200 OK", [])
            write(b"sent")
            try:
                raise ValueError("too late")
            except ValueError:
                import sys

                start_response("500 Oops", [], sys.exc_info())
            return []
        if kind == "twice":
            start_response("200 OK", [])
            start_response("200 OK", [])
            return []
        if kind == "environ_cleared":
            environ.clear()
            raise RuntimeError("after clear")
        if kind == "str_raises":
            class Bad(Exception):
                def __str__(self):
                    raise ValueError("no str")

            write = start_response("200 OK", [])
            write(b"x")
            raise Bad()
        if kind == "not_iterable":
            start_response("200 OK", [])
            return 42
        raise AssertionError(kind)

    return app


@pytest.mark.parametrize("kind", [
    "raise", "no_start", "no_start_empty", "str_piece", "str_pieces", "int_piece", "too_long",
    "too_long_later", "too_short", "bad_header", "mid_body", "exc_info", "exc_info_after_head",
    "twice", "environ_cleared", "str_raises", "not_iterable",
])
@pytest.mark.parametrize("method", [b"GET", b"HEAD"])
def test_app_misuse(kind, method):
    frames, counts, lines, _, nxt = run(misuse(kind), plain(method=method))
    assert nxt == sf.RESPONSE_HEAD
    if kind == "exc_info" or (method == b"HEAD" and kind.startswith("too_")):
        assert counts["ok"] == 1  # HEAD: no body bytes, none too many or too few
    else:
        assert counts["error"] == 1 and lines and lines[0][0] == "ERROR"


def test_close_raising_after_a_good_response_and_after_a_failure():
    def app(environ, start_response, seen, ctl):
        fail = environ["PATH_INFO"] == "/fail"

        class It:
            def __iter__(self):
                if fail:
                    raise RuntimeError("iter")
                start_response("200 OK", [])
                yield b"x"

            def close(self):
                raise OSError("close failed")

        return It()

    for target in (b"/", b"/fail"):
        frames, counts, lines, _, _ = run(app, plain(target=target))
        assert counts["error"] == 1
        assert any("close() of the app's iterable raised" in m for _, m, _ in lines)


def test_close_raising_a_base_exception_propagates_on_both_routes():
    class Stop(BaseException):
        pass

    class It:
        def __iter__(self):
            yield b"x"

        def close(self):
            raise Stop()

    def app(environ, start_response):
        start_response("200 OK", [])
        return It()

    for c_route in (True, False):
        h = WSGIHandler(app)
        if not c_route:
            h._worker = None
        client, server = socket_pair()
        try:
            st = client.open_stream()
            st.write(head() + frame(sf.END))
            st.flush()
            with pytest.raises(Stop):
                h.handle(server.accept_stream(timeout=10))
            assert [f[0] for f in read_all(st)] in ([sf.RESPONSE_HEAD, sf.BODY, sf.END],
                                                    [sf.RESPONSE_HEAD, sf.BODY])
        finally:
            client.close()
            server.close()


def _chain(e):
    """An exception's __context__ and __cause__, by type name, two links deep."""
    def name(x):
        return None if x is None else type(x).__name__

    ctx = e.__context__
    return (name(e), name(ctx), e.__cause__ is ctx, e.__suppress_context__,
            name(ctx.__context__) if ctx is not None else None)


def test_an_exception_escaping_handle_keeps_its_context_on_both_routes():
    # The C route took the app's exception (one the worker does not handle: a BaseException)
    # and raised it again with PyErr_SetObject, which chains it to the exception being handled
    # where handle() was called: Stop's __context__, the app's own TypeError, became the
    # caller's KeyError, and the TypeError was lost. The Python route lets it through as it is.
    class Stop(BaseException):
        pass

    def app(environ, start_response):
        try:
            raise TypeError("the app's own")
        except TypeError:
            raise Stop()

    req = head() + frame(sf.END)
    got = []
    for c_route in (True, False):
        h = WSGIHandler(app)
        if not c_route:
            h._worker = None
        try:
            raise KeyError("the caller's")
        except KeyError:
            with pytest.raises(Stop) as info:
                h.handle(FakeStream(req))
        got.append(_chain(info.value))
    assert got[0] == got[1] == ("Stop", "TypeError", False, False, "KeyError")


def socket_pair():
    """A session pair: (the front's, the worker's)."""
    lst = shmipc.Listener(unique_address("pair"), default_config())
    got = []
    t = threading.Thread(target=lambda: got.append(lst.accept(timeout=10)))
    t.start()
    client = shmipc.connect(lst.address, default_config())
    t.join(10)
    lst.close()
    return client, got[0]


# ---- hostile fronts -------------------------------------------------------------------------


@pytest.mark.parametrize("send", [
    [frame(sf.BODY, b"x"), frame(sf.END)],  # a body the head did not announce
    [frame(sf.RESPONSE_HEAD, b"\0" * 16)],  # a frame of the wrong direction
    [frame(sf.END), frame(sf.BODY, b"late")],  # something after the END
    [frame(sf.END), b"garbage!garbage!"],  # a header that does not decode, after the END
    [b"garbage!garbage!"],  # one instead of the END
    [frame(sf.ABORT, b"gone", sf.ABORT_CLIENT_GONE)],  # ABORT instead of the END
    [frame(sf.END), frame(sf.ABORT, b"gone", sf.ABORT_CLIENT_GONE)],  # ABORT after the END
    [frame(sf.END), frame(sf.ABORT, b"x" * 100, sf.ABORT_TIMEOUT)[:20]],  # cut short
])
@pytest.mark.parametrize("reads", [False, True])
def test_hostile_frames_behind_a_get(send, reads):
    def app(environ, start_response, seen, ctl):
        if reads:
            try:
                environ["wsgi.input"].read()
            except Exception as e:  # noqa: BLE001
                seen.append(type(e).__name__)
                raise
        start_response("200 OK", [])
        return [b"ok"]

    def script(session, ctl):
        st = session.open_stream()
        st.write(head())
        for f in send:
            st.write(f)
        st.flush()
        try:
            return read_all(st)
        finally:
            st.close()

    run(app, script)


@pytest.mark.parametrize("first", [
    frame(sf.ABORT, b"late", sf.ABORT_CLIENT_GONE),  # a late ABORT: "late"
    frame(sf.HELLO, struct.pack("<II", sf.FEAT_TAKEN, 0)),  # "hello"
    frame(sf.BODY, b"x"),  # a body before the head
    b"garbage!garbage!",
    frame(sf.REQUEST_HEAD, b"\0" * 60),  # a head breaking its rules
])
def test_first_frames_the_c_route_hands_back(first):
    def script(session, ctl):
        st = session.open_stream()
        st.write(first)
        st.flush()
        try:
            return read_all(st)
        finally:
            st.close()

    run(ok_list(), script)


@pytest.mark.parametrize("flags,clen,send", [
    (sf.REQ_CONTENT_LENGTH, 0, [frame(sf.END)]),  # Content-Length: 0, no body: the C route
    (sf.REQ_CONTENT_LENGTH, 3, [frame(sf.END)]),  # a length and no body: handed back
    (sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, 3, [frame(sf.BODY, b"abc"), frame(sf.END)]),
    (sf.REQ_HAS_BODY | sf.REQ_CHUNKED, 0, [frame(sf.BODY, b"ab"), frame(sf.END)]),
])
def test_bodies_and_lengths(flags, clen, send):
    def app(environ, start_response, seen, ctl):
        seen.append((environ.get("CONTENT_LENGTH"), environ["wsgi.input"].read()))
        start_response("200 OK", [])
        return [b"ok"]

    def script(session, ctl):
        st = session.open_stream()
        if flags & sf.REQ_HAS_BODY:
            st.write(head(b"POST", flags=flags, content_length=clen))
        else:  # the encoder refuses a length without HAS_BODY: written over one of 0
            h = bytearray(head(b"POST", flags=flags, content_length=0))
            h[24:32] = clen.to_bytes(8, "little")
            st.write(bytes(h))
        for f in send:
            st.write(f)
        st.flush()
        try:
            return read_all(st)
        finally:
            st.close()

    run(app, script)


def test_front_aborts_mid_response_and_the_app_sees_request_aborted():
    class Ctl:
        def __init__(self):
            self.started = threading.Event()
            self.go = threading.Event()

    def app(environ, start_response, seen, ctl):
        write = start_response("200 OK", [])
        write(b"first")
        ctl.started.set()
        ctl.go.wait(10)
        time.sleep(0.05)
        try:
            for _ in range(100):
                write(b"more")
                time.sleep(0.01)
        except OSError as e:
            seen.append(type(e).__name__)
            raise
        return []

    def script(session, ctl):
        st = session.open_stream()
        st.write(head() + frame(sf.END))
        st.flush()
        assert ctl.started.wait(10)
        st.write(frame(sf.ABORT, b"gone", sf.ABORT_CLIENT_GONE))
        st.flush()
        ctl.go.set()
        try:
            frames = read_all(st)
        finally:
            st.close()
        # How many "more" pieces went before the ABORT was seen is timing: not compared.
        return [f for f in frames if f[2] != b"more"]

    _, counts, lines, seen, _ = run(
        lambda e, s, seen, ctl: app(e, s, seen, ctl), script, Ctl)
    assert seen == ["RequestAborted"] and counts["aborted"] == 1
    assert lines == [("INFO", "shmipc-serve: GET /: the front aborted the request (reason 1)",
                      None)]


class _EndCtl:
    """The app says it has started; the test says the front has ended the stream or session."""

    def __init__(self):
        self.started = threading.Event()
        self.ended = threading.Event()


def _end_under_the_app(app, request, how):
    """On both routes: `request` (frames) goes on a new stream; once the app has started, the
    front ends the stream ("stream") or its whole session ("session"). The app must see
    RequestAborted and the outcome be "aborted", the same on both."""
    results = []
    for c_route in (True, False):
        ctl = _EndCtl()
        seen = []
        r = Route(lambda e, s: app(e, s, seen, ctl), c_route)
        try:
            st = r.session.open_stream()
            st.write(request)
            st.flush()
            assert ctl.started.wait(10)
            if how == "stream":
                st.close()
            else:
                r.session.shutdown()
            ctl.ended.set()
            counts = r.wait_total(1)
        finally:
            r.stop()
        results.append((seen, counts))
    assert results[0] == results[1]
    assert results[0][0] == ["RequestAborted"] and results[0][1]["aborted"] == 1


@pytest.mark.parametrize("how", ["stream", "session"])
def test_front_ends_the_stream_or_session_before_the_end(how):
    def app(environ, start_response, seen, ctl):
        ctl.started.set()
        ctl.ended.wait(10)
        time.sleep(0.05)
        try:
            environ["wsgi.input"].read()
        except OSError as e:
            seen.append(type(e).__name__)
            raise
        start_response("200 OK", [])
        return [b"x"]

    _end_under_the_app(app, head(), how)


@pytest.mark.parametrize("where", ["read", "write"])
@pytest.mark.parametrize("how", ["stream", "session"])
def test_request_aborted_in_the_apps_except_block_chains_as_in_python(where, how):
    # RequestAborted is raised from the stream's error ("raise ... from e" in the Python route's
    # "except ... as e:"): its __context__ and __cause__ are that error, whose own __context__
    # is the exception the app was handling. The C route raised it with PyErr_SetObject, which
    # set its __context__ to the app's exception instead, when the app read or wrote in its own
    # except block.
    chains = []

    def app(environ, start_response, seen, ctl):
        if where == "write":
            environ["wsgi.input"].read()
            write = start_response("200 OK", [])
            write(b"first")
        ctl.started.set()
        ctl.ended.wait(10)
        time.sleep(0.1)
        try:
            raise ValueError("the app's own")
        except ValueError:
            try:
                if where == "read":
                    environ["wsgi.input"].read()
                else:
                    write(b"more")
            except OSError as e:
                seen.append(type(e).__name__)
                chains.append(_chain(e))
                raise
        return []

    _end_under_the_app(app, head() + (frame(sf.END) if where == "write" else b""), how)
    assert len(chains) == 2 and chains[0] == chains[1]
    typ, ctx, cause_is_ctx, suppress, ctx_ctx = chains[0]
    assert typ == "RequestAborted" and ctx in ("EndOfStreamError", "PeerGoneError", "ClosedError")
    assert cause_is_ctx and suppress and ctx_ctx == "ValueError"


# ---- threads, the GIL, leaks ----------------------------------------------------------------


def test_other_threads_run_while_the_c_route_waits_for_the_front():
    # The worker waits for the request's head in C (the Stream's read, without the GIL):
    # a thread of the app's keeps running meanwhile.
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1
            time.sleep(0.001)

    r = Route(lambda e, s: (s("200 OK", []), [b"x"])[1], True)
    t = threading.Thread(target=spin)
    t.start()
    try:
        st = r.session.open_stream()
        st.write(head()[:10])  # part of the head: the worker waits for the rest
        st.flush()
        time.sleep(0.2)
        before = count[0]
        deadline = time.monotonic() + 10
        while count[0] < before + 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert count[0] >= before + 20
        st.write(head()[10:] + frame(sf.END))
        st.flush()
        assert [f[0] for f in read_all(st)] == [sf.RESPONSE_HEAD, sf.BODY, sf.END]
        st.close()
    finally:
        stop.set()
        t.join(10)
        r.stop()


def test_app_threads_write_and_read_beside_the_request():
    # The app's own threads use write() and wsgi.input while the request runs: serialized by
    # the GIL and the Stream's own busy check, nothing breaks the worker.
    def app(environ, start_response):
        write = start_response("200 OK", [])
        errors = []

        def work():
            try:
                for _ in range(20):
                    write(b"t")
                    environ["wsgi.input"].read()
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=work) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(10)
        return [b"end"]

    r = Route(app, True)
    try:
        for _ in range(5):
            st = r.session.open_stream()
            st.write(head() + frame(sf.END))
            st.flush()
            frames = read_all(st)
            st.close()
            assert frames[0][0] == sf.RESPONSE_HEAD and frames[-1][0] in (sf.END, sf.ABORT)
    finally:
        r.stop()


def test_no_exchange_or_response_outlives_its_request():
    kept = []

    def app(environ, start_response):
        kept.append(environ["wsgi.input"])  # the app keeps wsgi.input past the request
        start_response("200 OK", [])
        return [b"x"]

    r = Route(app, True)
    try:
        for _ in range(20):
            st = r.session.open_stream()
            st.write(head() + frame(sf.END))
            st.flush()
            read_all(st)
            st.close()
        r.wait_total(20)
        # A kept wsgi.input still reads as the request's end, whatever the stream's state.
        assert kept[0].read() == b""
        kept.clear()
        gc.collect()
        alive = [o for o in gc.get_objects()
                 if type(o).__name__ in ("WSGIExchange", "WSGIStreamResponse")]
        assert alive == []
    finally:
        r.stop()


def test_the_c_route_is_used_and_hands_back_only_what_it_must():
    h = WSGIHandler(lambda e, s: (s("200 OK", []), [b"x"])[1])
    assert isinstance(h._worker, sf.WSGIWorker)
    for bad in ({}, {"RequestAborted": RequestAbortedStub}):
        with pytest.raises((KeyError, TypeError)):
            sf.WSGIWorker(h.app, {}, bad)
    with pytest.raises(TypeError):
        sf.WSGIExchange()
    with pytest.raises(TypeError):
        sf.WSGIStreamResponse("GET")
    hooks = dict(wsgi_mod._HOOKS, ProtocolViolation=len)
    with pytest.raises(TypeError):
        sf.WSGIWorker(h.app, {}, hooks)


def test_a_worker_whose_init_never_succeeded_refuses_to_handle():
    # WSGIWorker.__new__ without __init__ (or an __init__ that failed) left app, base and the
    # hooks NULL, and handle() called a NULL hook: a segfault. Now handle() raises RuntimeError
    # and everything else of the type works on such a worker; a failed __init__ leaves a
    # worker as it was, and __init__ again (from the app itself, too) replaces what it serves
    # with. In a child under PYTHONMALLOC=debug: a crash is the child's exit, not pytest's.
    run_child("""
        import copy, gc, pickle
        import shmipc._serve as sf
        from shmipc.serve import wsgi as wsgi_mod
        from shmipc.serve.wsgi import WSGIHandler
        from test_serve_wsgi_c import FakeStream

        W = sf.WSGIWorker
        req = sf.encode_request_head(b"GET", b"/", [], peer=("127.0.0.1", 1),
                                     local=("127.0.0.1", 2)) + sf.encode_frame(sf.END)
        base = WSGIHandler(lambda e, s: []).base
        hooks = wsgi_mod._HOOKS

        def app(text):
            return lambda environ, start_response: (start_response("200 OK", []), [text])[1]

        def served(w):  # the outcome, and the body of its BODY frames
            st = FakeStream(req)
            outcome, out = w.handle(st), b"".join(st.out)
            bodies = []
            while out:
                typ, length, _ = sf.decode_header(out[:12])
                if typ == sf.BODY:
                    bodies.append(out[12:12 + length])
                out = out[12 + length:]
            return outcome, b"".join(bodies)

        def refuses(w):
            for data in (req, b"", b"x" * 5):
                try:
                    w.handle(FakeStream(data))
                except RuntimeError as e:
                    assert "not initialised" in str(e), e
                else:
                    raise AssertionError("handle() served without __init__")
            for bad in (None, 1, object()):
                try:
                    w.handle(bad)
                except RuntimeError:
                    pass
            assert w.app is None
            for name in dir(w):  # every attribute of the type reads without a crash
                getattr(w, name)
            repr(w), str(w), hash(w), w.__sizeof__(), w == w, w.__reduce_ex__
            for f in (copy.copy, copy.deepcopy, pickle.dumps):
                try:
                    f(w)
                except TypeError:
                    pass
            try:
                w.app = app(b"x")
            except AttributeError:
                pass
            else:
                raise AssertionError("app is writable")

        fresh = W.__new__(W)
        refuses(fresh)
        refuses(W.__new__(W, 1, 2, three=3))

        def wrapped(hooks):  # each callable hook a new function only the new dict holds
            return {k: (lambda f: lambda *a: f(*a))(v) if callable(v) and not isinstance(v, type)
                    else v for k, v in hooks.items()}

        # Each way __init__ fails, on a fresh worker: nothing is set.
        failures = [(), (app(b"a"),), (app(b"a"), base), (app(b"a"), [], hooks),
                    (app(b"a"), base, {}),
                    (app(b"a"), base, {k: v for k, v in hooks.items() if k != "_flat"}),
                    (app(b"a"), base, dict(hooks, ProtocolViolation=len)),
                    (app(b"a"), base, dict(hooks, ClosedError=ValueError()))]
        for args in failures:
            w = W.__new__(W)
            try:
                w.__init__(*args)
            except (TypeError, KeyError):
                pass
            else:
                raise AssertionError(f"__init__{args!r} succeeded")
            refuses(w)

        # __init__ twice; a failed one after it leaves the worker serving as it was.
        w = W(app(b"first"), base, hooks)
        assert served(w) == ("ok", b"first")
        w.__init__(app(b"second"), dict(base), dict(hooks))
        assert served(w) == ("ok", b"second")
        for args in failures:
            try:
                w.__init__(*args)
            except (TypeError, KeyError):
                pass
            assert served(w) == ("ok", b"second")

        # A hooks dict whose last lookup runs a key's __eq__ (a hash collision), which replaces
        # the hooks found before it: __init__ took them borrowed, and kept freed ones.
        armed = []

        class Key(str):
            def __hash__(self):
                return hash("ClosedError")

            def __eq__(self, other):
                if armed:
                    armed.clear()  # once: the update looks the keys up too
                    evil.update(wrapped(hooks))
                    gc.collect()
                return False

        evil = {Key("k"): 1}
        evil.update(wrapped(hooks))
        armed.append(1)
        w.__init__(app(b"evil"), dict(base), evil)
        assert not armed, "the key's __eq__ never ran"
        del evil
        gc.collect()
        import logging
        logging.getLogger("shmipc.serve").disabled = True
        assert served(w) == ("ok", b"evil")

        # __init__ from inside the app, with hooks only the new dict holds, and the app the
        # only reference to itself: the request ends on the hooks of its start.
        class Reinit:
            def __call__(self, environ, start_response):
                w.__init__(app(b"after"), dict(base), wrapped(hooks))
                gc.collect()
                raise ValueError("boom")  # the 500 goes through the rare turns' hooks

        w.__init__(Reinit(), dict(base), wrapped(hooks))
        gc.collect()
        assert served(w) == ("error", b"Internal Server Error\\n")
        assert served(w) == ("ok", b"after")
        del fresh, w
        gc.collect()
        print("done")
        """, env={"PYTHONMALLOC": "debug"})


@pytest.mark.parametrize("how", ["bool", "bool_no_body", "compare"])
def test_an_app_replacing_the_length_from_its_own_methods_is_no_use_after_free(how):
    # The response's length is writable (start_response.__self__.length): the C route read it
    # borrowed and called its __bool__ / __index__ / comparison, which can replace it, freeing
    # the object under the call (a crash under the debug allocator, which fills freed memory).
    # Both routes run in a child interpreter with PYTHONMALLOC=debug, on a stream of the test's.
    run_child(f"""
        import shmipc, shmipc._serve as sf
        from shmipc.serve.wsgi import WSGIHandler
        how = {how!r}

        class Length:
            def __init__(self, resp):
                self.resp = resp

            def drop(self):
                r, self.resp = self.resp, None
                if r is not None:
                    r.length = None  # frees this object, once its method returns
                return NotImplemented

            def __bool__(self):
                if how.startswith("bool"):
                    self.drop()
                return True

            def __index__(self):
                return 5

            def __lt__(self, other):  # `size > length`: write()'s check
                return self.drop()

            __gt__ = __lt__

        def app(environ, start_response):
            start_response("200 OK", [])
            start_response.__self__.length = Length(start_response.__self__)
            if how == "bool_no_body":
                return []
            return [b"hello"]

        from test_serve_wsgi_c import FakeStream as Stream

        req = sf.encode_request_head(b"GET", b"/", [], peer=("127.0.0.1", 1),
                                     local=("127.0.0.1", 2)) + sf.encode_frame(sf.END)
        got = []
        for c_route in (True, False):
            h = WSGIHandler(app)
            if not c_route:
                h._worker = None
            st = Stream(req)
            got.append((h.handle(st), b"".join(st.out)))
        assert got[0] == got[1], got
        print("done", got[0][0])
        """, env={"PYTHONMALLOC": "debug"})


def test_a_stream_that_keeps_what_it_is_given_keeps_the_body_bytes():
    # The C route gave the stream a piece that is not bytes (a bytearray, a memoryview, a
    # bytes subclass) or over MAX_CHUNK as a memoryview of bare memory: a stream that keeps
    # what write() gives it (one that buffers, as a test's does) read the app's piece after
    # it was freed. In a child under PYTHONMALLOC=debug (freed memory filled with 0xDD).
    run_child("""
        import gc
        import shmipc, shmipc._serve as sf
        from shmipc.serve.wsgi import WSGIHandler

        class Bytes(bytes):
            pass

        def app(environ, start_response):
            start_response("200 OK", [])
            return [bytearray(b"a" * 100000), memoryview(b"b" * 5000), Bytes(b"c" * 3000),
                    b"d" * (sf.MAX_CHUNK + 7)]

        expected = b"a" * 100000 + b"b" * 5000 + b"c" * 3000 + b"d" * (sf.MAX_CHUNK + 7)

        from test_serve_wsgi_c import FakeStream

        def Stream(data):
            return FakeStream(data, keep=True)  # kept as given, read after the request

        req = sf.encode_request_head(b"GET", b"/", [], peer=("127.0.0.1", 1),
                                     local=("127.0.0.1", 2)) + sf.encode_frame(sf.END)
        for c_route in (True, False):
            h = WSGIHandler(app)
            if not c_route:
                h._worker = None
            st = Stream(req)
            assert h.handle(st) == "ok"
            gc.collect()
            junk = [bytearray(b"z" * 100000) for _ in range(4)]  # reuses freed memory
            out, body = b"".join(bytes(x) for x in st.out), b""
            while out:
                typ, length, _ = sf.decode_header(out[:12])
                if typ == sf.BODY:
                    body += out[12:12 + length]
                out = out[12 + length:]
            assert body == expected, (c_route, len(body), body[:8])
        print("done")
        """, env={"PYTHONMALLOC": "debug"})


class RequestAbortedStub(OSError):
    pass


def test_ipv4_addresses_read_as_inet_ntop_writes_them():
    # decode_request formats an IPv4 address itself (no sprintf): the same text as before.
    import ipaddress
    import random

    rnd = random.Random(7)
    addrs = ["0.0.0.0", "255.255.255.255", "10.0.100.9", "1.20.255.0", "9.99.100.199"]
    addrs += [str(ipaddress.IPv4Address(rnd.getrandbits(32))) for _ in range(500)]
    for a in addrs:
        env = sf.decode_request(head(peer=(a, 1), local=(a, 2)))
        assert (env["REMOTE_ADDR"], env["SERVER_NAME"]) == (a, a)


def test_response_heads_over_the_stack_buffer_encode_whole():
    # encode_response_head tries 1 KiB on the stack first: a larger head is encoded whole.
    for n in (0, 10, 900, 1100, 4000, 7000):
        fields = [("X-Big", "v" * n)] + [(f"X-{i}", "w" * 8000) for i in range(n // 1000)]
        h = sf.encode_response_head(200, fields, 0, 0)
        assert sf.decode_response(h)[3] == fields
    with pytest.raises(ValueError):  # over MAX_HEAD: refused, as before
        sf.encode_response_head(200, [(f"X-{i}", "w" * 8000) for i in range(9)], 0, 0)


@pytest.mark.parametrize("body", [False, True])
@pytest.mark.parametrize("how", ["stream", "session"])
def test_write_after_the_front_ended_the_stream_raises_request_aborted(body, how):
    # docs/serve.md: at the stream's end, wsgi.input reads and write() raise RequestAborted.
    # write() looked for an ABORT with the exchange's check_abort, which let the stream's own
    # EndOfStreamError (PeerGoneError when the session ended) through once the request's END
    # was read: an app that stops on RequestAborted did not catch it.
    def app(environ, start_response, seen, ctl):
        environ["wsgi.input"].read()
        write = start_response("200 OK", [])
        write(b"first")
        ctl.started.set()
        ctl.ended.wait(10)
        time.sleep(0.1)
        try:
            write(b"more")
        except Exception as e:  # noqa: BLE001
            seen.append(type(e).__name__)
            raise
        return []

    if body:
        request = head(b"POST", flags=sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH,
                       content_length=2) + frame(sf.BODY, b"ab")
    else:
        request = head()
    _end_under_the_app(app, request + frame(sf.END), how)


# ---- request bodies -------------------------------------------------------------------------


def body_app(kind):
    def app(environ, start_response, seen, ctl):
        inp = environ["wsgi.input"]
        if kind == "read":
            data = inp.read()
        elif kind == "sizes":
            data = b"".join([inp.read(3), inp.read(0), inp.readline(), inp.read(5),
                             b"|".join(inp.readlines()), inp.read()])
        elif kind == "iter":
            data = b"|".join(list(inp))
        elif kind == "half":
            data = inp.read(4)  # the rest is never read: the worker drains it
        elif kind == "none":
            data = b""
        seen.append(data)
        write = start_response("200 OK", [("X-N", str(len(data)))])
        if kind in ("half", "none"):
            for _ in range(3):
                write(b"piece")  # the look for an ABORT reads one BODY frame ahead
        return [data]

    return app


def post(chunks, flags=sf.REQ_HAS_BODY | sf.REQ_CHUNKED, clen=0, tail=(frame(sf.END),)):
    def script(session, ctl):
        st = session.open_stream()
        st.write(head(b"POST", flags=flags, content_length=clen))
        for c in chunks:
            st.write(frame(sf.BODY, c))
        for f in tail:
            st.write(f)
        st.flush()
        try:
            return read_all(st)
        finally:
            st.close()

    return script


LINES = [b"one\ntwo", b"\nthree\n", b"four"]


@pytest.mark.parametrize("kind", ["read", "sizes", "iter", "half", "none"])
@pytest.mark.parametrize("chunks", [[b"abc"], LINES, [b"x" * 70000, b"y" * 5], [b""],
                                    [b"ab", b"", b"cd"]])
def test_request_bodies_read_through_wsgi_input(kind, chunks):
    frames, counts, _, seen, _ = run(body_app(kind), post(chunks))
    if b"" in chunks:
        return  # an empty BODY frame: whatever the Python route does, the same (run() checks)
    assert counts["ok"] == 1 and frames[-1][0] == sf.END
    n = sum(map(len, chunks))
    frames, counts, _, _, _ = run(body_app(kind), post(
        chunks, sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, n))
    assert counts["ok"] == 1


class _Index:
    def __init__(self, n):
        self.n = n

    def __index__(self):
        return self.n


_READS = {
    "none_and_negative": [("readline", None), ("readline", 0), ("readline", -1),
                          ("readline", 2), ("readline", None), ("readlines", 1),
                          ("readlines", None), ("read", None)],
    "wrong_types": [("readline", 1.5), ("readline", "1"), ("read", 1.5), ("read", "x"),
                    ("readlines", 1.5), ("readlines", "x"), ("readline", _Index(3)),
                    ("read", _Index(2)), ("readlines", _Index(0)), ("read", -5)],
    "hints": [("readlines", 3), ("readlines", 5), ("readlines", -1), ("readline", 0),
              ("readlines", 0), ("read", 0)],
    "readlines_zero": [("readlines", 0), ("read", None)],
}


@pytest.mark.parametrize("reads", sorted(_READS))
@pytest.mark.parametrize("chunks", [
    [b"one\ntwo\nthree\nfour\nfive\nsix\nseven"],
    [b"one\ntw", b"o\nthree", b"\n", b"four\nfive\nsix\nse", b"ven"],
])
def test_wsgi_input_takes_sizes_and_hints_as_io_does(reads, chunks):
    # wsgi.input.readline(None) raised TypeError (`0 <= None`) where read(None) reads all,
    # and readlines() with a hint of the wrong type raised only after it had taken a line,
    # which was lost. Sizes and hints now follow io (BytesIO here, the oracle): None or
    # negative is no limit, readline(0) is b"", a non-integer a TypeError before anything is
    # read. The same on both routes (both use wsgi.py's _Input, on their own exchange).
    import io
    import operator

    class Oracle(io.BytesIO):
        def readlines(self, hint=-1):  # a hint with __index__ too, as BufferedReader's
            return super().readlines(-1 if hint is None else operator.index(hint))

    def play(inp):
        out = []
        for name, arg in _READS[reads]:
            try:
                out.append(("ok", getattr(inp, name)(arg)))
            except TypeError:
                out.append(("TypeError",))
        return out

    def app(environ, start_response, seen, ctl):
        seen.append(play(environ["wsgi.input"]))
        start_response("200 OK", [])
        return [b"ok"]

    _, counts, _, seen, _ = run(app, post(chunks))
    assert counts["ok"] == 1
    assert seen == [play(Oracle(b"".join(chunks)))]


@pytest.mark.parametrize("flags,clen,chunks,tail", [
    (sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, 3, [b"abcde"], [frame(sf.END)]),  # past the length
    (sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, 3, [b"ab", b"cde"], [frame(sf.END)]),
    (sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH, 3, [b"a"], [frame(sf.END)]),  # END before it
    (sf.REQ_HAS_BODY | sf.REQ_CHUNKED, 0, [b"ab"], [frame(sf.RESPONSE_HEAD, b"\0" * 16)]),
    (sf.REQ_HAS_BODY | sf.REQ_CHUNKED, 0, [b"ab"], [b"garbage!garbage!"]),
    (sf.REQ_HAS_BODY | sf.REQ_CHUNKED, 0, [b"ab"], [frame(sf.END), frame(sf.BODY, b"late")]),
    (sf.REQ_HAS_BODY | sf.REQ_CHUNKED, 0, [b"ab"],
     [frame(sf.ABORT, b"gone", sf.ABORT_CLIENT_GONE)]),  # ABORT behind part of the body
    (sf.REQ_HAS_BODY | sf.REQ_CHUNKED, 0, [b"ab"],
     [frame(sf.END), frame(sf.ABORT, b"gone", sf.ABORT_TIMEOUT)]),
])
@pytest.mark.parametrize("kind", ["read", "half", "none"])
def test_bodies_that_break_the_protocol_or_end_early(flags, clen, chunks, tail, kind):
    run(body_app(kind), post(chunks, flags, clen, tail))


def test_abort_behind_an_unread_body_while_the_response_streams():
    # check_abort reads one BODY frame ahead (kept for wsgi.input), then sees the ABORT behind
    # the next one only once the app took it: the app reads the body piece by piece.
    class Ctl:
        def __init__(self):
            self.started = threading.Event()
            self.go = threading.Event()

    def app(environ, start_response, seen, ctl):
        write = start_response("200 OK", [])
        write(b"first")  # reads BODY "a" ahead
        ctl.started.set()
        ctl.go.wait(10)
        time.sleep(0.05)
        try:
            while True:
                write(b"more")
                seen.append(environ["wsgi.input"].read(1))
        except OSError as e:
            seen.append(type(e).__name__)
            raise

    def script(session, ctl):
        st = session.open_stream()
        st.write(head(b"POST", flags=sf.REQ_HAS_BODY | sf.REQ_CHUNKED) + frame(sf.BODY, b"a"))
        st.flush()
        assert ctl.started.wait(10)
        st.write(frame(sf.BODY, b"b") + frame(sf.BODY, b"c") +
                 frame(sf.ABORT, b"gone", sf.ABORT_CLIENT_GONE))
        st.flush()
        ctl.go.set()
        try:
            return read_all(st)
        finally:
            st.close()

    _, counts, _, seen, _ = run(app, script, Ctl)
    assert seen[:3] == [b"a", b"b", b"c"] and seen[-1] == "RequestAborted"
    assert counts["aborted"] == 1


def test_large_chunked_upload_streams_through_wsgi_input():
    import hashlib

    def app(environ, start_response, seen, ctl):
        h = hashlib.sha256()
        while True:
            b = environ["wsgi.input"].read(65536)
            if not b:
                break
            h.update(b)
        start_response("200 OK", [])
        return [h.hexdigest().encode()]

    piece = bytes(range(256)) * 4096  # 1 MiB, the largest BODY frame
    frames, counts, _, _, _ = run(app, post([piece] * 3))
    assert counts["ok"] == 1
    body = b"".join(p for t, _, p in frames if t == sf.BODY)
    assert body == hashlib.sha256(piece * 3).hexdigest().encode()


@pytest.mark.parametrize("kind", ["read", "none"])
def test_body_frame_whose_payload_comes_late(kind):
    # The look for an ABORT between pieces reads a BODY header whose payload is not all there:
    # it keeps the header (counted against content_length) and reads the payload later.
    class Ctl:
        def __init__(self):
            self.started = threading.Event()
            self.go = threading.Event()

    def app(environ, start_response, seen, ctl):
        write = start_response("200 OK", [])
        write(b"first")
        ctl.started.set()
        ctl.go.wait(10)
        time.sleep(0.05)
        write(b"second")
        if kind == "read":
            seen.append(environ["wsgi.input"].read())
        return [b"end"]

    def script(session, ctl):
        st = session.open_stream()
        body = frame(sf.BODY, b"x" * 50)
        st.write(head(b"POST", flags=sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH,
                      content_length=50) + body[:30])
        st.flush()
        assert ctl.started.wait(10)
        st.write(body[30:] + frame(sf.END))
        st.flush()
        ctl.go.set()
        try:
            return read_all(st)
        finally:
            st.close()

    _, counts, _, seen, _ = run(app, script, Ctl)
    assert counts["ok"] == 1 and seen == ([b"x" * 50] if kind == "read" else [])


def test_no_memory_kept_per_request_on_any_path():
    # Every path of the C route (a response, a 500, ABORT WORKER_ERROR, a body read, a body
    # left unread, a bad frame, ABORT from the front, a non-bytes piece) run many times: the
    # interpreter's allocated blocks do not grow with the count: a reference leaked on one path
    # adds 1000 blocks or more, where the run's own noise (threads, logging) stays under 300,
    # whether 800 or 8000 requests ran.
    import sys

    def app(environ, start_response):
        p = environ["PATH_INFO"]
        if p == "/raise":
            raise RuntimeError("boom")
        if p == "/str":
            start_response("200 OK", [])
            return ["text"]
        if p == "/mid":
            start_response("200 OK", [])

            def gen():
                yield b"x"
                raise RuntimeError("mid")

            return gen()
        data = environ["wsgi.input"].read() if p == "/read" else b""
        start_response("200 OK", [("Content-Length", str(len(data) + 2))])
        return [b"ok", data]

    def one(session, target, body=None, tail=()):
        st = session.open_stream()
        if body is None:
            st.write(head(target=target))
        else:
            st.write(head(b"POST", target, flags=sf.REQ_HAS_BODY | sf.REQ_CHUNKED) +
                     frame(sf.BODY, body))
        for f in tail or (frame(sf.END),):
            st.write(f)
        st.flush()
        read_all(st)
        st.close()

    r = Route(app, True)
    log = logging.getLogger("shmipc.serve")
    old, log.disabled = log.disabled, True
    try:
        def round_():
            one(r.session, b"/")
            one(r.session, b"/raise")
            one(r.session, b"/str")
            one(r.session, b"/mid")
            one(r.session, b"/read", b"abc")
            one(r.session, b"/unread", b"abc")
            one(r.session, b"/", None, [frame(sf.BODY, b"x"), frame(sf.END)])
            one(r.session, b"/", None, [frame(sf.ABORT, b"gone", sf.ABORT_CLIENT_GONE)])

        for _ in range(20):
            round_()
        r.wait_total(160)
        gc.collect()
        before = sys.getallocatedblocks()
        for _ in range(1000):
            round_()
        r.wait_total(8160)
        gc.collect()
        grown = sys.getallocatedblocks() - before
        assert grown < 600, grown  # 8000 requests, 1000 on each path
    finally:
        log.disabled = old
        r.stop()


def trickle_app(environ, start_response):
    """Answers without reading the request's body: /answer 200, /500 raises before its head,
    /abort after it (ABORT WORKER_ERROR); anything else 200 "next"."""
    path = environ["PATH_INFO"]
    if path == "/500":
        raise RuntimeError("failing before the head")
    start_response("200 OK", [("Content-Type", "text/plain")])
    if path == "/abort":
        def pieces():
            yield b"partial"
            raise RuntimeError("failing after the head")
        return pieces()
    return [b"ok" if path == "/answer" else b"next"]


@pytest.mark.parametrize("target,last", [(b"/answer", sf.END), (b"/500", sf.END),
                                         (b"/abort", sf.ABORT)])
@pytest.mark.parametrize("c_route", [True, False], ids=["c", "python"])
def test_drain_after_the_answer_ends_though_a_front_trickles(c_route, target, last):
    """Regression: after its END (an app that answered without reading the body, or the 500
    of one that failed before its head) the WSGI worker reads the rest of the request before
    it closes the stream, and did so with no deadline; after its ABORT, with 5 s for each
    read. A front that trickles the body (a BODY frame every 0.3 s, never END) held the worker
    (one request at a time) as long as it liked: the next request waited. The drain now has
    one deadline, 5 s for all its reads, as the C worker's after its ABORT; then the stream is
    closed and the next request served. Both routes."""
    r = Route(trickle_app, c_route)
    end = None
    try:
        got, end = answer_then_trickle(r.session, target)
        assert got[0] == last, got
        status, took = next_answer(r.session)
        assert status == 200
        assert took < 12, took
    finally:
        if end is not None:
            end()
        r.stop()


@pytest.mark.parametrize("what", CUT_SHORT)
@pytest.mark.parametrize("c_route", [True, False], ids=["c", "python"])
def test_first_frame_cut_short_does_not_hold_the_worker(c_route, what):
    """Regression: the WSGI worker read a stream's first frame (a REQUEST_HEAD, a HELLO's
    payload) with the stream's read timeout, none in the worker: a front that sent part of it
    (6 bytes of a header, a head short of its length, a HELLO short of its payload) and kept
    the stream open held the worker (one request at a time) as long as it liked: the next
    request waited. Now the whole first frame has one deadline, 5 s from the stream's accept
    (as the C and Lua workers'); then the stream is closed and the next request served. Both
    routes (the C route hands a HELLO back to the Python one after its header: one deadline
    for both). A late ABORT's text is never read: that stream is closed at once."""
    r = Route(trickle_app, c_route)
    try:
        status, took = cut_short_then_next(r.session, what)
        assert status == 200
        assert took < 10, took
        assert r.wait_total(2)["ok"] == 1
    finally:
        r.stop()


def test_the_first_frames_deadline_leaves_the_apps_reads_their_timeout():
    """The first frame's deadline sets the stream's read timeout only while a wait for the frame
    needs it, and puts the stream's own back once the frame came: the app's reads of the body
    wait as long as the stream's read timeout says (none here), not what was left of the
    first frame's 5 s. Both routes: a head that comes in two parts 0.3 s apart, then the body
    6 s later (past the first frame's deadline), which the app reads whole."""
    def app(environ, start_response):
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"got " + body]

    for c_route in (True, False):
        r = Route(app, c_route)
        try:
            st = r.session.open_stream()
            whole = head(b"POST", b"/", flags=sf.REQ_HAS_BODY | sf.REQ_CHUNKED)
            st.write(whole[:40])
            st.flush()
            time.sleep(0.3)
            st.write(whole[40:])
            st.flush()
            time.sleep(6)
            st.write(frame(sf.BODY, b"late") + frame(sf.END))
            st.flush()
            got = read_all(st)
            st.close()
            assert got[0][0] == sf.RESPONSE_HEAD, got
            assert got[1] == (sf.BODY, 0, b"got late"), got
        finally:
            r.stop()
