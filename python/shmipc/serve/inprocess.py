"""The WSGI and ASGI adapters of shmipc-serve on the in-process server, shmipc.Server
(docs/serve.md, "One process: the in-process adapters"; docs/python.md).

    server = shmipc.Server(port=8080, workers=2)
    server.route(None, "/*", shmipc.serve.wsgi_handler(app))     # or asgi_handler(app)

The route is a *frame route*: shmipc.Server's C side (request.c) hands the handler the request
as the REQUEST_HEAD frame a shmipc-serve front would send, and the handler builds the environ
or the scope with the same C decoder as a shmipc-serve worker (``shmipc._serve``), so an app
sees the same keys in both modes. What differs, because the in-process server answers from its
own worker threads with complete bodies:

- the request body has been read whole (up to the server's ``max_body``); wsgi.input is a
  BytesIO over it, and ASGI gets it as one http.request message;
- the response is collected whole and sent when the app has finished (a streaming iterable
  or several http.response.body messages still work, but nothing reaches the client early);
- a WSGI app does not see a client that goes away; an ASGI app gets http.disconnect when
  its client leaves (or once its response is complete);
- a broken Content-Length (the app sends fewer or more bytes than it declared) or an error
  after the first body bytes is a 500 here (nothing was sent yet), an ABORT with a front.
"""

import asyncio
import concurrent.futures
import io
import logging
import sys
import threading
import time

import shmipc

from .. import _serve as sf
from .. import _shmipc
from . import asgi as _asgi
from .wsgi import request_line

__all__ = ["ASGIRoute", "WSGIRoute", "asgi_handler", "wsgi_handler"]

log = logging.getLogger("shmipc.serve")

# How often a request waiting on the ASGI loop checks that the loop still runs.
_POLL_S = 0.5
_ERROR = (500, [(b"Content-Type", b"text/plain; charset=utf-8")], b"Internal Server Error\n")


class WSGIRoute:
    """A shmipc.Server route handler serving a WSGI app (PEP 3333) in-process:
    ``server.route(None, "/*", WSGIRoute(app))``. Runs on the server's worker threads
    (wsgi.multithread is True with more than one worker)."""

    _shmipc_frame_route = True  # server.c: call me with (frame, body)

    def __init__(self, app, *, errors=None):
        if not callable(app):
            raise TypeError("the WSGI app must be callable")
        self.app = app
        self.base = {
            "wsgi.version": (1, 0),
            "wsgi.errors": errors if errors is not None else sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "wsgi.input_terminated": True,
        }
        # The calls in the app now: `python -m shmipc.serve` tells a stop with requests left
        # at --graceful-timeout (exit 4) from one that is only still finishing.
        self._in_app = 0
        self._in_app_lock = threading.Lock()

    def __call__(self, frame, body):
        with self._in_app_lock:
            self._in_app += 1
        try:
            return self._call(frame, body)
        finally:
            with self._in_app_lock:
                self._in_app -= 1

    def _call(self, frame, body):
        environ = sf.decode_request(frame, self.base)
        environ["wsgi.input"] = io.BytesIO(body)
        # start_response, write() and the collecting of the body are C (serve_wsgi.c).
        resp = sf.WSGIResponse(environ["REQUEST_METHOD"])
        result = None
        try:
            result = self.app(environ, resp.start_response)
            out = resp.collect(result)
        except Exception:
            # The request line from the frame, not the environ: the app may have changed it
            # (environ.clear()), and a KeyError here was the server's 500 for the wrong error.
            log.exception("shmipc-serve: the app failed on %s", request_line(frame))
            out = _ERROR
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:
                    log.exception("shmipc-serve: the close() of the app's iterable raised")
                    out = _ERROR
        return out


class _Receive:
    """receive() of one in-process ASGI request: the body is whole, one http.request; then
    http.disconnect when the client leaves (the request's on_end, on the server's worker
    thread, wakes the loop) or once the response is complete. send() is C
    (shmipc._serve.ASGISend, python/shmipc/serve_asgi.c)."""

    __slots__ = ("body", "pending", "resp", "done", "disconnected")

    def __init__(self, body, pending, resp):
        self.body = body
        self.pending = pending
        self.resp = resp
        self.disconnected = False  # http.disconnect was given to the app
        # Made by the first receive() that waits: most apps never ask after the body, and an
        # asyncio.Event per request is measurable at these rates.
        self.done = None

    def _gone(self):
        """The request stopped waiting unanswered: the client left (or its deadline passed)."""
        p = self.pending
        return p.reason is not None and p.reason != shmipc.PENDING_SENT

    def finish(self):
        if self.done is not None:
            self.done.set()

    async def receive(self):
        body = self.body
        if body is not None:
            self.body = None
            return {"type": "http.request", "body": body, "more_body": False}
        if not self.resp.complete and not self._gone():
            if self.done is None:
                done = self.done = asyncio.Event()
                loop = asyncio.get_running_loop()

                def wake(*_, loop=loop, done=done):
                    try:
                        loop.call_soon_threadsafe(done.set)
                    except RuntimeError:  # the loop closed meanwhile
                        pass

                self.pending.on_end = wake
                self.resp.on_complete = done.set
                if self._gone():  # it ended before on_end was set
                    done.set()
            await self.done.wait()
        self.disconnected = True
        return {"type": "http.disconnect"}


