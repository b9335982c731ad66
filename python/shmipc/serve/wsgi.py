"""The WSGI side of a shmipc-serve worker (docs/serve.md): one request per shmipc stream.

The front opens a stream per request and sends REQUEST_HEAD, BODY* and END; the environ is
built in C (``shmipc._serve.decode_request``). The worker runs the app (PEP 3333:
start_response with exc_info, the write() callable, the iterable's close()) and answers
RESPONSE_HEAD, BODY* and END on the same stream. Failures:

- the app raises before anything was sent: a complete 500 response, the traceback logged;
- the app raises after the head was sent, or sends more or fewer bytes than its own
  Content-Length: ABORT WORKER_ERROR (the front closes the client connection, so the client
  sees a truncated response rather than a wrong one);
- the front sends ABORT (the client went away, a timeout) or the stream ends: the app's
  iterable is closed and nothing more is sent;
- a frame that breaks docs/serve.md: ABORT PROTOCOL.
"""

import logging
import operator
import struct
import sys
import time

import shmipc

from .. import _serve as sf

__all__ = ["RequestAborted", "WSGIHandler"]

log = logging.getLogger("shmipc.serve")

_HDR = struct.Struct("<HBBII")
_MAGIC = 0x5653
# Hop-by-hop fields (RFC 9110 §7.6.1) are the front's: PEP 3333 forbids them to an app, and
# the front reconciles its own framing. Connection: close turns into the CLOSE flag. The list
# is serve_wsgi.c's, which drops them in start_response; the ASGI worker checks its own.
_HOP = sf.HOP_FIELDS
_ERROR_BODY = b"Internal Server Error\n"
# After its END or its ABORT, how long the worker waits for the front to end its side of the
# stream: one deadline for all the reads of the drain (drain()).
_ABORT_DRAIN_TIMEOUT = 5.0
# A stream's first frame (a REQUEST_HEAD, a HELLO's payload): all of it within this long of the
# stream's accept (the front sends a frame whole), then the stream is given up.
_HEAD_READ_TIMEOUT = 5.0
# _Exchange.head_timeout before the first frame's reads had to wait: the stream's read timeout
# was not changed.
_UNCHANGED = object()


class RequestAborted(OSError):
    """The front ended the request (ABORT from it, or its stream ended): the client is gone,
    or the request timed out. Raised by wsgi.input reads and by write()."""


class ProtocolViolation(Exception):
    """The front sent a frame that breaks docs/serve.md."""


# A REQUEST_HEAD frame's method_len and target_len, and where its method starts (docs/serve.md).
_REQ_LENS = struct.Struct("<HH")
_REQ_LENS_AT = sf.HDR_SIZE + 4
_REQ_METHOD_AT = sf.HDR_SIZE + 60


def request_line(frame):
    """``METHOD TARGET`` of a REQUEST_HEAD frame (whole and valid: the request's, decoded
    already) for the failure's log lines, in every route alike (in-process and pool, WSGI and
    ASGI): from our own bytes, never from the environ or the scope, which the app may have
    changed by the time it failed. The target is as the client sent it, query included,
    latin-1 decoded; the HTTP parser lets only 0x21-0x7E through, and what else a frame may
    carry (0x80-0xFF) and a log should not show raw (C1 controls, a soft hyphen) is escaped
    ``\\xNN``, a backslash ``\\\\``: a client's own ``/\\x85`` (visible ASCII) never reads as
    the byte 0x85."""
    ml, tl = _REQ_LENS.unpack_from(frame, _REQ_LENS_AT)
    at = _REQ_METHOD_AT + ml
    method = bytes(frame[_REQ_METHOD_AT:at]).decode("latin-1")
    target = bytes(frame[at:at + tl]).decode("latin-1")
    if not target.isprintable() or "\\" in target:
        target = target.translate(_TARGET_ESCAPES)
    return f"{method} {target}"


# request_line's escapes: what latin-1 holds that is not printable, and the backslash itself.
_TARGET_ESCAPES = {c: f"\\x{c:02x}" for c in range(256) if not chr(c).isprintable()}
_TARGET_ESCAPES[0x5C] = "\\\\"


