"""The ASGI 3 side of a shmipc-serve worker (docs/serve.md, "The ASGI worker"): HTTP and
lifespan, one request per shmipc stream, one at a time per process, on an asyncio loop.

The scope is built in C (``shmipc._serve.decode_request_scope``); the frames are those of the
WSGI worker (wsgi.py's _Exchange). Failures:

- the app raises, or returns, before http.response.start: a complete 500, the traceback logged;
- the app raises after http.response.start, returns before the last body message, or breaks
  its own Content-Length: ABORT WORKER_ERROR (the client sees a truncated response);
- the front sends ABORT or the stream ends: receive() gives http.disconnect, and send() raises
  RequestAborted (an OSError, as ASGI 2.4 "Disconnected Client - Send Exception" asks);
- a send after the response is complete, an unknown event type or a missing key: the app's
  send() raises (RuntimeError, TypeError, ValueError), which maps as above.
"""

import asyncio
import logging
import time

import shmipc

from .. import _serve as sf
from .wsgi import (_END, _HOP, ProtocolViolation, RequestAborted, _body_header, _Exchange,
                   _exc_text, request_line)

__all__ = ["ASGIHandler", "LifespanFailed"]

log = logging.getLogger("shmipc.serve")

_ERROR_BODY = b"Internal Server Error\n"
# While the app waits in receive() after the body, the front's ABORT is looked for this often.
_DISCONNECT_POLL = 0.02
# receive()'s wait for the next BODY frame (see _Http._next_body).
_BODY_POLL_MIN = 0.00005
_BODY_POLL_MAX = 0.005
# Bounds on the lifespan exchanges: a startup or shutdown that never answers is a failure.
LIFESPAN_TIMEOUT = 30.0


_LIFESPAN_SENT = frozenset(("lifespan.startup.complete", "lifespan.startup.failed",
                            "lifespan.shutdown.complete", "lifespan.shutdown.failed"))


class LifespanFailed(Exception):
    """lifespan.startup.failed (or shutdown.failed): the app's message."""


def _as_bytes(v, what):
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    raise TypeError(f"{what} must be bytes, not {type(v).__name__}")


