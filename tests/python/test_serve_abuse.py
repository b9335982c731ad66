"""shmipc-serve against slow and abusive clients (issue 22, item 7), end to end with real Python
workers: 10,000 idle connections held beside 2 workers, slowloris heads, huge heads, a 1 GiB
body declared to the server's limit, a client that never reads a large response. In each case
the abusive connections are closed or refused as documented (docs/serve.md, "Failures"), and
requests from well-behaved clients running at the same time are all answered, each with its
own unique body (no cross-talk). Nothing here asserts on speed: only on outcomes, bounded by
generous timeouts."""
import os
import re
import resource
import signal
import socket
import threading
import time

import pytest

from test_serve_cli import ASGI_APP, NATIVE, SERVE, Serve, native_built

pytestmark = pytest.mark.skipif(not os.path.exists(SERVE), reason="shmipc-serve is not built")

IDLE = 10000


def raise_nofile(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return soft, hard


def cliapp_answer(status, out, path, body):
    """Whether test_serve_cli's app answered POST `path` with `body`."""
    return status == 200 and out.endswith(b" body=" + body) and \
        f"path={path} ".encode() in out


def unique_requests(s, tag, n, clients=4, answered=cliapp_answer):
    """n POSTs over `clients` threads, each with its own body; the mismatches and failures
    (`answered(status, out, path, body)` says whether an answer is right)."""
    bad = []

    def run(c):
        for i in range(c, n, clients):
            body = f"{tag}-{i}-{os.urandom(6).hex()}".encode()
            try:
                status, out = s.request("POST", f"/u/{tag}/{i}", body=body, timeout=60)
            except OSError as e:
                bad.append((i, repr(e)))
                continue
            if not answered(status, out, f"/u/{tag}/{i}", body):
                bad.append((i, status, out[:120]))

    ts = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return bad


def upload_threads(s, n, bad, answered=cliapp_answer, size=300 << 10):
    """Two threads that POST n uploads of `size` random bytes between them, each its own body;
    the mismatches and failures go to `bad`. Not started."""
    def upload(i):
        body = b"%d-" % i + os.urandom(size)
        try:
            status, out = s.request("POST", f"/u/big/{i}", body=body, timeout=60)
        except OSError as e:
            bad.append((i, repr(e)))
            return
        if not answered(status, out, f"/u/big/{i}", body):
            bad.append((i, status, out[:60]))

    return [threading.Thread(target=lambda c=c: [upload(i) for i in range(c, n, 2)])
            for c in range(2)]


def rss_kb(pid):
    """The process's private memory (RssAnon): the shared-memory buffers of its sessions,
    which the workers fill, are not the front's own."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def connect(port):
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    return c


def read_to_eof(c, timeout=60):
    """Bytes read from `c` until the server closes it; `c` is closed after."""
    c.settimeout(timeout)
    n = 0
    while True:
        part = c.recv(1 << 20)
        if not part:
            break
        n += len(part)
    c.close()
    return n


def closed_by_peer(c, timeout):
    """True when the server closes `c` within `timeout` s (after any answer it sends)."""
    c.settimeout(timeout)
    try:
        while c.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_10k_idle_connections_beside_two_workers(tmp_path):
    old = raise_nofile(IDLE + 1000)
    s = Serve(tmp_path, workers=2)
    idle = []
    try:
        base = rss_kb(s.p.pid)
        deadline = time.monotonic() + 120
        while len(idle) < IDLE and time.monotonic() < deadline:
            idle.append(connect(s.port))
        assert len(idle) == IDLE
        # Half of them sent part of a head: the server holds them as well.
        for c in idle[: IDLE // 2]:
            c.sendall(b"GET / HTTP/1.1\r\nHo")
        assert unique_requests(s, "idle", 400) == []
        grown = rss_kb(s.p.pid) - base
        # Bounded memory per idle connection (the front's process; no buffer for an idle one).
        assert grown < IDLE * 16, f"{grown} KiB for {IDLE} idle connections"
        # Every idle connection is still open and still served when it speaks.
        for c in idle[-3:]:
            c.sendall(b"GET /late HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            c.settimeout(30)
            got = b""
            while True:
                part = c.recv(65536)
                if not part:
                    break
                got += part
            assert got.startswith(b"HTTP/1.1 200 ") and b"path=/late" in got
    finally:
        for c in idle:
            c.close()
        assert s.stop() == 0
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def test_slowloris_heads_are_closed_and_others_served(tmp_path, monkeypatch):
    # The header deadline (1 s here; 10 s by default) closes a head that trickles in a byte at
    # a time, however steadily, while the others' requests go through.
    monkeypatch.setenv("SHMIPC_HTTP_HEADER_TIMEOUT_MS", "1000")
    s = Serve(tmp_path, workers=2)
    slow = [connect(s.port) for _ in range(64)]
    stop = threading.Event()
    cut = []

    def trickle():
        head = b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 4000
        for i in range(len(head)):
            if stop.is_set():
                return
            for c in list(slow):
                try:
                    c.send(head[i:i + 1])
                except OSError:
                    slow.remove(c)
                    cut.append(c)
            time.sleep(0.05)

    t = threading.Thread(target=trickle)
    t.start()
    try:
        assert unique_requests(s, "loris", 200) == []
        deadline = time.monotonic() + 30
        while slow and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not slow, f"{len(slow)} slowloris connections still open after 30 s"
        for c in cut:
            assert closed_by_peer(c, 5)
    finally:
        stop.set()
        t.join(10)
        for c in slow + cut:
            c.close()
        assert s.stop() == 0


@pytest.mark.parametrize("size,status", [(20000, 431), (70000, 431)])
def test_huge_heads_are_refused_and_others_served(tmp_path, size, status):
    s = Serve(tmp_path, workers=2)
    try:
        for _ in range(8):
            c = connect(s.port)
            try:
                c.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"b" * size + b"\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before it was all sent
            c.settimeout(10)
            try:
                got = c.recv(65536)
            except ConnectionResetError:
                got = b""
            assert got == b"" or got.startswith(b"HTTP/1.1 %d " % status), got[:80]
            assert closed_by_peer(c, 10)
            c.close()
        assert unique_requests(s, "huge", 100) == []
    finally:
        assert s.stop() == 0


def test_1gib_declared_body_is_413_without_being_read(tmp_path):
    s = Serve(tmp_path, workers=2)
    try:
        for _ in range(4):
            c = connect(s.port)
            c.sendall(b"POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 1073741824\r\n\r\n")
            c.sendall(b"z" * 65536)
            c.settimeout(10)
            got = c.recv(65536)
            assert got.startswith(b"HTTP/1.1 413 "), got[:80]
            assert b"\r\nConnection: close\r\n" in got
            assert closed_by_peer(c, 10)
            c.close()
        assert unique_requests(s, "big", 100) == []
    finally:
        assert s.stop() == 0


BIG_APP = '''
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    for _ in range(64):
        yield b"x" * (1 << 20)
'''


def test_client_that_never_reads_a_large_response(tmp_path):
    # 64 MiB streamed to 2 clients that never read: the front holds at most its mark (and a
    # frame) per connection, the workers wait on their streams, so the front's memory stays
    # bounded, and the third worker serves a whole 64 MiB to a reading client meanwhile.
    (tmp_path / "bigapp.py").write_text(BIG_APP)
    s2 = Serve(tmp_path, workers=3, app=("bigapp:app",))
    try:
        base = rss_kb(s2.p.pid)
        stuck = []
        for _ in range(2):
            c = connect(s2.port)
            c.sendall(b"GET /big HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            stuck.append(c)
        time.sleep(2)
        grown = rss_kb(s2.p.pid) - base
        print(f"front RssAnon grew {grown} KiB for 2 stalled 64 MiB readers")
        assert grown < 2 * 4 * 1024, f"the front grew {grown} KiB for 2 stalled readers"
        # The third worker is free: a request still goes through.
        c = connect(s2.port)
        c.sendall(b"GET /ok HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert read_to_eof(c) > 64 << 20
        # A stalled reader that reads again gets its whole response: held back, never cut.
        c = stuck.pop()
        assert read_to_eof(c) > 64 << 20
        for c in stuck:
            c.close()
    finally:
        assert s2.stop() == 0


def continue_(pid):
    """SIGCONT to a worker this test stopped, unless it is gone: stopped past its deadline
    and the 5 s drain after it, it was killed as hung (docs/serve.md, "Hung workers")."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("pipeline,backend", [(1, "io_uring"), (1, "epoll"), (16, "io_uring"),
                                              (16, "epoll")])
