"""shmipc-serve-worker (serve/worker.c, docs/serve.md "The C worker" and "The Lua worker"): the
C handler of examples/c/serve_hello.c (--c) and the Lua handler of examples/lua/serve_hello.lua
(--lua) in a real worker process, each case run for both. The front is played by a shmipc
client session speaking the frames, as in test_serve_worker.py: headers, bodies up to several
MiB, HEAD, 204, the handler failing before the head (500) and after it (ABORT WORKER_ERROR), bad
frames (ABORT PROTOCOL), a front that aborts or goes away, --max-requests, SIGTERM during a
request, a crash ending the front's stream, --check, bad applications."""
import os
import signal
import struct
import subprocess
import threading
import time

import pytest

import shmipc
from conftest import BUILD, ROOT, children, unique_address

sf = pytest.importorskip("shmipc._serve")
from test_serve_worker import (BAD_LEFTOVERS, CUT_SHORT, Front, answer_then_trickle,  # noqa: E402
                               bad_frames_behind_an_answer, first_frame_cut_short, frame, head,
                               length_bound_is_kept, next_answer)

WORKER = os.path.join(BUILD, "serve", "shmipc-serve-worker")


def connect_front(address):
    """A Front whose handshake may take 10 s: under TSan on a loaded machine the worker's
    handshake thread once overran the default (the worker had printed its ready line)."""
    f = Front.__new__(Front)
    f.session_address = address
    f.session = shmipc.connect(address, shmipc.Config(read_timeout=10, initialize_timeout=10))
    return f
C_LIB = os.path.join(BUILD, "examples", "c", "libserve_hello.so")
LUA_DIR = os.path.join(ROOT, "examples", "lua")

pytestmark = pytest.mark.skipif(not os.path.exists(WORKER), reason="shmipc-serve-worker not built")


def has_lua():
    r = subprocess.run([WORKER, "--lua", "serve_hello", "--check"], cwd=LUA_DIR,
                       capture_output=True, text=True)
    return r.returncode == 0


KINDS = ["c", pytest.param("lua", marks=pytest.mark.skipif(
    os.path.exists(WORKER) and not has_lua(), reason="the worker was built without Lua"))]


def app_args(kind):
    return ["--c", C_LIB] if kind == "c" else ["--lua", "serve_hello"]


def thread_file(pid, tid, name):
    try:
        with open(f"/proc/{pid}/task/{tid}/{name}") as f:
            return f.read()
    except OSError:
        return None  # the thread ended meanwhile


def wait_threads(pid, ok, what, timeout=10):
    """Waits (up to `timeout` s) until ok(pid, tid) holds for every thread of `pid`."""
    deadline = time.monotonic() + timeout
    while not all(ok(pid, tid) for tid in os.listdir(f"/proc/{pid}/task")):
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def sleeping(pid, tid):
    """Whether the thread sleeps in the kernel (/proc's state S, or gone). A worker's threads
    are its main thread (the listener's accept) and a session thread per front: past TAKEN, the
    session thread sleeps only in its wait for the request's body, after the response only in
    the one for the next stream."""
    stat = thread_file(pid, tid, "stat")
    return stat is None or stat.rsplit(")", 1)[1].split()[0] == "S"


def nothing_pending(pid, tid):
    """Whether the thread has taken every signal sent to it (/proc's SigPnd empty)."""
    status = thread_file(pid, tid, "status")
    return status is None or "SigPnd:\t0000000000000000" in status


class Proc:
    """A worker process and a front connected to it: the example application of `kind`, or
    `app` (the worker's application arguments) run in `cwd`."""

    def __init__(self, kind, *args, app=None, cwd=LUA_DIR):
        self.address = unique_address("native")
        self.p = subprocess.Popen([WORKER, *(app or app_args(kind)), "--address", self.address,
                                   *args], cwd=cwd, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        assert f"ready on {self.address}" in line, (line, self.p.stderr.read()
                                                    if self.p.poll() is not None else "")
        self.err = []
        self.t = threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True)
        self.t.start()
        self.front = connect_front(self.address)

    def finish(self, timeout=10):
        try:
            return self.p.wait(timeout)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
            self.front.close()
            self.p.stdout.close()


@pytest.fixture(params=KINDS)
def worker(request):
    procs = []

    def start(*args):
        w = Proc(request.param, *args)
        procs.append(w)
        return w

    start.kind = request.param
    yield start
    for w in procs:
        if w.p.poll() is None:
            w.p.terminate()
        w.finish()


def fields(headers):
    return {k.lower(): v for k, v in headers}


def test_hello_and_head(worker):
    w = worker()
    status, flags, clen, headers, body, last, _ = w.front.request(b"GET", b"/")
    assert (status, body, last) == (200, b"Hello, world!\n", sf.END)
    assert flags & sf.RESP_CONTENT_LENGTH and clen == 14
    assert fields(headers)["content-type"] == "text/plain"
    # HEAD: the head with the length, no BODY frame.
    status, flags, clen, _, body, last, _ = w.front.request(b"HEAD", b"/")
    assert (status, clen, body, last) == (200, 14, b"", sf.END)
    status, _, _, _, body, last, _ = w.front.request(b"GET", b"/nope")
    assert (status, body, last) == (404, b"not found\n", sf.END)


def test_204_sends_no_body(worker):
    w = worker()
    status, flags, _, _, body, last, _ = w.front.request(b"GET", b"/204")
    assert (status, body, last) == (204, b"", sf.END)
    assert not flags & sf.RESP_CONTENT_LENGTH