class _Http:
    """receive() and send() of one HTTP request."""

    def __init__(self, ex, scope):
        self.ex = ex
        self.method = scope["method"]
        self.body_done = False
        self.disconnected = False
        self.started = False  # http.response.start accepted
        self.head_sent = False
        self.complete = False  # the last body message sent
        self.status = 0
        self.headers = None
        self.flags = 0
        self.length = None
        self.sent = 0

    def bodyless(self):
        return self.method == "HEAD" or self.status < 200 or self.status in (204, 304)

    async def _next_body(self):
        """The next BODY payload without blocking the loop: a non-blocking look, then sleeps
        growing from 50 µs to 5 ms until the front's next frame is there, so the app's other
        tasks run while the client's body is on its way (a blocking read stopped them all).
        The stream's read timeout, when it has one, bounds the wait as it bounded the read."""
        delay = _BODY_POLL_MIN
        limit = self.ex.st.read_timeout
        end = None if limit is None or limit < 0 else time.monotonic() + limit
        while True:
            data = self.ex.next_body(nonblock=True)
            if data is not None:
                return data
            if end is not None and time.monotonic() >= end:
                raise shmipc.TimeoutError(f"no request body from the front in {limit} s")
            await self.ex.idle(delay)
            delay = min(delay * 2, _BODY_POLL_MAX)

    async def receive(self):
        if not self.body_done and not self.disconnected:
            try:
                # A look first: the body (or its END) is mostly here already, and the look
                # costs no coroutine.
                data = self.ex.next_body(nonblock=True)
                if data is None:
                    data = await self._next_body()
            except RequestAborted:
                self.disconnected = True
                return {"type": "http.disconnect"}
            if data == b"" or self.ex.done:
                self.body_done = True
            return {"type": "http.request", "body": data, "more_body": not self.body_done}
        # After the body: wait, bounded by the front's own deadlines, for its ABORT (the
        # client went away) or for our response to complete.
        while not self.disconnected and not self.complete:
            try:
                self.ex.check_abort()
            except RequestAborted:
                self.disconnected = True
                break
            await self.ex.idle(_DISCONNECT_POLL)
        self.disconnected = True
        return {"type": "http.disconnect"}

    async def send(self, message):
        if not isinstance(message, dict):
            raise TypeError(f"an ASGI message must be a dict, not {type(message).__name__}")
        typ = message.get("type")
        if self.complete:
            raise RuntimeError(f"{typ!r} sent after the response was complete")
        if self.disconnected or self.ex.aborted:
            raise RequestAborted("the client went away (the front aborted the request)")
        if typ == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self._start(message)
        elif typ == "http.response.body":
            if not self.started:
                raise RuntimeError("http.response.body before http.response.start")
            await self._body(message)
        else:
            raise ValueError(f"unexpected ASGI message type {typ!r} for an http scope")

    def _start(self, message):
        # In C (as the in-process adapter's ASGISend): status 200..599, as the C worker's (the
        # protocol carries a 1xx only as an interim head before the final one, which an app
        # cannot send here; a 1xx head then END was a bad exchange to the front, and a denial
        # response's 101 would have accepted the WebSocket); (bytes, bytes) headers, the
        # hop-by-hop ones dropped, Content-Length and Connection: close taken from them.
        status, fields, close, length = sf.asgi_start(message)
        flags = sf.RESP_CLOSE if close else 0
        # Checked now, so a bad header is a 500 rather than an ABORT at the first body.
        sf.encode_response_head(status, fields, flags, 0)
        self.status, self.headers, self.flags, self.length = status, fields, flags, length
        self.started = True

    def _head(self, length):
        flags = self.flags
        if length is not None:
            flags |= sf.RESP_CONTENT_LENGTH
        self.head_sent = True
        return sf.encode_response_head(self.status, self.headers, flags, length or 0)

    async def _body(self, message):
        body = message.get("body", b"")
        if not isinstance(body, bytes):
            if not isinstance(body, (bytearray, memoryview)):
                raise TypeError(f"the body must be bytes, not {type(body).__name__}")
            # Its bytes as they are now: len() of a memoryview counts its items, not bytes (a
            # view of 4-byte items went out cut to a quarter), a strided one cannot be cast,
            # and the app may change a bytearray while a send below waits for room.
            body = body.tobytes() if isinstance(body, memoryview) else bytes(body)
        more = bool(message.get("more_body", False))
        self.ex.check_abort()
        n = len(body)
        parts = []
        if not self.head_sent:
            length = self.length
            if (length is None and not more and self.status >= 200
                    and self.status not in (204, 304)):
                # One piece: the front can send Content-Length (to HEAD too: the length GET's
                # body would have, without the body).
                length = n
            parts.append(self._head(length))
        if not self.bodyless() and n:
            if self.length is not None and self.sent + n > self.length:
                raise _LengthError(f"the app sent more than its Content-Length of {self.length}")
            mv = memoryview(body).cast("B")
            for off in range(0, n, sf.MAX_CHUNK):
                piece = mv[off:off + sf.MAX_CHUNK]
                parts += [_body_header(len(piece)), piece]
            self.sent += n
        if not more:
            if (self.length is not None and self.sent < self.length and not self.bodyless()):
                raise _LengthError(
                    f"the app sent {self.sent} bytes of its Content-Length of {self.length}")
            parts.append(_END)
            self.complete = True
        if parts:
            parts = self.ex.try_send(parts)  # mostly all of them, without a coroutine
            if parts:
                await self.ex.asend(*parts)


class _LengthError(Exception):
    pass


