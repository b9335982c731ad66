"""shmipc-serve's ASGI websocket scope (python/shmipc/serve/asgi.py, docs/serve.md "The ASGI
worker"): this test plays the front over a shmipc client session, speaking the WS_* frames
of docs/serve.md to the worker (the front's own WebSocket side is not written yet)."""
import asyncio
import logging
import threading

import pytest

sf = pytest.importorskip("shmipc._serve")
from test_serve_asgi import Running, serve  # noqa: E402,F401  (serve: the fixture)
from test_serve_worker import frame  # noqa: E402
from serve_ws_front import FIN, accepted, close_frame, closed, message, send, upgrade  # noqa: E402


async def echo(scope, receive, send):
    assert scope["type"] == "websocket"
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while True:
        ev = await receive()
        if ev["type"] == "websocket.disconnect":
            echo.last = ev
            return
        await send({"type": "websocket.send", "text": ev.get("text"), "bytes": ev.get("bytes")})


def test_ws_scope_fields(serve):
    seen = {}

    async def app(scope, receive, send):
        seen.update(scope)
        await receive()
        await send({"type": "websocket.close"})

    front = serve(app)
    st = upgrade(front, b"/a%20b?x=1", protocols="chat, superchat")
    typ, arg, payload = front.read_frame(st)
    assert sf.decode_response(frame(typ, payload, arg))[0] == 403
    st.close()
    assert seen["type"] == "websocket"
    assert "method" not in seen
    assert seen["scheme"] == "ws"
    assert seen["path"] == "/a b" and seen["raw_path"] == b"/a%20b"
    assert seen["query_string"] == b"x=1"
    assert seen["subprotocols"] == ["chat", "superchat"]
    assert seen["client"] == ["127.0.0.1", 40000] and seen["server"] == ["127.0.0.1", 8080]
    assert [b"upgrade", b"websocket"] in seen["headers"]
    assert seen["asgi"]["version"] == "3.0"
    assert "websocket.http.response" in seen["extensions"]


def test_ws_echo_text_binary_fragmented_and_large(serve):
    front = serve(echo)
    st = upgrade(front)
    assert accepted(front, st) == []
    send(st, frame(sf.WS_DATA, "h\u00e9".encode(), 1 | FIN))
    assert message(front, st)[:2] == (1, "h\u00e9".encode())
    send(st, frame(sf.WS_DATA, b"\0\1", 2 | FIN))
    assert message(front, st)[:2] == (2, b"\0\1")
    # a message in three frames, with a ping between them (the front's business: ignored)
    send(st, frame(sf.WS_DATA, b"ab", 1), frame(sf.WS_PING, b"p"), frame(sf.WS_DATA, b"c", 0),
         frame(sf.WS_DATA, b"d", FIN))
    assert message(front, st)[:2] == (1, b"abcd")
    big = bytes(range(256)) * (4096 * 3 + 1)  # 3 MiB + 256: four frames of at most 1 MiB
    chunk = sf.MAX_CHUNK
    pieces = [big[i:i + chunk] for i in range(0, len(big), chunk)]
    for i, p in enumerate(pieces):
        st.write(frame(sf.WS_DATA, p, (2 if i == 0 else 0) | (FIN if i == len(pieces) - 1 else 0)))
    st.flush()
    op, data, n = message(front, st)
    assert (op, data == big, n) == (2, True, 4)
    send(st, close_frame(1000, b"bye"))
    assert closed(front, st) == (1000, "")
    st.close()


def test_ws_subprotocol_and_headers(serve):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept", "subprotocol": "superchat",
                    "headers": [(b"x-a", b"1"), (b"sec-websocket-accept", b"forged")]})
        await send({"type": "websocket.close", "code": 1000})
        ev = await receive()
        assert ev["type"] == "websocket.disconnect"

    front = serve(app)
    st = upgrade(front, protocols="chat, superchat")
    fields = accepted(front, st)
    assert ("Sec-WebSocket-Protocol", "superchat") in fields and ("x-a", "1") in fields
    assert not any(n.lower() == "sec-websocket-accept" for n, _ in fields)
    assert closed(front, st) == (1000, "")
    send(st, close_frame(1000))
    st.close()