def test_a_stopped_worker_costs_only_the_requests_it_holds(tmp_path, pipeline, backend):
    # One of two workers is stopped (SIGSTOP: neither its app nor its session turns run) while
    # small requests and 900 KiB uploads (which fill its session's shared memory) keep coming.
    # The front never waits on it: only the requests it was handed before it showed as stalled
    # get 504 at their deadline, at most `pipeline`; every other request is answered by the
    # other worker, each with its own body. Once it runs again it serves as before (or, if the
    # run took longer than its deadline and the drain, a worker replaced it as hung).
    timeout = 3
    s = Serve(tmp_path, "--timeout", str(timeout), "--pipeline", str(pipeline), workers=2,
              env={"SHMIPC_REACTOR_BACKEND": backend})
    stopped = s.worker_pids(2)[0]
    bigs = []

    def upload(i):
        body = b"%d-" % i + os.urandom(900 << 10)
        try:
            status, out = s.request("POST", f"/u/big/{i}", body=body, timeout=60)
        except OSError as e:
            bigs.append((i, repr(e)))
            return
        if status != 200 or not out.endswith(b" body=" + body):
            bigs.append((i, status, out[:60]))

    try:
        os.kill(stopped, signal.SIGSTOP)
        ts = [threading.Thread(target=upload, args=(i,)) for i in range(12)]
        for t in ts:
            t.start()
        bad = unique_requests(s, "small", 300)
        for t in ts:
            t.join(90)
        failed = bad + bigs
        assert all(len(f) == 3 and f[1] == 504 for f in failed), failed
        assert len(failed) <= pipeline, failed
        continue_(stopped)
        assert unique_requests(s, "after", 100) == []
        assert len(s.worker_pids(2)) == 2
    finally:
        continue_(stopped)
        assert s.stop() == 0


