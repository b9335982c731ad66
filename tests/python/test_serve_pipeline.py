"""shmipc-serve --pipeline N (docs/serve.md, "HELLO and TAKEN"): with every worker busy, up to N
requests wait in a worker's own queue, and a worker's death is a 502 only for the request it
had taken; those it never took go to another worker."""

import os
import re
import signal
import subprocess
import threading
import time
import http.client

import pytest

from test_serve_cli import SERVE, Serve

pytestmark = pytest.mark.skipif(not os.path.exists(SERVE), reason="shmipc-serve is not built")


def post(port, path, body, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=body)
        r = c.getresponse()
        return r.status, r.read()
    except OSError as e:
        return repr(e), b""
    finally:
        c.close()


# The app of these tests: a request to /hold is held until the test creates the file "release"
# in the app's directory (60 s at most). A hold of a fixed time (/slow?3) let the slow requests
# end before the test had seen the others queue behind them when the machine was loaded (CI,
# pytest-xdist): test_killed_worker_... then saw nothing in flight.
GATED_APP = """
import os
import time

def app(environ, start_response):
    path = environ["PATH_INFO"]
    body = environ["wsgi.input"].read()
    if path == "/hold":
        for _ in range(6000):
            if os.path.exists("release"):
                break
            time.sleep(0.01)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"pid=%d path=%s body=" % (os.getpid(), path.encode()) + body]
"""


def gated(tmp_path, *flags, workers):
    (tmp_path / "gatedapp.py").write_text(GATED_APP)
    return Serve(tmp_path, *flags, workers=workers, app=("gatedapp:app",))


def front_status(s):
    """The front's in-flight count per worker address and its own queue's length, from the
    SIGUSR1 status: ({address: in flight}, queued), or ({}, None) without an answer."""
    before = len(s.err)
    s.p.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = "".join(s.err[before:])
        rows = re.findall(r"^\s+(\S+) up: \d+ session\(s\), (\d+) in flight", text, re.M)
        queued = re.search(r"front: (\d+) queued", text)
        if rows and queued:
            return {a: int(n) for a, n in rows}, int(queued.group(1))
        time.sleep(0.02)
    return {}, None


def wait_front_ready(s, workers, timeout=20):
    """Waits until the front has a session with each of `workers` workers: a worker the
    supervisor reports ready may not have its session with the front yet, and a request sent
    meanwhile goes to the other one."""
    deadline = time.monotonic() + timeout
    while True:
        before = len(s.err)
        s.p.send_signal(signal.SIGUSR1)
        end = time.monotonic() + 10
        rows = []
        while time.monotonic() < end:
            text = "".join(s.err[before:])
            if re.search(r"front: \d+ queued", text) and "in flight" in text:
                rows = re.findall(r"^\s+\S+ up: (\d+) session\(s\)", text, re.M)
                break
            time.sleep(0.02)
        if len(rows) == workers and all(int(n) > 0 for n in rows):
            return
        assert time.monotonic() < deadline, "".join(s.err[-20:])
        time.sleep(0.1)


def in_flight(s):
    """The front's in-flight count per worker address, from the SIGUSR1 status."""
    return front_status(s)[0]


def wait_in_flight(s, total, timeout=20):
    deadline = time.monotonic() + timeout
    got = {}
    while time.monotonic() < deadline:
        got = in_flight(s)
        if sum(got.values()) == total:
            return got
        time.sleep(0.05)
    return got


def run_all(calls):
    out = [None] * len(calls)

    def one(i, f):
        out[i] = f()

    ts = [threading.Thread(target=one, args=(i, f)) for i, f in enumerate(calls)]
    for t in ts:
        t.start()
    return ts, out


