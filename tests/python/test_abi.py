"""shmipc.abi: generic libffi calls of any GENERIC entry of the ABI table (docs/python.md)."""
import gc
import os
import socket
import subprocess
import sys
import threading
import time
import weakref

import pytest

import shmipc
import shmipc.abi as abi

EINVAL = shmipc.errors["EINVAL"]


def addr(tag):
    return f"unix:@shmipc-pyabi-{os.getpid()}-{tag}"


@pytest.fixture
def config():
    rc, cfg = abi.call("shmipc_config_new")
    assert rc == 0
    yield cfg
    if not cfg.released:
        abi.call("shmipc_config_free", cfg)


def test_version_and_errors():
    assert abi.call("shmipc_version") == shmipc.version_number
    assert abi.call("shmipc_version_string") == shmipc.__version__
    assert abi.shmipc_version_string() == shmipc.__version__
    assert abi.call("shmipc_strerror", EINVAL) == shmipc.strerror(EINVAL)
    assert abi.call("shmipc_errname", EINVAL) == "SHMIPC_EINVAL"
    assert abi.call("shmipc_abi_count") == len(abi.names())
    assert "shmipc_config_new" in dir(abi)


def test_config_new_set_get_validate_free(config):
    assert config.kind == "CONFIG" and not config.released
    assert abi.call("shmipc_config_validate", config) == 0
    assert abi.call("shmipc_config_set_buffer_capacity", config, 4096) == EINVAL
    assert "buffer" in abi.call("shmipc_error_detail")
    assert abi.call("shmipc_config_set_buffer_capacity", config, 1 << 22) == 0
    assert abi.call("shmipc_config_get_buffer_capacity", config) == 1 << 22
    assert abi.call("shmipc_config_set_path_prefix", config, "/dev/shm/pyabi") == 0
    assert abi.call("shmipc_config_get_path_prefix", config) == "/dev/shm/pyabi"
    assert abi.call("shmipc_config_set_path_prefix", config, b"/dev/shm/raw") == 0
    assert abi.call("shmipc_config_get_path_prefix", config) == "/dev/shm/raw"
    assert abi.call("shmipc_config_parse_slice_classes", config, "4096:100") == 0
    assert abi.call("shmipc_config_set_queue_capacity", config, 1024) == 0
    assert abi.call("shmipc_config_get_queue_capacity", config) == 1024
    assert abi.call("shmipc_config_set_timeout_ms", config, 2, 1500) == 0
    assert abi.call("shmipc_config_get_timeout_ms", config, 2) == 1500
    rc, features = abi.call("shmipc_config_get_server_v4", config)
    assert rc in (0, 1) and isinstance(features, int)
    rc, clone = abi.call("shmipc_config_clone", config)
    assert rc == 0 and clone.kind == "CONFIG"
    assert abi.call("shmipc_config_get_queue_capacity", clone) == 1024
    assert abi.call("shmipc_config_free", clone) is None
    assert clone.released


def test_check_raises_the_module_errors(config):
    rc = abi.call("shmipc_config_set_buffer_capacity", config, 4096)
    with pytest.raises(shmipc.InvalidArgumentError) as e:
        abi.check(rc)
    assert e.value.code == EINVAL and "buffer" in str(e.value)
    assert abi.check(0) == 0
    assert abi.check((0, "x")) == (0, "x")


def test_integer_ranges(config):
    with pytest.raises(OverflowError):
        abi.call("shmipc_config_set_queue_capacity", config, -1)
    with pytest.raises(OverflowError):
        abi.call("shmipc_config_set_queue_capacity", config, 1 << 32)
    with pytest.raises(OverflowError):
        abi.call("shmipc_config_set_buffer_capacity", config, 1 << 64)
    with pytest.raises(OverflowError):
        abi.call("shmipc_strerror", 1 << 31)
    with pytest.raises(OverflowError):
        abi.call("shmipc_config_get_timeout_ms", config, -(1 << 40))
    with pytest.raises(TypeError):
        abi.call("shmipc_strerror", "1")
    with pytest.raises(TypeError):
        abi.call("shmipc_strerror", 1.0)
    with pytest.raises(TypeError):
        abi.call("shmipc_strerror", True)


