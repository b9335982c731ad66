"""A shmipc-serve worker process: a shmipc listener the front connects to, and a loop that
serves each stream the front opens on it as one request (docs/serve.md, "Streams").

The front is the shmipc client: shmipc (like shmipc-go) lets only the client open streams,
and the front opens one per request. So the worker listens, on an address its supervisor
gives it, and the front connects one session to it.

Requests are served one at a time per process (``wsgi.multithread`` is False): a stream
opened while one is being served waits in the session's accept queue, and the front sends a
worker one request at a time anyway. Each session the listener accepts gets a thread that
accepts its streams; they take turns through one lock.
"""

import logging
import os
import threading
import time

import shmipc

from .. import _serve as sf
from .wsgi import ProtocolViolation, WSGIHandler, _Exchange

__all__ = ["Worker"]

log = logging.getLogger("shmipc.serve")

# Blocking accepts wake this often to see stop() (the binding also wakes for signals).
_POLL = 0.2
# Streams refused when a session ends (a front that closes its session at the first refusal,
# as ours does, sends at most the ones in flight; another could keep opening them).
_REFUSE_MAX = 64
# Refused streams are given at most this long, all their reads together: the one that
# arrived after the stop, then those left in the session's accept queue (the C worker's too).
_REFUSE_TIMEOUT = 5.0


def own_uid_only(address):
    """Config keywords that let only processes of our own uid connect to a unix `address`
    (an abstract name is open to every local process); none for TCP, which carries no uid.
    Unix by the rule of shmipc's address parser: "unix:...", or a path or "@name" without the
    prefix."""
    a = str(address)
    unix = a.startswith("unix:") or (a != "" and a[0] in "/.@")
    return {"peer_uids": [os.geteuid()]} if unix else {}


class _StopFlag:
    """The "stopping" flag of a worker: set by stop(), which a SIGTERM handler calls, and read
    by its loops, which look at it at least every _POLL. Not a threading.Event: CPython runs a
    Python signal handler on the main thread between two bytecodes of whatever that thread is
    doing, and Event.set() takes the Event's lock, which that thread may hold at that instant
    (in its own set(), or in the set() of the handler of an earlier SIGTERM: a supervisor
    killed with SIGKILL can send two, one for each of its threads that exits holding the
    worker). The handler would then wait for that lock forever, and so would the worker.
    set() and is_set() are one attribute store and one load: they take no lock. Nothing waits
    on it."""

    __slots__ = ("_set",)

    def __init__(self):
        self._set = False

    def set(self):
        self._set = True

    def is_set(self):
        return self._set


class Worker:
    """Serve `app` (a WSGI callable) on shmipc `address` until stop().

    ``Worker(app, "unix:@name")``; ``serve_forever()`` blocks; ``stop()`` (any thread, or a
    signal handler) makes it return after the request in progress. ``counts`` holds the
    outcomes so far (ok, error, aborted, protocol; hello: the front's HELLO answered; and late: a stream that held only a late
    ABORT for an exchange already over).

    ``max_requests`` (0: no limit): stop after the request that makes this many served (a
    late ABORT is not a request), so ``serve_forever()`` returns and the process exits 0 and
    its supervisor starts a fresh one (``--max-requests``, docs/serve.md "Supervision").
    """

    def __init__(self, app, address, config=None, *, handler=None, max_requests=0):
        if not isinstance(max_requests, int) or isinstance(max_requests, bool) or \
                max_requests < 0:
            raise ValueError(f"max_requests must be an int >= 0, not {max_requests!r}")
        self.max_requests = max_requests
        self.served = 0
        self.handler = handler if handler is not None else WSGIHandler(app)
        if config is None:
            # A response the front holds back (its client reads slowly) stops this worker's
            # writes once the session's shared memory is full, instead of going over the
            # socket to the front's heap (docs/serve.md, "Backpressure"). The handshake gets
            # 10 s (the front's connect timeout bounds its own wait; 1 s failed on a loaded
            # machine). Only the front may connect: on a unix socket (an abstract name is open
            # to every local process) a client must run as our own uid, as the front does.
            config = shmipc.Config(memory_wait=True, initialize_timeout=10,
                                   **own_uid_only(address))
        self.listener = shmipc.Listener(address, config)
        self.address = self.listener.address
        self.counts = {"ok": 0, "error": 0, "aborted": 0, "protocol": 0, "late": 0, "hello": 0}
        self._lock = threading.Lock()
        self._stopping = _StopFlag()
        self._sessions = set()
        self._threads = []
        if hasattr(self.handler, "stopping"):
            self.handler.stopping = self._stopping  # an open WebSocket closes 1001 on stop

    def stop(self):
        # Safe in a signal handler, even one that interrupts stop() itself: no lock taken.
        self._stopping.set()

    def serve_forever(self):
        try:
            while not self._stopping.is_set():
                try:
                    s = self.listener.accept(timeout=_POLL)
                except shmipc.TimeoutError:
                    continue
                except shmipc.Error as e:
                    if self._stopping.is_set():
                        break
                    log.warning("shmipc-serve worker: a front's handshake failed: %s", e)
                    continue
                if s is None:
                    continue
                t = threading.Thread(target=self._serve_session, args=(s,),
                                     name="shmipc-serve-session", daemon=True)
                self._sessions.add(s)
                self._threads = [x for x in self._threads if x.is_alive()]
                self._threads.append(t)
                t.start()
        finally:
            self._stopping.set()
            # Closed first: a front that reconnects meanwhile is refused at once, rather than
            # waiting out its handshake timeout on a listener nobody accepts on.
            self.listener.close()
            for t in self._threads:
                t.join()

    def _serve_session(self, s):
        try:
            while not self._stopping.is_set():
                try:
                    st = s.accept_stream(timeout=_POLL)
                except shmipc.TimeoutError:
                    continue
                except shmipc.Error as e:
                    log.debug("shmipc-serve worker: the front's session ended: %s", e)
                    return
                if st is None:
                    continue
                with self._lock:
                    if self._stopping.is_set():
                        # Past --max-requests (or stopping): not served, and said so.
                        refuse(st)
                        return
                    outcome = self.handler.handle(st)
                    self.counts[outcome] += 1
                    if outcome not in ("late", "hello"):
                        self.served += 1
                        if self.max_requests and self.served >= self.max_requests:
                            self.stop()
        finally:
            # Streams the front opened that this worker will not serve: each refused (ABORT
            # SHUTDOWN), so the front gives its request to another worker instead of a 502.
            # One deadline for all of them: stalled streams cannot add up.
            deadline = time.monotonic() + _REFUSE_TIMEOUT
            for _ in range(_REFUSE_MAX):
                try:
                    st = s.accept_stream(nonblock=True)
                except shmipc.Error:
                    break
                if st is None:
                    break
                refuse(st, deadline)
            self._sessions.discard(s)
            s.close()