@pytest.mark.parametrize("added_to_scope", [False, True])
def test_ws_subprotocol_not_offered_is_an_error_500(serve, added_to_scope):
    """With added_to_scope, a regression: websocket.accept checked its subprotocol against the
    app's scope, so an app that added one to scope["subprotocols"] answered a subprotocol the
    client had not offered (RFC 6455 4.2.2). The offer is the worker's own copy now."""
    async def app(scope, receive, send):
        if added_to_scope:
            scope["subprotocols"].append("nope")
        await receive()
        await send({"type": "websocket.accept", "subprotocol": "nope"})

    front = serve(app)
    st = upgrade(front, protocols="chat")
    typ, arg, payload = front.read_frame(st)
    assert sf.decode_response(frame(typ, payload, arg))[0] == 500
    st.close()


def test_ws_worker_closes_with_4001_and_reason(serve):
    got = {}

    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 4001, "reason": "go \u00e9"})
        got.update(await receive())
        try:
            await send({"type": "websocket.send", "text": "late"})
        except RuntimeError as e:
            got["late"] = str(e)

    front = serve(app)
    st = upgrade(front)
    accepted(front, st)
    assert closed(front, st) == (4001, "go \u00e9")
    send(st, close_frame(4001))
    assert front.request(b"GET", b"/after")[5] in (sf.END, sf.ABORT)  # the worker is free
    st.close()
    assert got["type"] == "websocket.disconnect" and got["code"] == 4001
    assert "closed" in got["late"]


@pytest.mark.parametrize("payload,code", [(close_frame(1000), 1000),
                                          (close_frame(4999, b"x"), 4999),
                                          (close_frame(), 1005)])
def test_ws_client_close_code_reaches_app_and_is_echoed(serve, payload, code):
    front = serve(echo)
    echo.last = None
    st = upgrade(front)
    accepted(front, st)
    send(st, payload)
    assert closed(front, st)[0] == (None if code == 1005 else code)
    st.close()
    front.request(b"GET", b"/sync")  # served after the websocket ended
    assert echo.last["code"] == code


def test_ws_app_raises_after_accept_is_1011(serve):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        await receive()
        raise ZeroDivisionError("boom")

    front = serve(app)
    st = upgrade(front)
    accepted(front, st)
    send(st, frame(sf.WS_DATA, b"x", 1 | FIN))
    assert closed(front, st) == (1011, "")
    send(st, close_frame(1011))
    st.close()


def test_ws_app_raises_before_accept_is_500_returns_is_403(serve):
    async def bad(scope, receive, send):
        raise ValueError("no")

    async def quiet(scope, receive, send):
        await receive()

    for app, status in ((bad, 500), (quiet, 403)):
        front = serve(app)
        st = upgrade(front)
        typ, arg, payload = front.read_frame(st)
        assert sf.decode_response(frame(typ, payload, arg))[0] == status
        st.close()


def test_ws_app_that_cleared_its_scope_then_raised_is_500(serve, caplog):
    """Regression: the failure's handling read scope["raw_path"] after the app ran, so an app
    that had cleared its scope made it raise KeyError, and the client got no answer. Now the
    request line comes from the frame, logged as in every route: "GET /ws?x=1"."""
    async def app(scope, receive, send):
        scope.clear()
        raise ValueError("boom after scope.clear()")

    front = serve(app)
    with caplog.at_level(logging.INFO, logger="shmipc.serve"):
        st = upgrade(front, target=b"/ws?x=1")
        typ, arg, payload = front.read_frame(st)
        assert sf.decode_response(frame(typ, payload, arg))[0] == 500
        st.close()
        assert "the app failed on websocket GET /ws?x=1\n" in caplog.text
        assert "boom after scope.clear()" in caplog.text and "KeyError" not in caplog.text


def test_ws_denial_response_extension(serve):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.http.response.start", "status": 401,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "websocket.http.response.body", "body": b"who", "more_body": True})
        await send({"type": "websocket.http.response.body", "body": b"?"})

    front = serve(app)
    st = upgrade(front)
    status, _, _, headers, body, last, _ = front.response(st)
    st.close()
    assert (status, body, last) == (401, b"who?", sf.END)


