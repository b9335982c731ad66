"""Python to Python across processes: a server process (multiprocessing) and a client here,
and the reverse with a subprocess client, over V3, V2 and V4; the peer process dying."""
import hashlib
import multiprocessing
import os
import signal
import struct
import subprocess
import sys

import pytest

import shmipc
from conftest import default_config, python_env, unique_address


def echo_server_process(address, memmap, ready):
    """Runs in a child process: serves one session whose streams it echoes, then exits."""
    with shmipc.Listener(address) as listener:
        ready.set()
        with listener.accept(timeout=20) as session:
            try:
                while True:
                    with session.accept_stream(timeout=20) as st:
                        while True:
                            chunk = st.read_chunk()
                            if not chunk:
                                break
                            st.write(chunk)
                            chunk.release()
                            st.flush()
            except shmipc.PeerGoneError:
                return  # the client closed its session (a hard close may beat a stream's end)


@pytest.mark.parametrize("mode", ["v3", "v2", "v4"])
def test_client_here_server_in_another_process(mode):
    address = unique_address("mp")
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=echo_server_process, args=(address, mode, ready))
    proc.start()
    try:
        assert ready.wait(30)
        cfg = default_config(memmap="devshm" if mode == "v2" else "memfd")
        if mode == "v4":
            cfg.with_v4_eventfd()
        with shmipc.connect(address, cfg) as session:
            assert session.version == {"v3": 3, "v2": 2, "v4": 4}[mode]
            for n in range(3):
                with session.open_stream() as st:
                    for size in (1, 1000, 100000, 1 << 20):
                        data = os.urandom(size)
                        st.write(data)
                        st.flush()
                        assert st.readexactly(size) == data
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


CLIENT = r"""
import hashlib, os, struct, sys
import shmipc
address, memmap = sys.argv[1], sys.argv[2]
with shmipc.connect(address, shmipc.Config(memmap=memmap, read_timeout=20)) as s:
    with s.open_stream() as st:
        messages = [os.urandom(1 + (i * 7919) % 70000) for i in range(200)]
        st.write(struct.pack(">Q", sum(map(len, messages))))
        for data in messages:
            st.write(data)
            st.flush()
        digest = hashlib.sha256(b"".join(messages)).hexdigest()
        assert st.readexactly(64).decode() == digest
print("ok")
"""


@pytest.mark.parametrize("memmap", ["memfd", "devshm"])
def test_server_here_client_in_another_process(address, memmap):
    with shmipc.Listener(address, default_config()) as listener:
        client = subprocess.Popen([sys.executable, "-c", CLIENT, address, memmap],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=python_env())
        try:
            with listener.accept(timeout=20) as session, session.accept_stream(timeout=20) as st:
                (left,) = struct.unpack(">Q", st.readexactly(8))
                digest = hashlib.sha256()
                while left:
                    chunk = st.read_chunk(left)
                    assert chunk, "the client ended early"
                    digest.update(chunk)
                    left -= len(chunk)
                    chunk.release()
                st.write(digest.hexdigest().encode())
                st.flush()
                try:
                    assert st.read() == b""
                except shmipc.PeerGoneError:
                    pass  # the client's hard close came first
            out, err = client.communicate(timeout=30)
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
    assert client.returncode == 0, err
    assert out.strip() == "ok"


def test_peer_process_killed_fails_reads_promptly(address):
    code = r"""
import sys, time, shmipc
with shmipc.connect(sys.argv[1]) as s:
    st = s.open_stream(); st.write(b"hi"); st.flush()
    print("connected", flush=True)
    time.sleep(60)
"""
    with shmipc.Listener(address, default_config()) as listener:
        child = subprocess.Popen([sys.executable, "-c", code, address], stdout=subprocess.PIPE,
                                 text=True, env=python_env())
        try:
            with listener.accept(timeout=20) as session:
                st = session.accept_stream(timeout=20)
                assert st.readexactly(2) == b"hi"
                assert child.stdout.readline().strip() == "connected"
                child.send_signal(signal.SIGKILL)
                with pytest.raises(shmipc.PeerGoneError):
                    st.read()
                st.close()
        finally:
            child.kill()
            child.wait()
            child.stdout.close()