def test_wrong_counts_and_types_before_c(config):
    with pytest.raises(TypeError, match="takes 1 argument"):
        abi.call("shmipc_config_validate")
    with pytest.raises(TypeError, match="takes 0 arguments"):
        abi.call("shmipc_config_new", None)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        abi.call("shmipc_config_set_queue_capacity", config)
    with pytest.raises(TypeError, match="Handle"):
        abi.call("shmipc_config_validate", 1234)
    with pytest.raises(TypeError, match="Handle"):
        abi.call("shmipc_config_validate", shmipc.Config())
    with pytest.raises(TypeError):
        abi.call("shmipc_config_set_path_prefix", config, 12)
    with pytest.raises(ValueError, match="NUL"):
        abi.call("shmipc_config_set_path_prefix", config, "/dev/shm/a\0b")
    with pytest.raises(TypeError):
        abi.call("shmipc_set_log_sink", 5)
    with pytest.raises(AttributeError):
        abi.call("shmipc_no_such_function")
    with pytest.raises(AttributeError):
        abi.shmipc_no_such_function
    with pytest.raises(TypeError):
        abi.call(42)
    with pytest.raises(TypeError):
        abi.Handle()


def test_wrong_handle_kind(config):
    rc, scfg = abi.call("shmipc_server_config_new")
    assert rc == 0 and scfg.kind == "SERVER_CONFIG"
    try:
        with pytest.raises(TypeError, match="CONFIG handle, not a SERVER_CONFIG"):
            abi.call("shmipc_config_validate", scfg)
        with pytest.raises(TypeError, match="SERVER_CONFIG handle, not a CONFIG"):
            abi.call("shmipc_server_config_free", config)
        with pytest.raises(TypeError, match="STREAM"):
            abi.call("shmipc_stream_flush", config)
        assert not config.released
    finally:
        abi.call("shmipc_server_config_free", scfg)


def test_use_after_release(config):
    abi.call("shmipc_config_free", config)
    assert config.released and "released" in repr(config)
    with pytest.raises(ValueError, match="released"):
        abi.call("shmipc_config_validate", config)
    with pytest.raises(ValueError, match="released"):
        abi.call("shmipc_config_free", config)


def test_none_is_null():
    # NULL handles are part of the C contract (no-op free, EINVAL getters)
    assert abi.call("shmipc_config_free", None) is None
    assert abi.call("shmipc_config_validate", None) == EINVAL


def test_collected_handles_are_freed():
    for _ in range(1000):
        rc, cfg = abi.call("shmipc_config_new")
        del cfg
    gc.collect()


def test_non_generic_entries():
    for name in ("shmipc_config_set_slice_classes", "shmipc_abi_get"):
        flags, _, _ = abi.describe(name)
        assert not flags & 1
        with pytest.raises(NotImplementedError, match=name):
            abi.call(name, 1, 2)
    flags, ret, params = abi.describe("shmipc_config_new")
    assert flags & 1 and ret[0] == 1 and params[0][3] == "out"


def test_session_pair_streams(config):
    address = addr("pair")
    rc, lst = abi.call("shmipc_listener_new", address, config)
    assert rc == 0 and lst.kind == "LISTENER"
    assert abi.call("shmipc_listener_fileno", lst) >= 0
    box = {}

    def accept():
        box["accept"] = abi.call("shmipc_listener_accept", lst, 10000)

    t = threading.Thread(target=accept)
    t.start()
    rc, client = abi.call("shmipc_session_connect", address, config)
    t.join(10)
    assert rc == 0 and client.kind == "SESSION"
    rc, server = box["accept"]
    assert rc == 0 and server.kind == "SESSION"
    assert abi.call("shmipc_session_status", client) >= 0
    rc, interval = abi.call("shmipc_session_wakeup", client)
    assert rc >= 0 and isinstance(interval, int)

    rc, cs = abi.call("shmipc_session_open_stream", client)
    assert rc == 0 and cs.kind == "STREAM"
    assert abi.call("shmipc_stream_write", cs, b"hello ") == 0
    assert abi.call("shmipc_stream_write", cs, memoryview(bytearray(b"world"))) == 0
    assert abi.call("shmipc_stream_flush", cs) == 0
    with pytest.raises(TypeError, match="bytes-like"):
        abi.call("shmipc_stream_write", cs, "text")
    rc, ss = abi.call("shmipc_session_accept_stream", server, 10000)
    assert rc == 0 and ss.kind == "STREAM"
    assert abi.call("shmipc_stream_id", ss) == abi.call("shmipc_stream_id", cs)
    rc, data = abi.call("shmipc_stream_read_exact_bytes", ss, 6, 0)
    assert (rc, data) == (0, b"hello ")
    rc, data = abi.call("shmipc_stream_read_chunk", ss, 100, 0)
    assert (rc, data) == (0, b"world")
    assert abi.call("shmipc_stream_release", ss) == 0
    assert abi.call("shmipc_stream_available", ss) == 0

    # reply and close
    assert abi.call("shmipc_stream_write", ss, b"bye") == 0
    assert abi.call("shmipc_stream_flush", ss) == 0
    rc, data = abi.call("shmipc_stream_read_exact_bytes", cs, 3, 0)
    assert (rc, data) == (0, b"bye")
    with pytest.raises(TypeError, match="STREAM handle, not a SESSION"):
        abi.call("shmipc_stream_close", client)
    for h, closer in ((cs, "shmipc_stream_close"), (ss, "shmipc_stream_close"),
                      (client, "shmipc_session_close"), (server, "shmipc_session_close"),
                      (lst, "shmipc_listener_close")):
        assert abi.call(closer, h) is None
        assert h.released
    with pytest.raises(ValueError, match="released"):
        abi.call("shmipc_stream_write", cs, b"x")


