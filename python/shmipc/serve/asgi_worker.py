"""The ASGI worker process's server: many requests and WebSockets at once on one asyncio loop
(docs/serve.md, "The ASGI worker").

Every front session the listener accepts is served on the loop: each stream the front opens
is a task running the app (``ASGIHandler._handle``), at most ``concurrency`` of them at once
over all sessions; the worker's HELLO tells the front that number, and the front sends no more
(the rest wait in its queue). A stream past it (a front that does not count) waits for a place
before its head is read. A session waiting for its next stream holds no place.

Nothing on the loop blocks:

- reads take what is there (``nonblock``) and otherwise wait for the session's descriptor
  (``shmipc.aio``), so one request waiting for its body does not hold the others;
- writes never wait inside the library: the session's shared memory full (the front holds a
  slow client's response there, ``memory_wait``) fails the write at once, adding nothing, and
  the task waits on the loop for the front to free some, looking for the front's ABORT (its
  deadline, the client gone) meanwhile; the other tasks go on.

``stop()`` (a signal handler, another thread) stops accepting: the requests in progress finish
(an open WebSocket is closed 1001), a stream that arrives meanwhile is refused with ABORT
SHUTDOWN (the front gives it to another worker), then ``serve_forever()`` returns.
"""

import asyncio
import collections
import logging
import time

import shmipc

from .. import _serve as sf
from .. import aio
from .worker import _StopFlag, own_uid_only
from .wsgi import _ABORT_DRAIN_TIMEOUT, ProtocolViolation, RequestAborted, _Exchange, _hello_answer

__all__ = ["ASGIWorker", "DEFAULT_CONCURRENCY", "MAX_CONCURRENCY"]

log = logging.getLogger("shmipc.serve")

DEFAULT_CONCURRENCY = 64
MAX_CONCURRENCY = 256  # the front's bound (SHMIPC__FRONT_MAX_CONCURRENCY)
# A write that found shared memory full looks again after this long, doubling up to the max
# (the front frees memory as its clients read; it sends no wakeup for that).
_MEMORY_NAP_MIN = 0.00002
_MEMORY_NAP_MAX = 0.001
# Streams refused when a session ends, and the time all of them get (as worker.py's).
_REFUSE_MAX = 64
_REFUSE_TIMEOUT = 5.0


def _uncancel():
    """After a CancelledError this task swallowed on purpose (a stop): later timeouts of the
    task must not take it for theirs."""
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):
        task.uncancel()


class _Places:
    """Free places, as an asyncio.Semaphore on one loop, for a path taken per request:
    try_take() takes a free one with a test and a subtraction, where the semaphore's acquire()
    is a coroutine, and its locked() a generator over the waiters, each time. take() waits in
    turn (first come, first served); give() hands the place to the first waiter still waiting,
    and a waiter cancelled just after it was handed one passes it on."""

    __slots__ = ("free", "waiters", "loop")

    def __init__(self, n, loop):
        self.free = n
        self.waiters = collections.deque()
        self.loop = loop

    def try_take(self):
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return True
        return False

    async def take(self):
        if self.try_take():
            return True
        fut = self.loop.create_future()
        self.waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.give()  # handed a place, then cancelled before it ran: the next one's
            raise
        finally:
            try:
                self.waiters.remove(fut)
            except ValueError:
                pass  # give() took it off
        return True

    def give(self):
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the place goes to it, not back to the count
                return
        self.free += 1


