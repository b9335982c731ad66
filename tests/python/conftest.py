"""pytest setup: the package is imported from the build tree (PYTHONPATH=<build>/python)."""
import os
import signal
import sys

import pytest

# V4 with the fallback under load: the probe waits 5 s here, not 250 ms (scripts/test.sh).
os.environ.setdefault("SHMIPC_V4_PROBE_TIMEOUT_MS", "5000")

build = os.environ.get("SHMIPC_BUILD_DIR")
# SHMIPC_TEST_INSTALLED=1 (scripts/check-install-python.sh): the package under test is the one
# installed for this interpreter; SHMIPC_BUILD_DIR then only locates the example programs.
installed = os.environ.get("SHMIPC_TEST_INSTALLED") == "1"
if build and not installed:
    sys.path.insert(0, os.path.join(build, "python"))
if installed:
    import shmipc as _installed

    # Fail the whole run if the build tree's copy was picked up instead of the installed one.
    assert build is None or not os.path.abspath(_installed.__file__).startswith(
        os.path.abspath(build) + os.sep), f"shmipc imported from the build tree: {_installed.__file__}"


@pytest.fixture
def shmipc():
    import shmipc as module

    return module


# ---- IPC fixtures (sessions, streams, helper programs) ----------------------------------

import itertools
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = build or os.path.join(ROOT, "build")
_addresses = itertools.count()


def unique_address(tag="t"):
    """An abstract unix address no other test (or process) uses: no file to clean up."""
    return f"unix:@shmipc-py-{os.getpid()}-{tag}-{next(_addresses)}"


@pytest.fixture
def address():
    return unique_address()


def reserved_port():
    """A loopback TCP port for a server that must be told its port in advance (shmipc-serve
    takes 1 .. 65535, not 0), reserved until that server binds it.

    Binding port 0 and closing the socket left the port free: under pytest-xdist another
    worker's bind(0) (a Server(port=0), another test's port) could be handed that same port
    before our server bound it, which then failed with "address in use". Here a connection is
    made to the port and its accepted end closes first, so the port stays in TIME_WAIT (60 s):
    the kernel gives it to no bind(0) and no connect() meanwhile, while a server with
    SO_REUSEADDR (ours) binds it at once."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            accepted, _ = s.accept()
            accepted.close()  # the accepted end closes first: TIME_WAIT on `port`
    return port


class Pair:
    """A listener with one connected client session and its server session."""

    def __init__(self, client_config=None, server_config=None):
        import shmipc

        self.address = unique_address("pair")
        self.listener = shmipc.Listener(self.address, server_config)
        box = {}

        def connect():
            try:
                box["client"] = shmipc.connect(self.address, client_config)
            except BaseException as e:  # reported by the main thread
                box["error"] = e

        t = threading.Thread(target=connect)
        t.start()
        try:
            self.server = self.listener.accept(timeout=10)
        finally:
            t.join(10)
        if "error" in box:
            raise box["error"]
        self.client = box["client"]

    def streams(self):
        """A client stream and the server's end of it (announced by one byte, read here)."""
        cs = self.client.open_stream()
        cs.write(b"\0")
        cs.flush()
        ss = self.server.accept_stream(timeout=10)
        assert ss.readexactly(1) == b"\0"
        return cs, ss

    def close(self):
        self.client.close()
        self.server.close()
        self.listener.close()


def default_config(**kw):
    """A config whose reads give up after 10 s, so a broken test fails instead of hanging.

    Its handshake may take 10 s too: at the library's 1 s default, a thread stalled for a
    second on a loaded machine (CI beside other builds) failed whichever pair was being made
    ("handshake failed: SHMIPC_ETIMEDOUT" on the listener's side). Tests of the handshake
    timeout itself pass their own."""
    import shmipc

    kw.setdefault("read_timeout", 10.0)
    kw.setdefault("initialize_timeout", 10.0)
    return shmipc.Config(**kw)


@pytest.fixture
def make_pair():
    made = []

    def make(client_config=None, server_config=None):
        # The handshake may take as long as the fixture's accept waits (10 s): see
        # default_config.
        p = Pair(client_config or default_config(), server_config or default_config())
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
def pair(make_pair):
    return make_pair()


def python_env():
    """The environment for a child Python that imports the package from the build."""
    import shmipc

    pkg_parent = os.path.dirname(os.path.dirname(shmipc.__file__))
    return dict(os.environ, PYTHONPATH=pkg_parent)


# ---- processes a test starts -----------------------------------------------------------


def alive(pid):
    """Whether process `pid` still runs. An exited process not yet reaped (a zombie) has
    ended: a worker whose supervisor was killed is reparented to PID 1, which reaps on its
    own schedule (every 2 s here, later under load), so a zombie must not count as alive."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def children(pid):
    """The pids of the processes `pid` started (any of its threads)."""
    out = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(c) for c in f.read().split())
    except (FileNotFoundError, ProcessLookupError):
        pass
    return {c for c in out if alive(c)}


def kill_tree(p):
    """Kills process `p` (a Popen) and the processes it started (shmipc-serve's workers, an
    app's children), when a test left it running."""
    if p.poll() is None:
        for c in children(p.pid):
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it ended meanwhile
        p.kill()
        p.wait()


def sigint_default():
    """preexec_fn for a child that gets SIGINT (Ctrl-C) in a test.

    A background job of a non-interactive shell (`bash scripts/test.sh </dev/null >log 2>&1 &`)
    starts with SIGINT ignored, and an ignored disposition survives fork and exec; a child Python
    then never installs its KeyboardInterrupt handler. subprocess's restore_signals covers only
    SIGPIPE, SIGXFZ and SIGXFSZ, so a test that sends SIGINT resets it here, in the child, before exec.
    Only async-signal-safe work happens here (one sigaction)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


class EchoServer:
    """A Python server on its own thread, run by Listener.serve(): it echoes every stream and
    closes a stream when the client does."""

    def __init__(self, config=None, address=None):
        import shmipc

        self.address = address or unique_address("echo")
        self.listener = shmipc.Listener(self.address, config)
        self.streams = 0
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def on_stream(self, st):
        self.streams += 1

    def on_data(self, st):
        import shmipc

        try:
            while True:
                chunk = st.read_chunk(nonblock=True)
                if chunk is None:
                    return
                if not chunk:
                    break
                st.write(chunk)
                chunk.release()
                st.flush()
        except shmipc.Error:
            pass  # the client went away
        st.close()

    def _run(self):
        try:
            self.listener.serve(self.on_stream, self.on_data)
        except BaseException as e:
            self.error = e

    def stop(self):
        self.listener.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.listener.close()
        if self.error is not None:
            raise self.error


@pytest.fixture
def echo_server():
    server = EchoServer()
    yield server
    server.stop()