GREETER = os.path.join(os.environ.get("SHMIPC_BUILD_DIR", "build"), "examples", "c",
                       "greeter_server")


@pytest.mark.skipif(not os.path.exists(GREETER), reason="greeter_server not built")
def test_with_the_c_greeter_server(config):
    address = addr("greeter")
    proc = subprocess.Popen([GREETER, address, "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            rc, s = abi.call("shmipc_session_connect", address, config)
            if rc == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert rc == 0, abi.call("shmipc_errname", rc)
        rc, st = abi.call("shmipc_session_open_stream", s)
        assert rc == 0
        assert abi.call("shmipc_stream_write", st, b"client say hello world!!!") == 0
        assert abi.call("shmipc_stream_flush", st) == 0
        assert abi.call("shmipc_stream_set_timeout_ms", st, 2, 10000) >= 0
        reply = b"server hello world!!!"
        assert abi.call("shmipc_stream_read_exact_bytes", st, len(reply), 0) == (0, reply)
        abi.call("shmipc_stream_close", st)
        abi.call("shmipc_session_close", s)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert "client say hello world!!!" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def bad_handshake(address):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + address[len("unix:@"):])
    s.sendall(b"this is no shmipc handshake".ljust(64, b"\0"))
    s.close()


def test_log_sink_closure(config):
    lines = []
    address = addr("log")
    rc, lst = abi.call("shmipc_listener_new", address, config)
    assert rc == 0
    try:
        assert abi.call("shmipc_set_log_sink", lambda level, line: lines.append((level, line))) \
            is None
        bad_handshake(address)
        rc, s = abi.call("shmipc_listener_accept", lst, 300)
        assert rc < 0 and s is None
        assert lines, "no log line"
        level, line = lines[-1]
        assert level == 2 and "handshake failed" in line and f"shmipc[{os.getpid()}]" in line

        # a new sink replaces (and frees) the old closure; None restores stderr
        second = []
        abi.call("shmipc_set_log_sink", lambda level, line: second.append(line))
        before = len(lines)
        bad_handshake(address)
        abi.call("shmipc_listener_accept", lst, 300)
        assert second and len(lines) == before
    finally:
        abi.call("shmipc_set_log_sink", None)
        abi.call("shmipc_listener_close", lst)


def test_log_sink_in_a_subprocess_at_debug_level():
    code = (
        "import shmipc.abi as a, os, sys\n"
        "got = []\n"
        "a.call('shmipc_set_log_sink', lambda lvl, line: got.append((lvl, line)))\n"
        "rc, cfg = a.call('shmipc_config_new')\n"
        "addr = f'unix:@shmipc-pyabi-{os.getpid()}-dbg'\n"
        "rc, l = a.call('shmipc_listener_new', addr, cfg)\n"
        "import threading\n"
        "box = {}\n"
        "t = threading.Thread(target=lambda: box.update(r=a.call('shmipc_listener_accept', l, 10000)))\n"
        "t.start()\n"
        "rc, c = a.call('shmipc_session_connect', addr, cfg)\n"
        "t.join()\n"
        "assert rc == 0, rc\n"
        "print(len(got), max(l for l, _ in got) if got else 0)\n"
        "print(any('up' in line for _, line in got))\n"
        "# the sink is left installed: atexit removes it before the interpreter goes\n"
    )
    env = dict(os.environ, SHMIPC_LOG_LEVEL="debug",
               PYTHONPATH=os.path.dirname(os.path.dirname(shmipc.__file__)))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    count, top = r.stdout.split("\n")[0].split()
    assert int(count) >= 1 and int(top) == 4
    assert r.stdout.split("\n")[1] == "True"
    # the lines of the run went to the sink; only the sessions' teardown after atexit (the
    # sink removed) may reach stderr
    assert " up: " not in r.stderr


def test_log_sink_exception_is_unraisable(config):
    address = addr("unraisable")
    rc, lst = abi.call("shmipc_listener_new", address, config)
    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_type)
    try:
        def sink(level, line):
            raise RuntimeError("boom")

        abi.call("shmipc_set_log_sink", sink)
        bad_handshake(address)
        abi.call("shmipc_listener_accept", lst, 300)
        assert RuntimeError in seen
    finally:
        abi.call("shmipc_set_log_sink", None)
        sys.unraisablehook = old
        abi.call("shmipc_listener_close", lst)


