"""shmipc-serve, the command, end to end: the supervisor starts real `python -m
shmipc.serve.worker` processes, the front (core/serve/front.c) hands them HTTP requests. Unique
bodies from concurrent clients (no cross-talk), a worker killed with SIGKILL is replaced and
serving goes on, SIGHUP replaces every worker with no failed request, SIGTERM answers the
request in flight and leaves no process behind, an app that raises is a 500, and the flags
the build cannot honour yet are refused, not ignored."""
import http.client
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time

import pytest

from conftest import (BUILD, ROOT, alive, children, kill_tree, python_env, reserved_port,
                      sigint_default)

SERVE = os.path.join(BUILD, "serve", "shmipc-serve")

APP = '''
import os
import time

def app(environ, start_response):
    path = environ["PATH_INFO"]
    body = environ["wsgi.input"].read()
    if path == "/raise":
        raise RuntimeError("the app failed")
    if path == "/slow":
        time.sleep(float(environ.get("QUERY_STRING") or "1"))
    if path == "/hold":
        # Says it has the request ("held" in its directory), then holds it until the test
        # creates "release" there (60 s at most).
        open("held", "w").close()
        for _ in range(6000):
            if os.path.exists("release"):
                break
            time.sleep(0.01)
    out = b"pid=%d path=%s body=" % (os.getpid(), path.encode()) + body
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [out]
'''

pytestmark = pytest.mark.skipif(not os.path.exists(SERVE), reason="shmipc-serve is not built")