def refuse(st, deadline=None):
    """Answers ABORT SHUTDOWN, the protocol's "not processed", to a request this worker will
    not serve (it is stopping): the front gives it to another worker, whatever its method. The
    request's head is read first (a stream whose first frame is a late ABORT is not a
    request); then, as for any ABORT, the worker waits for the front to end its side before
    the stream closes. All of it by `deadline` (time.monotonic(); default _REFUSE_TIMEOUT
    from now): a front that stalls (part of a header) or trickles a body cannot keep a
    stopping worker from exiting."""
    if deadline is None:
        deadline = time.monotonic() + _REFUSE_TIMEOUT

    def wait_left():  # 0 takes what arrived, then TimeoutError: the deadline holds
        st.read_timeout = max(0.0, deadline - time.monotonic())

    ex = _Exchange(st)
    try:
        try:
            wait_left()
            raw, (typ, length, flags) = ex.read_frame_header()
            payload = st.readexactly(length) if length else b""
            if typ == sf.REQUEST_HEAD:
                ex.head(flags, payload)
                ex.send(sf.encode_frame(sf.ABORT, b"the worker is stopping", sf.ABORT_SHUTDOWN))
                while not ex.done:
                    wait_left()
                    ex.next_body()
            elif typ == sf.HELLO:
                # A new session's HELLO: the session gets nothing more from the front (were
                # the stream just closed, the front would take this worker for one that does
                # not know HELLO, and send it uploads it cannot resend when refused).
                ex.send(sf.encode_frame(sf.ABORT, b"the worker is stopping", sf.ABORT_SHUTDOWN))
        except (shmipc.Error, OSError, ProtocolViolation):
            pass  # RequestAborted and TimeoutError are OSErrors
    finally:
        try:
            st.close()
        except shmipc.Error:
            pass


def load_app(spec):
    """`module:callable` (the callable may be dotted: `pkg.mod:factory.app`) -> the object.
    The current directory is importable, as with gunicorn."""
    import importlib
    import os
    import sys

    modname, sep, attr = spec.partition(":")
    if not sep or not modname or not attr:
        raise ValueError(f"{spec!r} is not module:callable")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj = importlib.import_module(modname)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec} is not callable")
    return obj


def _follow_parent(pid):
    """Asks the kernel for SIGTERM when our parent dies (PR_SET_PDEATHSIG), so that a supervisor
    killed with SIGKILL leaves no worker behind; the worker then ends as on any SIGTERM, after
    the request in progress. False when the parent is not `pid` any more (it died already)."""
    import ctypes
    import os
    import signal

    PR_SET_PDEATHSIG = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        log.warning("shmipc-serve worker: no parent-death signal on this system")
    # Checked after the prctl: a parent that died before it is seen here, not missed.
    return os.getppid() == pid