def test_listener_serve_closures(config):
    address = addr("serve")
    rc, lst = abi.call("shmipc_listener_new", address, config)
    assert rc == 0
    got = []
    streams = []

    def on_stream(st):
        assert st.kind == "STREAM"
        streams.append(st)

    def on_data(st):
        rc, data = abi.call("shmipc_stream_read_chunk", st, 100, 1)
        if rc == 0:
            got.append(data)

    box = {}
    t = threading.Thread(
        target=lambda: box.update(rc=abi.call("shmipc_listener_serve", lst, on_stream, on_data)),
        daemon=True)
    t.start()
    rc, client = abi.call("shmipc_session_connect", address, config)
    assert rc == 0
    rc, cs = abi.call("shmipc_session_open_stream", client)
    abi.call("shmipc_stream_write", cs, b"ping")
    abi.call("shmipc_stream_flush", cs)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert abi.call("shmipc_listener_stop", lst) == 0
    t.join(10)
    assert not t.is_alive() and box["rc"] >= 0
    assert b"".join(got) == b"ping"
    # a handle lent to a callback is not usable after the callback
    assert streams and streams[0].released
    with pytest.raises(ValueError, match="released"):
        abi.call("shmipc_stream_id", streams[0])
    abi.call("shmipc_stream_close", cs)
    abi.call("shmipc_session_close", client)
    abi.call("shmipc_listener_close", lst)


def test_http_server_route_closure():
    import urllib.request

    rc, scfg = abi.call("shmipc_server_config_new")
    assert abi.call("shmipc_server_config_set_address", scfg, "127.0.0.1") == 0
    assert abi.call("shmipc_server_config_set_port", scfg, 0) == 0
    assert abi.call("shmipc_server_config_set_workers", scfg, 1) == 0
    rc, srv = abi.call("shmipc_server_new", scfg)
    assert rc == 0 and srv.kind == "SERVER"
    abi.call("shmipc_server_config_free", scfg)
    seen = []

    def handler(req, res):
        assert (req.kind, res.kind) == ("HTTP_REQUEST", "HTTP_RESPONSE")
        seen.append((abi.call("shmipc_http_request_method", req),
                     abi.call("shmipc_http_request_path", req),
                     abi.call("shmipc_http_request_query", req)))
        abi.call("shmipc_http_response_set_status", res, 201)
        abi.call("shmipc_http_response_add_header", res, "Content-Type", "text/plain")
        abi.call("shmipc_http_response_body", res, b"made by python")
        return abi.call("shmipc_http_response_end", res)

    assert abi.call("shmipc_server_route", srv, "GET", "/hello", handler) == 0
    with pytest.raises(TypeError, match="takes 4 arguments"):
        abi.call("shmipc_server_route", srv, "GET", "/x", handler, None, None)
    assert abi.call("shmipc_server_static", srv, "GET", "/static", 200, "text/plain", b"st") == 0
    rc = abi.call("shmipc_server_start", srv)
    if rc < 0:
        abi.call("shmipc_server_free", srv)
        pytest.skip(f"server cannot start here: {abi.call('shmipc_errname', rc)}")
    try:
        port = abi.call("shmipc_server_port", srv)
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello?a=1", timeout=10) as r:
            assert r.status == 201 and r.read() == b"made by python"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/static", timeout=10) as r:
            assert r.read() == b"st"
        assert seen == [(b"GET", b"/hello", b"a=1")]
    finally:
        abi.call("shmipc_server_stop", srv)
        abi.call("shmipc_server_free", srv)  # calls the route's destroy: the closure is freed
    assert srv.released
    ref = weakref.ref(handler)
    del handler
    gc.collect()
    assert ref() is None, "the route's closure was not freed by destroy"


