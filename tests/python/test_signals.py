"""Ctrl-C interrupts blocked calls: a child process blocks (no timeout) in a read, an accept
or an accept_stream, and gets SIGINT from a timer thread of its own or from this process;
KeyboardInterrupt must come within about a second."""
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
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
print("ready", flush=True)
t0 = time.monotonic()
try:
    calls[op]()
except KeyboardInterrupt:
    print("interrupted %.3f" % (time.monotonic() - t0), flush=True)
    sys.exit(0)
print("returned", flush=True)
sys.exit(1)
"""


@pytest.mark.parametrize("sender", ["self", "parent"])
@pytest.mark.parametrize("op", ["read_chunk", "read_exact_bytes", "readexactly",
                                "accept_stream", "accept"])
def test_ctrl_c_interrupts_a_blocked_call(op, sender):
    child = subprocess.Popen([sys.executable, "-c", CHILD, unique_address("sig"), op, sender],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=python_env(), preexec_fn=sigint_default)
    try:
        assert child.stdout.readline().strip() == "ready"
        if sender == "parent":
            time.sleep(0.3)
            child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, (out, err)
    elapsed = float(out.split()[1])
    # The signal comes 0.3 s after "ready"; the call must notice it within about a second.
    assert 0.2 < elapsed < 1.5, out


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