@pytest.mark.parametrize("backend", ["io_uring", "epoll"])
def test_a_stopped_asgi_worker_is_passed_over(tmp_path, backend):
    # An ASGI worker takes up to 64 requests at once. One of two is stopped whole (SIGSTOP):
    # the front gives each request to the least busy worker, and passes over one that has held
    # what it was sent for 200 ms without taking any, so the stopped worker keeps only the few
    # it got before (504 at their deadline). Before, it got every other request up to its 64,
    # each a 504, while the other worker idled.
    (tmp_path / "asgiapp.py").write_text(ASGI_APP)
    timeout, clients = 3, 4
    s = Serve(tmp_path, "--asgi", "--timeout", str(timeout), workers=2, app=("asgiapp:app",),
              env={"SHMIPC_REACTOR_BACKEND": backend})
    stopped = s.worker_pids(2)[0]

    def answered(status, out, path, body):
        return status == 201 and out == b"asgi " + path.encode() + b" " + body

    try:
        os.kill(stopped, signal.SIGSTOP)
        bad = unique_requests(s, "q", 200, clients, answered)
        assert all(len(f) == 3 and f[1] == 504 for f in bad), bad
        # At most what the clients had in flight before the stall showed, twice over.
        assert len(bad) <= 2 * clients, bad
        continue_(stopped)
        assert unique_requests(s, "after", 50, 1, answered) == []
        assert len(s.worker_pids(2)) == 2
    finally:
        continue_(stopped)
        assert s.stop() == 0