class Serve:
    """shmipc-serve running an app from tmp_path; stderr is collected on a thread."""

    def __init__(self, tmp_path, *flags, workers=2, app=("cliapp:app",), chdir=None, cpus=None,
                 env=None, new_session=False, listen=None):
        (tmp_path / "cliapp.py").write_text(APP)
        # With `listen` (port 0), host and port are the ones the "listening on" line says.
        self.host, self.port = "127.0.0.1", None if listen else reserved_port()
        self.p = subprocess.Popen(
            [SERVE, *app, "--chdir", str(chdir or tmp_path), "--listen",
             listen or f"127.0.0.1:{self.port}",
             "--workers", str(workers), "--python", "/usr/bin/python3", "--graceful-timeout", "10",
             *flags],
            env={**python_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
            start_new_session=new_session)
        self.err = []
        self.listening = threading.Event()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()
        threading.Thread(target=self.p.stdout.read, daemon=True).start()
        assert self.listening.wait(30), "".join(self.err)

    def _read(self):
        for line in self.p.stderr:
            self.err.append(line)
            if "listening on" in line:
                if self.port is None:
                    m = re.search(r"listening on (\d+\.\d+\.\d+\.\d+|\[[0-9a-f:.]+\]):(\d+)[ ,]",
                                  line)
                    if m:
                        self.host, self.port = m.group(1).strip("[]"), int(m.group(2))
                self.listening.set()

    def wait_err(self, text, timeout=20):
        """Whether a line of shmipc-serve's stderr holds `text`, waiting up to `timeout` s for
        it: a worker's log line reaches the supervisor's stderr through a pipe, possibly after
        the client already has its answer."""
        deadline = time.monotonic() + timeout
        while True:
            if any(text in line for line in list(self.err)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def request(self, method, path, body=None, timeout=20):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            c.request(method, path, body=body)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def worker_pids(self, count=None):
        """The ready worker pids of the newest generation, from the SIGUSR1 status table;
        with `count`, asks again (up to 20 s) until that many are ready."""
        deadline = time.monotonic() + 20
        while True:
            before = len(self.err)
            self.p.send_signal(signal.SIGUSR1)
            pids = None
            while time.monotonic() < deadline and pids is None:
                text = "".join(self.err[before:])
                rows = re.findall(r"^\d+\s+(\d+)\s+(\d+)\s+ready\s", text, re.M)
                if rows and "in flight" in text:
                    gen = max(int(g) for g, _ in rows)
                    pids = sorted(int(pid) for g, pid in rows if int(g) == gen)
                time.sleep(0.05)
            if pids is None:
                raise AssertionError("no status table: " + "".join(self.err[before:]))
            if count is None or len(pids) == count or time.monotonic() >= deadline:
                return pids
            time.sleep(0.1)

    def stop(self, timeout=30):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=timeout)
        self.t.join(5)
        return rc


def wait_for(path, timeout=30):
    """Waits (up to `timeout` s) for the app to create `path`; fails if it does not."""
    until(path.exists, f"{path.name} never appeared", timeout)


def until(cond, what, timeout=30):
    """Waits (up to `timeout` s) until cond() holds; fails saying `what` if it does not."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_unique_bodies_across_workers(tmp_path):
    s = Serve(tmp_path, workers=2)
    try:
        errors = []

        def client(k):
            for i in range(25):
                body = f"client {k} request {i} {os.urandom(6).hex()}".encode()
                status, out = s.request("POST", f"/u/{k}/{i}", body)
                if status != 200 or not out.endswith(b" path=/u/%d/%d body=" % (k, i) + body):
                    errors.append((status, out[:120]))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        # While one worker is busy, the other takes the next request. The busy one holds its
        # request until the fast one is answered: a fixed 1 s let it finish first on a loaded
        # machine (pytest-xdist), and the fast one could then go to the same worker.
        slow = {}
        t = threading.Thread(target=lambda: slow.setdefault("r", s.request("GET", "/hold",
                                                                           timeout=60)))
        t.start()
        try:
            wait_for(tmp_path / "held")
            status, fast = s.request("GET", "/fast")
        finally:
            (tmp_path / "release").touch()
            t.join(60)
        assert status == 200 and slow["r"][0] == 200
        assert fast.split()[0] != slow["r"][1].split()[0], (fast, slow)
    finally:
        assert s.stop() == 0


def test_killed_worker_is_replaced(tmp_path):
    s = Serve(tmp_path, workers=2)
    try:
        pids = s.worker_pids(2)
        os.kill(pids[0], signal.SIGKILL)
        # Requests go on (the other worker, then the replacement); at most the request that
        # was on the killed worker could fail, and none was.
        deadline = time.monotonic() + 20
        now = []
        while time.monotonic() < deadline:
            now = s.worker_pids(2)
            if len(now) == 2 and pids[0] not in now:
                break
            time.sleep(0.1)
        assert len(now) == 2 and pids[0] not in now and pids[1] in now, (pids, now)
        for i in range(20):
            status, out = s.request("GET", f"/after/{i}")
            assert status == 200, out
    finally:
        assert s.stop() == 0


# A request the front gives an old worker as it is TERMed is refused (ABORT SHUTDOWN) and
# goes to another worker: before that, about 1 reload in 20 under load failed one with a 502.
def test_reload_replaces_every_worker_without_failures(tmp_path):
    # The load runs across the whole reload: the SIGHUP goes once the old workers answered
    # some of it, and the load ends once the new ones did (each answer names its worker's pid),
    # not after fixed delays, which a loaded machine could make miss the reload.
    s = Serve(tmp_path, workers=2)
    try:
        old = s.worker_pids(2)
        failures, done, answered = [], threading.Event(), []

        def load():
            i = 0
            end = time.monotonic() + 90
            while not done.is_set() and i < 100000 and time.monotonic() < end:
                try:
                    status, out = s.request("GET", f"/during/{i}")
                except OSError as e:
                    failures.append(("error", repr(e)))
                else:
                    if status != 200:
                        failures.append((status, out[:100]))
                    else:
                        answered.append(int(out.split()[0][len(b"pid="):]))
                i += 1

        t = threading.Thread(target=load)
        t.start()
        until(lambda: set(answered) & set(old) or failures, "the old workers answered nothing")
        s.p.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        new = old
        while time.monotonic() < deadline:
            new = s.worker_pids(2)
            if len(new) == 2 and not set(new) & set(old):
                break
            time.sleep(0.2)
        assert len(new) == 2 and not set(new) & set(old), (old, new)
        until(lambda: set(answered) & set(new) or failures or not t.is_alive(),
              "the new workers answered nothing")
        done.set()
        t.join(60)
        assert failures == [], "".join(s.err)[-4000:]
        for pid in old:  # the old generation was stopped and reaped
            deadline = time.monotonic() + 15
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not alive(pid)
    finally:
        assert s.stop() == 0


# Uploads over 64 KiB across reloads: a stopping worker refuses a request it never took (ABORT
# SHUTDOWN before TAKEN), and the front holds such a body past 64 KiB until TAKEN, so the
# refused upload goes to another worker whole. Before, a refusal that came after the body's
# first message was a 503 (8 in 13,079 across reloads). Every answer must be the app's echo of
# that request's own body (no cross-talk, nothing cut).
def test_reloads_under_large_uploads_lose_none(tmp_path):
    s = Serve(tmp_path, workers=2)
    try:
        failures, done, count = [], threading.Event(), [0]

        def client(k):
            i = 0
            end = time.monotonic() + 120
            while not done.is_set() and i < 5000 and time.monotonic() < end:
                body = b"%d.%d." % (k, i) + os.urandom(40000).hex().encode()
                try:
                    status, out = s.request("POST", f"/up/{k}/{i}", body)
                except OSError as e:
                    failures.append(("error", repr(e)))
                else:
                    if status != 200 or not out.endswith(b" path=/up/%d/%d body=" % (k, i) + body):
                        failures.append((status, out[:100]))
                count[0] += 1
                i += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        # 16 reloads, each at least 0.4 s after the one before and once uploads were answered
        # since (a reload every fixed 0.4 s for 8 s could, on a loaded machine, find no upload
        # under way), and the last one followed by answered uploads too.
        for reload in range(17):
            since, at = count[0], time.monotonic()
            until(lambda: (count[0] >= since + 2 and time.monotonic() >= at + 0.4 or
                           not any(t.is_alive() for t in threads)),
                  f"no upload answered in round {reload} of the reloads", timeout=60)
            assert any(t.is_alive() for t in threads), (reload, count[0], failures[:5])
            if reload < 16:
                s.p.send_signal(signal.SIGHUP)
        done.set()
        for t in threads:
            t.join(60)
        assert count[0] > 20, count
        assert failures == [], (failures[:5], len(failures), count[0], "".join(s.err)[-3000:])
    finally:
        assert s.stop() == 0


# Apps a deploy breaks: one that no longer imports, one that imports but whose worker exits 1
# before its ready line (the module closes stdout: the worker's "ready on" print raises).
BROKEN_APPS = {
    "import fails": "import nosuchmodule_after_the_deploy\n",
    "exits 1 after import": "import sys\nsys.stdout.close()\n" + APP,
}


class Load:
    """Clients that POST unique bodies until stopped; every answer must echo its own request,
    and the pid that answered is kept."""

    def __init__(self, s, clients=2):
        self.s, self.failures, self.pids, self.done = s, [], [], threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(k,)) for k in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self, k):
        i = 0
        while not self.done.is_set() and i < 20000:
            body = b"%d.%d." % (k, i) + os.urandom(8).hex().encode()
            try:
                status, out = self.s.request("POST", f"/r/{k}/{i}", body)
            except OSError as e:
                self.failures.append(("error", repr(e)))
            else:
                if status != 200 or not out.endswith(b" path=/r/%d/%d body=" % (k, i) + body):
                    self.failures.append((status, out[:100]))
                else:
                    self.pids.append(int(out.split()[0][4:]))
            i += 1

    def wait_more(self, n, timeout=30):
        """Waits (up to `timeout` s) until n more requests than now were answered."""
        want = len(self.pids) + n
        deadline = time.monotonic() + timeout
        while len(self.pids) < want:
            assert time.monotonic() < deadline, (len(self.pids), want, self.failures[:5])
            time.sleep(0.02)

    def stop(self):
        self.done.set()
        for t in self.threads:
            t.join(60)


def wait_processes(directory, want, timeout=20):
    """Waits (up to `timeout` s) until the live processes working in `directory` (the workers)
    are the pids `want`; returns them."""
    deadline = time.monotonic() + timeout
    while True:
        now = sorted(processes_in(directory))
        if now == sorted(want) or time.monotonic() >= deadline:
            return now
        time.sleep(0.05)


@pytest.mark.parametrize("case", sorted(BROKEN_APPS))
def test_reload_to_a_broken_app_is_given_up(tmp_path, case):
    """Regression: a SIGHUP after a deploy that broke the app retried the new workers with
    back-off for good beside the old ones. As nginx on a HUP with a bad configuration, once
    every new worker failed before any was ready the reload is given up: one line says so, the
    new workers are gone, the old ones answer every request throughout (unique bodies, no
    502/503, each answered by an old pid), and a SIGHUP after the fix replaces them."""
    s = Serve(tmp_path, workers=2, env={"PYTHONDONTWRITEBYTECODE": "1"})
    load = None
    try:
        old = s.worker_pids(2)
        load = Load(s)
        load.wait_more(20)
        (tmp_path / "cliapp.py").write_text(BROKEN_APPS[case])
        s.p.send_signal(signal.SIGHUP)
        assert s.wait_err("the reload is given up", 30), "".join(s.err)[-3000:]
        line = next(x for x in s.err if "the reload is given up" in x)
        assert "failed to boot: all 2 of its workers ended before their ready line" in line, line
        assert ("exit 2" if case == "import fails" else "exit 1") in line, line
        says = ("cannot load cliapp:app: ModuleNotFoundError" if case == "import fails"
                else "ValueError: I/O operation on closed file")
        assert s.wait_err(says, 5), "".join(s.err)[-3000:]
        assert wait_processes(tmp_path, old) == sorted(old)
        load.wait_more(20)
        load.stop()
        assert load.failures == [], (load.failures[:5], "".join(s.err)[-3000:])
        assert set(load.pids) <= set(old), (set(load.pids) - set(old), old)
        assert s.worker_pids(2) == old
        # Fixed, a SIGHUP tries again and replaces every worker.
        (tmp_path / "cliapp.py").write_text(APP)
        s.p.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        new = old
        while time.monotonic() < deadline:
            new = s.worker_pids(2)
            if len(new) == 2 and not set(new) & set(old):
                break
            time.sleep(0.1)
        assert len(new) == 2 and not set(new) & set(old), (old, new, "".join(s.err)[-3000:])
        status, out = s.request("GET", "/fixed")
        assert status == 200 and b"path=/fixed" in out
        assert left_alive(old) == []
    finally:
        if load is not None:
            load.stop()
        assert s.stop() == 0


def test_two_quick_sighups_to_a_broken_app(tmp_path):
    """Two SIGHUPs back to back after a broken deploy (the second reload supersedes the first,
    or both are read as one): given up, no new worker left, the old ones answer throughout."""
    s = Serve(tmp_path, workers=2, env={"PYTHONDONTWRITEBYTECODE": "1"})
    load = None
    try:
        old = s.worker_pids(2)
        load = Load(s)
        load.wait_more(10)
        (tmp_path / "cliapp.py").write_text(BROKEN_APPS["import fails"])
        s.p.send_signal(signal.SIGHUP)
        s.p.send_signal(signal.SIGHUP)
        assert s.wait_err("the reload is given up", 30), "".join(s.err)[-3000:]
        assert wait_processes(tmp_path, old) == sorted(old), "".join(s.err)[-3000:]
        load.wait_more(20)
        load.stop()
        assert load.failures == [], (load.failures[:5], "".join(s.err)[-3000:])
        assert set(load.pids) <= set(old)
        assert s.worker_pids(2) == old
        # Nothing of the given-up generations is retried: no worker starts after the last line
        # about them (the next requests find the same processes).
        load = Load(s)
        load.wait_more(20)
        load.stop()
        assert load.failures == [] and set(load.pids) <= set(old)
        assert wait_processes(tmp_path, old, timeout=0) == sorted(old)
    finally:
        if load is not None:
            load.stop()
        assert s.stop() == 0


def test_sigterm_during_a_failing_reload(tmp_path):
    """SIGTERM while a reload's new workers hang in the import of a broken app (ignoring
    SIGTERM) stops everything within --graceful-timeout, exit 0 (docs/serve.md's exit status
    table), no process left; the old workers answered until then."""
    s = Serve(tmp_path, "--graceful-timeout", "2", workers=2,
              env={"PYTHONDONTWRITEBYTECODE": "1"})
    load = None
    try:
        old = s.worker_pids(2)
        load = Load(s)
        load.wait_more(10)
        (tmp_path / "cliapp.py").write_text(
            "import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "open('importing.%d' % os.getpid(), 'w').close()\ntime.sleep(60)\n"
            "raise ImportError('never')\n")
        s.p.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("importing.*"))) < 2:
            assert time.monotonic() < deadline, "".join(s.err)[-3000:]
            time.sleep(0.02)
        load.wait_more(10)
        load.stop()
        assert load.failures == [] and set(load.pids) <= set(old), load.failures[:5]
        t0 = time.monotonic()
        s.p.send_signal(signal.SIGTERM)
        rc = s.p.wait(timeout=30)
        took = time.monotonic() - t0
        assert rc == 0, "".join(s.err)[-3000:]
        assert took < 8, (took, "".join(s.err)[-3000:])
        assert wait_processes(tmp_path, [], timeout=5) == []
        assert "given up" not in "".join(s.err)
    finally:
        if load is not None:
            load.stop()
        kill_tree(s.p)
        for pid in processes_in(tmp_path):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_answers_the_request_in_flight_and_leaves_nothing(tmp_path):
    s = Serve(tmp_path, workers=1)
    pids = s.worker_pids(1)
    result = {}

    def slow():
        result["r"] = s.request("GET", "/hold", timeout=60)

    t = threading.Thread(target=slow)
    t.start()
    # SIGTERM once the worker has the request (not after a fixed 0.5 s: on a loaded machine the
    # request could reach the front after the stop), which is let go only once the stop began
    # (its line said; a fixed 0.2 s could let it go before).
    wait_for(tmp_path / "held")
    s.p.send_signal(signal.SIGTERM)
    assert s.wait_err("shmipc-serve: stopping (up to"), "".join(s.err)
    (tmp_path / "release").touch()
    t.join(60)
    assert s.stop() == 0
    assert result["r"][0] == 200, result
    assert b"path=/hold" in result["r"][1]
    for pid in pids:
        assert not alive(pid)
    with pytest.raises(OSError):
        s.request("GET", "/gone", timeout=2)


@pytest.mark.parametrize("group", [False, True])
def test_sigquit_is_a_graceful_stop(tmp_path, group):
    """Regression: SIGQUIT was not handled: its default action (a core dump) ended
    shmipc-serve at once, its request in flight cut, and the workers were left to the
    parent-death signal. As nginx's QUIT it is now a graceful stop, the same as SIGTERM: the
    request in flight is answered, exit 0, no worker left. With `group`, SIGQUIT goes to the
    whole process group, as a terminal's Ctrl-\\ sends it: the workers got it too and died of
    it (the request in flight a 502); they now stop as on SIGTERM, after that request."""
    s = Serve(tmp_path, workers=2, new_session=group)
    pids = []
    try:
        pids = s.worker_pids(2)
        assert children(s.p.pid) == set(pids)
        result = {}

        def slow():
            result["r"] = s.request("GET", "/hold", timeout=60)

        t = threading.Thread(target=slow)
        t.start()
        wait_for(tmp_path / "held")
        if group:
            os.killpg(s.p.pid, signal.SIGQUIT)
        else:
            s.p.send_signal(signal.SIGQUIT)
        # The request is let go once the stop began (its line said), not after a fixed 0.3 s.
        assert s.wait_err("shmipc-serve: stopping (up to"), "".join(s.err)
        (tmp_path / "release").touch()
        t.join(60)
        assert s.p.wait(timeout=30) == 0, "".join(s.err)
        assert result["r"][0] == 200, (result, "".join(s.err))
        assert b"path=/hold" in result["r"][1]
        assert left_alive(pids) == []
    finally:
        kill_tree(s.p)
        left_alive(pids, timeout=0)


@pytest.mark.parametrize("second", [True, False])
def test_stop_keeps_its_deadline_and_a_second_signal_kills(tmp_path, second):
    """A request the worker holds past every deadline (/hold, never let go: the worker
    finishes the request in progress before it exits): one SIGINT ends the stop, workers
    included, within --graceful-timeout (before: the server's close waited it out, and only then
    did the workers get SIGTERM and a whole timeout more: 2 x); a second SIGINT kills them at
    once (before: ignored, nobody read it). The first SIGINT goes once the app holds the
    request, the second once the stop began (its line said): fixed delays could send the
    first before the request reached the worker, and the second before the first was read
    (two pending SIGINTs are one)."""
    s = Serve(tmp_path, "--graceful-timeout", "4", workers=1)
    pids = s.worker_pids(1)
    got = {}

    def slow():
        try:
            got["r"] = s.request("GET", "/hold", timeout=60)
        except OSError as e:  # the connection cut with the worker that held it
            got["e"] = e

    t = threading.Thread(target=slow, daemon=True)
    t.start()
    wait_for(tmp_path / "held")
    t0 = time.monotonic()
    s.p.send_signal(signal.SIGINT)
    if second:
        assert s.wait_err("shmipc-serve: stopping (up to"), "".join(s.err)
        s.p.send_signal(signal.SIGINT)
    try:
        rc = s.p.wait(timeout=30)
    finally:
        if s.p.poll() is None:
            s.p.kill()
    took = time.monotonic() - t0
    assert rc == 0
    assert took < (3 if second else 7), (took, "".join(s.err[-6:]))
    for pid in pids:
        assert not alive(pid)
    t.join(10)  # the client is not left waiting: a 502, or its connection closed
    assert not t.is_alive() and ("e" in got or got["r"][0] == 502), got


def test_app_exception_is_500_and_the_worker_serves_on(tmp_path):
    s = Serve(tmp_path, workers=1)
    try:
        status, _ = s.request("GET", "/raise")
        assert status == 500
        status, out = s.request("GET", "/fine")
        assert status == 200 and b"path=/fine" in out
    finally:
        assert s.stop() == 0
    assert "RuntimeError: the app failed" in "".join(s.err)


def run_cli(*args, timeout=60):
    return subprocess.run([SERVE, *args], env=python_env(), capture_output=True, text=True,
                          timeout=timeout)


def test_help_version_and_bad_flags():
    r = run_cli("--help")
    assert r.returncode == 0 and "usage: shmipc-serve" in r.stdout
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("shmipc-serve ")
    for bad in (["--workers", "0", "a:b"], ["--workers", "-1", "a:b"], ["--nope", "a:b"], []):
        r = run_cli(*bad)
        assert r.returncode == 2, (bad, r.stderr)
        assert "shmipc-serve:" in r.stderr


def test_bad_flag_into_a_closed_stderr():
    """Regression: the bad option's message was written before SIGPIPE was ignored, so with
    stderr a pipe whose reader had gone (`shmipc-serve --bogus 2>&1 | true`) the process died
    of SIGPIPE instead of exiting 2 (usage). SIGPIPE is ignored from main()'s first line."""
    for bad in (["--bogus", "a:b"], ["--workers", "0", "a:b"], []):
        r, w = os.pipe()
        os.close(r)
        try:
            # restore_signals (the default) gives the child SIGPIPE's default action.
            p = subprocess.Popen([SERVE, *bad], env=python_env(), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=w)
        finally:
            os.close(w)
        assert p.wait(timeout=30) == 2, bad