class _LoopExchange(_Exchange):
    """An exchange whose waits are the loop's: see the module's text."""

    __slots__ = ("loop", "session", "table")

    def __init__(self, st, loop, table=None):
        super().__init__(st)
        self.loop = loop
        self.session = st.session
        self.table = aio._table(loop) if table is None else table  # the loop's, for _drive_in
        st.write_timeout = 0  # a write that finds shared memory full fails at once

    def read_frame_header(self, nonblock=False):
        if nonblock:
            # Other tasks waiting on this session must not lose the news this read takes.
            aio._drive_in(self.table, self.session)
        return super().read_frame_header(nonblock)

    def payload(self, length, nonblock=False):
        if nonblock and length:
            aio._drive_in(self.table, self.session)  # as read_frame_header
        return super().payload(length, nonblock)

    async def _read(self, attempt):
        """attempt() (non-blocking, None for "not yet") until it gives something, bounded by
        the stream's read timeout when it has one, and by the first frame's deadline until it
        was read (head_by: _Exchange.head_deadline)."""
        limit = self.st.read_timeout
        if self.head_by is not None:
            left = self.head_by - time.monotonic()
            if left <= 0:
                raise self.head_late()
            if limit is None or limit < 0 or left < limit:
                limit = left
        wait = aio._until(self.st, attempt, self.loop)
        if limit is None or limit < 0:
            return await wait
        try:
            return await asyncio.wait_for(wait, limit)
        except asyncio.TimeoutError:
            if self.head_by is not None and time.monotonic() >= self.head_by:
                raise self.head_late() from None
            raise shmipc.TimeoutError(f"no frame from the front in {limit} s") from None

    async def aread_frame_header(self):
        return await self._read(lambda: _Exchange.read_frame_header(self, True))

    async def areadexactly(self, n):
        return await self._read(lambda: self.st.readexactly(n, nonblock=True))

    async def aanswer_hello(self, length, concurrency=1):
        await self.asend(_hello_answer(await self.areadexactly(length), concurrency))
        return "hello"

    async def ataken(self, flags):
        if flags & sf.REQ_TAKEN_WANTED:
            await self.asend(sf.encode_frame(sf.TAKEN))

    def try_send(self, parts):
        """Writes `parts` and flushes them, when shared memory takes them all now (nearly
        always): returns (). Else returns the parts from the first one it refused, for
        asend(), which flushes what went before them and waits for room on the loop."""
        st = self.st
        for i, p in enumerate(parts):
            try:
                st.write(p)  # all of p or nothing
            except shmipc.TimeoutError:
                return parts[i:]
        self._flush()
        return ()

    async def asend(self, *parts):
        st = self.st
        nap = _MEMORY_NAP_MIN
        for p in parts:
            while True:
                try:
                    st.write(p)  # all of p or nothing
                    break
                except shmipc.TimeoutError:
                    pass
                # What was written goes first, so the front can take (and free) it.
                self._flush()
                # The session's news (this stream closed by the front, the session's end)
                # must be seen while no read of this session waits to see it: the next write
                # fails with it. Then the front's ABORT, when no unread body frame hides it.
                self._poke()
                self.check_abort()  # the front gave the request up: RequestAborted
                await asyncio.sleep(nap)
                nap = min(nap * 2, _MEMORY_NAP_MAX)
        self._flush()

    def _poke(self):
        session = self.session
        if session is None or session.closed:
            return
        table = aio._watchers.get(self.loop)
        if table and session in table:
            aio._drive(self.loop, session)  # processes, and wakes the reads that wait
            return
        try:
            session.process()
        except shmipc.Error:
            pass  # the session ended: the next write says so

    def _flush(self):
        # A full queue (the front has not taken the last 8192 messages) is retried for up to
        # 100 ms, as every flush; only the write above must not wait.
        st = self.st
        st.write_timeout = None
        try:
            st.flush()
        finally:
            st.write_timeout = 0

    async def aabort(self, reason, text=""):
        data = text.encode("utf-8", "replace")[: sf.MAX_ABORT_TEXT]
        try:
            await self.asend(sf.encode_frame(sf.ABORT, data, reason))
            if reason != sf.ABORT_PROTOCOL:
                await self.adrain()
        except (shmipc.Error, OSError, ProtocolViolation):
            pass

    async def adrain(self):
        """drain() on the loop: the rest of the request, after our END or ABORT, within one
        deadline for all of it (_ABORT_DRAIN_TIMEOUT; past it shmipc.TimeoutError, which gives
        the stream up). Before, the drain after our END had none: a front that trickled the
        body (a frame every few seconds, never END) held the request's place as long as it
        liked. What has arrived is read first, without a wait (the front's END is nearly
        always there already)."""
        try:
            while not self.done:
                if self.next_body(nonblock=True) is None:
                    break
            if self.done:
                return
            try:
                await asyncio.wait_for(self._adrain(), _ABORT_DRAIN_TIMEOUT)
            except asyncio.TimeoutError:
                raise shmipc.TimeoutError(
                    f"stream {self.st.id}: the front did not end the request within "
                    f"{_ABORT_DRAIN_TIMEOUT} s of the worker's END or ABORT") from None
        except RequestAborted:
            pass

    async def _adrain(self):
        while not self.done:
            await self._read(lambda: self.next_body(nonblock=True))

    async def idle(self, delay):
        session = self.session
        if session is None or session.closed:
            await asyncio.sleep(delay)
            return
        # Until something arrives on the session (or aio's recheck, 100 ms): the caller looks.
        await aio._wait(self.loop, session)