HUNG_APP = '''
import asyncio, os, time

def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/spin":
        while True:
            pass
    if path.startswith("/sleep/"):
        time.sleep(float(path[7:]))
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"pid=%d" % os.getpid()]

async def aapp(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    path = scope["path"]
    if path == "/spin":
        while True:
            pass
    if path.startswith("/sleep/"):
        await asyncio.sleep(float(path[7:]))
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"pid=%d" % os.getpid()})
'''


def served_by(s, timeout=40):
    """The pid of the worker that answers GET / with 200, asking again (504 and 503 while the
    only worker is held or restarting) for up to `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        status, out = s.request("GET", "/", timeout=30)
        if status == 200:
            return int(out.split(b"=")[1])
        assert status in (503, 504), (status, out)
        assert time.monotonic() < deadline, "no worker answered"
        time.sleep(0.2)


@pytest.mark.parametrize("kind,how", [("wsgi", "spin"), ("wsgi", "sleep/3600"),
                                      ("asgi", "spin")])
def test_a_hung_worker_is_killed_and_replaced(tmp_path, kind, how):
    # The only worker's app never returns and never lets its session run (a busy loop, a
    # blocking sleep; an ASGI app that blocks its event loop): its request is a 504 at the
    # deadline, and once the worker has not even taken the front's ABORT for the 5 s drain, the
    # supervisor kills it (SIGKILL) and starts another, which serves. Before, the worker kept its
    # slot for good and every later request was a 504.
    (tmp_path / "hungapp.py").write_text(HUNG_APP)
    flags = ("--asgi",) if kind == "asgi" else ()
    s = Serve(tmp_path, *flags, "--timeout", "1", workers=1,
              app=("hungapp:aapp" if kind == "asgi" else "hungapp:app",))
    try:
        old = s.worker_pids(1)[0]
        status, _ = s.request("GET", "/" + how, timeout=30)
        assert status == 504
        new = served_by(s)
        assert new != old
        assert s.wait_err("is hung"), "".join(s.err)
        with pytest.raises(ProcessLookupError):
            os.kill(old, 0)
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_slow_worker_that_is_not_hung_is_kept(tmp_path, kind):
    # Not hung: a WSGI app busy for 7 s whose client left (the front's ABORT says CLIENT_GONE,
    # not a deadline), and an ASGI app awaiting past its deadline (its loop runs: it takes the
    # ABORT, the task is cancelled). Neither worker is killed; each serves the next request.
    (tmp_path / "hungapp.py").write_text(HUNG_APP)
    flags = ("--asgi",) if kind == "asgi" else ()
    timeout = "30" if kind == "wsgi" else "1"
    s = Serve(tmp_path, *flags, "--timeout", timeout, workers=1,
              app=("hungapp:aapp" if kind == "asgi" else "hungapp:app",))
    try:
        old = s.worker_pids(1)[0]
        if kind == "wsgi":
            c = connect(s.port)
            c.sendall(b"GET /sleep/7 HTTP/1.1\r\nHost: t\r\n\r\n")
            time.sleep(0.5)
            c.close()  # the client leaves: ABORT CLIENT_GONE
        else:
            status, _ = s.request("GET", "/sleep/3600", timeout=30)
            assert status == 504
        assert served_by(s) == old
        assert not any("is hung" in line for line in s.err), "".join(s.err)
    finally:
        assert s.stop() == 0


def asgi_answer(status, out, path, body):
    """Whether test_serve_cli's ASGI app answered POST `path` with `body`."""
    return status == 201 and out == b"asgi " + path.encode() + b" " + body


def native_answer(status, out, path, body):
    """Whether examples/c/serve_hello.c or examples/lua/serve_hello.lua echoed `body`."""
    return status == 200 and out == body


@pytest.mark.parametrize("kind,pipeline,backend", [
    ("wsgi", 1, "io_uring"), ("wsgi", 16, "epoll"), ("asgi", 1, "io_uring"), ("asgi", 1, "epoll"),
    ("c", 1, "io_uring"), ("lua", 16, "epoll")])