def test_closed_standard_descriptors_are_not_reused(tmp_path):
    """Regression: started with stdin and stdout closed (a service manager's, `<&- >&-`), the
    descriptors made next (the signalfd, an eventfd) took numbers 0 and 1, so the workers'
    forwarded stdout went into one of them. Now each closed one of 0, 1, 2 is /dev/null from
    the start, and the run serves and stops as usual."""
    (tmp_path / "cliapp.py").write_text(APP)
    port = reserved_port()

    def close_0_1():
        os.close(0)
        os.close(1)

    p = subprocess.Popen(
        [SERVE, "cliapp:app", "--chdir", str(tmp_path), "--listen", f"127.0.0.1:{port}",
         "--workers", "1", "--python", "/usr/bin/python3"],
        env=python_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, preexec_fn=close_0_1)
    try:
        deadline = time.monotonic() + 30
        for line in p.stderr:
            if "listening on" in line or time.monotonic() > deadline:
                break
        assert "listening on" in line, line
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        c.request("GET", "/x")
        assert c.getresponse().status == 200
        c.close()
        for fd in (0, 1):
            assert os.readlink(f"/proc/{p.pid}/fd/{fd}") == "/dev/null", fd
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:
        kill_tree(p)
        p.stderr.close()


@pytest.mark.parametrize("into", ["closed", "full"])
def test_print_and_exit_options_report_a_write_error(tmp_path, into):
    """Regression: `--help`, `--version` and `--check` print on stdout and exited 0 whether the
    text was written or not: into a closed stdout (`shmipc-serve --help >&-`) or a full one
    (`>/dev/full`) the caller was told it had the text. As coreutils' close_stdout, they now
    say "write error" on stderr and exit 1."""
    (tmp_path / "cliapp.py").write_text(APP)
    for args in (["--help"], ["--version"],
                 ["--check", "cliapp:app", "--chdir", str(tmp_path), "--python",
                  "/usr/bin/python3"]):
        ok = subprocess.run([SERVE, *args], env=python_env(), capture_output=True, text=True,
                            timeout=60)
        assert ok.returncode == 0 and ok.stdout, (args, ok.stderr)  # the text there is
        if into == "full":
            with open("/dev/full", "w") as full:
                r = subprocess.run([SERVE, *args], env=python_env(), stdout=full,
                                   stderr=subprocess.PIPE, text=True, timeout=60)
        else:
            r = subprocess.run([SERVE, *args], env=python_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, timeout=60,
                               preexec_fn=lambda: os.close(1))
        assert r.returncode == 1, (args, r.returncode, r.stderr)
        assert "shmipc-serve: write error" in r.stderr, (args, r.stderr)


def left_alive(pids, timeout=10):
    """The pids of `pids` still alive after waiting up to `timeout` s for all to end; each is
    killed (SIGKILL) on the way out, so a failed check leaves no process behind."""
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it ended meanwhile
    return left