class ASGIWorker:
    """Serve the ASGI app of `handler` (an ASGIHandler, its lifespan started) on shmipc
    `address` until stop(), running up to `concurrency` requests at once on the handler's
    loop. ``counts`` and ``max_requests`` as for worker.Worker; ``in_flight`` is the number of
    requests being served now, ``peak`` the most at once so far."""

    def __init__(self, handler, address, config=None, *, max_requests=0,
                 concurrency=DEFAULT_CONCURRENCY):
        if not isinstance(max_requests, int) or isinstance(max_requests, bool) or \
                max_requests < 0:
            raise ValueError(f"max_requests must be an int >= 0, not {max_requests!r}")
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or \
                not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be an int in 1 .. {MAX_CONCURRENCY}, "
                             f"not {concurrency!r}")
        self.handler = handler
        self.max_requests = max_requests
        self.concurrency = concurrency
        handler.concurrency = concurrency
        self.served = 0
        self.started = 0  # requests whose head was read and that were not refused
        self.in_flight = 0
        self.peak = 0
        if config is None:
            # As worker.Worker: see its comment.
            config = shmipc.Config(memory_wait=True, initialize_timeout=10,
                                   **own_uid_only(address))
        self.listener = shmipc.Listener(address, config)
        self.address = self.listener.address
        self.counts = {"ok": 0, "error": 0, "aborted": 0, "protocol": 0, "late": 0, "hello": 0}
        self.loop = handler.loop
        self._stopping = _StopFlag()
        handler.stopping = self._stopping  # an open WebSocket closes 1001 on stop
        self._parked = set()  # tasks waiting to accept: cancelled by a stop
        self._slots = None
        self._table = None

    def stop(self):
        """Any thread, or a signal handler: stop accepting, finish what is in progress. Takes
        no lock (worker._StopFlag; call_soon_threadsafe appends to a deque and writes to the
        loop's self-pipe), so a signal that comes inside it runs it again safely."""
        self._stopping.set()
        try:
            self.loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            pass  # the loop is closed: nothing runs to be woken

    def _wake(self):
        for t in list(self._parked):
            t.cancel()

    def serve_forever(self):
        self.loop.run_until_complete(self._main())

    async def _parked_on(self, aw):
        """`aw` unless a stop comes first (then None)."""
        # The loop named: current_task() without it asks get_running_loop(), a getpid() system
        # call (CPython checks for a fork), which this does three times a request.
        task = asyncio.current_task(self.loop)
        if self._stopping.is_set():
            if asyncio.iscoroutine(aw):
                aw.close()
            return None
        self._parked.add(task)
        try:
            return await aw
        except asyncio.CancelledError:
            if not self._stopping.is_set():
                raise
            _uncancel()
            return None
        finally:
            self._parked.discard(task)

    async def _main(self):
        self._slots = _Places(self.concurrency, self.loop)
        self._table = aio._table(self.loop)  # the loop's watchers: kept, as the loop is
        sessions = set()
        try:
            while not self._stopping.is_set():
                try:
                    s = await self._parked_on(aio.accept(self.listener))
                except shmipc.Error as e:
                    if self._stopping.is_set():
                        break
                    log.warning("shmipc-serve worker: a front's handshake failed: %s", e)
                    continue
                if s is None:
                    break
                t = self.loop.create_task(self._session(s))
                sessions.add(t)
                t.add_done_callback(sessions.discard)
        finally:
            self._stopping.set()
            # Closed first: a front that reconnects meanwhile is refused at once.
            self.listener.close()
            self._wake()
            if sessions:
                await asyncio.gather(*sessions, return_exceptions=True)

    async def _session(self, s):
        tasks = set()
        # A session has at most `concurrency` streams accepted and not finished: the rest stay
        # in the library's accept queue, whose bound (max_pending_streams) ends a session that
        # floods it. The worker's places are taken in the tasks, so a session waiting for its
        # next stream holds none (the front spreads its requests over its sessions, one per
        # reactor thread, and sends no more than the concurrency over all of them).
        mine = _Places(self.concurrency, self.loop)
        loop = self.loop
        table = self._table

        def done(t):  # one callback for both: each costs the loop a turn of its own
            tasks.discard(t)
            mine.give()

        try:
            while not self._stopping.is_set():
                # Per request, what a burst finds ready is taken without a coroutine: a place
                # when one is free, the next stream when it is queued already (each await of
                # _parked_on is a coroutine, a task lookup and two set operations more).
                if not mine.try_take() and await self._parked_on(mine.take()) is None:
                    break
                try:
                    aio._drive_in(table, s)  # as aio._accept_stream: others' news first
                    st = s.accept_stream(nonblock=True)
                    if st is None:
                        st = await self._parked_on(aio._accept_stream(s, loop))
                except shmipc.Error as e:
                    mine.give()
                    log.debug("shmipc-serve worker: the front's session ended: %s", e)
                    break
                if st is None:
                    mine.give()
                    break
                if self._stopping.is_set():  # it came with the stop: refused
                    mine.give()
                    await self._refuse(_LoopExchange(st, loop),
                                       time.monotonic() + _REFUSE_TIMEOUT)
                    break
                t = loop.create_task(self._serve(st))
                tasks.add(t)
                t.add_done_callback(done)
        finally:
            # Streams the front opened that this worker will not serve: each refused (ABORT
            # SHUTDOWN), so the front gives its request to another worker instead of a 502:
            # those that come while the requests in progress finish, then those left.
            refusals = set()
            if tasks:
                refuser = self.loop.create_task(self._refuse_arrivals(s, refusals))
                await asyncio.gather(*tasks, return_exceptions=True)
                refuser.cancel()
                await asyncio.gather(refuser, *refusals, return_exceptions=True)
            deadline = time.monotonic() + _REFUSE_TIMEOUT
            for _ in range(max(0, _REFUSE_MAX - len(refusals))):
                try:
                    st = s.accept_stream(nonblock=True)
                except shmipc.Error:
                    break
                if st is None:
                    break
                await self._refuse(_LoopExchange(st, self.loop), deadline)
            s.close()

    async def _refuse_arrivals(self, s, refusals):
        """Until cancelled: each stream that arrives on session `s` refused, at most
        _REFUSE_MAX (a front that closes its session at the first refusal, as ours does,
        sends only those already in flight)."""
        try:
            while len(refusals) < _REFUSE_MAX:
                st = await aio.accept_stream(s)
                t = self.loop.create_task(self._refuse(_LoopExchange(st, self.loop),
                                                       time.monotonic() + _REFUSE_TIMEOUT))
                refusals.add(t)
        except shmipc.Error:
            pass  # the session ended

    async def _serve(self, st):
        # Past the concurrency (a front that does not count, or a burst across its sessions
        # while the counts settle), a stream waits its turn here; a stop meanwhile refuses
        # it at once (not started: the front gives it to another worker).
        try:
            slots = self._slots
            got = True if slots.try_take() else await self._parked_on(slots.take())
        except BaseException:
            try:
                st.close()
            except shmipc.Error:
                pass
            raise
        if got is None:
            try:
                ex = _LoopExchange(st, self.loop)
            except shmipc.Error:  # the stream is gone already
                return
            await self._refuse(ex, time.monotonic() + _REFUSE_TIMEOUT)
            return
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            ex = _LoopExchange(st, self.loop, self._table)
            if self._stopping.is_set():  # the stop came as it got its place: not started
                await self._refuse(ex, time.monotonic() + _REFUSE_TIMEOUT)
                return
            # All of the first frame within 5 s of the request's place: before, a front that
            # sent part of it held the place (with --concurrency 1, the worker) for good.
            ex.head_deadline()
            try:
                # The head is nearly always here already (the front sends it in one message):
                # read without the coroutines of a wait.
                first = ex.read_frame_header(nonblock=True)
                if first is None:
                    first = await ex.aread_frame_header()
            except ProtocolViolation as e:
                log.error("shmipc-serve: bad frame from the front: %s", e)
                await ex.aabort(sf.ABORT_PROTOCOL, str(e))
                self.counts["protocol"] += 1
                return
            except (shmipc.Error, OSError) as e:
                log.debug("shmipc-serve: stream %d ended: %s", st.id, e)
                self.counts["aborted"] += 1
                return
            if first[1][0] == sf.REQUEST_HEAD:
                if self.max_requests and self.started >= self.max_requests:
                    # Past --max-requests (it arrived beside the last one): not served, said so
                    # (the refusal's deadline bounds the rest of its head).
                    ex.head_read()
                    await self._refuse(ex, time.monotonic() + _REFUSE_TIMEOUT, first)
                    return
                self.started += 1
                if self.max_requests and self.started >= self.max_requests:
                    self.stop()  # this one is the last: it and those in progress finish
            try:
                outcome = await self.handler._handle(ex, first)
            except (shmipc.Error, OSError) as e:
                log.debug("shmipc-serve: stream %d ended: %s", st.id, e)
                outcome = "aborted"
            self.counts[outcome] += 1
            if outcome not in ("late", "hello"):
                self.served += 1
        finally:
            try:
                st.close()
            except shmipc.Error:
                pass
            self.in_flight -= 1
            self._slots.give()

    async def _refuse(self, ex, deadline, first=None):
        """worker.refuse on the loop: ABORT SHUTDOWN to a request's head (`first`, its frame
        header when read already), then the front's end of it, all by `deadline`; the stream
        closed."""
        st = ex.st

        def left():
            return max(0.0, deadline - time.monotonic())

        try:
            try:
                if first is None:
                    first = await asyncio.wait_for(ex.aread_frame_header(), left())
                _, (typ, length, flags) = first
                payload = await asyncio.wait_for(ex.areadexactly(length), left()) \
                    if length else b""
                if typ == sf.REQUEST_HEAD:
                    ex.head(flags, payload)
                    await ex.asend(sf.encode_frame(sf.ABORT, b"the worker is stopping",
                                                   sf.ABORT_SHUTDOWN))
                    await asyncio.wait_for(ex.adrain(), left())
                elif typ == sf.HELLO:  # a new session's: it gets nothing more (worker.refuse)
                    await ex.asend(sf.encode_frame(sf.ABORT, b"the worker is stopping",
                                                   sf.ABORT_SHUTDOWN))
            except (shmipc.Error, OSError, ProtocolViolation, asyncio.TimeoutError):
                pass
        finally:
            try:
                st.close()
            except shmipc.Error:
                pass