def test_recycling_every_few_requests_loses_none(tmp_path, kind, pipeline, backend):
    # --max-requests 5 with two workers: a worker ends after every fifth request and a new one
    # starts, about 70 times in this run, while 6 clients send small requests and 300 KiB
    # uploads (each its own body). A worker past its count refuses what it was handed (ABORT
    # SHUTDOWN) and the front gives that to another worker, the uploads whole: every request is
    # answered by the app, with its own body, none lost, none 502.
    flags = ["--max-requests", "5", "--timeout", "30", "--pipeline", str(pipeline)]
    app, answered, chdir = ("cliapp:app",), cliapp_answer, None
    if kind == "asgi":
        (tmp_path / "asgiapp.py").write_text(ASGI_APP)
        flags.append("--asgi")
        app, answered = ("asgiapp:app",), asgi_answer
    elif kind in NATIVE:
        if not native_built(kind):
            pytest.skip(f"no {kind} worker in this build")
        (app, chdir), answered = NATIVE[kind], native_answer
    s = Serve(tmp_path, *flags, workers=2, app=app, chdir=chdir,
              env={"SHMIPC_REACTOR_BACKEND": backend})
    bigs = []
    try:
        ts = upload_threads(s, 40, bigs, answered)
        for t in ts:
            t.start()
        bad = unique_requests(s, "r", 300, 4, answered)
        for t in ts:
            t.join(120)
        assert bad + bigs == [], (bad + bigs, "".join(s.err[-10:]))
        assert unique_requests(s, "after", 20, 1, answered) == []
    finally:
        assert s.stop() == 0


CRASH_APP = '''
import os

def app(environ, start_response):
    body = environ["wsgi.input"].read()
    if environ["PATH_INFO"] == "/crash":
        os._exit(1)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"pid=%d path=%s body=" % (os.getpid(), environ["PATH_INFO"].encode()) + body]
'''


@pytest.mark.parametrize("pipeline,backend", [(1, "io_uring"), (16, "epoll")])
def test_workers_crashing_under_load_cost_only_their_request(tmp_path, pipeline, backend):
    # Two workers; one client asks for /crash (the app exits mid-request) 12 times while 4
    # others send unique requests and 2 send 300 KiB uploads. Each /crash is a 502 and the
    # worker is restarted; every other request is answered by the app with its own body: one
    # pipelined behind a crashing request, or queued at the dying worker, goes to another
    # worker whole, never a 502 (docs/serve.md, "Failures").
    (tmp_path / "crashapp.py").write_text(CRASH_APP)
    s = Serve(tmp_path, "--timeout", "30", "--pipeline", str(pipeline), workers=2,
              app=("crashapp:app",), env={"SHMIPC_REACTOR_BACKEND": backend})
    crashes, bigs = [], []

    def crash():
        for _ in range(12):
            try:
                crashes.append(s.request("POST", "/crash", body=b"x", timeout=60)[0])
            except OSError as e:
                crashes.append(repr(e))
            time.sleep(0.3)

    try:
        ts = [threading.Thread(target=crash)] + upload_threads(s, 30, bigs)
        for t in ts:
            t.start()
        bad = unique_requests(s, "c", 400, 4)
        for t in ts:
            t.join(120)
        assert bad + bigs == [], (bad + bigs, "".join(s.err[-10:]))
        assert crashes == [502] * 12
        assert unique_requests(s, "after", 20, 1) == []
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("kind,backend", [("asgi", "io_uring"), ("c", "epoll"),
                                          ("lua", "io_uring")])