def processes_in(directory):
    """The live processes whose working directory is `directory` (the workers run there)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.readlink(f"/proc/{pid}/cwd") == str(directory) and alive(int(pid)):
                    out.append(int(pid))
            except OSError:
                pass
    return out


@pytest.mark.parametrize("case", ["missing module", "syntax error", "missing callable"])
def test_app_that_cannot_load_at_the_start_exits_3(tmp_path, case):
    """Regression: an app that cannot be imported at the start had its workers restarted with
    back-off for good, shmipc-serve running and serving nothing. As gunicorn ("Worker failed
    to boot"), a worker that fails before any worker of the run was ever ready now ends the
    run: the others are stopped, the worker's error is on stderr, exit status 3, within 10 s,
    no process left."""
    (tmp_path / "cliapp.py").write_text(APP)
    (tmp_path / "broken.py").write_text("def app(environ, start_response)\n    return []\n")
    app = {"missing module": "nosuchmodule:app", "syntax error": "broken:app",
           "missing callable": "cliapp:nope"}[case]
    says = {"missing module": "No module named 'nosuchmodule'", "syntax error": "SyntaxError",
            "missing callable": "AttributeError"}[case]
    p = subprocess.Popen(
        [SERVE, app, "--chdir", str(tmp_path), "--listen", "127.0.0.1:0", "--workers", "3",
         "--python", "/usr/bin/python3", "--graceful-timeout", "10"],
        env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=10)
        assert p.returncode == 3, err
        assert f"cannot load {app}" in err and says in err, err
        assert "failed to boot" in err and "listening on" not in err, err
        deadline = time.monotonic() + 5
        while processes_in(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_in(tmp_path) == []
    finally:
        kill_tree(p)
        for pid in processes_in(tmp_path):
            os.kill(pid, signal.SIGKILL)


def wchan(pid):
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGTERM", "SIGINT"])
def test_signals_right_after_the_start_are_handled(tmp_path, sig):
    """Regression: the stop and reload signals were blocked (for the signalfd) only once the
    options were parsed, the access log opened and the workers' command built, some 20 ms
    after the start: a SIGHUP (a service manager's reload), SIGTERM or SIGINT sent then killed
    shmipc-serve with the default action. Now they are blocked from main()'s first line.

    To land in that window every time (a signal sent right after the spawn may also land in
    the dynamic loader, before main(), where no program can handle it), the access log is a
    FIFO: shmipc-serve waits for its reader in main() (in its open() before; now in a wait
    that a SIGTERM or SIGINT ends, as the open() could not once the signals were blocked). 30 starts, the signal sent
    while it waits there or just after the reader came: it never dies by a signal; SIGTERM and
    SIGINT stop it (exit 0, the graceful stop's); a SIGHUP is a reload once it runs."""
    (tmp_path / "cliapp.py").write_text(APP)
    fifo = str(tmp_path / "access.fifo")
    os.mkfifo(fifo)
    signo = getattr(signal, sig)
    starts = 30 if sig != "SIGHUP" else 8  # a SIGHUP start waits for two generations
    for i in range(starts):
        p = subprocess.Popen(
            [SERVE, "cliapp:app", "--chdir", str(tmp_path), "--listen",
             f"127.0.0.1:{reserved_port()}", "--workers", "1", "--python", "/usr/bin/python3",
             "--graceful-timeout", "10", "--access-log", fifo],
            env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=sigint_default)
        err = []
        t = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
        t.start()
        reader = None
        try:
            deadline = time.monotonic() + 20
            # In the FIFO's open() (wait_for_partner), or, now, in the wait for its reader that
            # a stop signal ends (do_sigtimedwait): either way in main(), its start under way.
            while (wchan(p.pid).split(".")[0] not in ("wait_for_partner", "do_sigtimedwait")
                   and p.poll() is None):
                if time.monotonic() > deadline:
                    pytest.skip(f"/proc/PID/wchan does not show the FIFO's open ({wchan(p.pid)})")
                time.sleep(0.001)
            if i % 2 == 0:
                p.send_signal(signo)  # in main(), waiting for the FIFO's reader
                reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            else:
                reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
                time.sleep((i % 10) * 0.002)  # somewhere in the rest of the start
                p.send_signal(signo)
            if signo != signal.SIGHUP:
                rc = p.wait(timeout=30)
                t.join(10)
                assert rc == 0, (i, rc, "".join(err))
                continue
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and p.poll() is None and not (
                    any("reload: generation" in line and "ready" in line for line in list(err))
                    and any("listening on" in line for line in list(err))):
                time.sleep(0.05)
            text = "".join(err)
            assert p.poll() is None, (i, p.returncode, text)
            assert "SIGHUP: reloading the workers" in text, (i, text)
            assert "listening on" in text, (i, text)
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 0, (i, "".join(err))
        finally:
            kill_tree(p)
            if reader is not None:
                os.close(reader)
            t.join(5)


def test_check(tmp_path):
    (tmp_path / "cliapp.py").write_text(APP)
    r = run_cli("--check", "--chdir", str(tmp_path), "--python", "/usr/bin/python3", "cliapp:app")
    assert r.returncode == 0, r.stderr
    r = run_cli("--check", "--chdir", str(tmp_path), "--python", "/usr/bin/python3", "nomod:app")
    assert r.returncode == 2 and "nomod" in r.stderr


def wait_lines(path, n, timeout=10):
    """The file's lines once it has n (the front writes them within 100 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if text.count("\n") >= n or time.monotonic() > deadline:
            assert text.count("\n") == n, text
            return text.splitlines()


def test_access_log_file(tmp_path):
    import json
    log = tmp_path / "access.log"
    s = Serve(tmp_path, "--access-log", str(log), "--access-log-format", "json", workers=2)
    try:
        assert s.request("GET", "/a?x=1")[0] == 200
        assert s.request("POST", "/raise", b"body")[0] == 500
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=20)
        c.request("GET", "/ua", headers={"User-Agent": 'evil"\\ agent', "Referer": "http://r/"})
        assert c.getresponse().read().startswith(b"pid=")
        c.close()
        lines = [json.loads(l) for l in wait_lines(log, 3)]
        assert [(l["method"], l["target"], l["status"]) for l in lines] == [
            ("GET", "/a?x=1", 200), ("POST", "/raise", 500), ("GET", "/ua", 200)]
        assert all(l["remote"] == "127.0.0.1" and l["protocol"] == "HTTP/1.1" and
                   l["worker"].startswith("unix:") for l in lines), lines
        assert lines[0]["bytes"] == len(s.request("GET", "/a?x=1")[1])
        assert lines[2]["user_agent"] == 'evil"\\ agent' and lines[2]["referer"] == "http://r/"
        wait_lines(log, 4)
        # logrotate: the file moves, SIGUSR2 opens a new one at the path
        log.rename(tmp_path / "access.log.1")
        s.p.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert s.request("GET", "/after")[0] == 200
        assert json.loads(wait_lines(log, 1)[0])["target"] == "/after"
        assert len(wait_lines(tmp_path / "access.log.1", 4)) == 4
        # the status output counts the lines and the write errors
        before = len(s.err)
        s.p.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while "access log:" not in "".join(s.err[before:]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert re.search(r"access log: 5 lines written, 0 write errors", "".join(s.err[before:]))
    finally:
        assert s.stop() == 0
    # the stop wrote nothing more, and no line is torn
    assert len(wait_lines(log, 1)) == 1


def test_reopen_onto_a_fifo_nobody_reads(tmp_path):
    """Regression: SIGUSR2 reopens the access log on the main thread, the one that reads the
    signals; when the path had become a FIFO nobody reads, its open() waited for a reader, and
    a SIGTERM was never read: shmipc-serve did not stop. The open does not wait now: the old
    file stays (said on stderr), and the stop is as always (exit 0)."""
    log = tmp_path / "access.log"
    s = Serve(tmp_path, "--access-log", str(log), workers=1)
    try:
        assert s.request("GET", "/a")[0] == 200
        os.rename(log, tmp_path / "access.log.1")
        os.mkfifo(log)
        s.p.send_signal(signal.SIGUSR2)
        assert s.wait_err("the old file stays"), "".join(s.err)
        assert s.request("GET", "/b")[0] == 200
    finally:
        if s.p.poll() is None:
            s.p.send_signal(signal.SIGTERM)
        try:
            rc = s.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
            with open(log, "rb", 0):  # a reader: the open() ends, and so can the process
                pass
            s.p.kill()
            s.p.wait()
        s.t.join(5)
    assert rc == 0, "".join(s.err)
    assert wait_lines(tmp_path / "access.log.1", 2)


def test_stop_while_the_access_log_fifo_has_no_reader(tmp_path):
    """--access-log naming a FIFO nobody reads: shmipc-serve waited in its open() for a reader.
    A SIGTERM then killed it (the default action); with the signals blocked from main()'s start
    it would not even do that. Now it waits for the reader in a wait that SIGTERM ends: exit 0
    (the graceful stop's), no worker started."""
    (tmp_path / "cliapp.py").write_text(APP)
    fifo = tmp_path / "access.fifo"
    os.mkfifo(fifo)
    p = subprocess.Popen(
        [SERVE, "cliapp:app", "--chdir", str(tmp_path), "--listen", f"127.0.0.1:{reserved_port()}",
         "--python", "/usr/bin/python3", "--access-log", str(fifo)],
        env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = []
    t = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
    t.start()
    try:
        # In the wait (its line said so): it lasts until a reader or a stop signal.
        until(lambda: any("is a FIFO: waiting for its reader" in line for line in list(err)) or
              p.poll() is not None, "no wait for the FIFO's reader")
        assert p.poll() is None, "".join(err)
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        t.join(5)
        assert rc == 0, (rc, "".join(err))
        assert "starting" not in "".join(err)
    finally:
        if p.poll() is None:
            with open(fifo, "rb", 0):  # a reader: the open() ends, and so can the process
                pass
            p.kill()
            p.wait()


def test_access_log_common_to_stdout(tmp_path):
    (tmp_path / "cliapp.py").write_text(APP)
    port = reserved_port()
    p = subprocess.Popen(
        [SERVE, "cliapp:app", "--chdir", str(tmp_path), "--listen", f"127.0.0.1:{port}",
         "--python", "/usr/bin/python3", "--access-log", "-"],
        env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
                c.request("GET", "/x")
                assert c.getresponse().status == 200
                c.close()
                break
            except (ConnectionRefusedError, http.client.RemoteDisconnected):
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
    assert p.returncode == 0
    # stdout also carries what the workers print (their "ready" lines), whole lines each
    logged = [l for l in out.splitlines() if not l.startswith("shmipc-serve worker ")]
    assert len(logged) == 1, out
    assert re.fullmatch(r'127\.0\.0\.1 - - \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d \+0000\] '
                        r'"GET /x HTTP/1\.1" 200 \d+', logged[0]), out


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, address, timeout=20):
        super().__init__("localhost", timeout=timeout)
        self.address = address

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.address)


def test_listen_on_a_unix_socket(tmp_path):
    import json
    (tmp_path / "cliapp.py").write_text(APP)
    sock = tmp_path / "serve.sock"
    log = tmp_path / "access.log"
    stale = socket.socket(socket.AF_UNIX)  # a socket file left by a server that died
    stale.bind(str(sock))
    stale.close()
    p = subprocess.Popen(
        [SERVE, "cliapp:app", "--chdir", str(tmp_path), "--listen", f"unix:{sock}",
         "--workers", "2", "--threads", "2", "--python", "/usr/bin/python3",
         "--access-log", str(log), "--access-log-format", "json"],
        env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        err = ""
        while "listening on" not in err:
            line = p.stderr.readline()
            assert line, err
            err += line
        threading.Thread(target=p.stderr.read, daemon=True).start()
        assert f"listening on unix:{sock}" in err
        assert stat.S_ISSOCK(os.lstat(sock).st_mode)
        for i in range(10):
            c = UnixHTTPConnection(str(sock))
            c.request("POST", f"/u/{i}", body=b"x%d" % i)
            r = c.getresponse()
            assert r.status == 200 and r.read().endswith(b"path=/u/%d body=x%d" % (i, i))
            c.close()
        lines = [json.loads(l) for l in wait_lines(log, 10)]
        assert {l["remote"] for l in lines} == {"unix:"}
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    assert not os.path.lexists(sock)  # removed at the stop


def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sk:
            sk.bind(("::1", 0))
        return True
    except OSError:
        return False


def tcp_listeners(port, v6):
    """How many sockets listen on `port` (/proc/net/tcp or tcp6, state 0A)."""
    n = 0
    with open("/proc/net/tcp6" if v6 else "/proc/net/tcp") as f:
        for row in f.read().splitlines()[1:]:
            cols = row.split()
            if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":
                n += 1
    return n


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]"])
def test_listen_on_port_0(tmp_path, host):
    """Regression: `--listen 127.0.0.1:0` was refused ("the port must be 1 .. 65535"). Port 0
    lets the kernel pick one: the front's first reactor thread binds it, the others share that
    port (not a port each), and the "listening on" line names the real port for a script to
    read (it said `:0`). 3 reactor threads: 3 listening sockets on the one port, and 30
    connections to it, each its own, all answered."""
    if host == "[::1]" and not ipv6_loopback():
        pytest.skip("no IPv6 loopback")
    s = Serve(tmp_path, "--threads", "3", workers=2, listen=f"{host}:0")
    try:
        line = next(line for line in s.err if "listening on" in line)
        assert s.port not in (None, 0), line
        assert f"listening on {host}:{s.port}," in line, line
        assert tcp_listeners(s.port, host.startswith("[")) == 3
        for i in range(30):
            status, out = s.request("GET", f"/p0/{i}")
            assert status == 200 and b"path=/p0/%d " % i in out, (status, out)
    finally:
        assert s.stop() == 0


def test_listen_on_a_path_that_is_not_a_socket_is_refused(tmp_path):
    (tmp_path / "cliapp.py").write_text(APP)
    common = ["cliapp:app", "--chdir", str(tmp_path), "--python", "/usr/bin/python3"]
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    link = tmp_path / "link.sock"
    link.symlink_to(victim)
    for path in (victim, link):
        r = run_cli(*common, "--listen", f"unix:{path}", timeout=30)
        assert r.returncode != 0 and "not a socket" in r.stderr, r.stderr
    assert victim.read_text() == "keep me" and link.is_symlink()
    r = run_cli(*common, "--listen", "unix:/" + "p" * 107, timeout=30)
    assert r.returncode == 2 and "107" in r.stderr, r.stderr


ASGI_APP = """
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 201,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"asgi " + scope["path"].encode() + b" " + body})
"""


def test_asgi_app(tmp_path):
    (tmp_path / "asgiapp.py").write_text(ASGI_APP)
    port = reserved_port()
    p = subprocess.Popen([SERVE, "--asgi", "asgiapp:app", "--chdir", str(tmp_path), "--listen",
                          f"127.0.0.1:{port}", "--python", "/usr/bin/python3"],
                         env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    try:
        for line in p.stderr:
            if "listening on" in line:
                break
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        c.request("POST", "/x", body=b"hello")
        r = c.getresponse()
        assert (r.status, r.read()) == (201, b"asgi /x hello")
        c.close()
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0


GATED_ASGI_APP = """
import asyncio
gates = {}
async def app(scope, receive, send):
    if scope["type"] != "http":
        raise RuntimeError("no lifespan")
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    path = scope["path"]
    if path.startswith("/wait/") or path.startswith("/open/"):
        gate = gates.setdefault(path[6:], asyncio.Event())
        if path.startswith("/open/"):
            gate.set()
        else:
            open("waiting." + path[6:], "w").close()  # the test sends /open/ once it is here
            await gate.wait()
        out = path.encode()
    else:
        await asyncio.sleep(0.001 * (len(body) % 3))
        out = path.encode() + b" " + body
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": out})
"""


def test_asgi_worker_runs_requests_at_once(tmp_path):
    # One ASGI worker, its default concurrency: a request that waits for the one after it is
    # answered (one at a time, both would wait for the deadline), over both front threads;
    # then 48 clients at once with unique bodies each get their own answer.
    (tmp_path / "gated.py").write_text(GATED_ASGI_APP)
    s = Serve(tmp_path, "--asgi", "--threads", "2", "--timeout", "20", workers=1,
              app=("gated:app",))
    try:
        for k in range(4):
            out = []
            t = threading.Thread(target=lambda: out.append(s.request("GET", f"/wait/{k}")))
            t.start()
            # /open/ once /wait/ waits in the app (a fixed 0.05 s could send it first, and the
            # case then showed nothing: /wait/ found its gate open).
            wait_for(tmp_path / f"waiting.{k}")
            assert s.request("GET", f"/open/{k}") == (200, f"/open/{k}".encode())
            t.join(20)
            assert out == [(200, f"/wait/{k}".encode())]
        got = {}

        def client(i):
            body = f"client {i} ".encode() * (i + 1)
            got[i] = (s.request("POST", f"/c{i}", body=body), body)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(48)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(got) == 48
        for i, ((status, answer), body) in got.items():
            assert (status, answer) == (200, f"/c{i} ".encode() + body)
    finally:
        s.p.send_signal(signal.SIGTERM)
        assert s.p.wait(30) == 0, "".join(s.err)
    # One at a time, the request that waits for the next one holds the worker: both 504.
    s = Serve(tmp_path, "--asgi", "--concurrency", "1", "--timeout", "1", workers=1,
              app=("gated:app",))
    try:
        out = []
        t = threading.Thread(target=lambda: out.append(s.request("GET", "/wait/z")[0]))
        t.start()
        wait_for(tmp_path / "waiting.z")  # else /open/z could come first: a 200, not a 504
        assert s.request("GET", "/open/z")[0] == 504
        t.join(20)
        assert out == [504]
    finally:
        s.p.send_signal(signal.SIGTERM)
        assert s.p.wait(30) == 0, "".join(s.err)


HOLD_APP = '''
import os
import time

def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/hold":
        # Says it has the request, then holds it until the test lets go (30 s at most).
        open("held", "w").close()
        for _ in range(3000):
            if os.path.exists("release"):
                break
            time.sleep(0.01)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [path.encode()]
'''


@pytest.mark.parametrize("queue", ["0", "1"])
def test_queue_bounds_the_requests_that_wait(tmp_path, queue):
    """--queue N: N requests wait for a busy worker, the next one gets 503 with Retry-After
    while the worker still holds its request. --queue 0 let none wait, as its row in
    docs/serve.md says: before, the front took 0 for its default and 1024 waited."""
    (tmp_path / "holdapp.py").write_text(HOLD_APP)
    s = Serve(tmp_path, "--queue", queue, workers=1, app=("holdapp:app",))
    held = []
    waiting = []
    t = threading.Thread(target=lambda: held.append(s.request("GET", "/hold")))
    t.start()
    w = None
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "held").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (tmp_path / "held").exists(), "".join(s.err)
        if queue == "1":
            w = threading.Thread(target=lambda: waiting.append(s.request("GET", "/waits")))
            w.start()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # until the front counts it as queued
                before = len(s.err)
                s.p.send_signal(signal.SIGUSR1)
                time.sleep(0.2)
                if any(" 1 queued" in line for line in s.err[before:]):
                    break
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=20)
        c.request("GET", "/refused")
        r = c.getresponse()
        assert (r.status, r.getheader("Retry-After")) == (503, "1"), (r.status, r.read())
        r.read()
        c.close()
        assert not (tmp_path / "release").exists() and held == []  # still held meanwhile
    finally:
        (tmp_path / "release").write_text("")
        t.join(30)
        if w is not None:
            w.join(30)
        assert s.stop() == 0, "".join(s.err)
    assert held == [(200, b"/hold")]
    assert waiting == ([(200, b"/waits")] if queue == "1" else [])


def test_concurrency_is_for_asgi_and_bounded(tmp_path):
    for bad, says in ((["cliapp:app", "--concurrency", "4"], "--concurrency is for --asgi"),
                      (["--asgi", "cliapp:app", "--concurrency", "0"], "out of range"),
                      (["--asgi", "cliapp:app", "--concurrency", "257"], "out of range")):
        r = run_cli(*bad)
        assert r.returncode == 2 and says in r.stderr, (bad, r.stderr)


def test_workers_end_when_the_supervisor_is_killed(tmp_path):
    # SIGKILL gives shmipc-serve no chance to stop its workers: each worker asked the kernel
    # for a SIGTERM when its parent dies (--parent-pid, PR_SET_PDEATHSIG) and ends on it.
    s = Serve(tmp_path, workers=2)
    pids = s.worker_pids(2)
    assert len(pids) == 2
    s.p.kill()
    s.p.wait(10)
    assert left_alive(pids, timeout=15) == []


def spin_env(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    return env.get(b"SHMIPC_SPIN_US")


@pytest.mark.parametrize("cpus,user,want", [
    ({0}, None, b"0"),     # one CPU: the front and its workers never spin
    ({0}, "20", b"20"),    # unless the user said otherwise
    (None, None, None),    # more CPUs: the library's default, untouched
])
def test_one_cpu_means_no_spin(tmp_path, cpus, user, want):
    if cpus is None and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this machine has one CPU")
    if python_env().get("SHMIPC_SPIN_US") is not None:
        pytest.skip("SHMIPC_SPIN_US is set around the tests")
    s = Serve(tmp_path, workers=1, cpus=cpus, env=None if user is None else {"SHMIPC_SPIN_US": user})
    try:
        # The workers' environment as they were started (the supervisor's own setenv does not
        # show in its /proc/PID/environ, which is its environment at exec).
        pids = s.worker_pids(1)
        assert [spin_env(pid) for pid in pids] == [want]
        assert s.request("GET", "/")[0] == 200
    finally:
        s.stop()


def test_worker_whose_parent_is_not_the_one_named_serves_nothing(tmp_path):
    (tmp_path / "cliapp.py").write_text(APP)
    import sys
    r = subprocess.run([sys.executable, "-m", "shmipc.serve.worker", "cliapp:app", "--address",
                        "unix:@shmipc-test-ppid-%d" % os.getpid(), "--parent-pid", "1"],
                       cwd=tmp_path, env=python_env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


# ---- C and Lua handlers (shmipc-serve-worker, examples/c/serve_hello.c, examples/lua/serve_hello.lua)

C_DIR = os.path.join(BUILD, "examples", "c")
LUA_DIR = os.path.join(ROOT, "examples", "lua")
NATIVE = {"c": (("--c", "libserve_hello.so"), C_DIR), "lua": (("--lua", "serve_hello"), LUA_DIR)}


def native_built(kind):
    worker = os.path.join(BUILD, "serve", "shmipc-serve-worker")
    if not os.path.exists(worker):
        return False
    app, chdir = NATIVE[kind]
    return subprocess.run([worker, *app, "--check"], cwd=chdir, capture_output=True).returncode == 0


@pytest.mark.parametrize("kind", ["c", "lua"])
def test_native_unique_bodies_and_a_killed_worker(tmp_path, kind):
    if not native_built(kind):
        pytest.skip(f"no {kind} worker in this build")
    app, chdir = NATIVE[kind]
    s = Serve(tmp_path, workers=2, app=app, chdir=chdir)
    try:
        assert s.request("GET", "/") == (200, b"Hello, world!\n")
        errors = []

        def client(k):
            for i in range(25):
                body = f"client {k} request {i} {os.urandom(8).hex()}".encode() * (1 + i % 5)
                status, out = s.request("POST", f"/u/{k}/{i}", body)
                if status != 200 or out != body:
                    errors.append((status, out[:120]))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []  # 200 unique bodies, zero mismatches
        assert s.request("GET", "/fail") == (500, b"Internal Server Error\n")
        # A handler that kills its worker: 502 for that request only, then a restart.
        pids = s.worker_pids(2)
        others = []
        t = threading.Thread(target=lambda: others.extend(
            s.request("GET", "/slow?300") for _ in range(5)))
        t.start()
        assert s.request("GET", "/crash")[0] == 502
        t.join(60)
        assert [st for st, _ in others] == [200] * 5, others
        deadline = time.monotonic() + 20
        now = []
        while time.monotonic() < deadline:
            now = s.worker_pids(2)
            if len(now) == 2 and now != pids:
                break
            time.sleep(0.1)
        assert len(now) == 2 and now != pids, (pids, now)
        for i in range(10):
            assert s.request("GET", "/")[0] == 200
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("kind", ["c", "lua"])
def test_native_worker_stops_gracefully_on_a_group_sigquit(tmp_path, kind):
    """Regression: shmipc-serve-worker did not handle SIGQUIT, so a terminal's Ctrl-\\ (SIGQUIT
    to the whole process group, shmipc-serve's graceful stop) killed a C (or Lua: the same
    program) worker with a core dump and its request in flight got a 502. It now stops as on
    SIGTERM, after that request. (The Lua example's /slow ran `sleep` through os.execute, which
    ignored SIGQUIT while it waited; test_serve_native_worker.py
    test_stop_signal_during_slow_finishes_it_and_exits.)"""
    if not native_built(kind):
        pytest.skip(f"no {kind} worker in this build")
    app, chdir = NATIVE[kind]
    s = Serve(tmp_path, workers=1, app=app, chdir=chdir, new_session=True)
    pids = []
    try:
        pids = s.worker_pids(1)
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("r", s.request("GET", "/slow?2500",
                                                                          timeout=60)))
        t.start()
        # The worker has it once the front's status says so (SIGUSR1), not after a fixed delay.
        deadline = time.monotonic() + 20
        while True:
            before = len(s.err)
            s.p.send_signal(signal.SIGUSR1)
            time.sleep(0.1)
            if any(" 1 in flight" in line for line in s.err[before:]):
                break
            assert time.monotonic() < deadline, "".join(s.err)
        os.killpg(s.p.pid, signal.SIGQUIT)
        t.join(60)
        assert s.p.wait(timeout=30) == 0, "".join(s.err)
        assert got["r"][0] == 200, (got, "".join(s.err))
        assert left_alive(pids) == []
    finally:
        kill_tree(s.p)
        left_alive(pids, timeout=0)


def serves_its_request_through_a_group_signal(s, sig, path):
    """A request to `path` (taking the worker 2.5 s) in flight while shmipc-serve's whole
    process group gets `sig` (SIGHUP, SIGUSR1 or SIGUSR2): the request is answered, no worker
    died of it; a SIGHUP's reload replaced the worker once it was done, the others left it in
    place. Returns the status of the answer."""
    pids = []
    try:
        pids = s.worker_pids(1)
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("r", s.request("GET", path,
                                                                          timeout=60)))
        t.start()
        deadline = time.monotonic() + 20
        while True:  # the worker has it once the front's status says so
            before = len(s.err)
            s.p.send_signal(signal.SIGUSR1)
            time.sleep(0.1)
            if any(" 1 in flight" in line for line in s.err[before:]):
                break
            assert time.monotonic() < deadline, "".join(s.err)
        os.killpg(s.p.pid, getattr(signal, sig))
        t.join(60)
        assert got["r"][0] in (200, 201), (got, "".join(s.err))
        assert "died (signal" not in "".join(s.err)
        if sig == "SIGHUP":
            deadline = time.monotonic() + 20
            while s.worker_pids(1) == pids:  # the reload replaced the worker
                assert time.monotonic() < deadline, "".join(s.err)
                time.sleep(0.1)
            assert left_alive(pids) == []
        else:
            assert s.worker_pids(1) == pids
        assert s.request("GET", "/")[0] in (200, 201)
    finally:
        assert s.stop() == 0
        left_alive(pids, timeout=0)


@pytest.mark.parametrize("kind,sig", [("c", "SIGHUP"), ("lua", "SIGHUP"), ("c", "SIGUSR1"),
                                      ("c", "SIGUSR2")])
def test_native_worker_serves_its_request_through_group_hup_usr1_usr2(tmp_path, kind, sig):
    """Regression: the supervisor's own signals sent to the whole process group (a terminal's
    hangup, `kill -HUP -PGID`, a pkill whose pattern also matches "shmipc-serve-worker") reach
    the workers too, and shmipc-serve-worker left them to their default action: the C or Lua
    worker died of it and its request in flight got a 502, though a SIGHUP to shmipc-serve is
    a reload "without failing a request" and SIGUSR1 and SIGUSR2 only ask for its status and
    a new access log. The worker now takes no action on them: a reload stops it with SIGTERM
    once the next generation is ready, after that request."""
    if not native_built(kind):
        pytest.skip(f"no {kind} worker in this build")
    app, chdir = NATIVE[kind]
    s = Serve(tmp_path, workers=1, app=app, chdir=chdir, new_session=True)
    serves_its_request_through_a_group_signal(s, sig, "/slow?2500")


SLOW_ASGI_APP = ASGI_APP.replace(
    "    body = b\"\"\n",
    "    if scope[\"path\"] == \"/slow\":\n"
    "        import asyncio\n"
    "        await asyncio.sleep(float(scope[\"query_string\"] or b\"1\"))\n"
    "    body = b\"\"\n", 1)


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("sig", ["SIGHUP", "SIGUSR1", "SIGUSR2"])
def test_python_worker_serves_its_request_through_group_hup_usr1_usr2(tmp_path, kind, sig):
    """Regression: as test_native_worker_serves_its_request_through_group_hup_usr1_usr2 for the
    Python workers (`python -m shmipc.serve.worker`, WSGI and --asgi), which handled only
    SIGTERM, SIGINT and SIGQUIT: a SIGHUP, SIGUSR1 or SIGUSR2 sent to the whole group killed
    the worker ("died (signal 1)") and its request in flight got a 502. They now catch each
    with a handler that does nothing: caught, not ignored (SigIgn would pass to the programs
    the app runs)."""
    assert SLOW_ASGI_APP != ASGI_APP
    (tmp_path / "asgiapp.py").write_text(SLOW_ASGI_APP)
    app = ("cliapp:app",) if kind == "wsgi" else ("--asgi", "asgiapp:app")
    s = Serve(tmp_path, workers=1, app=app, new_session=True)
    try:
        pid = s.worker_pids(1)[0]
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":\t", 1) for line in f if ":\t" in line)
        mask = sum(1 << (int(getattr(signal, n)) - 1) for n in ("SIGHUP", "SIGUSR1", "SIGUSR2"))
        assert int(status["SigCgt"], 16) & mask == mask, status["SigCgt"]
        assert int(status["SigIgn"], 16) & mask == 0, status["SigIgn"]
    except BaseException:
        s.stop()
        raise
    serves_its_request_through_a_group_signal(s, sig, "/slow?2.5")


SIGNALS_APP = """
import signal
import subprocess

# The app's own handler for SIGUSR2, installed as it loads: the worker must keep it.
signal.signal(signal.SIGUSR2, lambda signum, frame: open("usr2", "a").write("x"))


def child_sigign():
    # What a program the app runs inherits: its SigIgn mask.
    out = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.startswith("SigIgn:")][0].encode()


def app(environ, start_response):
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [child_sigign() + b" " + str(len(body)).encode()]


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    n = 0
    while True:
        m = await receive()
        n += len(m.get("body", b""))
        if not m.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": child_sigign() + b" " + str(n).encode()})
"""


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_python_worker_reads_a_body_through_hup_usr1_usr2_and_keeps_the_apps_handler(
        tmp_path, kind):
    """The Python workers' handlers for SIGHUP, SIGUSR1 and SIGUSR2 (which do nothing) are
    Python handlers: each signal interrupts the worker's waits (EINTR) and runs on the main
    thread. A request whose body trickles in while the worker gets a stream of them is read
    whole and answered; the app's own SIGUSR2 handler, installed as it loaded, is kept (it
    ran); a program the app runs ignores none of them (SigIgn), as the worker catches rather
    than ignores them."""
    (tmp_path / "sigapp.py").write_text(SIGNALS_APP)
    app = ("sigapp:app",) if kind == "wsgi" else ("--asgi", "sigapp:asgi")
    s = Serve(tmp_path, workers=1, app=app)
    pids = []
    try:
        pids = s.worker_pids(1)
        c = socket.create_connection((s.host, s.port), timeout=30)
        c.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 40000\r\n"
                  b"Connection: close\r\n\r\n")
        for i in range(40):  # about 2 s of body, a signal or three between its pieces
            c.sendall(b"b" * 1000)
            for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)[:1 + i % 3]:
                os.kill(pids[0], sig)
            time.sleep(0.05)
        answer = b""
        while True:
            got = c.recv(65536)
            if not got:
                break
            answer += got
        c.close()
        assert answer.startswith(b"HTTP/1.1 200"), (answer, "".join(s.err))
        sigign = int(answer.rsplit(b"\r\n\r\n", 1)[1].split()[1], 16)
        for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            assert not sigign & (1 << (int(sig) - 1)), (answer, sig)
        assert answer.endswith(b" 40000"), answer
        assert (tmp_path / "usr2").read_text().startswith("x")
        assert s.worker_pids(1) == pids
        assert "died (signal" not in "".join(s.err)
    finally:
        assert s.stop() == 0
        left_alive(pids, timeout=0)