class ASGIHandler:
    """Runs one ASGI 3 app on request streams: ``startup()``, then ``handle(stream)`` per
    request (the Worker calls it), then ``shutdown()``."""

    def __init__(self, app, *, lifespan_timeout=LIFESPAN_TIMEOUT):
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.lifespan_timeout = lifespan_timeout
        self._ls_in = None
        self._ls_out = None
        self._ls_task = None
        self.lifespan_supported = None
        # What its HELLO answers: 1 (one request at a time) unless an ASGIWorker runs it.
        self.concurrency = 1
        # Set by the Worker (its stop event): an open WebSocket is closed 1001 when it is set.
        self.stopping = None

    # ---- lifespan ---------------------------------------------------------------------

    def startup(self):
        """Run lifespan.startup; LifespanFailed with the app's message if it fails. An app
        that raises on the lifespan scope before answering does not support lifespan: the
        spec lets the server go on without it (logged)."""
        return self.loop.run_until_complete(self._startup())

    async def _startup(self):
        self._ls_in, self._ls_out = asyncio.Queue(), asyncio.Queue()
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": {}}
        self.state = scope["state"]

        async def send(message):
            # Anything else raises in the app (as uvicorn's lifespan does): an app that
            # answers the lifespan scope with http messages does not support lifespan.
            typ = message.get("type") if isinstance(message, dict) else None
            if typ not in _LIFESPAN_SENT:
                raise RuntimeError(f"unexpected ASGI message {typ!r} for a lifespan scope")
            await self._ls_out.put(message)

        async def run():
            try:
                await self.app(scope, self._ls_in.get, send)
            except BaseException as e:  # noqa: BLE001 (reported through the queue)
                await self._ls_out.put({"type": "_raised", "exc": e})
                return
            await self._ls_out.put({"type": "_returned"})

        self._ls_task = self.loop.create_task(run())
        await self._ls_in.put({"type": "lifespan.startup"})
        msg = await asyncio.wait_for(self._ls_out.get(), self.lifespan_timeout)
        typ = msg.get("type")
        if typ == "lifespan.startup.complete":
            self.lifespan_supported = True
            return
        if typ == "lifespan.startup.failed":
            raise LifespanFailed(msg.get("message", ""))
        self.lifespan_supported = False
        if typ == "_raised":
            log.info("shmipc-serve: the app does not support lifespan (%s: %s)",
                     type(msg["exc"]).__name__, msg["exc"])
        elif typ != "_returned":
            raise LifespanFailed(f"unexpected lifespan message {typ!r}")

    def shutdown(self):
        """Run lifespan.shutdown (after the last request); LifespanFailed if it fails."""
        try:
            if self.lifespan_supported:
                self.loop.run_until_complete(self._shutdown())
        finally:
            if self._ls_task is not None and not self._ls_task.done():
                self._ls_task.cancel()
                try:
                    self.loop.run_until_complete(self._ls_task)
                except BaseException:  # noqa: BLE001 (cancelled, or the app's own error)
                    pass
            self.loop.close()

    async def _shutdown(self):
        await self._ls_in.put({"type": "lifespan.shutdown"})
        msg = await asyncio.wait_for(self._ls_out.get(), self.lifespan_timeout)
        typ = msg.get("type")
        if typ == "lifespan.shutdown.failed":
            raise LifespanFailed(msg.get("message", ""))
        if typ != "lifespan.shutdown.complete":
            raise LifespanFailed(f"unexpected lifespan message {typ!r} at shutdown")

    # ---- http -------------------------------------------------------------------------

    def handle(self, st):
        """Serve the request on stream `st`, then close it; the outcomes of WSGIHandler."""
        ex = _Exchange(st)
        ex.head_deadline()  # all of the first frame within 5 s, as WSGIHandler's
        try:
            return self.loop.run_until_complete(self._handle(ex))
        except (shmipc.Error, OSError) as e:
            log.debug("shmipc-serve: stream %d ended: %s", st.id, e)
            return "aborted"
        finally:
            try:
                st.close()
            except shmipc.Error:
                pass

    async def _handle(self, ex, first=None):
        """One stream's exchange; `first`: its first frame header, when read already."""
        try:
            raw, (typ, length, arg) = first if first is not None else await ex.aread_frame_header()
            if typ == sf.ABORT:
                return "late"  # as in WSGIHandler._handle
            if typ == sf.HELLO:
                return await ex.aanswer_hello(length, self.concurrency)
            if typ != sf.REQUEST_HEAD:
                raise ProtocolViolation(f"a frame of type {typ} before the request head")
            payload = ex.payload(length, nonblock=True)  # nearly always here (as the head)
            if payload is None:
                payload = await ex.areadexactly(length)
            ex.head_read()
            frame = raw + payload
            try:
                scope = sf.decode_request_scope(frame)
            except sf.FrameError as e:
                raise ProtocolViolation(str(e)) from None
            ex.head(arg, payload)
            await ex.ataken(arg)
        except ProtocolViolation as e:
            log.error("shmipc-serve: bad frame from the front: %s", e)
            await ex.aabort(sf.ABORT_PROTOCOL, str(e))
            return "protocol"
        if getattr(self, "state", None) is not None:
            scope["state"] = dict(self.state)  # the spec: a shallow copy per request
        if arg & sf.REQ_UPGRADE:
            return await self._websocket(ex, _ws_scope(scope), frame)
        # The failure's handling takes the method from h (set now) and the request line from
        # the frame, never from the scope: the app may have changed it (del scope["method"])
        # before it raised, and the KeyError ended the task with no answer (a 502).
        h = _Http(ex, scope)
        try:
            await self.app(scope, h.receive, h.send)
            if not h.complete and not h.disconnected and not ex.aborted:
                raise RuntimeError("the app returned before completing its response")
        except RequestAborted as e:
            log.info("shmipc-serve: %s: %s", request_line(frame), e)
            return "aborted"
        except ProtocolViolation as e:
            log.error("shmipc-serve: bad frame from the front: %s", e)
            await ex.aabort(sf.ABORT_PROTOCOL, str(e))
            return "protocol"
        except shmipc.Error:
            raise
        except Exception as e:
            if h.disconnected or ex.aborted:
                log.info("shmipc-serve: the app raised after the client went away: %r", e)
                return "aborted"
            if h.complete:
                # The response went out whole (its END too): it stands, no ABORT after it.
                log.error("shmipc-serve: the app failed after its response on %s",
                          request_line(frame), exc_info=e)
                return "protocol" if await ex.adrain_end() else "error"
            return await self._failed(ex, h, frame, e)
        if h.disconnected or ex.aborted:
            return "aborted"
        if ex.done:
            return "ok"  # the request was read to its END: nothing is left to drain
        return "protocol" if await ex.adrain_end() else "ok"

    async def _websocket(self, ex, scope, frame):
        ws = _WebSocket(ex, scope, self.stopping)
        try:
            await self.app(scope, ws.receive, ws.send)
            await ws.finish()
        except RequestAborted as e:
            log.info("shmipc-serve: websocket %s: %s", request_line(frame), e)
            return "aborted"
        except ProtocolViolation as e:
            log.error("shmipc-serve: bad frame from the front: %s", e)
            await ex.aabort(sf.ABORT_PROTOCOL, str(e))
            return "protocol"
        except shmipc.Error:
            raise
        except Exception as e:
            if ws.got_close is not None and ws.got_close[0] == _WS_GONE:
                log.info("shmipc-serve: the app raised after the client went away: %r", e)
                return "aborted"
            log.error("shmipc-serve: the app failed on websocket %s", request_line(frame),
                      exc_info=e)
            if ws.accepted:
                await ws.fail()
            elif isinstance(ws.refused, _Http):
                if ws.refused.complete:
                    return "error"
                await ex.aabort(sf.ABORT_WORKER_ERROR, _exc_text(e))
            elif not ws.refused:
                await self._failed(ex, _Http(ex, {"method": "GET"}), frame, e, websocket=True)
            return "error"
        if ws.got_close is not None and ws.got_close[0] == _WS_GONE:
            return "aborted"
        if not ws.accepted and await ex.adrain_end():
            return "protocol"
        return "ok"

    async def _failed(self, ex, h, frame, exc, websocket=False):
        """The app raised: a 500 before its head, else ABORT WORKER_ERROR. The method is h's
        (taken before the app ran), the request line the frame's (request_line)."""
        if not websocket:  # _websocket logged it
            log.error("shmipc-serve: the app failed on %s", request_line(frame), exc_info=exc)
        if not h.started:
            head = sf.encode_response_head(
                500, [("Content-Type", "text/plain; charset=utf-8")], sf.RESP_CONTENT_LENGTH,
                len(_ERROR_BODY))
            parts = [head]
            if h.method != "HEAD":
                parts += [_body_header(len(_ERROR_BODY)), _ERROR_BODY]
            await ex.asend(*parts, _END)
            if await ex.adrain_end():
                return "protocol"
        else:
            await ex.aabort(sf.ABORT_WORKER_ERROR, _exc_text(exc))
        return "error"


