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


def in_flight(s):
    """The front's in-flight count per worker address, from the SIGUSR1 status."""
    before = len(s.err)
    s.p.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = "".join(s.err[before:])
        rows = re.findall(r"^\s+(\S+) up: \d+ session\(s\), (\d+) in flight", text, re.M)
        if rows and "queued" in text:
            return {a: int(n) for a, n in rows}
        time.sleep(0.02)
    return {}


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
    s = Serve(tmp_path, "--pipeline", "4", workers=2)
    try:
        pids = s.worker_pids(2)
        assert len(pids) == 2
        # One slow request per worker (a free worker first), then six that wait at them. Slow
        # enough that all eight are in flight before the first ends, on a loaded machine too
        # (with 3 s, a CI run beside other tests saw them end before the six were queued).
        slow_ts, slow = run_all([lambda: post(s.port, "/slow?8", b"") for _ in range(2)])
        assert sum(wait_in_flight(s, 2).values()) == 2
        bodies = [f"queued-{i}-{os.getpid()}".encode() for i in range(6)]
        q_ts, queued = run_all([lambda b=b: post(s.port, "/echo", b) for b in bodies])
        got = wait_in_flight(s, 8)
        assert sorted(got.values()) == [4, 4], got  # four at each: none left in the front
        os.kill(pids[0], signal.SIGKILL)
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
    s = Serve(tmp_path, workers=1)
    try:
        slow_ts, slow = run_all([lambda: post(s.port, "/slow?1", b"") for _ in range(3)])
        time.sleep(0.5)
        got = in_flight(s)
        assert list(got.values()) == [1], got
        for t in slow_ts:
            t.join(30)
        assert [st for st, _ in slow] == [200, 200, 200]
    finally:
        assert s.stop() == 0


def test_reload_with_requests_queued_at_the_old_worker_cuts_none(tmp_path):
    # SIGHUP while the worker runs a slow request and three more wait in its queue: the old
    # worker finishes the slow one and refuses the three (ABORT SHUTDOWN, never TAKEN); they go
    # to the new worker, and no request is cut or lost.
    s = Serve(tmp_path, "--pipeline", "4", workers=1)
    try:
        old = s.worker_pids(1)
        slow_ts, slow = run_all([lambda: post(s.port, "/slow?1.5", b"")])
        assert sum(wait_in_flight(s, 1).values()) == 1
        bodies = [f"reload-{i}-{os.getpid()}".encode() for i in range(3)]
        q_ts, queued = run_all([lambda b=b: post(s.port, "/echo", b) for b in bodies])
        assert sum(wait_in_flight(s, 4).values()) == 4
        s.p.send_signal(signal.SIGHUP)
        for t in slow_ts + q_ts:
            t.join(60)
        assert slow[0][0] == 200, slow
        assert b"pid=%d " % old[0] in slow[0][1]  # the old worker finished it
        for b, (status, got) in zip(bodies, queued):
            assert status == 200, (b, status, got)
            assert got.endswith(b"path=/echo body=" + b)
    finally:
        assert s.stop() == 0