def test_ws_denial_response_of_101_is_an_app_error(serve):
    # A 101 as the denial response would have been the front's accept of the WebSocket (and
    # the body behind it a bad frame); a 1xx status is refused, as for http: 500.
    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.http.response.start", "status": 101})
        await send({"type": "websocket.http.response.body", "body": b"no"})

    front = serve(app)
    st = upgrade(front)
    status, _, _, _, body, last, _ = front.response(st)
    st.close()
    assert (status, body, last) == (500, b"Internal Server Error\n", sf.END)


def test_ws_client_gone_is_disconnect_1006(serve):
    got = {}
    done = threading.Event()

    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        got.update(await receive())
        try:
            await send({"type": "websocket.send", "text": "late"})
        except OSError as e:
            got["late"] = type(e).__name__
        done.set()

    front = serve(app)
    st = upgrade(front)
    accepted(front, st)
    send(st, frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
    assert done.wait(10)
    st.close()
    assert got["type"] == "websocket.disconnect" and got["code"] == 1006
    assert got["late"] == "RequestAborted"


@pytest.mark.parametrize("sending", [False, True], ids=["reading", "sending"])
def test_ws_close_then_stream_end_is_the_disconnect_code(serve, sending):
    """The front's WS_CLOSE (the client's 4001 "bye") with the stream closed right behind it,
    as the front does when it gave up waiting for the worker's answer: the app's receive()
    gives websocket.disconnect 4001 "bye", whether it was waiting in receive() (the echo of
    the close fails) or sent first (its echo of a message before the close fails, raising to
    the app). receive() raised EndOfStreamError: the failed answer escaped it."""
    got = {}
    done = threading.Event()

    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        try:
            while True:
                m = await receive()
                if m["type"] == "websocket.disconnect":
                    got.update(m)
                    return
                try:
                    await send({"type": "websocket.send", "text": m["text"]})
                except OSError as e:
                    got["send"] = type(e).__name__
        except BaseException as e:
            got["raised"] = repr(e)
            raise
        finally:
            done.set()

    front = serve(app)
    st = upgrade(front)
    accepted(front, st)
    frames = [frame(sf.WS_DATA, b"m1", 1 | FIN)] if sending else []
    send(st, *frames, close_frame(4001, b"bye"))
    st.close()
    assert done.wait(10)
    assert "raised" not in got, got
    assert (got["type"], got["code"], got["reason"]) == ("websocket.disconnect", 4001, "bye")
    # Whether the app's echo of "m1" failed depends on whether it ran before the stream's end
    # was seen (a race): only that a failed one raised an OSError to the app, not past it.
    assert "send" not in got or not sending or got["send"].endswith("Error")


def test_ws_many_connections_unique_messages(serve):
    """One worker serves one stream at a time: 40 connections one after the other, each
    with unique messages, none seen on another."""
    front = serve(echo)
    for i in range(40):
        st = upgrade(front)
        accepted(front, st)
        for j in range(5):
            m = f"c{i}-m{j}".encode() * (j + 1)
            send(st, frame(sf.WS_DATA, m, (1 if j % 2 else 2) | FIN))
            assert message(front, st)[:2] == ((1 if j % 2 else 2), m)
        send(st, close_frame(1000))
        assert closed(front, st) == (1000, "")
        st.close()


def test_ws_bad_frames_are_protocol_errors(serve):
    for bad in (frame(sf.WS_DATA, b"x", 0 | FIN),  # a continuation with no message
                frame(sf.BODY, b"x")):
        front = serve(echo)
        st = upgrade(front)
        accepted(front, st)
        send(st, bad)
        typ, arg, _ = front.read_frame(st)
        assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
        st.close()


@pytest.mark.parametrize("code,reason", [(1005, b""), (1006, b""), (999, b""), (5000, b""),
                                         (1000, b"\xff")])
def test_ws_bad_close_from_the_front_is_a_protocol_error(serve, code, reason):
    # A WS_CLOSE is checked whole, code and UTF-8 (docs/serve.md, "Bad frames"), as the C
    # worker does. Before, the bad code or reason failed the app's receive() (the echo of the
    # code, the reason's decoding: "the app failed", 1011 not sent, the stream closed bare).
    seen = []

    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        try:
            seen.append(await receive())
        except Exception as e:  # noqa: BLE001 (what the app got)
            seen.append(e)
            raise

    front = serve(app)
    st = upgrade(front)
    accepted(front, st)
    send(st, frame(sf.WS_CLOSE, code.to_bytes(2, "little") + reason))
    typ, arg, _ = front.read_frame(st)
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
    st.close()
    assert len(seen) == 1 and type(seen[0]).__name__ == "ProtocolViolation", seen


def test_ws_bad_close_after_the_app_returned_is_a_protocol_error(serve):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})

    front = serve(app)
    st = upgrade(front)
    accepted(front, st)
    assert closed(front, st) == (1000, "")
    send(st, frame(sf.WS_CLOSE, (1005).to_bytes(2, "little")))
    typ, arg, _ = front.read_frame(st)
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
    st.close()