def test_request_headers_peer_and_query(worker):
    w = worker()
    status, _, _, headers, body, last, _ = w.front.request(
        b"GET", b"/headers?a=1&b=%41", [("Host", "ex.org"), ("X-A", "1"), ("x-a", "2")],
        peer=("10.1.2.3", 4567))
    assert (status, last) == (200, sf.END)
    if worker.kind == "c":
        assert body == b"Host: ex.org\nX-A: 1\nx-a: 2\n"
    else:
        assert body == b"host: ex.org\nx-a: 1, 2\n"  # lower-cased names, repeats joined
        h = fields(headers)
        assert (h["x-peer"], h["x-method"], h["x-query"]) == ("10.1.2.3", "GET", "a=1&b=%41")


@pytest.mark.parametrize("size", [1, 65536, 1 << 20, (3 << 20) + 7])
def test_echo_bodies_up_to_several_mib(worker, size):
    w = worker()
    data = os.urandom(size)
    # with its length, in frames of at most 1 MiB (a larger BODY frame is a protocol error)
    st, _ = w.front.open(b"POST", b"/echo", body=data)
    w.front.send_body(st, [data[i:i + (1 << 20)] for i in range(0, size, 1 << 20)])
    status, flags, clen, _, body, last, _ = w.front.response(st)
    st.close()
    assert (status, last, clen) == (200, sf.END, size) and body == data
    # the same body in frames of odd sizes, chunked (no length known)
    pieces = [data[i:i + 300007] for i in range(0, size, 300007)]
    status, flags, _, _, body, last, _ = w.front.request(b"POST", b"/echo", chunks=pieces)
    assert (status, last) == (200, sf.END) and body == data