@pytest.mark.parametrize("kind", ["c", "lua"])
def test_native_check(tmp_path, kind):
    if not native_built(kind):
        pytest.skip(f"no {kind} worker in this build")
    app, chdir = NATIVE[kind]
    r = run_cli("--check", "--chdir", chdir, *app)
    assert r.returncode == 0, r.stderr
    bad = ("--c", "libserve_hello.so:nosuch") if kind == "c" else ("--lua", "nosuchmodule")
    r = run_cli("--check", "--chdir", chdir, *bad)
    assert r.returncode == 2 and "cannot be loaded by shmipc-serve-worker" in r.stderr, r.stderr
    assert ("no function nosuch" if kind == "c" else "nosuchmodule") in r.stderr


# Run as nobody with no shmipc at all (the package under test may sit where nobody cannot read
# it, as the pip route's private venv does): a plain connect, then whether the worker hung up
# at once. A worker that accepts the uid waits for the handshake instead.
NOBODY_CONNECT = """
import socket
import sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect("\\0" + sys.argv[1][len("unix:@"):])
try:
    print("closed" if s.recv(1) == b"" else "data")
except ConnectionResetError:
    print("closed")
except socket.timeout:
    print("open")
"""


def worker_addresses(supervisor_pid):
    """The abstract names the workers listen on, as /proc/net/unix shows them to any local
    user (the last field of a listening socket's line)."""
    with open("/proc/net/unix") as f:
        return sorted({"unix:" + line.split()[-1] for line in f
                       if f"@shmipc-serve-{supervisor_pid}-" in line})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a second uid (root runs it as nobody)")