def _exc_text(exc):
    """An ABORT's text for the app's exception: "Type: message". The message is the app's
    __str__, which may raise itself (or return no str, or a str subclass whose formatting
    raises): then the type alone; before, that error escaped the failure's handling."""
    try:
        return f"{type(exc).__name__}: {str(exc)}"
    except Exception:  # noqa: BLE001 (the app's own __str__, or its result's __format__)
        return f"{type(exc).__name__}: <str() failed>"


def _decode_header(raw):
    """A frame header's (type, length, arg); ProtocolViolation when it breaks docs/serve.md."""
    try:
        return sf.decode_header(raw)
    except sf.FrameError as e:
        raise ProtocolViolation(str(e)) from None


def _body_header(n):
    return _HDR.pack(_MAGIC, 1, sf.BODY, n, 0)


_END = sf.encode_frame(sf.END)


def _hello_answer(payload, concurrency):
    offered = int.from_bytes(payload[:4], "little")
    grant = (offered & sf.FEAT_TAKEN).to_bytes(4, "little") + concurrency.to_bytes(4, "little")
    return sf.encode_frame(sf.HELLO, grant)


class _Exchange:
    """The worker's end of one stream: reads the request's frames, writes the response's."""

    __slots__ = ("st", "done", "aborted", "abort_reason", "pending", "has_body", "expect", "got",
                 "end_queued", "partial", "drain_by", "head_by", "head_timeout")

    def __init__(self, st):
        self.st = st
        self.done = False  # the front's END (or ABORT) was read
        self.aborted = False
        self.abort_reason = 0
        self.pending = None  # a BODY payload check_abort read ahead, for wsgi.input
        self.has_body = True  # until head() says otherwise
        self.expect = None  # the head's content_length (CONTENT_LENGTH), else None
        self.got = 0  # body bytes read
        self.end_queued = False  # our END is written, not flushed: close() sends it (flush_close)
        # A frame (typ, length, arg) whose header a look without waiting read, checked, and
        # whose payload had not all arrived: the next look reads the payload. A look that
        # must not wait (the ASGI worker's loop) never waits for a payload either: a front
        # that sent a header and part of its payload (a flush cut short, or hostile) held
        # every request of the loop while one read waited for the rest.
        self.partial = None
        self.drain_by = None  # drain()'s deadline (time.monotonic()) while it runs
        # The first frame's deadline (time.monotonic()) until it was read (head_read()), and
        # the stream's read timeout before a wait for it changed that.
        self.head_by = None
        self.head_timeout = _UNCHANGED

    def head(self, flags, payload):
        """What the REQUEST_HEAD (`flags`, its payload) says of the body, for _next_body to
        hold the frames that follow to it: BODY frames only with HAS_BODY, and with
        CONTENT_LENGTH exactly content_length bytes of them (docs/serve.md, REQUEST_HEAD)."""
        self.has_body = bool(flags & sf.REQ_HAS_BODY)
        if flags & sf.REQ_CONTENT_LENGTH:
            self.expect = int.from_bytes(payload[12:20], "little")

    def answer_hello(self, length, concurrency=1):
        """The front's HELLO, its header read (docs/serve.md, "HELLO and TAKEN"): granted, of
        what it offers, what this worker does (TAKEN), with the worker's concurrency (1: it
        runs one request at a time). Not a request: "hello"."""
        payload = self.payload(length)
        self.head_read()
        self.send(_hello_answer(payload, concurrency))
        return "hello"

    def taken(self, flags):
        """TAKEN, before the application runs, when the front asked for it: the front gives a
        request it never saw TAKEN for to another worker, so one that cannot be said taken
        (the send fails) is not run."""
        if flags & sf.REQ_TAKEN_WANTED:
            self.send(sf.encode_frame(sf.TAKEN))

    def read_frame_header(self, nonblock=False):
        raw = self.st.readexactly(sf.HDR_SIZE, nonblock=True) if nonblock else \
            self.readexactly(sf.HDR_SIZE)
        if raw is None:
            return None
        return raw, _decode_header(raw)

    def next_body(self, nonblock=False):
        """The next BODY payload of the request; b"" at its END; with nonblock, None when no
        frame header is queued yet (a payload is then read whole). RequestAborted on ABORT,
        and when the stream or the session ends (the front closed it, or went away)."""
        try:
            return self._next_body(nonblock)
        except (shmipc.EndOfStreamError, shmipc.PeerGoneError, shmipc.ClosedError) as e:
            self.done = self.aborted = True
            raise RequestAborted(f"the front's stream ended: {e}") from e

    def _next_body(self, nonblock):
        if self.pending is not None:
            data, self.pending = self.pending, None
            return data
        while not self.done:
            if self.partial is None:
                got = self.read_frame_header(nonblock)
                if got is None:
                    return None
                _, (typ, length, arg) = got
                if typ == sf.BODY:
                    if not self.has_body:
                        raise ProtocolViolation("a BODY frame for a request without HAS_BODY")
                    if self.expect is not None and self.got + length > self.expect:
                        raise ProtocolViolation(
                            f"the body goes past its content_length {self.expect}")
                    self.got += length
                elif typ == sf.END:
                    if self.expect is not None and self.got != self.expect:
                        raise ProtocolViolation(
                            f"END after {self.got} of the body's {self.expect} bytes")
                    self.done = True
                    return b""
                elif typ != sf.ABORT:
                    raise ProtocolViolation(f"a frame of type {typ} in a request body")
                self.partial = (typ, length, arg)
            typ, length, arg = self.partial
            payload = self.payload(length, nonblock)
            if payload is None:
                return None
            self.partial = None
            if typ == sf.BODY:
                return payload
            self.done = self.aborted = True  # ABORT, its text read and dropped
            self.abort_reason = arg
            break
        if self.aborted:
            raise RequestAborted(f"the front aborted the request (reason {self.abort_reason})")
        return b""

    def payload(self, length, nonblock=False):
        """A frame's `length` payload bytes; with nonblock, None until all of them are here
        (nothing is consumed then)."""
        if not length:
            return b""
        return self.st.readexactly(length, nonblock=True) if nonblock else \
            self.readexactly(length)

    def readexactly(self, n):
        """`n` bytes, waited for: by drain()'s deadline while it runs, by the first frame's
        until it was read (head_by), else with the stream's read timeout."""
        if self.drain_by is not None:
            self._drain_left()
        elif self.head_by is not None:
            got = self.st.readexactly(n, nonblock=True)  # nearly always here: no timeout set
            if got is not None:
                return got
            self._head_left()
        return self.st.readexactly(n)

    def check_abort(self):
        """Without blocking: raise RequestAborted if the front has aborted the request
        (between the body pieces of a response, so a client that went away stops the app).

        What is queued before an ABORT may be request body the app has not read: one BODY
        frame is read ahead and kept for wsgi.input, and no more until the app takes it, so
        this never buffers more than one frame (1 MiB)."""
        while self.pending is None:
            if self.done:
                if self.partial is None:
                    got = self.read_frame_header(nonblock=True)
                    if got is None:
                        return
                    _, (typ, length, arg) = got
                    if typ != sf.ABORT:
                        raise ProtocolViolation(f"a frame of type {typ} after the request's END")
                    self.partial = (typ, length, arg)
                typ, length, arg = self.partial
                if self.payload(length, nonblock=True) is None:
                    return  # its text is on its way
                self.partial = None
                self.aborted = True
                self.abort_reason = arg
                raise RequestAborted(f"the front aborted the request (reason {arg})")
            data = self.next_body(nonblock=True)
            if data is None:
                return
            if data:
                self.pending = data

    def queue(self, *parts):
        """Written, not flushed: they go with the next send, or the close (flush_close)."""
        for p in parts:
            self.st.write(p)

    def send(self, *parts):
        self.queue(*parts)
        self.st.flush()

    def close(self):
        """Closes the stream; our END still queued goes with the close, one wakeup of the
        front for both (flush_close)."""
        if self.end_queued:
            self.end_queued = False
            self.st.flush_close()
        else:
            self.st.close()

    def abort(self, reason, text=""):
        """Send ABORT, then wait (bounded) for the front to end its side: its END or ABORT,
        or the stream's end when it closes. Closing at once would let its frames still in
        flight arrive after our close, and shmipc delivers data for a closed stream id as a
        new stream."""
        data = text.encode("utf-8", "replace")[: sf.MAX_ABORT_TEXT]
        try:
            self.send(sf.encode_frame(sf.ABORT, data, reason))
            if reason != sf.ABORT_PROTOCOL:
                self.drain()
        except (shmipc.Error, OSError, ProtocolViolation):
            pass

    def drain(self):
        """After our END or ABORT: read the rest of the request (the front ends it at once when
        it sees them), so both sides have ended the exchange before the stream closes. One
        deadline for all of it, _ABORT_DRAIN_TIMEOUT: each read waits only what is left of it,
        and none starts once it passed (shmipc.TimeoutError, which gives the stream up, as a
        stream that ended). Before, the drain after our END waited as long as the front kept
        sending (and the one after our ABORT 5 s for each read): a front that trickled the
        body, a frame every few seconds and never END, held the worker, which serves one
        request at a time, for as long as it liked."""
        self.drain_by = time.monotonic() + _ABORT_DRAIN_TIMEOUT
        try:
            while not self.done:
                self.next_body()
        except RequestAborted:
            pass
        finally:
            self.drain_by = None

    def _drain_left(self):
        """Before a read of drain(): what is left of its deadline as the read's timeout."""
        left = self.drain_by - time.monotonic()
        if left <= 0:
            raise shmipc.TimeoutError(
                f"stream {self.st.id}: the front did not end the request within "
                f"{_ABORT_DRAIN_TIMEOUT} s of the worker's END or ABORT")
        self.st.read_timeout = left

    def head_deadline(self, by=None):
        """The stream's first frame (a REQUEST_HEAD, a HELLO's payload) is read by `by`
        (time.monotonic(); None: _HEAD_READ_TIMEOUT from now), its reads waiting only what is
        left of it: past it shmipc.TimeoutError, which gives the stream up. The front sends a
        frame whole; before, those reads had the stream's read timeout (none in our workers),
        and a front that sent part of the frame and kept the stream open held the worker (one
        request at a time) as long as it liked."""
        self.head_by = time.monotonic() + _HEAD_READ_TIMEOUT if by is None else by

    def _head_left(self):
        """Before a wait for the first frame: what is left of head_by as the read's timeout."""
        left = self.head_by - time.monotonic()
        if left <= 0:
            raise self.head_late()
        if self.head_timeout is _UNCHANGED:
            self.head_timeout = self.st.read_timeout
        self.st.read_timeout = left

    def head_late(self):
        """The error of a first frame that did not come whole by head_by."""
        return shmipc.TimeoutError(
            f"stream {self.st.id}: the front did not send the stream's first frame whole "
            f"within {_HEAD_READ_TIMEOUT} s")

    def head_read(self):
        """The first frame was read: its deadline ends, the stream's read timeout is as it
        was (the application's reads have it)."""
        self.head_by = None
        if self.head_timeout is not _UNCHANGED:
            self.st.read_timeout, self.head_timeout = self.head_timeout, _UNCHANGED

    def drain_end(self):
        """drain() after our END, when nothing else would catch a bad frame in what is left of
        the request (a body the app never read): ABORT PROTOCOL, and True. Before, the
        ProtocolViolation escaped the handler and ended the worker's session thread, and the
        session (every request on it) with it."""
        try:
            self.drain()
        except ProtocolViolation as e:
            log.error("shmipc-serve: bad frame from the front: %s", e)
            self.abort(sf.ABORT_PROTOCOL, str(e))
            return True
        return False

    # The same for a coroutine (the ASGI handler). Here they block, as the calls above: a
    # worker that runs one request at a time has nothing else to run meanwhile. The ASGI
    # worker that runs many at once replaces them with ones that wait on its loop.

    async def aread_frame_header(self):
        return self.read_frame_header()

    async def areadexactly(self, n):
        return self.readexactly(n)

    async def aanswer_hello(self, length, concurrency=1):
        return self.answer_hello(length, concurrency)

    async def ataken(self, flags):
        self.taken(flags)

    async def asend(self, *parts):
        self.send(*parts)

    def try_send(self, parts):
        """asend() without a coroutine where it needs no wait: the parts still to asend().
        Here none: send() blocks. (_LoopExchange's returns those a full memory refused.)"""
        self.send(*parts)
        return ()

    async def aabort(self, reason, text=""):
        self.abort(reason, text)

    async def adrain(self):
        self.drain()

    async def adrain_end(self):
        """drain_end() for a coroutine (adrain and aabort: the loop's where it has them)."""
        try:
            await self.adrain()
        except ProtocolViolation as e:
            log.error("shmipc-serve: bad frame from the front: %s", e)
            await self.aabort(sf.ABORT_PROTOCOL, str(e))
            return True
        return False

    async def idle(self, delay):
        """Between two looks for a frame that was not there yet: `delay` seconds."""
        import asyncio  # only the ASGI handler awaits: a WSGI worker never imports it

        await asyncio.sleep(delay)