# ---- websocket ----------------------------------------------------------------------------

_WS_TEXT, _WS_BINARY, _WS_FIN = 1, 2, 0x100
# After the app's close (or its return): how long the front has to answer with its WS_CLOSE.
_WS_CLOSE_WAIT = 5.0
_WS_NO_CODE = 1005  # an empty WS_CLOSE: RFC 6455 §7.1.5's "no status code was present"
_WS_GONE = 1006  # the client went away without a close (never sent on the wire)


def _ws_scope(scope):
    """The websocket scope (ASGI 2.3) from the http scope of the REQUEST_HEAD with UPGRADE:
    no method, scheme ws/wss, the offered subprotocols, the denial-response extension."""
    del scope["method"]
    scope["type"] = "websocket"
    scope["scheme"] = "wss" if scope["scheme"] == "https" else "ws"
    subs = []
    for name, value in scope["headers"]:
        if name == b"sec-websocket-protocol":
            subs += [p.strip() for p in value.decode("latin-1").split(",") if p.strip()]
    scope["subprotocols"] = subs
    scope["extensions"] = {"websocket.http.response": {}}
    return scope


class _WsGone(Exception):
    """The front ended the WebSocket (its WS_CLOSE, ABORT, or the stream's end)."""


def _ws_close_frame(code, reason=b""):
    return sf.encode_frame(sf.WS_CLOSE, code.to_bytes(2, "little") + reason if code else b"")


