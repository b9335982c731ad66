"""shmipc.aio: awaitable stream reads and writes for asyncio.

Built on the non-blocking calls of the C module: a read first tries ``nonblock=True``; when
no data is there it waits for the session's descriptor (``loop.add_reader``), calls
``Session.process()`` when it fires, and tries again. Every read of one session on one loop
shares one reader registration, which exists only while some read waits.

    import asyncio, shmipc
    from shmipc.aio import AsyncStream

    async def main():
        with shmipc.connect("unix:@svc") as session:
            a = AsyncStream(session.open_stream())
            a.write(b"ping")
            await a.drain()
            print(await a.readexactly(4))
            a.close()

``AsyncStream`` holds nothing but its current stream while idle, and the stream can be
replaced at any time (``a.stream = pool.get_stream()``): a read that was pending keeps reading
the stream it started on, and an end of stream seen on an old stream is forgotten.

Streams from a ``SessionManager`` or a serving ``Listener`` have no descriptor in the C ABI
(their sessions are not exposed), so reads on them poll with a growing delay (0.1 ms up to
10 ms) instead of waiting for the descriptor.
"""

import asyncio
import weakref

from . import _shmipc

__all__ = ["AsyncStream", "accept", "accept_stream"]

# A waiting read looks again after this long even without a wakeup. Reads of other streams of
# the session can process the event meant for it (the C non-blocking read handles whatever the
# socket holds); a wakeup lost that way costs at most this delay, never a hang.
_RECHECK = 0.1
# Polling of streams without a session descriptor (SessionManager and serve() streams).
_POLL_MIN = 0.0001
_POLL_MAX = 0.01

# loop -> {Session: _Watcher}; a watcher exists only while reads of that session wait.
_watchers = weakref.WeakKeyDictionary()


def _closed(what):
    try:
        _shmipc._raise_for_code(_shmipc.errors["ECLOSED"], what)
    except _shmipc.ClosedError as e:
        return e


def _wake(fut):
    if not fut.done():
        fut.set_result(None)


class _Watcher:
    """The one add_reader registration of a session on a loop, shared by its waiting reads."""

    __slots__ = ("loop", "session", "fd", "waiters", "table")

    def __init__(self, loop, session, table):
        self.loop = loop
        self.session = session
        self.fd = session.fileno()
        self.waiters = set()
        self.table = table

    def add(self, fut):
        if not self.waiters:
            self.loop.add_reader(self.fd, self._ready)
        self.waiters.add(fut)

    def discard(self, fut):
        self.waiters.discard(fut)
        if not self.waiters:
            self.loop.remove_reader(self.fd)
            if self.table.get(self.session) is self:
                del self.table[self.session]

    def _ready(self):
        try:
            self.session.process()
        except _shmipc.Error:
            pass  # the session ended: the woken reads raise the error themselves
        self.wake()

    def wake(self):
        for fut in self.waiters:
            _wake(fut)


def _table(loop):
    table = _watchers.get(loop)
    if table is None:
        table = _watchers[loop] = {}
    return table


def _drive(loop, session):
    """Before a read of `session`: when other reads of it wait, process the session's events
    here and wake them if there were any, so that this read cannot swallow their news."""
    table = _watchers.get(loop)
    if table:
        _drive_in(table, session)


def _drive_in(table, session):
    """_drive() with the loop's table (_table(loop), kept by a caller that reads often: the
    lookup by loop is a WeakKeyDictionary's, several calls of Python)."""
    w = table.get(session)
    if w is None:
        return
    try:
        events = session.process()
    except _shmipc.Error:
        events = 1  # the session ended: everyone must look
    if events:
        w.wake()


async def _wait(loop, session):
    table = _table(loop)
    w = table.get(session)
    if w is None:
        w = table[session] = _Watcher(loop, session, table)
    fut = loop.create_future()
    w.add(fut)
    timer = loop.call_later(_RECHECK, _wake, fut)
    try:
        await fut
    finally:
        timer.cancel()
        w.discard(fut)


async def _until(stream, attempt, loop=None):
    """Calls attempt() (a non-blocking call returning None for 'not yet') until it returns
    something, waiting for the stream's session between attempts. `loop`: the running loop,
    when the caller knows it (asyncio.get_running_loop() is a getpid() system call)."""
    if loop is None:
        loop = asyncio.get_running_loop()
    session = stream.session
    delay = _POLL_MIN
    while True:
        if session is not None:
            _drive(loop, session)
        result = attempt()
        if result is not None:
            return result
        if session is not None and not session.closed:
            await _wait(loop, session)
        else:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)


