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
from .wsgi import _END, _HOP, ProtocolViolation, RequestAborted, _body_header, _Exchange

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
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BODY_POLL_MAX)

    async def receive(self):
        if not self.body_done and not self.disconnected:
            try:
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
            await asyncio.sleep(_DISCONNECT_POLL)
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
        status = message["status"]
        if type(status) is not int or not 100 <= status <= 599:
            raise ValueError(f"bad status {status!r}")
        flags, length, fields = 0, None, []
        for h in message.get("headers", ()):
            name, value = h
            name, value = _as_bytes(name, "a header name"), _as_bytes(value, "a header value")
            lname = name.lower().decode("latin-1")
            if lname in _HOP:
                if lname == "content-length":
                    v = value.strip()
                    if not v.isdigit():
                        raise ValueError(f"bad Content-Length {value!r}")
                    length = int(v)
                elif lname == "connection" and b"close" in value.lower():
                    flags |= sf.RESP_CLOSE
                continue
            fields.append((name, value))
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
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"the body must be bytes, not {type(body).__name__}")
        more = bool(message.get("more_body", False))
        self.ex.check_abort()
        n = len(body)
        parts = []
        if not self.head_sent:
            length = self.length
            if length is None and not more and not self.bodyless():
                length = n  # one piece: the front can send Content-Length
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
            self.ex.send(*parts)


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

    async def _handle(self, ex):
        try:
            raw, (typ, length, arg) = ex.read_frame_header()
            if typ == sf.ABORT:
                return "late"  # as in WSGIHandler._handle
            if typ != sf.REQUEST_HEAD:
                raise ProtocolViolation(f"a frame of type {typ} before the request head")
            payload = ex.st.readexactly(length)
            try:
                scope = sf.decode_request_scope(raw + payload)
            except sf.FrameError as e:
                raise ProtocolViolation(str(e)) from None
            ex.head(arg, payload)
        except ProtocolViolation as e:
            log.error("shmipc-serve: bad frame from the front: %s", e)
            ex.abort(sf.ABORT_PROTOCOL, str(e))
            return "protocol"
        if getattr(self, "state", None) is not None:
            scope["state"] = dict(self.state)  # the spec: a shallow copy per request
        h = _Http(ex, scope)
        try:
            await self.app(scope, h.receive, h.send)
            if not h.complete and not h.disconnected and not ex.aborted:
                raise RuntimeError("the app returned before completing its response")
        except RequestAborted as e:
            log.info("shmipc-serve: %s %s: %s", scope["method"], scope["raw_path"], e)
            return "aborted"
        except ProtocolViolation as e:
            log.error("shmipc-serve: bad frame from the front: %s", e)
            ex.abort(sf.ABORT_PROTOCOL, str(e))
            return "protocol"
        except shmipc.Error:
            raise
        except Exception as e:
            if h.disconnected or ex.aborted:
                log.info("shmipc-serve: the app raised after the client went away: %r", e)
                return "aborted"
            if h.complete:
                # The response went out whole (its END too): it stands, no ABORT after it.
                log.error("shmipc-serve: the app failed after its response on %s %s",
                          scope["method"], scope["raw_path"], exc_info=e)
                ex.drain()
                return "error"
            return self._failed(ex, h, scope, e)
        if h.disconnected or ex.aborted:
            return "aborted"
        ex.drain()
        return "ok"

    def _failed(self, ex, h, scope, exc):
        log.error("shmipc-serve: the app failed on %s %s", scope["method"], scope["raw_path"],
                  exc_info=exc)
        if not h.started:
            head = sf.encode_response_head(
                500, [("Content-Type", "text/plain; charset=utf-8")], sf.RESP_CONTENT_LENGTH,
                len(_ERROR_BODY))
            parts = [head]
            if scope["method"] != "HEAD":
                parts += [_body_header(len(_ERROR_BODY)), _ERROR_BODY]
            ex.send(*parts, _END)
            ex.drain()
        else:
            ex.abort(sf.ABORT_WORKER_ERROR, f"{type(exc).__name__}: {exc}")
        return "error"