class _WebSocket:
    """receive() and send() of one websocket scope (docs/serve.md, "The ASGI worker").

    States: CONNECTING (the REQUEST_HEAD with UPGRADE is read; the app answers with
    websocket.accept, websocket.close (a 403) or websocket.http.response.*), OPEN, then
    closed once both sides sent their WS_CLOSE."""

    def __init__(self, ex, scope, stopping=None):
        self.ex = ex
        self.scope = scope
        # The subprotocols the client offered, ours: the app may change its scope's list.
        self.offered = tuple(scope["subprotocols"])
        self.stopping = stopping  # is_set(): the worker is stopping (worker._StopFlag)
        self.connect_given = False
        self.accepted = False
        self.refused = None  # an _Http for websocket.http.response.*, or True after a 403
        self.sent_close = False  # our WS_CLOSE is sent
        self.got_close = None  # the front's (code, reason), or (1006, "") when it went away
        self.parts = []  # the message being reassembled
        self.kind = 0

    # -- reading the front's frames --

    async def _frame(self, timeout=None):
        """The next frame (typ, arg, payload), polled without blocking the loop."""
        delay = _BODY_POLL_MIN
        limit = self.ex.st.read_timeout if timeout is None else timeout
        end = None if limit is None or limit < 0 else time.monotonic() + limit
        while True:
            if self.stopping is not None and self.stopping.is_set() and not self.sent_close:
                # The worker is stopping: close 1001 (going away), and wait for the front's
                # answer as after any close of ours, bounded.
                await self._send_close(1001, b"")
                wait = time.monotonic() + _WS_CLOSE_WAIT
                end = wait if end is None else min(end, wait)
            try:
                if self.ex.partial is not None:
                    # A frame whose header a look before the accept read (check_abort):
                    # its payload, then the frame, as any other.
                    typ, length, arg = self.ex.partial
                    self.ex.partial = None
                    return typ, arg, await self.ex.areadexactly(length) if length else b""
                got = self.ex.read_frame_header(nonblock=True)
                if got is not None:
                    _, (typ, length, arg) = got
                    if typ == sf.END and not self.ex.done and not length:
                        self.ex.done = True  # the END after the upgrade's REQUEST_HEAD
                        continue
                    return typ, arg, await self.ex.areadexactly(length) if length else b""
            except (shmipc.EndOfStreamError, shmipc.PeerGoneError, shmipc.ClosedError) as e:
                raise _WsGone(str(e)) from e
            if end is not None and time.monotonic() >= end:
                if self.sent_close and timeout is not None and timeout < 0:
                    raise _WsGone("no WS_CLOSE from the front after the worker's close")
                raise shmipc.TimeoutError(f"no WebSocket frame from the front in {limit} s")
            await self.ex.idle(delay)
            delay = min(delay * 2, _BODY_POLL_MAX)

    async def _closed_by_front(self, typ, arg, payload):
        """The front's WS_CLOSE or ABORT: note it (and answer a WS_CLOSE, completing the
        close handshake) and return the disconnect event."""
        if typ == sf.WS_CLOSE:
            # Checked whole, as the C worker does (docs/serve.md, "Bad frames"): a code the
            # protocol does not carry (1005, 1006, 999, 5000) or a reason that is not UTF-8
            # is the front's bad frame. Before, it reached the app: as its code, or as an
            # error raised in its receive() (the echo of the code, or the reason's decoding)
            # that failed the app, and the stream closed with no ABORT.
            try:
                sf.encode_frame(sf.WS_CLOSE, payload)
            except ValueError:
                raise ProtocolViolation("a WS_CLOSE with a bad code or reason") from None
        if typ == sf.ABORT:
            self.ex.aborted = True
            self.ex.abort_reason = arg
            self.got_close = (_WS_GONE, "")
        elif len(payload) >= 2:
            self.got_close = (int.from_bytes(payload[:2], "little"),
                              payload[2:].decode("utf-8"))
        elif self.ex.aborted:
            self.got_close = (_WS_GONE, "")
        else:
            self.got_close = (_WS_NO_CODE, "")
        if typ == sf.WS_CLOSE and not self.sent_close:
            # Echo its code, as RFC 6455 §5.5.1 asks of the endpoint that did not close first.
            code = self.got_close[0] if self.got_close[0] != _WS_NO_CODE else 0
            try:
                await self._send_close(code, b"")
            except (shmipc.EndOfStreamError, shmipc.PeerGoneError, shmipc.ClosedError,
                    RequestAborted):
                # The front closed the stream right behind its close (it gave up waiting for
                # our answer): the client's close came all the same, and is the disconnect's
                # code (RFC 6455 §7.1.5), not an error out of receive().
                pass
        return self._disconnect()

    def _disconnect(self):
        code, reason = self.got_close
        return {"type": "websocket.disconnect", "code": code, "reason": reason}

    async def receive(self):
        if not self.connect_given:
            self.connect_given = True
            return {"type": "websocket.connect"}
        if self.got_close is not None:
            return self._disconnect()
        if not self.accepted:
            # Nothing comes before our answer but the front's ABORT (the client went away).
            while True:
                try:
                    self.ex.check_abort()
                except RequestAborted:
                    self.got_close = (_WS_GONE, "")
                    return self._disconnect()
                except (shmipc.EndOfStreamError, shmipc.PeerGoneError, shmipc.ClosedError):
                    self.got_close = (_WS_GONE, "")
                    return self._disconnect()
                if self.accepted or self.refused:
                    break
                await self.ex.idle(_DISCONNECT_POLL)
            if self.refused:
                self.got_close = (_WS_GONE, "")
                return self._disconnect()
        while True:
            try:
                typ, arg, payload = await self._frame(timeout=-1)
            except _WsGone:
                self.got_close = (_WS_GONE, "")
                return self._disconnect()
            if typ in (sf.WS_CLOSE, sf.ABORT):
                return await self._closed_by_front(typ, arg, payload)
            if typ in (sf.WS_PING, sf.WS_PONG):
                continue  # the front answers the client's pings itself
            if typ != sf.WS_DATA:
                raise ProtocolViolation(f"a frame of type {typ} on an open WebSocket")
            op = arg & 0xFF
            if op not in (0, _WS_TEXT, _WS_BINARY) or (op == 0) == (not self.parts and self.kind == 0):
                raise ProtocolViolation(f"WS_DATA opcode {op} out of sequence")
            if op:
                self.kind = op
            self.parts.append(payload)
            if arg & _WS_FIN:
                data, kind = b"".join(self.parts), self.kind
                self.parts, self.kind = [], 0
                if kind == _WS_TEXT:
                    try:
                        return {"type": "websocket.receive", "text": data.decode("utf-8")}
                    except UnicodeDecodeError:
                        raise ProtocolViolation("a text message that is not UTF-8") from None
                return {"type": "websocket.receive", "bytes": data}

    # -- writing --

    async def _send_close(self, code, reason):
        f = _ws_close_frame(code, reason)  # a bad code raises here, with nothing sent
        self.sent_close = True
        await self.ex.asend(f)

    async def send(self, message):
        if not isinstance(message, dict):
            raise TypeError(f"an ASGI message must be a dict, not {type(message).__name__}")
        typ = message.get("type")
        if isinstance(self.refused, _Http):
            if typ not in ("websocket.http.response.body",):
                raise RuntimeError(f"{typ!r} after websocket.http.response.start")
            await self.refused.send(dict(message, type="http.response.body"))
            return
        if self.sent_close or self.refused:
            raise RuntimeError(f"{typ!r} sent after the WebSocket was closed")
        if self.got_close is not None or self.ex.aborted:
            raise RequestAborted("the client went away (the WebSocket is closed)")
        if typ == "websocket.accept":
            if self.accepted:
                raise RuntimeError("websocket.accept sent twice")
            await self._accept(message)
        elif typ == "websocket.send":
            if not self.accepted:
                raise RuntimeError("websocket.send before websocket.accept")
            await self._data(message)
        elif typ == "websocket.close":
            code = message.get("code", 1000)
            reason = message.get("reason") or ""
            if not isinstance(reason, str):
                raise TypeError(f"the close reason must be str, not {type(reason).__name__}")
            reason = reason.encode("utf-8")
            if type(code) is not int or len(reason) > 123:
                raise ValueError(f"bad close code {code!r} or a reason over 123 bytes")
            if not self.accepted:
                await self._refuse403()
                return
            try:
                await self._send_close(code, reason)
            except ValueError as e:
                raise ValueError(f"bad close code {code!r}: {e}") from None
        elif typ == "websocket.http.response.start":
            if self.accepted:
                raise RuntimeError("websocket.http.response.start after websocket.accept")
            h = _Http(self.ex, {"method": "GET"})
            await h.send(dict(message, type="http.response.start"))
            self.refused = h
        else:
            raise ValueError(f"unexpected ASGI message type {typ!r} for a websocket scope")

    async def _accept(self, message):
        fields = []
        sub = message.get("subprotocol")
        if sub is not None:
            if sub not in self.offered:
                raise ValueError(f"subprotocol {sub!r} was not offered by the client")
            fields.append((b"Sec-WebSocket-Protocol", sub.encode("latin-1")))
        for h in message.get("headers", ()):
            name, value = h
            name, value = _as_bytes(name, "a header name"), _as_bytes(value, "a header value")
            lname = name.lower().decode("latin-1")
            if lname in _HOP or lname.startswith("sec-websocket-"):
                continue  # the front's: the handshake's own fields
            fields.append((name, value))
        head = sf.encode_response_head(101, fields, 0, 0)
        self.accepted = True
        await self.ex.asend(head, _END)

    async def _data(self, message):
        b, t = message.get("bytes"), message.get("text")
        if (b is None) == (t is None):
            raise ValueError("websocket.send needs exactly one of bytes and text")
        if t is not None:
            if not isinstance(t, str):
                raise TypeError(f"text must be str, not {type(t).__name__}")
            data, op = t.encode("utf-8"), _WS_TEXT
        else:
            data, op = _as_bytes(b, "bytes"), _WS_BINARY
        parts, n, off = [], len(data), 0
        while True:
            piece = data[off:off + sf.MAX_CHUNK]
            off += len(piece)
            parts.append(sf.encode_frame(sf.WS_DATA, piece, op | (_WS_FIN if off >= n else 0)))
            op = 0
            if off >= n:
                break
        await self.ex.asend(*parts)

    async def _refuse403(self):
        self.refused = True
        await self.ex.asend(sf.encode_response_head(403, [], sf.RESP_CONTENT_LENGTH, 0), _END)

    async def finish(self):
        """After the app: complete what it left (a 403 when it never answered, a 1000 close
        when it returned on an open socket) and wait, bounded, for the front's WS_CLOSE so
        that both sides ended the stream before it closes."""
        if isinstance(self.refused, _Http):
            if not self.refused.complete:
                raise RuntimeError("the app returned before completing its denial response")
            return
        if self.refused:
            return
        if not self.accepted:
            if self.got_close is None:
                await self._refuse403()
            return
        if not self.sent_close and self.got_close is None:
            await self._send_close(1000, b"")
        await self._await_close()

    async def fail(self):
        """The app raised on an open socket: close 1011 (RFC 6455 §7.4.1)."""
        if not self.sent_close and self.got_close is None:
            await self._send_close(1011, b"")
        await self._await_close()

    async def _await_close(self):
        while self.got_close is None:
            try:
                typ, arg, payload = await self._frame(timeout=_WS_CLOSE_WAIT)
                if typ in (sf.WS_CLOSE, sf.ABORT):
                    await self._closed_by_front(typ, arg, payload)
            except (_WsGone, shmipc.TimeoutError):
                return
            except ProtocolViolation as e:
                # After the app (or in its failure's handling, fail()): nobody else would
                # catch it, and it ended the worker's session thread (or the loop's task).
                log.error("shmipc-serve: bad frame from the front: %s", e)
                await self.ex.aabort(sf.ABORT_PROTOCOL, str(e))
                self.got_close = (_WS_GONE, "")
