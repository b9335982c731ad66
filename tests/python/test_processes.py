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