def test_large_streamed_response(worker):
    w = worker()
    n = 5 * (1 << 20) + 3
    status, flags, _, _, body, last, _ = w.front.request(b"GET", b"/big?%d" % n)
    assert (status, last, len(body)) == (200, sf.END, n)
    assert not flags & sf.RESP_CONTENT_LENGTH
    piece = (b"abcdefghijklmnopqrstuvwxyz" * 3847)[:100000]
    assert body == (piece * (n // 100000 + 1))[:n]


def test_unique_bodies_many_requests(worker):
    w = worker()
    for i in range(200):
        data = b"request %d " % i + os.urandom(i * 37)
        status, _, _, _, body, last, _ = w.front.request(b"POST", b"/e", body=data)
        assert (status, body, last) == (200, data, sf.END)


@pytest.mark.parametrize("path", [b"/fail", b"/nothing"])
def test_failure_before_the_head_is_500(worker, path):
    w = worker()
    status, flags, clen, _, body, last, _ = w.front.request(b"GET", path)
    assert (status, body, last) == (500, b"Internal Server Error\n", sf.END)
    assert w.front.request(b"GET", b"/")[0] == 200  # the worker serves on


@pytest.mark.parametrize("path", [b"/fail-after", b"/short", b"/long"])
def test_failure_after_the_head_aborts(worker, path):
    w = worker()
    st, _ = w.front.open(b"GET", path)
    w.front.send_body(st, None)
    typ, arg, payload = w.front.read_frame(st)
    assert typ == sf.RESPONSE_HEAD
    while True:
        typ, arg, payload = w.front.read_frame(st)
        if typ != sf.BODY:
            break
    assert (typ, arg) == (sf.ABORT, sf.ABORT_WORKER_ERROR)
    st.close()
    assert w.front.request(b"GET", b"/")[0] == 200


@pytest.mark.parametrize("bad", [
    b"garbage!garbage!",
    frame(sf.BODY, b"x"),  # a body before the head
    frame(sf.REQUEST_HEAD, b"\0" * 60),  # a head breaking its rules
])
def test_bad_frames_get_abort_protocol(worker, bad):
    w = worker()
    st = w.front.session.open_stream()
    st.write(bad)
    st.flush()
    typ, arg, _ = w.front.read_frame(st)
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
    st.close()
    assert w.front.request(b"GET", b"/")[0] == 200


def test_bad_frame_in_the_body_gets_abort_protocol(worker):
    w = worker()
    st, _ = w.front.open(b"POST", b"/echo", chunks=[])
    w.front.send_body(st, [b"abc"], end=False)
    st.write(frame(sf.RESPONSE_HEAD, b"\0" * 16))  # the wrong direction
    st.flush()
    while True:
        typ, arg, _ = w.front.read_frame(st)
        if typ not in (sf.RESPONSE_HEAD, sf.BODY):
            break
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
    st.close()
    assert w.front.request(b"GET", b"/")[0] == 200


@pytest.mark.parametrize("flags,clen,frames", BAD_LEFTOVERS)
def test_bad_frame_behind_a_body_the_handler_never_read(flags, clen, frames):
    # The C example's /early answers without reading its body; the front's frames after the
    # answer break the protocol. The worker's drain after its END reads them: ABORT PROTOCOL
    # (as the Python workers answer), and the session serves on. Before, the worker closed
    # the stream without a word. (The Lua worker reads a body before its handler runs.)
    w = Proc("c")
    try:
        bad_frames_behind_an_answer(w.front, flags, clen, frames, b"/early")
        assert w.front.request(b"GET", b"/")[0] == 200
    finally:
        w.p.terminate()
        w.finish()


@pytest.mark.parametrize("chunks", [[b"abcde"], [b"ab", b"cd"], [b"ab"], []])
def test_body_that_contradicts_its_content_length_is_a_bad_frame(worker, chunks):
    # content_length is the body's exact length (docs/serve.md, "REQUEST_HEAD"): a front whose
    # BODY frames go past it, or whose END comes before it, broke a rule of the protocol. The
    # handler must not be handed a body its head lies about (the C echo declared 3 and failed
    # as if the handler were wrong; the Lua echo answered the 5 or 2 bytes with a 200).
    w = worker()
    st, _ = w.front.open(b"POST", b"/echo", flags=sf.REQ_HAS_BODY | sf.REQ_CONTENT_LENGTH,
                         content_length=3)
    w.front.send_body(st, chunks)
    while True:
        typ, arg, _ = w.front.read_frame(st)
        if typ not in (sf.RESPONSE_HEAD, sf.BODY):
            break
    assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
    st.close()
    assert w.front.request(b"POST", b"/echo", body=b"abc")[4] == b"abc"


@pytest.mark.parametrize("kind", KINDS)
def test_request_content_length_over_2_63_is_abort_protocol(tmp_path, kind):
    # test_serve_worker.py's case: a head's content_length past 2^63 - 1 is ABORT PROTOCOL
    # (the handler never runs); 2^63 - 1 reaches it. The C example's /early answers without
    # reading the body; the Lua handler says the req.content_length it got (2^64 - 1 was -1).
    if kind == "c":
        w = Proc("c")
        target, answer = b"/early", b"ok"
    else:
        (tmp_path / "length.lua").write_text(
            "return function(req) return 200, {}, tostring(req.content_length) end\n")
        w = Proc("lua", app=["--lua", "length"], cwd=tmp_path)
        target, answer = b"/", None
    try:
        length_bound_is_kept(w.front, target, answer)
    finally:
        w.p.terminate()
        w.finish()


def test_late_abort_is_not_a_request_and_max_requests(worker):
    w = worker("--max-requests", "2")
    st = w.front.session.open_stream()  # a late ABORT alone: not counted
    st.write(frame(sf.ABORT, b"late", sf.ABORT_CLIENT_GONE))
    st.flush()
    st.close()
    assert w.front.request(b"GET", b"/")[0] == 200
    assert w.front.request(b"GET", b"/")[0] == 200
    assert w.finish() == 0


def test_requests_past_max_requests_are_refused_with_abort_shutdown(worker):
    # Two requests sent at once with --max-requests 1: the first is served, the second is
    # refused with ABORT SHUTDOWN (the front gives it to another worker), not dropped with
    # the session (which the front had to answer 502).
    # st1's head goes first, then st2 whole, then st1's body: the worker holds st2 in its
    # queue before it can serve st1 and exit (sending st2 after st1's body raced the exit:
    # PeerGoneError in a loaded CI run).
    w = worker("--max-requests", "1")
    st1, c1 = w.front.open(b"POST", b"/echo", body=b"one")
    st1.flush()
    st2, c2 = w.front.open(b"POST", b"/echo", body=b"two")
    w.front.send_body(st2, c2)
    w.front.send_body(st1, c1)
    status, _, _, _, body, last, _ = w.front.response(st1)
    assert (status, body, last) == (200, b"one", sf.END)
    status, _, _, _, _, last, arg = w.front.response(st2)
    assert (status, last, arg) == (None, sf.ABORT, sf.ABORT_SHUTDOWN)
    st1.close()
    st2.close()
    assert w.finish() == 0


def test_a_hello_past_max_requests_is_refused_with_abort_shutdown(worker):
    # A new session's HELLO that reaches a worker past --max-requests is answered ABORT
    # SHUTDOWN (the front sends that session nothing more), not closed without a word, which
    # says "I do not know HELLO" (the front then sent it uploads it could not resend).
    w = worker("--max-requests", "1")
    st1, c1 = w.front.open(b"POST", b"/echo", body=b"one")
    st1.flush()
    hello = w.front.session.open_stream()
    hello.write(frame(sf.HELLO, struct.pack("<II", sf.FEAT_TAKEN, 0)))
    hello.flush()
    w.front.send_body(st1, c1)
    status, _, _, _, body, last, _ = w.front.response(st1)
    assert (status, body, last) == (200, b"one", sf.END)
    status, _, _, _, _, last, arg = w.front.response(hello)
    assert (status, last, arg) == (None, sf.ABORT, sf.ABORT_SHUTDOWN)
    st1.close()
    hello.close()
    assert w.finish() == 0


def test_front_abort_mid_body_stops_the_handler(worker):
    w = worker()
    st, _ = w.front.open(b"POST", b"/echo", chunks=[])
    w.front.send_body(st, [b"x" * 1000], end=False)
    st.write(frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
    st.flush()
    # The worker may have sent its head and the echoed piece; it sends no END and no ABORT.
    st.read_timeout = 1.0
    got = []
    try:
        while True:
            typ, _, _ = w.front.read_frame(st)
            got.append(typ)
    except (shmipc.TimeoutError, shmipc.EndOfStreamError):
        pass
    assert sf.END not in got and sf.ABORT not in got
    st.close()
    assert w.front.request(b"GET", b"/")[0] == 200


def test_front_session_gone_mid_request(worker):
    w = worker()
    st, _ = w.front.open(b"POST", b"/echo", chunks=[])
    w.front.send_body(st, [b"abc"], end=False)
    w.front.session.close()
    w.front = connect_front(w.address)
    assert w.front.request(b"GET", b"/")[0] == 200


def test_sigterm_during_a_request_finishes_it(worker):
    # The SIGTERM goes once the worker said TAKEN: a fixed sleep before it let a loaded
    # machine (load 13, two flakes) signal a worker that had not begun the request, which a
    # stopping worker rightly refuses.
    w = worker()
    st, chunks = w.front.open(b"GET", b"/slow?600", flags=sf.REQ_TAKEN_WANTED)
    w.front.send_body(st, chunks)
    st.read_timeout = 10
    assert w.front.read_frame(st)[0] == sf.TAKEN
    w.p.send_signal(signal.SIGTERM)
    status, _, _, _, body, last, _ = w.front.response(st)
    assert (status, body, last) == (200, b"%d\n" % w.p.pid, sf.END)
    st.close()
    assert w.finish() == 0


@pytest.mark.parametrize("sig", ["SIGQUIT", "SIGINT"])
def test_stop_signal_during_slow_finishes_it_and_exits(worker, sig):
    """Regression: the Lua example's /slow slept through os.execute("sleep ..."), whose
    system() ignores SIGINT and SIGQUIT in the calling process until its child ends: a stop
    signal sent to the worker during /slow was lost, and the worker served on (only SIGTERM
    stopped it). Now the sleep is a child the worker waits for with its handlers in place: the
    request is answered and the worker exits 0, as on SIGTERM (docs/serve.md, "The C worker").
    The signal goes once the worker is in the sleep: TAKEN said, and for Lua its child there
    (system() ignores the two signals before it starts the child)."""
    w = worker()
    st, chunks = w.front.open(b"GET", b"/slow?1500", flags=sf.REQ_TAKEN_WANTED)
    w.front.send_body(st, chunks)
    st.read_timeout = 10
    assert w.front.read_frame(st)[0] == sf.TAKEN
    if worker.kind == "lua":
        deadline = time.monotonic() + 10
        while not children(w.p.pid):
            assert time.monotonic() < deadline, "no sleep started"
            time.sleep(0.01)
    w.p.send_signal(getattr(signal, sig))
    status, _, _, _, body, last, _ = w.front.response(st)
    assert (status, body, last) == (200, b"%d\n" % w.p.pid, sf.END)
    st.close()
    assert w.finish(timeout=15) == 0  # 1.5 s of sleep at most, then the exit


def test_sigterm_on_the_thread_blocked_in_a_read_finishes_the_request(worker):
    # A process's SIGTERM lands on any thread that does not block it: on the session thread
    # blocked in shmipc_serve_read() the wait returns SHMIPC_EINTR. The request in progress must
    # still be served (the stop is after it), not dropped with its session (it was: the front
    # saw its session gone, the Lua handler "the request was aborted").
    # The SIGTERM goes once the handler waits for the rest of the body (TAKEN said, then every
    # thread asleep), and the rest once the signal was taken: a fixed 0.5 s before it could,
    # on a loaded machine, stop a worker that had not taken the stream yet (it then refuses it).
    import ctypes
    tgkill = ctypes.CDLL(None, use_errno=True).tgkill
    w = worker()
    st, _ = w.front.open(b"POST", b"/echo", chunks=[], flags=sf.REQ_TAKEN_WANTED)
    w.front.send_body(st, [b"abc"], end=False)
    st.read_timeout = 10
    assert w.front.read_frame(st)[0] == sf.TAKEN
    wait_threads(w.p.pid, sleeping, "the handler never waited for the body")
    for tid in os.listdir(f"/proc/{w.p.pid}/task"):
        if int(tid) != w.p.pid:
            tgkill(w.p.pid, int(tid), signal.SIGTERM)
    wait_threads(w.p.pid, nothing_pending, "the SIGTERM was never taken")
    w.front.send_body(st, [b"def"])
    status, _, _, _, body, last, _ = w.front.response(st)
    assert (status, body, last) == (200, b"abcdef", sf.END)
    st.close()
    assert w.finish() == 0


SIG_LIB = os.path.join(BUILD, "tests", "c", "libserve_sigapp.so")


@pytest.mark.skipif(not os.path.exists(SIG_LIB), reason="libserve_sigapp.so not built")
def test_signals_of_the_app_do_not_end_the_front_session():
    # An app with a signal handler of its own (SIGUSR2, no SA_RESTART): a signal on the thread
    # waiting for the front's next stream made accept_stream return SHMIPC_EINTR, and the
    # worker took that for the front's session ending and closed it.
    import ctypes
    tgkill = ctypes.CDLL(None, use_errno=True).tgkill
    address = unique_address("sigapp")
    p = subprocess.Popen([WORKER, "--c", SIG_LIB, "--address", address],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert f"ready on {address}" in line, line
        front = connect_front(address)
        try:
            assert front.request(b"GET", b"/")[::4] == (200, b"ok")
            for _ in range(3):
                # Once the session thread waits in accept_stream (every thread asleep), and
                # the next round once the signals were taken.
                wait_threads(p.pid, sleeping, "the session thread never waited for a stream")
                for tid in os.listdir(f"/proc/{p.pid}/task"):
                    tgkill(p.pid, int(tid), signal.SIGUSR2)
                wait_threads(p.pid, nothing_pending, "a SIGUSR2 was never taken")
            for i in range(3):
                assert front.request(b"GET", b"/%d" % i)[::4] == (200, b"ok"), i
        finally:
            front.close()
    finally:
        p.terminate()
        assert p.wait(10) == 0
        p.stdout.close()
        p.stderr.close()


def test_crash_ends_the_front_stream(worker):
    w = worker()
    st, chunks = w.front.open(b"GET", b"/crash")
    w.front.send_body(st, chunks)
    with pytest.raises((shmipc.PeerGoneError, shmipc.EndOfStreamError, shmipc.ClosedError)):
        w.front.response(st)
    assert w.finish() == -signal.SIGKILL


def test_parent_pid_that_is_not_the_parent_serves_nothing(worker):
    # The supervisor died before the worker could watch it: the worker exits at once.
    addr = unique_address("orphan")
    p = subprocess.run([WORKER, *app_args(worker.kind), "--address", addr, "--parent-pid", "1"],
                       cwd=LUA_DIR, capture_output=True, text=True, timeout=20)
    assert p.returncode == 0


@pytest.mark.parametrize("args,why", [
    (["--c", "/nonexistent/lib.so"], "cannot load"),
    (["--c", C_LIB + ":no_such_symbol"], "no function no_such_symbol"),
    (["--lua", "no_such_module"], "module 'no_such_module' not found"),
    (["--lua", "serve_hello:handler"], "returns a function, not a table"),
    (["--lua", "string"], "not a handler function"),  # a module of the standard library
    (["--c", C_LIB, "--lua", "x"], "one of --c and --lua"),
    (["--c", C_LIB, "--max-requests", "-1"], "bad argument"),
    (["--c", C_LIB], "--address"),
])
def test_bad_applications_and_arguments_exit_2(args, why):
    argv = [WORKER, *args] if why == "--address" else \
        [WORKER, *args, "--address", unique_address("bad-args")]
    p = subprocess.run(argv, cwd=LUA_DIR, capture_output=True, text=True, timeout=20)
    if args[0] == "--lua" and "built without Lua" in p.stderr:
        pytest.skip("the worker was built without Lua")
    assert p.returncode == 2 and why in p.stderr, p.stderr


def test_check_loads_the_application(worker):
    p = subprocess.run([WORKER, *app_args(worker.kind), "--check"], cwd=LUA_DIR,
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 0, p.stderr


def test_lua_req_kept_past_its_request_is_refused(tmp_path):
    if not has_lua():
        pytest.skip("the worker was built without Lua")
    (tmp_path / "keep.lua").write_text('''
local kept
return function(req)
  if req.path == "/keep" then kept = req return 200, {}, "kept" end
  local ok, err = pcall(function() return kept:read() end)
  local ok2, err2 = pcall(function() return kept.body end)
  return 200, {}, tostring(ok) .. " " .. tostring(ok2) .. " " .. tostring(err)
end
''')
    addr = unique_address("keep")
    p = subprocess.Popen([WORKER, "--lua", "keep", "--address", addr], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "ready on" in p.stdout.readline()
        front = connect_front(addr)
        assert front.request(b"GET", b"/keep")[4] == b"kept"
        body = front.request(b"GET", b"/use")[4]
        assert body.startswith(b"false false ") and b"this request is over" in body
        front.close()
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()


@pytest.mark.parametrize("ret,what", [
    ('"200"', 200),  # a number as a string is refused? no: Lua converts it
    ("700, {}, 'x'", 500),
    ("200, {['X-A'] = {}}, 'x'", 200),
    ("200, {['Bad Name'] = 'x'}, 'x'", 500),
    ("200, {['X'] = 'a\\nb'}, 'x'", 500),
    ("200, 'headers', 'x'", 500),
    ("200, {}, 42", 500),
    ("200, {['Content-Length'] = '5'}, 'abc'", 500),
    ("200, {['Content-Length'] = 'x'}, 'abc'", 500),
    ("200, {}, function() return 42 end", "abort"),
    ("200, {[1] = 'not a pair'}, 'x'", 500),
])
def test_lua_hostile_returns(tmp_path, ret, what):
    if not has_lua():
        pytest.skip("the worker was built without Lua")
    (tmp_path / "bad.lua").write_text("return function(req) return %s end\n" % ret)
    addr = unique_address("badlua")
    p = subprocess.Popen([WORKER, "--lua", "bad", "--address", addr], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "ready on" in p.stdout.readline()
        front = connect_front(addr)
        status, _, _, _, body, last, arg = front.request(b"GET", b"/")
        if what == "abort":
            assert (last, arg) == (sf.ABORT, sf.ABORT_WORKER_ERROR)
        else:
            assert status == what
        front.close()
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()


def test_stopping_worker_exits_though_a_front_trickles_a_refused_stream(worker):
    # SIGTERM while a request is served and another waits whose body trickles (a BODY frame
    # every 0.3 s, never END: a hostile or stuck front): the waiting one is refused, and the
    # worker exits within the refusal's bound. Before, each read had 5 s but the drain had no
    # end, and the stopping worker never exited. The SIGTERM goes once the worker said TAKEN
    # for /slow (a fixed 0.2 s could land before it began, and a stopping worker refuses it).
    w = worker()
    st, chunks = w.front.open(b"GET", b"/slow?600", flags=sf.REQ_TAKEN_WANTED)
    w.front.send_body(st, chunks)
    st.read_timeout = 10
    trickled, _ = w.front.open(b"POST", b"/echo", chunks=[])
    trickled.flush()
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.3):
            try:
                trickled.write(frame(sf.BODY, b"x"))
                trickled.flush()
            except shmipc.Error:
                return

    tt = threading.Thread(target=trickle, daemon=True)
    tt.start()
    try:
        assert w.front.read_frame(st)[0] == sf.TAKEN
        w.p.send_signal(signal.SIGTERM)
        status, _, _, _, _, last, _ = w.front.response(st)
        assert (status, last) == (200, sf.END)
        assert w.finish(timeout=15) == 0
    finally:
        stop.set()
        tt.join(5)


def test_second_stop_signal_during_a_refusal_does_not_end_it(worker):
    """Regression: a stopping worker refuses a stream queued behind its last request (ABORT
    SHUTDOWN), then reads the rest of that request (up to 5 s) so that none of it arrives
    after the close. A signal landing on the thread in that read (a second SIGTERM: the
    supervisor and the parent-death signal, or a group's signal on top of the supervisor's)
    made it return SHMIPC_EINTR, which ended the refusal: the stream was closed and the
    worker gone before the front had sent the request's END. The read now goes on within the
    refusal's bound. The second SIGTERM goes to the worker's threads but the main one (a
    process's signal lands on the main thread first), once every thread sleeps (the refusal
    waits for the rest), and the check once the signals were taken."""
    import ctypes
    tgkill = ctypes.CDLL(None, use_errno=True).tgkill
    w = worker()
    st, chunks = w.front.open(b"GET", b"/slow?600", flags=sf.REQ_TAKEN_WANTED)
    w.front.send_body(st, chunks)
    st.read_timeout = 10
    queued, _ = w.front.open(b"POST", b"/echo", chunks=[])
    w.front.send_body(queued, [b"x"], end=False)
    queued.read_timeout = 10
    assert w.front.read_frame(st)[0] == sf.TAKEN
    w.p.send_signal(signal.SIGTERM)
    status, _, _, _, _, last, _ = w.front.response(st)
    assert (status, last) == (200, sf.END)
    st.close()
    assert w.front.read_frame(queued)[:2] == (sf.ABORT, sf.ABORT_SHUTDOWN)
    wait_threads(w.p.pid, sleeping, "the refusal never waited for the rest")
    for tid in os.listdir(f"/proc/{w.p.pid}/task"):
        if int(tid) != w.p.pid:
            tgkill(w.p.pid, int(tid), signal.SIGTERM)
    wait_threads(w.p.pid, nothing_pending, "the second SIGTERM was never taken")
    time.sleep(0.3)  # the refusal, ended by the signal, closed the stream within this
    queued.read_timeout = 0.5
    with pytest.raises(shmipc.TimeoutError):
        queued.readexactly(1)  # the stream is still open: the refusal waits for its END
    assert w.p.poll() is None
    w.front.send_body(queued, [b"y"])
    queued.read_timeout = 10
    with pytest.raises((shmipc.EndOfStreamError, shmipc.PeerGoneError)):
        queued.readexactly(1)
    queued.close()
    assert w.finish(timeout=15) == 0


def test_drain_after_the_workers_abort_ends_though_a_front_trickles(tmp_path):
    # The handler fails after its head (ABORT WORKER_ERROR), without reading the body, on a
    # request whose body trickles (a BODY frame every 0.3 s, never END). docs/serve.md
    # ("ABORT"): the worker then reads and drops what the front sends "for at most 5 seconds",
    # and closes. Before, each read had 5 s but the drain had no end: the worker (one request
    # at a time) served nothing more while the front trickled. (The Lua worker runs the same
    # shmipc_serve_handle_stream() as the C one; the C example reads every body.)
    if not has_lua():
        pytest.skip("the worker was built without Lua")
    (tmp_path / "failafter.lua").write_text(
        'return function(req)\n'
        '  if req.has_body then return 200, {}, function() error("after the head") end end\n'
        '  return 200, {}, "ok"\n'
        'end\n')
    w = Proc("lua", app=["--lua", "failafter"], cwd=tmp_path)
    st, _ = w.front.open(b"POST", b"/fail-after", chunks=[])
    st.flush()
    stop = threading.Event()

    def trickle():
        deadline = time.monotonic() + 20
        while not stop.wait(0.3) and time.monotonic() < deadline:
            try:
                st.write(frame(sf.BODY, b"x"))
                st.flush()
            except shmipc.Error:
                return

    while True:  # the handler does not read the body: its ABORT comes at once
        typ, arg, _ = w.front.read_frame(st)
        if typ not in (sf.RESPONSE_HEAD, sf.BODY):
            break
    assert (typ, arg) == (sf.ABORT, sf.ABORT_WORKER_ERROR)
    tt = threading.Thread(target=trickle, daemon=True)
    tt.start()
    try:
        t0 = time.monotonic()
        done = {}
        rt = threading.Thread(target=lambda: done.setdefault("r", w.front.request(b"GET", b"/")),
                              daemon=True)
        rt.start()
        rt.join(10)
        assert "r" in done, "the worker still drains the aborted request"
        assert done["r"][0] == 200
        assert time.monotonic() - t0 < 8
    finally:
        stop.set()
        tt.join(5)
        w.p.terminate()
        w.finish()


TRICKLE_LUA = """
return function(req)
  if req.path == "/500" then error("failing before the head") end
  return 200, {}, req.path == "/answer" and "ok" or "next"
end
"""


@pytest.mark.parametrize("kind,target", [("c", b"/early"), ("lua", b"/answer"), ("lua", b"/500")])
def test_drain_after_the_answer_ends_though_a_front_trickles(tmp_path, kind, target):
    """Regression: after its END (a handler that answered without reading the body, or the
    500 of one that failed before its head) the worker reads the rest of the request before it
    closes the stream, and did so with no deadline (only the drain after its ABORT had one). A
    front that trickles the body (a BODY frame every 0.3 s, never END) held the worker (one
    request at a time) as long as it liked: the next request waited. The drain now has one
    deadline, 5 s for all of it, as after the ABORT (test_drain_after_the_workers_abort_ends_
    though_a_front_trickles). The C handler is the example's /early; the Lua one answers
    without reading the body (both run shmipc_serve_handle_stream())."""
    if kind == "c":
        w = Proc("c")
    else:
        if not has_lua():
            pytest.skip("the worker was built without Lua")
        (tmp_path / "trickleapp.lua").write_text(TRICKLE_LUA)
        w = Proc("lua", app=["--lua", "trickleapp"], cwd=tmp_path)
    end = None
    try:
        got, end = answer_then_trickle(w.front.session, target)
        assert got[0] == sf.END, got
        status, took = next_answer(w.front.session)
        assert status == 200
        assert took < 12, took
    finally:
        if end is not None:
            end()
        w.p.terminate()
        w.finish()


def upgrade_without_end(session, trickle, limit=12):
    """An upgrade to the examples' /ws whose END never comes: the head alone (the stream kept
    open), or, with `trickle`, a head with HAS_BODY and a one-byte BODY frame every 0.3 s
    behind it. Waits (at most `limit` s) for the worker to close the stream, looking every
    0.3 s without blocking: the seconds that took, or None when it did not. A 101 fails."""
    headers = [("Host", "h"), ("Upgrade", "websocket"), ("Connection", "Upgrade"),
               ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Sec-WebSocket-Version", "13")]
    flags = sf.REQ_UPGRADE | sf.REQ_KEEP_ALIVE
    if trickle:
        flags |= sf.REQ_HAS_BODY | sf.REQ_CHUNKED
    st = session.open_stream()
    t0 = time.monotonic()
    try:
        st.write(head(b"GET", b"/ws", headers, flags=flags))
        st.flush()
        while time.monotonic() - t0 < limit:
            time.sleep(0.3)
            try:
                if trickle:
                    st.write(frame(sf.BODY, b"x"))
                    st.flush()
                got = st.readexactly(12, nonblock=True)
            except (shmipc.EndOfStreamError, shmipc.PeerGoneError, shmipc.ClosedError):
                return time.monotonic() - t0
            if got is not None:
                assert sf.decode_header(got)[0] != sf.RESPONSE_HEAD, \
                    "a 101 without the upgrade's END"
        return None
    finally:
        st.close()


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickle"])
def test_websocket_accept_ends_though_a_front_never_ends_the_upgrade(worker, trickle):
    """Regression: shmipc_serve_ws_accept() (the C handler's, and Lua's req:accept_websocket)
    reads the upgrade request's END (and any body) before its 101, and did so with no
    deadline: a front that sent the upgrade's head and then nothing (the stream kept open), or
    trickled BODY frames behind it (a frame every 0.3 s, never END), held the worker (one
    request at a time) as long as it liked: the next request waited. Now the read has one
    deadline, 5 s for all of it: the accept fails (SHMIPC_ETIMEDOUT), the stream is closed
    without a 101, and the next request is served."""
    w = worker()
    try:
        took = upgrade_without_end(w.front.session, trickle)
        assert took is not None, "the worker never gave the upgrade up"
        assert took > 4, took  # the deadline, not a refusal at once
        status, took = next_answer(w.front.session)
        assert status == 200
        assert took < 5, took
    finally:
        w.p.terminate()
        w.finish()


@pytest.mark.parametrize("what", CUT_SHORT)
def test_first_frame_cut_short_does_not_hold_the_worker(worker, what):
    """Regression: shmipc_serve_handle_stream() (the C and Lua workers) read a stream's first
    frame (a REQUEST_HEAD, a HELLO's payload, a late ABORT's text) with no deadline: a front
    that sent part of it (6 bytes of a header, a head short of its length) and kept the stream
    open held the worker (one request at a time) as long as it liked: the next request waited.
    Now the whole first frame has one deadline, 5 s from the stream's accept; then the stream
    is closed and the next request served."""
    w = worker()
    st = w.front.session.open_stream()
    try:
        st.write(first_frame_cut_short(what))
        st.flush()
        status, took = next_answer(w.front.session)
        assert status == 200
        assert took < 10, took
        # The stalled stream was given up: closed by the worker, nothing sent on it.
        st.read_timeout = 5
        with pytest.raises((shmipc.EndOfStreamError, shmipc.PeerGoneError)):
            st.readexactly(12)
    finally:
        st.close()
        w.p.terminate()
        w.finish()


def test_abort_text_cut_short_does_not_hold_the_worker(worker):
    """Regression: a handler's respond() or write() that saw the front's ABORT header behind
    the request (check_abort()) read the ABORT's text with the stream's read timeout, none in
    the worker: a front that sent the header and part of the text, and kept the stream open,
    held the worker (one request at a time) as long as it liked: the next request waited. Now
    the text has 5 s; then the stream is given up and the next request served."""
    w = worker()
    st, chunks = w.front.open(b"GET", b"/slow?300")
    try:
        w.front.send_body(st, chunks)
        # The header says 20 bytes of text; 4 of them come, and the stream stays open.
        st.write(frame(sf.ABORT, b"the client went away", sf.ABORT_CLIENT_GONE)[:16])
        st.flush()
        status, took = next_answer(w.front.session)
        assert status == 200
        assert took < 10, took
        # The aborted request got nothing: its stream was closed by the worker.
        st.read_timeout = 5
        with pytest.raises((shmipc.EndOfStreamError, shmipc.PeerGoneError)):
            st.readexactly(12)
    finally:
        st.close()
        w.p.terminate()
        w.finish()


def test_websocket_echo_refusal_and_stop(worker):
    """The examples' WebSocket echo (docs/serve.md, "WebSocket in the C and Lua workers"),
    for the C handler API and the Lua one alike: a refusal, echo of text, binary and a 3 MiB
    fragmented message, the client's close echoed, then SIGTERM closing an open socket 1001."""
    from serve_ws_front import FIN, accepted, close_frame, closed, message, send, upgrade
    w = worker()
    st = upgrade(w.front, b"/other")
    assert w.front.response(st)[0] == 403
    st.close()
    st = upgrade(w.front, b"/ws")
    assert accepted(w.front, st) == []
    send(st, frame(sf.WS_DATA, "h\u00e9".encode(), 1 | FIN))
    assert message(w.front, st)[:2] == (1, "h\u00e9".encode())
    big = os.urandom(3 * sf.MAX_CHUNK + 5)
    pieces = [big[i:i + sf.MAX_CHUNK] for i in range(0, len(big), sf.MAX_CHUNK)]
    for i, p in enumerate(pieces):
        st.write(frame(sf.WS_DATA, p, (2 if i == 0 else 0) | (FIN if i == len(pieces) - 1 else 0)))
    st.flush()
    op, data, n = message(w.front, st)
    assert (op, data == big, n) == (2, True, 4)
    send(st, close_frame(4000, b"bye"))
    assert closed(w.front, st) == (4000, "")
    st.close()
    assert w.front.request(b"GET", b"/")[4] == b"Hello, world!\n"
    st = upgrade(w.front, b"/ws")
    accepted(w.front, st)
    w.p.send_signal(signal.SIGTERM)
    assert closed(w.front, st) == (1001, "")
    send(st, close_frame(1001))
    st.close()
    assert w.finish() == 0


WSCLOSE_LIB = os.path.join(BUILD, "tests", "c", "libserve_wsclose.so")


@pytest.mark.parametrize("sending", [False, True], ids=["reading", "sending"])
@pytest.mark.parametrize("kind", KINDS)
def test_websocket_close_then_stream_end_is_the_clients_code(kind, sending, tmp_path):
    """The front's WS_CLOSE (the client's 4001 "bye") with the stream closed right behind it,
    as the front does when it gave up waiting for the worker's answer: shmipc_serve_ws_closed()
    and Lua's recv_frame give 4001 "bye", whether the handler's next call reads (its answer
    then fails) or sends (its echo of a message before the close, 300 ms late, fails first).
    The send's failure made the exchange "gone" and the close, unread in the stream, came out
    as 1006.
    The handlers (tests/c/serve_wsclose.c, and the Lua one of test_serve_ws_front.py) append
    the code to disconnects.log."""
    if kind == "c" and not os.path.exists(WSCLOSE_LIB):
        pytest.skip("libserve_wsclose.so is not built")
    from serve_ws_front import FIN, accepted, close_frame, send, upgrade
    from test_serve_ws_front import GONE_LUA
    if kind == "c":
        app = ["--c", WSCLOSE_LIB]
    else:
        (tmp_path / "goneapp.lua").write_text(GONE_LUA)
        app = ["--lua", "goneapp"]
    w = Proc(kind, app=app, cwd=str(tmp_path))
    try:
        st = upgrade(w.front, b"/ws?t")
        accepted(w.front, st)
        frames = [frame(sf.WS_DATA, b"slow", 1 | FIN)] if sending else []
        send(st, *frames, close_frame(4001, b"bye"))
        st.close()
        # A whole line: the handler opens the file (which then exists, empty) before it writes
        # its line; reading once it existed read "" now and then on a loaded machine (4 runs
        # of 200, Lua, whose io library writes the line at its close).
        log = tmp_path / "disconnects.log"
        deadline = time.monotonic() + 10
        text = ""
        while not text.endswith("\n") and time.monotonic() < deadline:
            time.sleep(0.02)
            text = log.read_text() if log.exists() else ""
        assert text == "t 4001 bye\n"
    finally:
        w.p.terminate()
        w.finish()


def test_stopping_websocket_exits_though_a_front_trickles_a_frame(worker):
    """SIGTERM while the front trickles the payload of a message's frame (its header said
    1000 bytes; one more every 0.3 s, never its close answer): the worker sends its 1001 and
    gives up the front's answer after 5 s, as docs/serve.md says, and exits. Before, the
    going-away wait bounded only the wait for a frame header: the rest of the frame was dropped
    one read at a time, 5 s for each, and the stopping worker (one request at a time) stayed
    for the ~5 minutes the trickle took. The examples' echo reads the frame's first bytes, so
    the handler waits in the payload when the signal comes (C and Lua alike)."""
    from serve_ws_front import FIN, accepted, upgrade
    w = worker()
    st = upgrade(w.front, b"/ws")
    accepted(w.front, st)
    st.write(frame(sf.WS_DATA, b"x" * 1000, 1 | FIN)[:12 + 10])
    st.flush()
    stop = threading.Event()

    def trickle():
        deadline = time.monotonic() + 30
        while not stop.wait(0.3) and time.monotonic() < deadline:
            try:
                st.write(b"x")
                st.flush()
            except shmipc.Error:
                return

    tt = threading.Thread(target=trickle, daemon=True)
    tt.start()
    try:
        wait_threads(w.p.pid, sleeping, "the handler never waited for the frame", timeout=10)
        time.sleep(0.5)  # a few of the trickled bytes read
        t0 = time.monotonic()
        w.p.send_signal(signal.SIGTERM)
        assert w.finish(timeout=15) == 0
        assert time.monotonic() - t0 < 12
    finally:
        stop.set()
        tt.join(5)


@pytest.mark.parametrize("raise_,logged", [
    # an error object with a __tostring: its text, as lua.c prints it
    ('setmetatable({}, {__tostring = function() return "custom failure 42" end})',
     "custom failure 42"),
    # one whose __tostring raises, returns no string, or none at all: its type
    ('setmetatable({}, {__tostring = function() error("in tostring") end})',
     "(error object is a table value whose __tostring failed)"),
    ('setmetatable({}, {__tostring = function() return {} end})',
     "(error object is a table value whose __tostring failed)"),
    ("{code = 1}", "(error object is a table value)"),
    ("nil", "(error object is a nil value)"),
    ("true", "(error object is a boolean value)"),
])
def test_lua_error_objects_that_are_not_strings_are_logged_by_what_they_say(tmp_path, raise_,
                                                                          logged):
    # A Lua error whose value is not a string: the 500 as for any error, and a log line that
    # says what failed. Before, every such error was logged as "(an error object that is not
    # a string)": an error object's own __tostring text was lost.
    if not has_lua():
        pytest.skip("the worker was built without Lua")
    (tmp_path / "errobj.lua").write_text(
        "return function(req)\n"
        "  if req.path == '/fail' then error(%s) end\n"
        "  return 200, {}, 'ok'\n"
        "end\n" % raise_)
    w = Proc("lua", app=["--lua", "errobj"], cwd=tmp_path)
    try:
        status, _, _, _, body, last, _ = w.front.request(b"GET", b"/fail")
        assert (status, body, last) == (500, b"Internal Server Error\n", sf.END)
        assert w.front.request(b"GET", b"/")[4] == b"ok"
        deadline = time.monotonic() + 10
        while "the Lua handler failed on GET /fail" not in "".join(w.err):
            assert time.monotonic() < deadline, w.err
            time.sleep(0.01)
        line = next(e for e in w.err if "the Lua handler failed on GET /fail" in e)
        assert line.rstrip("\n").endswith(": " + logged), line
    finally:
        w.p.terminate()
        assert w.finish() == 0