def _size(size):
    """A read's size or readlines' hint as io takes it: None (or a negative number) is no
    limit, -1; an integer, or what has __index__; else TypeError, before anything is read."""
    if size is None:
        return -1
    try:
        return operator.index(size)
    except TypeError:
        raise TypeError(
            f"argument should be integer or None, not '{type(size).__name__}'") from None


class _Input:
    """wsgi.input: the request body, read frame by frame as the app asks for it. Its sizes
    and hint are io's: None or negative is no limit, readline(0) is b"", readlines stops once
    its lines hold `hint` bytes (BytesIO's); anything but an integer (or what has __index__,
    as BufferedReader takes) or None is a TypeError before anything is read."""

    __slots__ = ("_ex", "_buf", "_pos")

    def __init__(self, ex):
        self._ex = ex
        self._buf = b""
        self._pos = 0

    def _fill(self):
        if self._ex.done:
            return False
        data = self._ex.next_body()
        if not data:
            return False
        if self._pos < len(self._buf):
            self._buf = self._buf[self._pos:] + data
        else:
            self._buf = data
        self._pos = 0
        return True

    def read(self, size=-1):
        if type(size) is not int:
            size = _size(size)
        if size < 0:
            while self._fill():
                pass
            out = self._buf[self._pos:]
            self._buf, self._pos = b"", 0
            return out
        while len(self._buf) - self._pos < size and self._fill():
            pass
        out = self._buf[self._pos:self._pos + size]
        self._pos += len(out)
        return out

    def readline(self, size=-1):
        if type(size) is not int:
            size = _size(size)  # None: no limit; before, `0 <= None` raised TypeError
        while True:
            i = self._buf.find(b"\n", self._pos)
            if i >= 0:
                end = i + 1
                break
            if 0 <= size <= len(self._buf) - self._pos or not self._fill():
                end = len(self._buf)
                break
        if size >= 0:
            end = min(end, self._pos + size)
        out = self._buf[self._pos:end]
        self._pos = end
        return out

    def readlines(self, hint=-1):
        if type(hint) is not int:
            hint = _size(hint)  # a wrong type raised after a line was taken, and lost it
        lines, total = [], 0
        while True:
            line = self.readline()
            if not line:
                return lines
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                return lines

    def __iter__(self):
        return self

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line