@pytest.mark.parametrize("kind", ["wsgi", "asgi", "c", "lua"])
def test_workers_refuse_a_client_of_another_uid(tmp_path, kind):
    # A worker listens on an abstract name, which every local process can find in
    # /proc/net/unix and connect to: without the allow-list of its own uid, another user could
    # send it requests directly (a forged peer address, a host the front would refuse, no
    # limits) and hold its places. Run as nobody, the connect is refused; the front is served.
    if kind in ("c", "lua"):
        if not native_built(kind):
            pytest.skip(f"no {kind} worker in this build")
        app, chdir = NATIVE[kind]
    else:
        (tmp_path / "asgiapp.py").write_text(ASGI_APP)
        app, chdir = (("cliapp:app",) if kind == "wsgi" else ("--asgi", "asgiapp:app")), None
    s = Serve(tmp_path, workers=1, app=app, chdir=chdir)
    try:
        assert s.request("GET", "/")[0] in (200, 201)
        addrs = worker_addresses(s.p.pid)
        assert addrs, "no worker socket in /proc/net/unix"
        for addr in addrs:
            try:
                r = subprocess.run(["/usr/bin/python3", "-c", NOBODY_CONNECT, addr], user=65534,
                                   group=65534, env=python_env(), capture_output=True,
                                   text=True, timeout=60)
            except PermissionError:
                pytest.skip("no second uid here (a user namespace mapping only root)")
            assert r.returncode == 0 and r.stdout.strip() == "closed", (r.stdout, r.stderr)
        # Refused for its uid (the worker says so), not for anything else.
        assert s.wait_err("is uid 65534, which is not"), "".join(s.err)
        assert s.request("GET", "/")[0] in (200, 201)
    finally:
        assert s.stop() == 0


