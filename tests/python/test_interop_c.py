"""Python against the C greeters (examples/c): a Python client against greeter_server and a
Python server (accept, and serve() with callbacks) against greeter_client, over V3 (memfd)
and V2 (/dev/shm files); and the Python example programs paired with the C ones."""
import os
import subprocess
import sys
import threading

import pytest

import shmipc
from conftest import BUILD, ROOT, python_env, unique_address

REQUEST = b"client say hello world!!!"
REPLY = b"server hello world!!!"
C_SERVER = os.path.join(BUILD, "examples", "c", "greeter_server")
C_CLIENT = os.path.join(BUILD, "examples", "c", "greeter_client")
PY_SERVER = os.path.join(ROOT, "examples", "python", "greeter_server.py")
PY_CLIENT = os.path.join(ROOT, "examples", "python", "greeter_client.py")


def start(argv, env=None):
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    line = proc.stdout.readline()
    assert "listening on" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


def finish(proc):
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, err)
    return out


@pytest.mark.parametrize("memmap, version", [("memfd", 3), ("devshm", 2)])
def test_python_client_against_c_server(memmap, version):
    address = unique_address("c-server")
    server = start([C_SERVER, address, "1"])
    cfg = shmipc.Config(memmap=memmap, path_prefix="/dev/shm/client.ipc.shm", read_timeout=10,
                        initialize_timeout=10)
    with shmipc.connect(address, cfg) as session, session.open_stream() as st:
        assert session.version == version
        st.write(REQUEST)
        st.flush()
        with st.read_exact_bytes(len(REPLY)) as reply:
            assert reply == REPLY
    out = finish(server)
    assert f"session with protocol V{version}" in out
    assert "server receive request message:" + REQUEST.decode() in out


@pytest.mark.parametrize("proto, version", [("v3", 3), ("v2", 2)])
def test_python_server_against_c_client(proto, version):
    address = unique_address("c-client")
    with shmipc.Listener(address, shmipc.Config(read_timeout=10, initialize_timeout=10)) as listener:
        client = subprocess.Popen([C_CLIENT, address, proto], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        with listener.accept(timeout=10) as session:
            assert session.version == version
            with session.accept_stream(timeout=10) as st:
                assert st.readexactly(len(REQUEST)) == REQUEST
                st.write(REPLY)
                st.flush()
                # The client closes its stream and then its session at once (a hard close):
                # we see the end of the stream, or the session's end if that came first.
                try:
                    assert st.read() == b""
                except shmipc.PeerGoneError:
                    pass
        out = finish(client)
    assert "client stream receive response " + REPLY.decode() in out


def test_python_serve_against_c_clients():
    address = unique_address("c-serve")
    listener = shmipc.Listener(address)
    answered = []

    def on_data(st):
        try:
            request = st.readexactly(len(REQUEST), nonblock=True)
        except shmipc.EndOfStreamError:
            st.close()
            return
        except shmipc.Error:
            st.close()  # the client went away
            return
        if request is not None:
            assert request == REQUEST
            st.write(REPLY)
            st.flush()
            answered.append(st.id)

    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", listener.serve(lambda st: None,
                                                                           on_data)))
    t.start()
    try:
        for proto in ("v3", "v2", "v3"):
            out = subprocess.run([C_CLIENT, address, proto], capture_output=True, text=True,
                                 timeout=30)
            assert out.returncode == 0, out.stderr
            assert "client stream receive response " + REPLY.decode() in out.stdout
    finally:
        listener.stop()
        t.join(10)
        listener.close()
    assert answered == [2, 2, 2] and "r" in box


@pytest.mark.parametrize("proto", ["v3", "v2"])
def test_python_example_client_against_c_server(proto):
    address = unique_address("ex-client")
    server = start([C_SERVER, address, "1"])
    out = subprocess.run([sys.executable, PY_CLIENT, address, proto], capture_output=True,
                         text=True, env=python_env(), timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"client stream send request:{REQUEST.decode()} (protocol V{proto[1]})",
        f"client stream receive response {REPLY.decode()}",
    ]
    finish(server)


def test_python_example_server_against_c_and_python_clients():
    address = unique_address("ex-server")
    server = start([sys.executable, PY_SERVER, address, "3"], env=python_env())
    for argv in ([C_CLIENT, address, "v3"], [C_CLIENT, address, "v2"],
                 [sys.executable, PY_CLIENT, address, "v3"]):
        out = subprocess.run(argv, capture_output=True, text=True, env=python_env(), timeout=30)
        assert out.returncode == 0, (argv, out.stderr)
        assert "client stream receive response " + REPLY.decode() in out.stdout
    out = finish(server)
    assert out.count("server receive request message:" + REQUEST.decode()) == 3
    assert "protocol V2" in out and "protocol V3" in out