class _Response(sf.WSGIResponse):
    """write() and the sending of the head and body of one response; start_response and its
    checks are the C base's (shmipc._serve.WSGIResponse, shared with the in-process adapter):
    it sets status, code, headers (without the hop-by-hop fields), flags (RESP_CLOSE for
    Connection: close) and length (the app's Content-Length)."""

    __slots__ = ("ex", "hold")

    def __init__(self, ex, method):
        sf.WSGIResponse.__init__(self, method)
        self.ex = ex
        # The app's iterable runs no code after its last piece (a list or tuple without
        # close()): the piece that completes Content-Length waits for our END, and the END
        # for the stream's close, so that one message and one wakeup of the front carry all.
        self.hold = False

    def _head(self, length):
        flags = self.flags
        if length is not None:
            flags |= sf.RESP_CONTENT_LENGTH
        return sf.encode_response_head(self.code, self.headers, flags, length or 0)

    def send_head(self, length=None):
        if self.status is None:
            raise AssertionError("the app sent body bytes before calling start_response")
        if length is None:
            length = self.length
        h = self._head(length)
        self.head_sent = True
        self.ex.send(h)

    def write(self, data):
        if type(data) is bytes:
            mv = data
        elif isinstance(data, (bytes, bytearray, memoryview)):
            # A subclass's own __len__ or __getitem__ is not asked: its bytes are what goes,
            # as the C route takes them (by the buffer).
            mv = _flat(data)
        else:
            raise TypeError(f"the body must be bytes, not {type(data).__name__}")
        n = len(mv)
        if n == 0:
            return
        if self.status is None:
            raise AssertionError("the app sent body bytes before calling start_response")
        _look(self.ex)
        parts = []
        if not self.head_sent:
            parts.append(self._head(self.length))  # may raise: then nothing was sent
            self.head_sent = True
        if self._bodyless():
            if parts:
                self.ex.send(*parts)
            return
        if self.length is not None and self.sent + n > self.length:
            raise _LengthError(f"the app sent more than its Content-Length of {self.length}")
        for off in range(0, n, sf.MAX_CHUNK):
            piece = mv[off:off + sf.MAX_CHUNK]
            parts.append(_body_header(len(piece)))
            parts.append(piece)
        self.sent += n
        if self.hold and self.length is not None and self.sent == self.length:
            self.ex.queue(*parts)
            return
        self.ex.send(*parts)

    def finish(self):
        """The iterable is exhausted: the head if none was sent yet, then END."""
        if not self.head_sent:
            length = self.length
            if length is None and not (self.code < 200 or self.code in (204, 304)):
                length = 0  # no body: Content-Length 0, also to HEAD (GET's would be 0)
            h = self._head(length)
            self.head_sent = True
            self._end(h, _END)
            return
        if self.length is not None and self.sent < self.length and not self._bodyless():
            raise _LengthError(
                f"the app sent {self.sent} bytes of its Content-Length of {self.length}")
        self._end(_END)

    def _end(self, *parts):
        """The END (after the head, when none was sent): queued for the close when the request
        was read to its END (nothing left to drain; a look without waiting tells), else sent."""
        if self.hold:
            _look(self.ex)
            if self.ex.done and self.ex.pending is None:
                self.ex.queue(*parts)
                self.ex.end_queued = True
                return
        self.ex.send(*parts)