def test_stderr_nobody_reads_stalls_no_supervision(tmp_path):
    """Regression: shmipc-serve's stderr a pipe nobody reads. The workers' output and the
    supervisor's lines are dropped once it is full (serve/sup_output.c), but the main thread
    wrote its own lines ("listening on", SIGHUP's, the stop's) with a blocking fprintf: it hung
    on the first one with the pipe full, and no signal was handled any more (SIGTERM
    ignored); the library's own lines (the front's "session ended" when a worker dies) held
    the reactor thread that wrote them, so nothing was served and the server's close never
    returned. Now a crashed worker is restarted (and served by), SIGHUP reloads and SIGTERM
    stops, all with the pipe full and never read. One worker: the front has a session with
    the one it kills, so the front logs its end."""
    # The worker writes 256 KiB on stderr as it imports the app: the pipe (64 KiB) fills.
    (tmp_path / "loudapp.py").write_text(
        APP + "\nimport sys\nfor _ in range(256):\n    sys.stderr.write('x' * 1023 + '\\n')\n"
        "sys.stderr.flush()\n")
    port = reserved_port()
    r, w = os.pipe()
    try:
        p = subprocess.Popen(
            [SERVE, "loudapp:app", "--chdir", str(tmp_path), "--listen", f"127.0.0.1:{port}",
             "--workers", "1", "--python", "/usr/bin/python3", "--graceful-timeout", "5"],
            env=python_env(), stdout=subprocess.DEVNULL, stderr=w)
    finally:
        os.close(w)
    try:
        def get(path):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                c.request("GET", path)
                resp = c.getresponse()
                return resp.status, resp.read()
            finally:
                c.close()

        def wait_for(cond, what, timeout=30):
            deadline = time.monotonic() + timeout
            while not cond():
                assert time.monotonic() < deadline, what
                time.sleep(0.1)

        last = []

        def serves():
            try:
                got = get("/x")
            except OSError as e:
                got = e
            last.append(got)
            return not isinstance(got, OSError) and got[0] == 200

        wait_for(serves, "never served")
        wait_for(lambda: len(children(p.pid)) == 1, "no worker")
        before = children(p.pid)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(children(p.pid) - before) == 1 and victim not in children(p.pid),
                 "the killed worker was not restarted")
        wait_for(serves, "nothing served after the restart")
        after_kill = children(p.pid)  # before the signal: the new worker may come at once
        p.send_signal(signal.SIGHUP)
        wait_for(lambda: not (children(p.pid) & after_kill) and len(children(p.pid)) == 1,
                 "SIGHUP replaced no worker")
        assert serves(), last[-1]
        left = children(p.pid)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 0, ("no stop on SIGTERM", time.monotonic() - t0)
        wait_for(lambda: not any(alive(c) for c in left), "workers left behind", timeout=10)
    finally:
        kill_tree(p)
        os.close(r)