@pytest.mark.parametrize("bad", ["0", "17", "x"])
def test_pipeline_flag_is_checked(bad):
    r = subprocess.run([SERVE, "--pipeline", bad, "app:app", "--check"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "--pipeline" in r.stderr, r.stderr


def test_pipelined_requests_cross_no_bodies(tmp_path):
    # 24 clients, 2 workers, pipeline 4, slow requests among them so that workers are busy
    # and requests queue at them: each client gets its own body back, no other's.
    s = Serve(tmp_path, "--pipeline", "4", workers=2)
    try:
        errors = []

        def client(i):
            for k in range(4):
                path = "/slow?0.05" if (i + k) % 3 == 0 else f"/echo{i}"
                body = f"client-{i}-req-{k}-{os.getpid()}".encode() * (1 + i % 5)
                status, got = post(s.port, path, body)
                if status != 200 or not got.endswith(b"path=" + path.split("?")[0].encode()
                                                     + b" body=" + body):
                    errors.append((i, k, status, got[:100]))

        ts = [threading.Thread(target=client, args=(i,)) for i in range(24)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert errors == []
    finally:
        assert s.stop() == 0


def test_killed_worker_is_a_502_only_for_the_request_it_had_taken(tmp_path):
    s = gated(tmp_path, "--pipeline", "4", workers=2)
    try:
        pids = s.worker_pids(2)
        assert len(pids) == 2
        wait_front_ready(s, 2)
        # One held request per worker (a free worker first), then six that wait at them.
        slow_ts, slow = run_all([lambda: post(s.port, "/hold", b"", timeout=60)
                                 for _ in range(2)])
        assert sum(wait_in_flight(s, 2).values()) == 2
        bodies = [f"queued-{i}-{os.getpid()}".encode() for i in range(6)]
        q_ts, queued = run_all([lambda b=b: post(s.port, "/echo", b, timeout=60)
                                for b in bodies])
        got = wait_in_flight(s, 8)
        assert sorted(got.values()) == [4, 4], got  # four at each: none left in the front
        os.kill(pids[0], signal.SIGKILL)
        # The killed worker's held request fails at once; the other is let go only now.
        (tmp_path / "release").touch()
        for t in slow_ts + q_ts:
            t.join(60)
        # The slow request the killed worker had taken: 502. The other: 200.
        assert sorted(st for st, _ in slow) == [200, 502], slow
        # The three waiting at the killed worker had not been taken: served elsewhere.
        for b, (status, got) in zip(bodies, queued):
            assert status == 200, (b, status, got)
            assert got.endswith(b"path=/echo body=" + b)
            assert b"pid=%d " % pids[0] not in got
    finally:
        s.stop()


def test_default_is_one_request_at_a_time(tmp_path):
    # Without --pipeline, a busy worker gets nothing more: the rest wait in the front.
    s = gated(tmp_path, workers=1)
    try:
        slow_ts, slow = run_all([lambda: post(s.port, "/hold", b"", timeout=60)
                                 for _ in range(3)])
        # All three have come (up to 20 s): one at the worker, two in the front's queue.
        deadline = time.monotonic() + 20
        got, queued = front_status(s)
        while sum(got.values()) + (queued or 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            got, queued = front_status(s)
        assert (list(got.values()), queued) == ([1], 2), (got, queued)
        (tmp_path / "release").touch()
        for t in slow_ts:
            t.join(60)
        assert [st for st, _ in slow] == [200, 200, 200]
    finally:
        assert s.stop() == 0


def test_reload_with_requests_queued_at_the_old_worker_cuts_none(tmp_path):
    # SIGHUP while the worker runs a slow request and three more wait in its queue: the old
    # worker finishes the slow one and refuses the three (ABORT SHUTDOWN, never TAKEN); they go
    # to the new worker, and no request is cut or lost.
    s = gated(tmp_path, "--pipeline", "4", workers=1)
    try:
        old = s.worker_pids(1)
        slow_ts, slow = run_all([lambda: post(s.port, "/hold", b"", timeout=60)])
        assert sum(wait_in_flight(s, 1).values()) == 1
        bodies = [f"reload-{i}-{os.getpid()}".encode() for i in range(3)]
        q_ts, queued = run_all([lambda b=b: post(s.port, "/echo", b, timeout=60)
                                for b in bodies])
        assert sum(wait_in_flight(s, 4).values()) == 4
        s.p.send_signal(signal.SIGHUP)
        # The held request is let go once the new worker is ready (the old one is then told to
        # stop), up to 30 s.
        deadline = time.monotonic() + 30
        while s.worker_pids(1) == old and time.monotonic() < deadline:
            time.sleep(0.1)
        (tmp_path / "release").touch()
        for t in slow_ts + q_ts:
            t.join(60)
        assert slow[0][0] == 200, slow
        assert b"pid=%d " % old[0] in slow[0][1]  # the old worker finished it
        for b, (status, got) in zip(bodies, queued):
            assert status == 200, (b, status, got)
            assert got.endswith(b"path=/echo body=" + b)
    finally:
        assert s.stop() == 0