def test_reloads_under_load_lose_none(tmp_path, kind, backend):
    # Six reloads (SIGHUP: a new generation of workers, the old one drained), each once
    # requests were answered since the one before, while 4 clients send small requests and 2
    # send 300 KiB uploads, each its own body: every request is answered by the app, none
    # lost, none 502 or 503 (test_serve_cli.py has the same for WSGI).
    flags = ["--timeout", "30"]
    if kind == "asgi":
        (tmp_path / "asgiapp.py").write_text(ASGI_APP)
        flags.append("--asgi")
        app, answered, chdir = ("asgiapp:app",), asgi_answer, None
    else:
        if not native_built(kind):
            pytest.skip(f"no {kind} worker in this build")
        (app, chdir), answered = NATIVE[kind], native_answer
    s = Serve(tmp_path, *flags, workers=2, app=app, chdir=chdir,
              env={"SHMIPC_REACTOR_BACKEND": backend})
    done, failures, count = threading.Event(), [], [0]

    def client(k, size):
        i = 0
        end = time.monotonic() + 120
        while not done.is_set() and i < 5000 and time.monotonic() < end:
            path = f"/r/{k}/{i}"
            body = b"%d.%d-" % (k, i) + os.urandom(size)
            try:
                status, out = s.request("POST", path, body=body, timeout=60)
            except OSError as e:
                failures.append((path, repr(e)))
            else:
                if not answered(status, out, path, body):
                    failures.append((path, status, out[:60]))
            count[0] += 1
            i += 1

    threads = [threading.Thread(target=client, args=(k, 300 << 10 if k < 2 else 16))
               for k in range(6)]
    first = s.worker_pids(2)
    try:
        for t in threads:
            t.start()
        for reload in range(7):
            since, at = count[0], time.monotonic()
            deadline = at + 60
            while (count[0] < since + 20 or time.monotonic() < at + 0.3) and \
                    time.monotonic() < deadline:
                time.sleep(0.01)
            assert count[0] >= since + 20, f"nothing answered in round {reload}"
            if reload < 6:
                s.p.send_signal(signal.SIGHUP)
        done.set()
        for t in threads:
            t.join(120)
        assert failures == [], (failures[:10], "".join(s.err[-10:]))
        end = time.monotonic() + 30  # the last reload's workers may still be starting
        while set(s.worker_pids(2)) & set(first) and time.monotonic() < end:
            time.sleep(0.2)
        assert not set(s.worker_pids(2)) & set(first), "the workers were never replaced"
    finally:
        done.set()
        assert s.stop() == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_access_log_rotated_under_load_keeps_every_line_once(tmp_path, threads):
    # logrotate ten times (the file moved, SIGUSR2), each while 4 clients send 50 unique
    # requests through 1 or 2 reactor threads: every request is in exactly one of the files,
    # once, each line whole (JSON), and the SIGUSR1 status counts them all, no write error.
    import json
    log = tmp_path / "access.log"
    s = Serve(tmp_path, "--access-log", str(log), "--access-log-format", "json",
              "--threads", str(threads), workers=2)
    rotated, bad = [], []
    try:
        for k in range(10):
            load = threading.Thread(
                target=lambda k=k: bad.extend(unique_requests(s, f"log{k}", 50, 4)))
            load.start()
            time.sleep(0.01)
            os.rename(log, tmp_path / f"access.log.{k}")
            rotated.append(tmp_path / f"access.log.{k}")
            s.p.send_signal(signal.SIGUSR2)
            load.join(60)
            end = time.monotonic() + 10
            while not log.exists() and time.monotonic() < end:
                time.sleep(0.01)
        assert bad == []
        targets = [f"/u/log{k}/{i}" for k in range(10) for i in range(50)]
        end = time.monotonic() + 20
        while True:
            seen = []
            for f in rotated + [log]:
                text = f.read_text() if f.exists() else ""
                assert text == "" or text.endswith("\n"), (f, text[-200:])
                seen += [json.loads(line)["target"] for line in text.splitlines()]
            if len(seen) >= len(targets) or time.monotonic() > end:
                break
            time.sleep(0.1)
        assert sorted(seen) == sorted(targets)
        before = len(s.err)
        s.p.send_signal(signal.SIGUSR1)
        assert s.wait_err("access log:")
        assert re.search(r"access log: %d lines written, 0 write errors" % len(targets),
                         "".join(s.err[before:])), "".join(s.err[before:])
    finally:
        assert s.stop() == 0