def test_failed_start_can_still_be_stopped(tmp_path):
    """Regression: the server's start failing (its port taken) after the workers started,
    shmipc-serve stopped them with SIGTERM and waited for them with its stop signals blocked
    and nobody reading them: workers that ignore SIGTERM held it for the whole
    --graceful-timeout (60 s here) whatever the user did. Now the stop's watcher runs on that
    path too: a SIGINT kills the workers at once, and the exit is 1 (sent as soon as the
    failure is said: on that path the workers have only 0.5 s after their SIGTERM now,
    test_failed_start_stops_the_workers_promptly)."""
    (tmp_path / "deafapp.py").write_text(
        APP + "\nimport signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "_set = signal.signal\n"
        "signal.signal = lambda s, h: None if s == signal.SIGTERM else _set(s, h)\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = subprocess.Popen(
            [SERVE, "deafapp:app", "--chdir", str(tmp_path), "--listen", f"127.0.0.1:{port}",
             "--workers", "2", "--python", "/usr/bin/python3", "--graceful-timeout", "60"],
            env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        err = []
        failed = threading.Event()

        def read():
            for line in p.stderr:
                err.append(line)
                if "shmipc-serve: server:" in line:
                    failed.set()

        t = threading.Thread(target=read, daemon=True)
        t.start()
        try:
            assert failed.wait(30), "".join(err)
            workers = children(p.pid)
            t0 = time.monotonic()
            p.send_signal(signal.SIGINT)
            try:
                rc = p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                rc = None
            assert rc == 1, (rc, time.monotonic() - t0, "".join(err[-5:]))
            deadline = time.monotonic() + 10
            while any(alive(w) for w in workers) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not any(alive(w) for w in workers)
        finally:
            kill_tree(p)
            t.join(5)


@pytest.mark.parametrize("cause", ["port taken", "stop signal"])
def test_failed_start_stops_the_workers_promptly(tmp_path, cause):
    """Regression: a start that failed once workers ran (the server's port taken) stopped them
    with the whole --graceful-timeout (60 s here) to end after their SIGTERM, as a stop with
    requests in flight: workers that ignore SIGTERM held the process that long before its exit
    1, though no request could have reached them. Before the server ran, the workers have
    0.5 s after their SIGTERM, then SIGKILL; the exit is 1 for the failed start, 0 for a stop
    signal that came during the start (the graceful stop's)."""
    (tmp_path / "deafapp.py").write_text(
        APP + "\nimport signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "_set = signal.signal\n"
        "signal.signal = lambda s, h: None if s == signal.SIGTERM else _set(s, h)\n"
        "open('ready.' + str(__import__('os').getpid()), 'w').close()\n"
        # With a stop signal: the import never ends, so no worker is ever ready.
        + ("import time\ntime.sleep(3600)\n" if cause == "stop signal" else ""))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1] if cause == "port taken" else reserved_port()
        p = subprocess.Popen(
            [SERVE, "deafapp:app", "--chdir", str(tmp_path), "--listen", f"127.0.0.1:{port}",
             "--workers", "2", "--python", "/usr/bin/python3", "--graceful-timeout", "60",
             "--timeout", "0"],
            env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        err = []
        t = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
        t.start()
        try:
            workers = set()
            deadline = time.monotonic() + 30
            # Both workers ignore SIGTERM before the stop (the app's import got that far).
            while len(list(tmp_path.glob("ready.*"))) < 2 and p.poll() is None:
                assert time.monotonic() < deadline, "".join(err)
                workers |= children(p.pid)
                time.sleep(0.01)
            workers |= children(p.pid)
            t0 = time.monotonic()
            if cause == "stop signal":
                p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                rc = None
            took = time.monotonic() - t0
            t.join(5)
            text = "".join(err)
            assert rc == (1 if cause == "port taken" else 0), (rc, took, text)
            assert took < 15, (took, text)  # 60 s before
            assert "listening on" not in text, text
            assert ("the start failed" if cause == "port taken" else
                    "stopped before the server started") in text, text
            assert not any(alive(w) for w in workers)
        finally:
            kill_tree(p)
            t.join(5)


@pytest.mark.parametrize("where", ["python", "lua"])
def test_address_text_in_a_path_or_app_is_left_alone(tmp_path, where):
    """Regression: "{address}" was replaced in every argument of the workers' command, so an
    interpreter path, or a Lua file, holding that text named another file (the worker then
    never started). Only the argument after --address gets the address now."""
    if where == "lua" and not native_built("lua"):
        pytest.skip("no lua worker in this build")
    d = tmp_path / "{address}"
    d.mkdir()
    if where == "python":
        os.symlink("/usr/bin/python3", d / "python3")
        flags, app = ["--python", str(d / "python3")], ("cliapp:app",)
    else:
        shutil.copy(os.path.join(NATIVE["lua"][1], "serve_hello.lua"), d / "hello.lua")
        flags, app = [], ("--lua", str(d / "hello.lua"))
    s = Serve(tmp_path, *flags, workers=1, app=app)
    try:
        status, out = s.request("GET", "/")
        assert status == 200, out
    finally:
        assert s.stop() == 0


def test_access_log_into_a_pipe_nobody_reads(tmp_path):
    """Regression: `--access-log -` with stdout a pipe nobody reads. The front's threads wrote
    the lines with a blocking write(): once the pipe was full (a few hundred requests) the
    server answered nothing more, and SIGTERM never ended the process (its close waited for
    those threads). Now a line without room is dropped after 20 ms at most (counted as a
    write error in the SIGUSR1 table), every request is answered and the stop is clean."""
    (tmp_path / "cliapp.py").write_text(APP)
    port = reserved_port()
    r, w = os.pipe()
    try:
        p = subprocess.Popen(
            [SERVE, "cliapp:app", "--chdir", str(tmp_path), "--listen", f"127.0.0.1:{port}",
             "--workers", "1", "--python", "/usr/bin/python3", "--graceful-timeout", "5",
             "--access-log", "-"],
            env=python_env(), stdout=w, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(w)
    err = []
    t = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while not any("listening on" in line for line in list(err)):
            assert time.monotonic() < deadline, "".join(err)
            time.sleep(0.05)
        # Lines of over 250 bytes: 1500 of them are well past a pipe's 64 KiB.
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for i in range(1500):
            c.request("GET", f"/{i}/" + "x" * 200)
            resp = c.getresponse()
            assert resp.status == 200 and resp.read().startswith(b"pid="), i
        c.close()
        p.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not any("write errors" in line for line in list(err)):
            assert time.monotonic() < deadline, "".join(err[-5:])
            time.sleep(0.05)
        counts = [line for line in err if "write errors" in line][-1]
        written, errors = map(int, re.findall(r"(\d+) lines written, (\d+) write errors",
                                               counts)[0])
        assert errors > 0 and written < 1500, counts
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 0, "".join(err[-5:])
    finally:
        if p.poll() is None:
            for ch in children(p.pid):
                os.kill(ch, signal.SIGKILL)
            p.kill()
            p.wait()
        os.close(r)
        t.join(5)