class _LengthError(Exception):
    pass


def _look(ex):
    """ex.check_abort() for write() and the END: the stream's or the session's end is
    RequestAborted here too, as in wsgi.input's reads (docs/serve.md). Before, the app's
    write() after the request's END raised the stream's own EndOfStreamError (PeerGoneError
    when the session ended), which an app that stops on RequestAborted did not catch."""
    try:
        ex.check_abort()
    except (shmipc.EndOfStreamError, shmipc.PeerGoneError, shmipc.ClosedError) as e:
        ex.done = ex.aborted = True
        raise RequestAborted(f"the front's stream ended: {e}") from e


def _flat(data):
    """A bytearray, memoryview or bytes subclass body piece as a view of its bytes, one per
    item: a memoryview's len() counts its items (4 bytes each for format "I"), and one that is
    not contiguous cannot be cast; both are taken whole, as bytes(data) takes them. A
    subclass's own __len__ and __getitem__ are not asked."""
    mv = memoryview(data)
    return mv.cast("B") if mv.c_contiguous else memoryview(mv.tobytes())


def _nbytes(data):
    """The bytes a body piece holds: len() of a memoryview counts its items, and a bytes or
    bytearray subclass's __len__ may say anything (the C route counts the object's bytes, and
    write() sends them: a subclass that said 2 for b"hello" got Content-Length 2 and five body
    bytes here). len() of anything else (a str: write() refuses it)."""
    t = type(data)
    if t is bytes or t is bytearray:
        return len(data)
    if t is memoryview:
        return data.nbytes
    if isinstance(data, (bytes, bytearray)):
        return memoryview(data).nbytes
    return len(data)