def _take_no_action(signum, frame):
    pass


def _ignore_supervisor_signals():
    """The supervisor's own signals: SIGHUP (a reload, which stops this generation with SIGTERM
    once the next one is ready), SIGUSR1 (its status), SIGUSR2 (its access log). Sent to the
    whole process group (a terminal's hangup, kill -HUP -PGID) they reach the workers too, and
    their default action killed the worker and cut its request in flight (a 502). Each is
    caught by a handler that does nothing, as the C worker does (serve/worker.c), unless the
    application (its import, an ASGI app's lifespan startup) handles or ignores it itself, or
    a C extension of its installed a handler (getsignal() says None). Caught rather than
    ignored: an ignored signal stays ignored in the programs the application runs. The worker's
    own waits take a signal as SIGTERM's (a wait in slices that checks for signals); the
    application's blocking calls are retried after it (PEP 475)."""
    import signal

    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _take_no_action)


def main(argv=None):
    """One worker process: ``python -m shmipc.serve.worker APP --address ADDR``. The
    supervisor of shmipc-serve starts these; run by hand, any front speaking docs/serve.md can
    connect to ADDR. SIGTERM, SIGINT and SIGQUIT stop it after the request in progress (exit 0;
    SIGQUIT reaches the workers too when a terminal's Ctrl-\\ stops shmipc-serve), and so
    does the Nth request with ``--max-requests N``; SIGHUP, SIGUSR1 and SIGUSR2 do nothing
    (unless the app handles them)."""
    import argparse
    import signal
    import sys

    ap = argparse.ArgumentParser(
        prog="python -m shmipc.serve.worker",
        description="Serve a WSGI app to a shmipc-serve front on a shmipc address "
        "(docs/serve.md).")
    ap.add_argument("app", help="the WSGI (or, with --asgi, ASGI 3) application, as "
                    "module:callable")
    ap.add_argument("--address", required=True,
                    help="the shmipc address to listen on, e.g. unix:@name or unix:/path")
    ap.add_argument("--parent-pid", type=int, default=0, metavar="PID",
                    help="exit (as on SIGTERM) when process PID, the supervisor that started "
                    "this worker, dies, even by SIGKILL (Linux parent-death signal)")
    ap.add_argument("--max-requests", type=int, default=0, metavar="N",
                    help="exit 0 after serving N requests, for the supervisor to start a fresh "
                    "worker (0: no limit)")
    ap.add_argument("--asgi", action="store_true",
                    help="APP is an ASGI 3 app (http and lifespan; docs/serve.md, "
                    "\"The ASGI worker\"): lifespan startup runs before the worker is ready, "
                    "shutdown after it stops; a failed startup exits with status 3")
    ap.add_argument("--concurrency", type=int, default=None, metavar="N",
                    help="with --asgi: requests and WebSockets run at once on the worker's "
                    "loop, 1 .. 256 (default 64); a WSGI worker runs one at a time")
    args = ap.parse_args(argv)
    if args.max_requests < 0:
        ap.error("--max-requests must be >= 0")
    if args.concurrency is not None and not args.asgi:
        ap.error("--concurrency is for --asgi apps (a WSGI worker runs one request at a time)")
    if args.concurrency is not None and not 1 <= args.concurrency <= 256:
        ap.error("--concurrency must be in 1 .. 256")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(process)d] %(message)s")
    try:
        app = load_app(args.app)
    except Exception as e:
        print(f"shmipc-serve worker: cannot load {args.app}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 2
    handler = None
    if args.asgi:
        import asyncio

        from .asgi import ASGIHandler, LifespanFailed
        from .asgi_worker import DEFAULT_CONCURRENCY, ASGIWorker

        handler = ASGIHandler(app)
        try:
            handler.startup()
        except (LifespanFailed, TimeoutError, asyncio.TimeoutError) as e:
            print(f"shmipc-serve worker: lifespan startup failed: {e}", file=sys.stderr)
            return 3
        worker = ASGIWorker(handler, args.address, max_requests=args.max_requests,
                            concurrency=args.concurrency or DEFAULT_CONCURRENCY)
    else:
        worker = Worker(app, args.address, max_requests=args.max_requests)

    def stop(signum, frame):
        worker.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGQUIT, stop)
    _ignore_supervisor_signals()
    if args.parent_pid > 0 and not _follow_parent(args.parent_pid):
        worker.stop()  # the supervisor died before we could watch it: serve nothing
    print(f"shmipc-serve worker {__import__('os').getpid()} ready on {worker.address}",
          flush=True)
    worker.serve_forever()
    if handler is not None:
        try:
            handler.shutdown()
        except (LifespanFailed, TimeoutError, asyncio.TimeoutError) as e:
            print(f"shmipc-serve worker: lifespan shutdown failed: {e}", file=sys.stderr)
            return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
