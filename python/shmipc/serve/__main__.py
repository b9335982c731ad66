"""``python -m shmipc.serve --in-process myapp:app``: one process serving a WSGI (or, with
--asgi, ASGI 3) app on shmipc.Server through the in-process adapters (docs/serve.md, "One
process"). The supervised pool of worker processes is the ``shmipc-serve`` command.
SIGTERM, SIGINT and SIGQUIT stop it gracefully (ASGI lifespan shutdown after the server)."""
import argparse
import logging
import os
import select
import signal
import socket
import stat
import sys
import threading

from .worker import load_app


# How long the ASGI requests cancelled past --graceful-timeout have to end.
_CANCEL_S = 1.0
# How long a write to a stderr without room waits for it before its bytes are dropped (the C
# front's OUT_WAIT_MS, serve/sup_int.h).
_OUT_WAIT_MS = 20
_PIPE_BUF = select.PIPE_BUF


class _DropWriter:
    """sys.stderr, logging's stream and wsgi.errors of `python -m shmipc.serve --in-process`:
    never waits for a reader (docs/serve.md, "One process"). The server's threads log here (a
    request's log lines, the app's tracebacks): with blocking writes a stderr pipe nobody read
    filled up, and they all waited in write(), answering nothing. As the C front's writers
    (serve/sup_output.c): a pipe or a terminal is written through an O_NONBLOCK description of
    its own, put on fd 2 too (the library's own lines, written there by C, do not wait either;
    the shell's description keeps its flags), a socket with MSG_DONTWAIT, in pieces of at most
    PIPE_BUF; a write without room waits 20 ms for it, then its bytes are dropped and counted,
    and later writes do not wait until there is room again, when a line says what was lost.
    A regular file gets every line with plain writes."""

    def __init__(self, fd=2):
        self._fd = fd
        self._lock = threading.Lock()
        self._sock = None
        self._file = False
        self._stalled = False
        self._line_open = False
        self.dropped_bytes = 0
        self.dropped_lines = 0
        self.encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
        self.errors = "backslashreplace"
        try:
            st = os.fstat(fd)
        except OSError:
            # No stderr (started with fd 2 closed): /dev/null takes its number, which the next
            # open() would take otherwise (a pipe, a client's socket) and get every log line
            # in it, the library's too. The lines go nowhere, as they would have.
            self._file = True
            try:
                nul = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
                if nul != fd:
                    os.dup2(nul, fd, inheritable=True)
                    os.close(nul)
                else:
                    os.set_inheritable(fd, True)
            except OSError:
                pass
            return
        if stat.S_ISREG(st.st_mode):
            self._file = True
        elif stat.S_ISSOCK(st.st_mode):
            try:
                self._sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                self._file = True
        elif stat.S_ISFIFO(st.st_mode) or os.isatty(fd):
            try:
                nb = os.open(f"/proc/self/fd/{fd}",
                             os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError:
                return  # written as it is (a pipe whose reader left: the write fails anyway)
            # Inheritable, as fd 2 is: a program the app starts keeps its stderr (it shares
            # the non-blocking description: a full pipe fails its writes, EAGAIN, as it drops
            # ours, rather than stopping it).
            os.dup2(nb, fd, inheritable=True)
            os.close(nb)
        else:
            self._file = True  # /dev/null and other devices: they do not block

    def writable(self):
        return True

    def isatty(self):
        try:
            return os.isatty(self._fd)
        except OSError:
            return False

    def fileno(self):
        return self._fd

    def flush(self):
        pass

    def write(self, text):
        data = text.encode(self.encoding, self.errors) if isinstance(text, str) else bytes(text)
        if data:
            with self._lock:
                self._write(data)
        return len(text)

    def _raw(self, data):
        if self._sock is not None:
            return self._sock.send(data, socket.MSG_DONTWAIT)
        return os.write(self._fd, data)

    def _room(self, ms):
        p = select.poll()
        p.register(self._fd, select.POLLOUT)
        try:
            ev = p.poll(ms)
        except InterruptedError:
            return False
        return any(e & select.POLLOUT for _, e in ev)

    def _drop(self, data):
        self._stalled = True
        self.dropped_bytes += len(data)
        self.dropped_lines += data.count(b"\n") or 1

    def _write(self, data):
        if self._file:
            try:
                while data:
                    data = data[os.write(self._fd, data):]
            except OSError:
                pass  # a full disk or a closed stderr: not a reason to stop serving
            return
        if self._stalled:
            if not self._room(0):
                self._drop(data)
                return
            self._notice()
        view = memoryview(data)
        waited = False
        while view:
            try:
                n = self._raw(view[:_PIPE_BUF])
            except InterruptedError:
                continue
            except BlockingIOError:
                if waited or not self._room(_OUT_WAIT_MS):
                    self._drop(view)
                    return
                waited = True  # one more try once poll() saw room: EAGAIN again is a drop
                continue
            except OSError:
                self._drop(view)  # the reader left (EPIPE): nobody reads them either
                return
            self._line_open = view[n - 1] != ord("\n") if n else self._line_open
            view = view[n:]
            waited = False

    def _notice(self):
        line = (f"{chr(10) if self._line_open else ''}python -m shmipc.serve[{os.getpid()}]: "
                f"{self.dropped_lines} line{'s' if self.dropped_lines != 1 else ''} "
                f"({self.dropped_bytes} bytes) of stderr dropped: nobody read them\n").encode()
        self._stalled = False
        self._line_open = False
        self.dropped_bytes = self.dropped_lines = 0
        try:
            self._raw(line)
        except OSError:
            pass


def _listen(text):
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m shmipc.serve",
        description="Serve a WSGI or ASGI app in this process on shmipc.Server "
        "(docs/serve.md, \"One process\"); the supervised pool is the shmipc-serve command.")
    ap.add_argument("app", help="the application, as module:callable")
    ap.add_argument("--in-process", action="store_true", required=True,
                    help="serve in this process (required: the only mode of this command)")
    ap.add_argument("--asgi", action="store_true", help="APP is an ASGI 3 app (http, lifespan)")
    ap.add_argument("--listen", type=_listen, default=("127.0.0.1", 8000), metavar="HOST:PORT",
                    help="where to listen (127.0.0.1:8000; port 0: any free port)")
    ap.add_argument("--workers", type=int, default=None, metavar="N",
                    help="the server's worker threads, 1 .. 1024 (default: SHMIPC_WORKERS, else "
                    "one per CPU)")
    ap.add_argument("--graceful-timeout", type=float, default=10.0, metavar="SECONDS",
                    help="on SIGTERM/SIGINT/SIGQUIT, how long requests in flight have (10); ASGI "
                    "requests still in the app then are cancelled (1 s more to end, then 500); "
                    "a WSGI one ends the process (exit 4)")
    ap.add_argument("--concurrency", type=int, default=None, metavar="N",
                    help="--asgi: requests in the app at once, beyond which the server answers "
                    "503 with Retry-After (default: no bound)")
    args = ap.parse_args(argv)
    if args.workers is not None and not 1 <= args.workers <= 1024:
        ap.error("--workers must be 1 .. 1024")
    if args.concurrency is not None and not args.asgi:
        ap.error("--concurrency is for --asgi apps (WSGI runs one request per worker thread)")
    if args.concurrency is not None and args.concurrency < 1:
        ap.error("--concurrency must be >= 1")
    if not 0 < args.graceful_timeout <= 86400:
        ap.error("--graceful-timeout must be in 0 .. 86400 seconds")
    # Logging, the app's tracebacks and wsgi.errors never wait for stderr's reader.
    if sys.stderr is not None:  # None: Python started with fd 2 closed
        sys.stderr.flush()
    errlog = sys.stderr = _DropWriter(2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(process)d] %(message)s",
                        stream=errlog)
    try:
        app = load_app(args.app)
    except Exception as e:
        print(f"python -m shmipc.serve: cannot load {args.app}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 2

    import shmipc

    from .asgi import LifespanFailed
    from .inprocess import ASGIRoute, WSGIRoute

    try:
        route = (ASGIRoute(app, max_concurrency=args.concurrency) if args.asgi
                 else WSGIRoute(app, errors=errlog))
    except LifespanFailed as e:
        print(f"python -m shmipc.serve: lifespan startup failed: {e}", file=sys.stderr)
        return 3
    from .worker import _StopFlag

    # The handlers take no lock: CPython runs them on the main thread between two bytecodes of
    # whatever it is doing, and a threading.Event's set() would wait forever for the lock that
    # thread holds inside its own wait() (or inside the set() of an earlier signal's handler).
    # A flag, and a byte in a pipe that the main thread waits on; the pipe is never closed, as
    # a handler may still run after main() returns, and its fd must not name another file then.
    stopping = _StopFlag()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def on_signal(signum, frame):
        stopping.set()
        try:
            os.write(wake_w, b"\0")
        except OSError:
            pass  # the pipe is full: a byte is there to wake the main thread already

    # SIGQUIT (Ctrl-\\) as shmipc-serve takes it: nginx's graceful stop, not a core dump.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, on_signal)
    # The handlers run between two bytecodes: a signal that lands after the last check before
    # select() sleeps (and so interrupts nothing) would wait there for good. The C-level handler
    # writes the pipe at once, so select() returns and the handler runs.
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    # An ASGI request still in the app at --graceful-timeout is cancelled and answered 500
    # (below); the server's own stop timeout, which closes the connections still waiting,
    # comes 2 s later, so that the 500 goes out first.
    kw = {"address": args.listen[0], "port": args.listen[1],
          "stop_timeout": args.graceful_timeout + (2.0 if args.asgi else 0.0)}
    if args.workers is not None:
        kw["workers"] = args.workers
    rc = 0
    try:
        try:
            # The address is parsed here, the port bound by start(): either is one line.
            server = shmipc.Server(**kw)
        except shmipc.Error as e:
            print(f"python -m shmipc.serve: cannot listen on {args.listen[0]}:"
                  f"{args.listen[1]}: {e}", file=sys.stderr)
            return 1
        with server:
            server.route(None, "/*", route)
            try:
                server.start()
            except shmipc.Error as e:
                print(f"python -m shmipc.serve: cannot listen on {args.listen[0]}:"
                      f"{args.listen[1]}: {e}", file=sys.stderr)
                return 1
            print(f"python -m shmipc.serve: {args.app} listening on "
                  f"{args.listen[0]}:{server.port}", flush=True)
            # The handlers only set the flag: a stop() from a signal that came before run()
            # would stop the started server, and run() would then start it again and block.
            # A signal that comes before select() left its byte in the pipe: no wait is lost.
            while not stopping.is_set():
                select.select([wake_r], [], [])
            # stop() waits for the requests in the app: an ASGI request that never finishes
            # (a long poll) would hold it until the server's stop timeout closed its
            # connection. Past --graceful-timeout, close() cancels the requests still in the
            # app (their clients get 500), as the pool's front would ABORT.
            stopper = threading.Thread(target=server.stop, name="shmipc-serve-stop")
            stopper.start()
            stopper.join(args.graceful_timeout)
            # The stop takes some time of its own: past a timeout shorter than that (1e-9 is
            # valid) with no request in the app, it is clean, and ends on its own (the server's
            # stop timeout is over too). Only a request still in the app makes it exit 4.
            while stopper.is_alive() and not args.asgi and route._in_app == 0:
                stopper.join(0.05)
            if stopper.is_alive() and args.asgi:
                rc = _close(route)
            elif stopper.is_alive():
                # A WSGI call cannot be cancelled: one that never returns held the stop, and
                # the process, for good (a second signal is only the flag again). Past the
                # timeout the process ends without it, as the pool's SIGKILL ends a worker;
                # exiting normally would wait for the server again, so it ends here.
                print("python -m shmipc.serve: requests still in the WSGI app after "
                      f"--graceful-timeout {args.graceful_timeout:g} s: exiting without them",
                      file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(4)
            stopper.join()
    finally:
        if args.asgi:
            rc = _close(route) or rc
    return rc


def _close(route):
    """route.close(): 3 (and the message) when lifespan shutdown fails, else 0."""
    from .asgi import LifespanFailed

    try:
        # Past --graceful-timeout: the requests cancelled have 1 s to end, then get their 500
        # before the server's own stop timeout (2 s later) closes their connections.
        route.close(cancel_timeout=_CANCEL_S)
    except LifespanFailed as e:
        print(f"python -m shmipc.serve: lifespan shutdown failed: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