def test_log_sink_closures_are_freed_when_replaced():
    class Sink:
        def __call__(self, level, line):
            pass

    first = Sink()
    ref = weakref.ref(first)
    abi.call("shmipc_set_log_sink", first)
    del first
    gc.collect()
    assert ref() is not None  # kept by the registration
    abi.call("shmipc_set_log_sink", None)
    gc.collect()
    assert ref() is None


def test_stub_matches():
    import ast

    with open(os.path.join(os.path.dirname(abi.__file__), "abi.pyi")) as f:
        tree = ast.parse(f.read())
    declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert set(abi.__all__) <= declared
    for name in abi.__all__:
        assert getattr(abi, name).__doc__


RELEASE_DURING_BLOCKING_CALL = r"""
import socket, sys, threading, time
import shmipc.abi as abi

mode = sys.argv[1]
rc, cfg = abi.call("shmipc_server_config_new")
for setter, value in (("address", "127.0.0.1"), ("port", 0), ("workers", 1)):
    assert abi.call("shmipc_server_config_set_" + setter, cfg, value) == 0
rc, srv = abi.call("shmipc_server_new", cfg)
abi.call("shmipc_server_config_free", cfg)
in_handler, second_done = threading.Event(), threading.Event()

def until_released():
    # srv is marked the moment its close starts; the old code marked it when close returned
    deadline = time.monotonic() + 3
    while not srv.released and time.monotonic() < deadline:
        time.sleep(0.01)

def attempts(who):
    for name in ("shmipc_server_free", "shmipc_server_close", "shmipc_server_port"):
        try:
            abi.call(name, srv)
            print(who, name, "accepted", flush=True)
        except RuntimeError as e:
            print(who, name, "RuntimeError", "being released" in str(e), flush=True)

def handler(req, res):
    in_handler.set()
    if mode == "handler":  # a handler still in flight while the main thread closes the server
        until_released()
        attempts("handler")
    else:
        second_done.wait(10)
    abi.call("shmipc_http_response_set_status", res, 200)
    return 0

assert abi.call("shmipc_server_route", srv, "GET", "/", handler) == 0
assert abi.call("shmipc_server_start", srv) == 0
c = socket.create_connection(("127.0.0.1", abi.call("shmipc_server_port", srv)), timeout=20)
c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
assert in_handler.wait(10)
if mode == "handler":
    abi.call("shmipc_server_close", srv)
else:  # a second thread releases the handle a first thread's close is releasing
    first = threading.Thread(target=abi.call, args=("shmipc_server_close", srv))
    first.start()
    until_released()
    attempts("thread")
    second_done.set()
    first.join(20)
    assert not first.is_alive()
print("closed", srv.released, c.recv(100).startswith(b"HTTP/1.1 200"), flush=True)
"""


@pytest.mark.parametrize("mode", ["handler", "thread"])
def test_a_handle_being_released_is_refused(mode):
    """Regression: a handle passed to a blocking releasing call (shmipc_server_close) was
    marked released only when the call returned, so a route handler in flight (SIGSEGV) or
    another thread (a hang in pthread_join) could release it again meanwhile. It is marked
    before the call now: every use during the call raises RuntimeError."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(shmipc.__file__)))
    r = subprocess.run([sys.executable, "-c", RELEASE_DURING_BLOCKING_CALL, mode], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        f"{mode} shmipc_server_free RuntimeError True",
        f"{mode} shmipc_server_close RuntimeError True",
        f"{mode} shmipc_server_port RuntimeError True",
        "closed True True",
    ]