class ASGIRoute:
    """A shmipc.Server route handler serving an ASGI 3 app (http and lifespan) in-process.

    The app runs on an asyncio loop of its own thread, started here; lifespan startup runs
    before the constructor returns (LifespanFailed if the app reports failure; an app that
    raises on the lifespan scope does not support it, as the spec allows). Each request is
    deferred (shmipc.PendingResponse) and handed to the loop, where it runs as a task and
    sends its answer when the app has finished: the server's worker threads never wait for the
    app, so any number of requests run at once on the loop (at most one per connection;
    ``max_concurrency`` bounds them, the rest answered 503 with Retry-After). A client that
    leaves while its app runs is an http.disconnect for it. ``close()`` (or ``with``) runs
    lifespan shutdown and stops the loop; close it after the server.
    """

    # server.c: not called; each request is queued on _shmipc_queue by the worker thread,
    # without the GIL (python/shmipc/route_queue.c), and taken here on the loop.
    _shmipc_frame_route = "queue"

    def __init__(self, app, *, lifespan=True, lifespan_timeout=_asgi.LIFESPAN_TIMEOUT,
                 loop_factory=None, max_concurrency=None):
        if not callable(app):
            raise TypeError("the ASGI app must be callable")
        if max_concurrency is not None and (
                isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int)
                or max_concurrency < 1):
            raise ValueError("max_concurrency must be a positive int or None")
        self.app = app
        self.max_concurrency = max_concurrency
        self.loop = loop_factory() if loop_factory is not None else asyncio.new_event_loop()
        # The lifespan exchange of the worker's handler, on our loop.
        self._life = _asgi.ASGIHandler.__new__(_asgi.ASGIHandler)
        self._life.app = app
        self._life.loop = self.loop
        self._life.lifespan_timeout = lifespan_timeout
        self._life._ls_task = None
        self._life.lifespan_supported = None
        self.state = None
        # The requests the worker threads queued; its eventfd wakes the loop once per burst.
        self._shmipc_queue = _shmipc._RouteQueue()
        # The pending answers of the requests taken and not answered yet: the loop thread's
        # (and, once it ended, the closer's).
        self._taken = set()
        # One close() at a time: a second (another thread's) waits for the first and returns.
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run_loop, name="shmipc-asgi-loop",
                                        daemon=True)
        self._thread.start()
        if lifespan:
            try:
                self._wait(self._life._startup())
            except BaseException:
                self._stop_loop()
                raise
            self.state = self._life.state

    def _run_loop(self):
        asyncio.set_event_loop(self.loop)
        # An app's server.stop() or close() from here would wait for the server's requests,
        # which wait for this thread: shmipc.Server treats it as a handler (they do not wait).
        _shmipc._handler_thread()
        try:
            self.loop.add_reader(self._shmipc_queue.fileno(), self._take)
            self.loop.run_forever()
        finally:
            # However it ends (close(), or an app that stopped the loop or raised SystemExit
            # out of a callback), later requests are refused at once, and the ones handed
            # over and not taken are answered 500 rather than left to wait.
            self._refuse_queued()

    def _refuse_queued(self):
        """The loop takes nothing any more: later requests get 500 from the worker, and every
        request queued or taken and not answered (a task the stopped loop will never finish
        included) is answered 500."""
        self._shmipc_queue.close()
        left, self._taken = self._taken, set()
        for pending in left:
            if not pending.sent:
                pending.send(*_ERROR)

    def _submit(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _wait(self, coro, timeout=None):
        """Runs `coro` on the loop and returns its result, waiting at most `timeout` s: an
        error, never a hang, when the loop's thread has ended or ends under it (an app that
        stopped the loop), which left the future pending for good."""
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the ASGI route's loop has ended")
        fut = self._submit(coro)
        end = None if timeout is None else time.monotonic() + timeout
        while not concurrent.futures.wait((fut,), _POLL_S).done:
            if not self._thread.is_alive():
                raise RuntimeError("the ASGI route's loop ended under the call")
            if end is not None and time.monotonic() >= end:
                raise TimeoutError(f"the ASGI route's loop did not answer in {timeout} s")
        return fut.result()

    def __call__(self, *args):
        raise TypeError("an ASGIRoute is served by shmipc.Server.route(), not called")

    def _take(self):
        """On the loop: the requests the workers queued since the last wakeup become tasks."""
        for frame, body, pending in self._shmipc_queue.take():
            try:
                scope = sf.decode_request_scope(frame)
            except Exception:  # noqa: BLE001 (our own encoding: not expected)
                log.exception("shmipc-serve: a request frame did not decode")
                pending.send(*_ERROR)
                continue
            if self.state is not None:
                scope["state"] = dict(self.state)  # the spec: a shallow copy per request
            if self.max_concurrency is not None and len(self._taken) >= self.max_concurrency:
                pending.send(503, _BUSY_HEADERS, b"Service Unavailable\n")
                continue
            self._taken.add(pending)
            self.loop.create_task(self._serve(scope, body, pending, frame))

    async def _serve(self, scope, body, pending, frame):
        # The failure's log line takes the request line from the frame, never from the
        # scope: the app may have changed it (del scope["method"]) before it raised, and the
        # KeyError escaped the task ("Task exception was never retrieved").
        resp = sf.ASGISend(scope["method"], pending)
        h = _Receive(body, pending, resp)
        try:
            await self.app(scope, h.receive, resp.send)
            if not resp.complete:
                if h.disconnected or h._gone():
                    return  # the client left: no answer to give (as the pool's worker)
                raise RuntimeError("the app returned before completing its response")
        except (asyncio.CancelledError, GeneratorExit):
            raise  # close(), or a stopped loop's end: answered 500 (the finally, or after)
        except BaseException as e:  # noqa: BLE001
            # SystemExit or KeyboardInterrupt too: out of a task they would leave the loop's
            # run_forever(), its thread would end, and every later request would be refused.
            if not resp.complete and (h.disconnected or h._gone()):
                log.info("shmipc-serve: the app raised after the client went away: %r", e)
            elif resp.complete:
                # The response went whole (or its fields were refused: the client got 500).
                log.error("shmipc-serve: the app failed after its response on %s",
                          request_line(frame), exc_info=e)
            else:
                log.error("shmipc-serve: the app failed on %s", request_line(frame),
                          exc_info=e)
                if not pending.sent:
                    pending.send(*_ERROR)
        finally:
            h.finish()
            self._taken.discard(pending)
            if not pending.sent:  # cancelled (close())
                pending.send(*_ERROR)

    def _stop_loop(self, cancel_timeout=None):
        if cancel_timeout is None:
            cancel_timeout = self._life.lifespan_timeout
        try:
            if self._thread.is_alive():
                # Requests still running are cancelled first (their clients get 500) rather
                # than left pending on a stopped loop.
                try:
                    deaf = self._wait(_cancel_all(cancel_timeout), cancel_timeout + 1)
                except Exception:  # noqa: BLE001 (the loop ended under it: stopped anyway)
                    deaf = 0
                if deaf:
                    log.warning("shmipc-serve: %d request(s) ignored the cancel for %g s: "
                                "answered 500 and left on the stopped loop", deaf,
                                cancel_timeout)
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join()
        finally:
            # Even when this close() is interrupted (Ctrl-C): nothing handed over is left
            # waiting for a loop that no longer takes it.
            self._refuse_queued()
        self.loop.close()

    def close(self, *, cancel_timeout=None):
        """Lifespan shutdown (LifespanFailed if the app reports failure), then the loop
        stops. Requests still in the app are cancelled and have ``cancel_timeout`` seconds
        (default: the lifespan timeout) to end; those that ignore the cancel are answered 500
        and left on the stopped loop (logged). Safe twice, and from several threads at once
        (the later ones return when the first has closed); not from the app's own loop
        (RuntimeError), which would wait on itself. A loop that an app ended has no lifespan
        shutdown (logged)."""
        if cancel_timeout is not None and (
                isinstance(cancel_timeout, bool)
                or not isinstance(cancel_timeout, (int, float))):
            raise TypeError("cancel_timeout must be a number of seconds or None")
        if cancel_timeout is not None and not 0 <= cancel_timeout <= 86400:
            raise ValueError("cancel_timeout must be in 0 .. 86400 seconds")
        if threading.current_thread() is self._thread:
            raise RuntimeError("an ASGI route cannot be closed from its own loop")
        with self._close_lock:
            if self.loop.is_closed():
                return
            try:
                if self._life.lifespan_supported:
                    if self._thread.is_alive():
                        self._wait(self._life._shutdown())
                    else:
                        log.error("shmipc-serve: the ASGI loop had ended: no lifespan shutdown")
            finally:
                task = self._life._ls_task
                if task is not None and not task.done() and self._thread.is_alive():
                    try:
                        self._wait(_cancel(task), self._life.lifespan_timeout)
                    except Exception:  # noqa: BLE001 (the app's own error on cancel)
                        pass
                self._stop_loop(cancel_timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_BUSY_HEADERS = [(b"Content-Type", b"text/plain; charset=utf-8"), (b"Retry-After", b"1")]


async def _cancel_all(timeout):
    """Cancels every other task of the loop and waits `timeout` s for them: how many did not
    end."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    if not tasks:
        return 0
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    return len(pending)


async def _cancel(task):
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 (cancelled, or the app's own error)
        pass


def wsgi_handler(app, **kw):
    """``server.route(None, "/*", wsgi_handler(app))``: see WSGIRoute."""
    return WSGIRoute(app, **kw)


def asgi_handler(app, **kw):
    """``server.route(None, "/*", asgi_handler(app))``: see ASGIRoute (close it after the
    server)."""
    return ASGIRoute(app, **kw)