class AsyncStream:
    """An asyncio adapter over a shmipc.Stream.

    ``await read_chunk()`` / ``read_exact_bytes(n)`` return zero-copy Chunks, ``await read()``
    / ``readexactly(n)`` return bytes, ``write()`` fills the send buffer and ``await drain()``
    flushes it. End of stream is an empty result from read_chunk()/read() (and ``at_eof()``
    becomes true) and EndOfStreamError from read_exact_bytes()/readexactly().

    The adapter holds only its current stream while idle. ``stream`` may be replaced (or set
    to None) at any time: a pending read keeps reading the stream it started on, and the
    end-of-stream state of the old stream does not carry over.
    """

    __slots__ = ("_stream", "_gen", "_eof_chunk", "__weakref__")

    def __init__(self, stream=None):
        self._stream = None
        self._gen = 0
        self._eof_chunk = None
        self.stream = stream

    @property
    def stream(self):
        """The underlying shmipc.Stream (or None). Setting it forgets the old one's state."""
        return self._stream

    @stream.setter
    def stream(self, stream):
        if stream is not None and not isinstance(stream, _shmipc.Stream):
            raise TypeError(f"AsyncStream needs a shmipc.Stream, not {type(stream).__name__}")
        self._stream = stream
        self._gen += 1
        self._eof_chunk = None

    def detach(self):
        """Return the stream and leave the adapter empty (e.g. to put the stream back)."""
        stream = self._stream
        self.stream = None
        return stream

    def at_eof(self):
        """True once a read of the current stream saw its end."""
        return self._eof_chunk is not None

    def _current(self):
        if self._stream is None:
            raise _closed("AsyncStream: no stream")
        return self._stream, self._gen

    def _saw_eof(self, gen, chunk):
        # Only for the stream the read started on, and only while it is still the current one.
        if gen == self._gen:
            self._eof_chunk = chunk

    async def read_chunk(self, max=0):
        """The next piece of data as a zero-copy Chunk; an empty Chunk at end of stream."""
        stream, gen = self._current()
        if self._eof_chunk is not None and not self._eof_chunk.released:
            return self._eof_chunk
        chunk = await _until(stream, lambda: stream.read_chunk(max, nonblock=True))
        if not len(chunk):
            self._saw_eof(gen, chunk)
        return chunk

    async def read(self, max=0):
        """The next piece of data as bytes; b'' at end of stream."""
        stream, gen = self._current()
        if self._eof_chunk is not None:
            return b""
        chunk = await _until(stream, lambda: stream.read_chunk(max, nonblock=True))
        if not len(chunk):
            self._saw_eof(gen, chunk)
            return b""
        with chunk:
            return bytes(chunk)

    async def read_exact_bytes(self, n):
        """Exactly n bytes as a Chunk; EndOfStreamError if the stream ends first."""
        stream, _ = self._current()
        return await _until(stream, lambda: stream.read_exact_bytes(n, nonblock=True))

    async def readexactly(self, n):
        """Exactly n bytes as bytes; EndOfStreamError if the stream ends first."""
        stream, _ = self._current()
        return await _until(stream, lambda: stream.readexactly(n, nonblock=True))

    async def forward(self, src, n=0):
        """Send received bytes on without a copy (see Stream.forward): what src (a Stream or
        an AsyncStream) read and has not given back, then its next n bytes, go into this
        stream's send buffer once they are there; drain() sends them. EndOfStreamError if src
        ends first."""
        stream, _ = self._current()
        if isinstance(src, AsyncStream):
            src, _ = src._current()
        return await _until(src, lambda: stream.forward(src, n, nonblock=True))

    def write(self, data):
        """Append data to the send buffer (see Stream.write); returns its length."""
        stream, _ = self._current()
        return stream.write(data)

    async def drain(self):
        """Send what was written (Stream.flush). Never waits for the peer to read; it blocks
        the loop only while the peer's queue is full (up to 100 ms)."""
        stream, _ = self._current()
        stream.flush()

    def close(self):
        """Close the underlying stream (if any) and leave the adapter empty."""
        stream = self.detach()
        if stream is not None:
            stream.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<shmipc.aio.AsyncStream {self._stream!r}{' eof' if self.at_eof() else ''}>"


async def accept_stream(session):
    """Await the next stream the peer opens on a server Session."""
    return await _accept_stream(session)


async def _accept_stream(session, loop=None):
    """accept_stream() on `loop`, the running loop when the caller knows it (as _until)."""
    return await _until_session(session, lambda: session.accept_stream(nonblock=True), loop)


async def _until_session(session, attempt, loop=None):
    if loop is None:
        loop = asyncio.get_running_loop()
    while True:
        _drive(loop, session)
        result = attempt()
        if result is not None:
            return result
        await _wait(loop, session)


async def accept(listener):
    """Await a client on a Listener and return its Session. Handshakes run on the
    listener's own threads, so a client that stalls its handshake never blocks the loop;
    the descriptor may wake the loop while one is still running, and the wait goes on."""
    loop = asyncio.get_running_loop()
    while True:
        session = listener.accept(nonblock=True)
        if session is not None:
            return session
        fut = loop.create_future()
        fd = listener.fileno()
        loop.add_reader(fd, _wake, fut)
        try:
            await fut
        finally:
            loop.remove_reader(fd)