def _list_length(pieces):
    """The bytes of a list of body pieces; None when one is not bytes (write() refuses it)."""
    if len(pieces) == 1:
        return _nbytes(pieces[0])
    total = 0
    for piece in pieces:
        if not isinstance(piece, (bytes, bytearray, memoryview)):
            return None
        total += _nbytes(piece)
    return total


class WSGIHandler:
    """Runs one WSGI app on request streams: ``handle(stream)`` serves one request."""

    def __init__(self, app, *, errors=None):
        self.app = app
        self.base = {
            "wsgi.version": (1, 0),
            "wsgi.errors": errors if errors is not None else sys.stderr,
            "wsgi.multithread": False,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            # wsgi.input returns b"" at the end of the body, chunked uploads included.
            "wsgi.input_terminated": True,
        }
        # The request in C (shmipc._serve.WSGIWorker, serve_wsgi_worker.c, the same frames
        # and outcomes as the route below): it hands what is not a request (HELLO, a late
        # ABORT, a bad first frame) back to _serve (docs/serve.md). None: every request in
        # Python, on _Exchange and _Response.
        self._worker = sf.WSGIWorker(app, self.base, _HOOKS)

    def handle(self, st):
        """Serve the request on stream `st`, then close it. Returns "ok", "error" (the app
        failed: 500 or ABORT WORKER_ERROR), "aborted" (the front ended it), "protocol" or
        "late" (the stream held only a late ABORT)."""
        if self._worker is None:
            return self._serve(st, None)
        # What the C route hands back comes with its first frame's deadline: the rest of the
        # frame is read by it.
        got = self._worker.handle(st)
        return got if type(got) is str else self._serve(st, got[:2], got[2])

    def _serve(self, st, first, head_by=None):
        """handle(), from the request's first frame when it was read already: `first` is
        (its header's bytes, its payload or None when only the header was read); all of the
        first frame by `head_by` (_Exchange.head_deadline)."""
        ex = _Exchange(st)
        ex.head_deadline(head_by)
        outcome = "aborted"
        try:
            outcome = self._handle(ex, first)
        except (shmipc.Error, OSError) as e:
            # The stream or session ended under us: the front went away.
            _stream_ended(st, e)
        finally:
            try:
                ex.close()
            except shmipc.Error as e:
                # Our END went with the close (flush_close): the front never got it.
                _stream_ended(st, e)
                outcome = "aborted"
        return outcome

    def _handle(self, ex, first=None):
        try:
            if first is None:
                raw, (typ, length, flags) = ex.read_frame_header()
                payload = None
            else:
                raw, payload = first
                typ, length, flags = _decode_header(raw)
            if typ == sf.ABORT:
                # A late ABORT for an exchange that is already over on our side: the front
                # sent it before it saw our END, and shmipc delivers data for a closed
                # stream id as a new stream. Nothing to do.
                return "late"
            if typ == sf.HELLO:
                return ex.answer_hello(length)
            if typ != sf.REQUEST_HEAD:
                raise ProtocolViolation(f"a frame of type {typ} before the request head")
            if payload is None:
                payload = ex.payload(length)
            ex.head_read()
            frame = raw + payload
            try:
                environ = sf.decode_request(frame, self.base)
            except sf.FrameError as e:
                raise ProtocolViolation(str(e)) from None
            ex.head(flags, payload)
            ex.taken(flags)
        except ProtocolViolation as e:
            return _violation(ex, e)
        environ["wsgi.input"] = _Input(ex)
        # The failure's handling takes the method and the target from the frame and here,
        # never from the environ: the app may have changed it (environ.clear()) before it
        # raised, and a KeyError in the handler ended the worker's session thread.
        method = environ["REQUEST_METHOD"]
        resp = _Response(ex, method)
        result = None
        outcome = "ok"
        finished = False  # our END went out (or is queued): the response stands
        try:
            result = self.app(environ, resp.start_response)
            resp.hold = type(result) in (list, tuple)
            if (resp.length is None and not resp.head_sent and type(result) in (list, tuple)
                    and result and resp.status is not None
                    and not (resp.code < 200 or resp.code in (204, 304))):
                # A list's length is known before its first piece goes, so the front can send
                # Content-Length (to HEAD too: the length GET's body would have, without the
                # body), whether the pieces reach it at once or not.
                resp.length = _list_length(result)
            for data in result:
                resp.write(data)
            resp.finish()
            finished = True
        except RequestAborted as e:
            outcome = _aborted(frame, e)
        except ProtocolViolation as e:
            outcome = _violation(ex, e)
        except (shmipc.Error, OSError) as e:
            if isinstance(e, shmipc.Error) or ex.aborted:
                raise  # the stream is gone: handle() reports it
            outcome = _failed(ex, resp.head_sent, frame, method, e)
        except Exception as e:
            outcome = _failed(ex, resp.head_sent, frame, method, e)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as e:
                    _close_failed(e)
                    if outcome == "ok":
                        outcome = "error"
        if finished:
            # Also when close() raised after it: the front's END is still read before the
            # stream closes, else it would come as a new stream (docs/serve.md, "Streams").
            if ex.drain_end():
                outcome = "protocol"
        return outcome