def test_ws_bad_frame_after_the_app_failed_is_a_protocol_error(serve):
    # The app raised on an open socket: 1011, then the worker waits for the front's close. A
    # bad frame meanwhile is ABORT PROTOCOL, and the worker serves on. Before, the
    # ProtocolViolation escaped the failure's handling: the one-at-a-time worker's session
    # thread died (the session ended), the loop's task died unanswered.
    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        raise RuntimeError("boom after accept")

    front = serve(app)
    st = upgrade(front)
    accepted(front, st)
    assert closed(front, st) == (1011, "")
    send(st, b"XX" + frame(sf.WS_CLOSE)[2:])  # bad magic
    typ, arg, _ = front.read_frame(st)
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
    st.close()
    st = upgrade(front)
    accepted(front, st)
    assert closed(front, st) == (1011, "")
    send(st, close_frame(1011))
    st.close()


def test_ws_worker_stop_closes_open_socket_1001():
    """A stopping worker (SIGTERM, --max-requests) does not wait for the client forever: its
    open WebSocket closes 1001 (going away) and the app gets the disconnect."""
    got = {}

    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        got.update(await receive())

    r = Running(app)
    try:
        st = upgrade(r.front)
        accepted(r.front, st)
        r.worker.stop()
        assert closed(r.front, st) == (1001, "")
        send(st, close_frame(1001))
        r.thread.join(10)
        assert not r.thread.is_alive()
        st.close()
    finally:
        r.stop()
    assert got["type"] == "websocket.disconnect" and got["code"] == 1001


@pytest.mark.parametrize("bad", [
    {"type": "websocket.send", "text": "a", "bytes": b"b"},
    {"type": "websocket.send"},
    {"type": "websocket.send", "text": b"not str"},
    {"type": "websocket.send", "bytes": "not bytes"},
    {"type": "websocket.close", "code": 1005},
    {"type": "websocket.close", "code": 999},
    {"type": "websocket.close", "code": "1000"},
    {"type": "websocket.close", "reason": "x" * 124},
    {"type": "websocket.close", "reason": b"bytes"},
    {"type": "websocket.accept"},
    {"type": "websocket.http.response.start", "status": 403},
    {"type": "http.response.start", "status": 200},
    "not a dict",
])
def test_ws_misuse_after_accept_is_1011(serve, bad):
    raised = []

    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        try:
            await send(bad)
        except Exception as e:
            raised.append(e)
            raise

    front = serve(app)
    st = upgrade(front)
    accepted(front, st)
    assert closed(front, st) == (1011, "")
    send(st, close_frame(1011))
    st.close()
    front.request(b"GET", b"/sync")
    assert len(raised) == 1 and isinstance(raised[0], (TypeError, ValueError, RuntimeError))


def test_ws_concurrent_workers_unique_messages():
    """4 workers, a thread per worker driving 10 connections each with unique messages: no
    message seen on another connection."""
    runs = [Running(echo) for _ in range(4)]
    errors = []

    def drive(k, r):
        try:
            for i in range(10):
                st = upgrade(r.front)
                accepted(r.front, st)
                for j in range(4):
                    m = f"w{k}-c{i}-m{j}-".encode() * (50 * j + 1)
                    send(st, frame(sf.WS_DATA, m, 2 | FIN))
                    got = message(r.front, st)[1]
                    if got != m:
                        errors.append((k, i, j))
                send(st, close_frame(1000))
                closed(r.front, st)
                st.close()
        except Exception as e:  # noqa: BLE001 (reported below, the thread never asserts)
            errors.append(repr(e))

    try:
        ts = [threading.Thread(target=drive, args=(k, r)) for k, r in enumerate(runs)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not any(t.is_alive() for t in ts)
        assert errors == []
    finally:
        for r in runs:
            r.stop()
