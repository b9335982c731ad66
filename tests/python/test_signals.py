"""Ctrl-C interrupts blocked calls: a child process blocks (no timeout) in a read, an accept
or an accept_stream, and gets SIGINT from a thread of its own or from this process once it is
blocked there; KeyboardInterrupt must come within about a second."""
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import python_env, sigint_default, unique_address

CHILD = r"""
import os, signal, sys, threading, time
import shmipc

address, op, sender = sys.argv[1], sys.argv[2], sys.argv[3]
listener = shmipc.Listener(address)
box = {}
if op != "accept":
    t = threading.Thread(target=lambda: box.setdefault("c", shmipc.connect(address)))
    t.start()
    server = listener.accept(timeout=10)
    t.join()
    client = box["c"]
    cs = client.open_stream()
    cs.write(b"\0")
    cs.flush()
    ss = server.accept_stream(timeout=10)
    ss.readexactly(1)
calls = {
    "read_chunk": lambda: ss.read_chunk(),
    "read_exact_bytes": lambda: ss.read_exact_bytes(10),
    "readexactly": lambda: ss.readexactly(10),
    "accept_stream": lambda: server.accept_stream(),
    "accept": lambda: listener.accept(),
}
if sender == "self":
    # A thread of this process sends it, when the test says "go" (the call is blocked then).
    def on_go():
        if sys.stdin.readline() == "go\n":
            os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=on_go, daemon=True).start()
print("ready", flush=True)
try:
    calls[op]()
except KeyboardInterrupt:
    # CLOCK_MONOTONIC is one clock for every process: the test compares it with its own.
    print("interrupted %.6f" % time.monotonic(), flush=True)
    sys.exit(0)
print("returned", flush=True)
sys.exit(1)
"""


def blocked(pid, timeout=10):
    """Whether the main thread of `pid` sleeps in the kernel within `timeout` s: its blocking
    call is under way. No other thread of the child holds the GIL then (the "self" sender waits
    in a read, the GIL released), so that sleep is no wait for the GIL, and nothing else after
    the "ready" line sleeps. A fixed 0.3 s after "ready" could signal a child that a loaded
    machine had not let reach the call yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "S":
                return True
        time.sleep(0.005)
    return False


@pytest.mark.parametrize("sender", ["self", "parent"])
@pytest.mark.parametrize("op", ["read_chunk", "read_exact_bytes", "readexactly",
                                "accept_stream", "accept"])
def test_ctrl_c_interrupts_a_blocked_call(op, sender):
    child = subprocess.Popen([sys.executable, "-c", CHILD, unique_address("sig"), op, sender],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=python_env(),
                             preexec_fn=sigint_default)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert blocked(child.pid), "the child never blocked in the call"
        sent = time.monotonic()
        if sender == "parent":
            child.send_signal(signal.SIGINT)
        else:
            child.stdin.write("go\n")
            child.stdin.flush()
        out, err = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, (out, err)
    # Interrupted by the signal, not before it; the call must notice it within about a second.
    assert 0 <= float(out.split()[1]) - sent < 1.5, (out, sent)


def test_signal_handler_that_does_not_raise_lets_the_read_go_on():
    code = r"""
import os, signal, sys, threading
import shmipc
address = sys.argv[1]
hits = []
signal.signal(signal.SIGUSR1, lambda *a: hits.append(1))
l = shmipc.Listener(address)
box = {}
t = threading.Thread(target=lambda: box.setdefault("c", shmipc.connect(address)))
t.start(); s = l.accept(timeout=10); t.join()
cs = box["c"].open_stream(); cs.write(b"\0"); cs.flush()
ss = s.accept_stream(timeout=10); ss.readexactly(1)
def later():
    os.kill(os.getpid(), signal.SIGUSR1)
    threading.Timer(0.3, lambda: (cs.write(b"done"), cs.flush())).start()
threading.Timer(0.2, later).start()
print(ss.readexactly(4), len(hits))
"""
    out = subprocess.run([sys.executable, "-c", code, unique_address("usr1")], capture_output=True,
                         text=True, env=python_env(), timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "b'done' 1"