FORKED = r"""
import http.client, os, sys, threading, time
import shmipc
import shmipc.abi as abi

mode, base = sys.argv[1], sys.argv[2]

def accepted(listener, connect):
    box = {}
    t = threading.Thread(target=lambda: box.update(s=listener.accept(timeout=10)), daemon=True)
    t.start()
    peer = connect()
    t.join(10)
    return peer, box.get("s")

path, mpath = os.path.join(base, "l.sock"), os.path.join(base, "m.sock")
cfg = shmipc.Config(read_timeout=5, write_timeout=5, initialize_timeout=5)  # no check hangs
L, ML = shmipc.Listener("unix:" + path, cfg), shmipc.Listener("unix:" + mpath, cfg)
c, s = accepted(L, lambda: shmipc.connect("unix:" + path, cfg))
a = c.open_stream()
a.write(b"before")
a.flush()
b = s.accept_stream(timeout=20)
ch = b.read_chunk()  # kept by the parent; the child's copy is dropped at its exit
m, ms = accepted(ML, lambda: shmipc.SessionManager("unix:" + mpath, cfg))
mst = m.get_stream()
mst.write(b"m")
mst.flush()
mb = ms.accept_stream(timeout=20)
assert mb.read() == b"m"
(rc, ah), s2 = accepted(L, lambda: abi.call("shmipc_session_connect", "unix:" + path, None))
srv = shmipc.Server("127.0.0.1", 0, workers=1)
srv.static("/", "ok")
srv.start()
objects = [a, b, mst, mb, c, s, s2, ms, m, ML, L, srv]

pid = os.fork()
if pid == 0:
    if mode == "close":  # the child closes what it inherited: forgotten, the parent's untouched
        for o in objects:
            o.close()
        assert all(o.closed for o in objects)
        try:
            a.write(b"x")
            os._exit(3)
        except shmipc.ClosedError:
            pass
    sys.exit(0)  # a normal exit: every object deallocated, the atexit hooks run
for _ in range(300):  # at most 30 s
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child", os.waitstatus_to_exitcode(status), flush=True)
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("child hung", flush=True)

def check(label, fn):  # each check on its own, so that a failure shows which object broke
    try:
        print(label, fn(), flush=True)
    except Exception as e:
        print(label, type(e).__name__, e, flush=True)

def stream():
    a.write(b"after")
    a.flush()
    b.write(b"back")
    b.flush()
    return b.read(), a.read(), bytes(ch)

def new_stream():
    a2 = c.open_stream()
    a2.write(b"new")
    a2.flush()
    return s.accept_stream(timeout=5).read()

def manager():
    mst.write(b"m2")
    mst.flush()
    return mb.read()

def listener():
    c3, s3 = accepted(L, lambda: shmipc.connect("unix:" + path, cfg))
    return c3.status, s3.status

def server():
    h = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    h.request("GET", "/")
    r = h.getresponse()
    return r.status, r.read()

check("stream", stream)
check("new stream", new_stream)
check("manager", manager)
check("files", lambda: (os.path.exists(path), os.path.exists(mpath)))
check("listener", listener)
check("status", lambda: (c.status, s.status, s2.status, abi.call("shmipc_session_status", ah)))
check("server", server)
"""


@pytest.mark.parametrize("mode", ["exit", "close"])
def test_a_fork_child_leaves_the_parents_objects_alone(mode, tmp_path):
    """Regression: a fork() child that exited normally closed what it inherited at its
    deallocs (the parent's next stream failed with PeerGoneError) and its Listener removed the
    parent's socket file. Now, in the child, dealloc and close() only forget Session, Stream,
    Chunk, SessionManager, Listener, Server and shmipc.abi handles: the parent goes on."""
    r = subprocess.run([sys.executable, "-c", FORKED, mode, str(tmp_path)], capture_output=True,
                       text=True, env=python_env(), timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "child 0",
        "stream (b'after', b'back', b'before')",
        "new stream b'new'",
        "manager b'm2'",
        "files (True, True)",
        "listener (0, 0)",
        "status (0, 0, 0, 0)",
        "server (200, b'ok')",
    ]