# The rare turns of a request, shared by WSGIHandler's two routes: in C
# (shmipc._serve.WSGIWorker, with its own exchange of the same methods) and in Python.

def _stream_ended(st, e):
    log.debug("shmipc-serve: stream %d ended: %s", st.id, e)


def _aborted(frame, e):
    log.info("shmipc-serve: %s: %s", request_line(frame), e)
    return "aborted"


def _violation(ex, e):
    log.error("shmipc-serve: bad frame from the front: %s", e)
    ex.abort(sf.ABORT_PROTOCOL, str(e))
    return "protocol"


def _close_failed(e):
    log.error("shmipc-serve: the close() of the app's iterable raised", exc_info=e)


def _failed(ex, head_sent, frame, method, exc):
    """The app raised `exc`: a 500 when no head was sent yet, else ABORT WORKER_ERROR."""
    log.error("shmipc-serve: the app failed on %s", request_line(frame), exc_info=exc)
    if not head_sent:
        head = sf.encode_response_head(
            500, [("Content-Type", "text/plain; charset=utf-8")], sf.RESP_CONTENT_LENGTH,
            len(_ERROR_BODY))
        body = b"" if method == "HEAD" else _ERROR_BODY
        parts = [head]
        if body:
            parts += [_body_header(len(body)), body]
        ex.send(*parts, _END)
        if ex.drain_end():
            return "protocol"
    else:
        ex.abort(sf.ABORT_WORKER_ERROR, _exc_text(exc))
    return "error"


# What WSGIWorker takes from here (serve_wsgi_worker.c says what each is for).
_HOOKS = {
    "RequestAborted": RequestAborted, "ProtocolViolation": ProtocolViolation,
    "_LengthError": _LengthError, "_Input": _Input, "_flat": _flat,
    "_stream_ended": _stream_ended, "_aborted": _aborted, "_violation": _violation,
    "_close_failed": _close_failed, "_failed": _failed,
    "_ABORT_DRAIN_TIMEOUT": _ABORT_DRAIN_TIMEOUT, "_HEAD_READ_TIMEOUT": _HEAD_READ_TIMEOUT,
    "Error": shmipc.Error,
    "EndOfStreamError": shmipc.EndOfStreamError, "PeerGoneError": shmipc.PeerGoneError,
    "ClosedError": shmipc.ClosedError, "TimeoutError": shmipc.TimeoutError,
}
