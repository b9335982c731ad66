"""Listener.serve() with Python callables as callbacks: echoing many clients, stop(), an
exception in a callback, close() while serving, and Ctrl-C while serving."""
import subprocess
import sys
import threading
import time

import pytest

import shmipc
from conftest import default_config, python_env, sigint_default, unique_address


def send(st, data):
    st.write(data)
    st.flush()


def run_serve(listener, on_stream, on_data=None):
    box = {}

    def run():
        try:
            listener.serve(on_stream, on_data)
            box["returned"] = True
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, box


def test_echo_many_clients_and_streams(echo_server):
    sessions = [shmipc.connect(echo_server.address, default_config()) for _ in range(3)]
    streams = [s.open_stream() for s in sessions for _ in range(4)]
    for round_ in range(20):
        for i, st in enumerate(streams):
            send(st, b"%d-%d" % (i, round_))
        for i, st in enumerate(streams):
            expect = b"%d-%d" % (i, round_)
            assert st.readexactly(len(expect)) == expect
    for st in streams:
        st.close()
    for s in sessions:
        s.close()
    assert echo_server.streams == 12


def test_callbacks_run_on_the_serving_thread_and_get_the_same_stream(address):
    seen = {"threads": set(), "objects": []}
    l = shmipc.Listener(address)

    def on_stream(st):
        seen["threads"].add(threading.get_ident())
        seen["objects"].append(st)

    def on_data(st):
        seen["threads"].add(threading.get_ident())
        assert st is seen["objects"][0]
        while (chunk := st.read(nonblock=True)) is not None:
            if not chunk:
                st.close()
                l.stop()
                return
            send(st, chunk.upper())

    t, box = run_serve(l, on_stream, on_data)
    with shmipc.connect(address, default_config()) as s, s.open_stream() as st:
        send(st, b"hello")
        assert st.readexactly(5) == b"HELLO"
    t.join(10)
    assert box.get("returned"), box
    assert seen["threads"] == {t.ident}
    l.close()


def test_exception_in_on_data_stops_serving_and_is_raised(address):
    l = shmipc.Listener(address)

    def on_data(st):
        if st.read(nonblock=True):
            raise ValueError("boom")

    t, box = run_serve(l, lambda st: None, on_data)
    s = shmipc.connect(address, default_config(read_timeout=5.0))
    st = s.open_stream()
    send(st, b"x")
    t.join(10)
    assert not t.is_alive()
    assert isinstance(box.get("error"), ValueError) and str(box["error"]) == "boom"
    # serve() closed its sessions when it returned: the client sees the server go.
    with pytest.raises(shmipc.PeerGoneError):
        st.read()
    s.close()
    l.close()


def test_exception_in_on_stream_stops_serving(address):
    l = shmipc.Listener(address)

    def on_stream(st):
        raise KeyError("no streams today")

    t, box = run_serve(l, on_stream, None)
    with shmipc.connect(address, default_config()) as s:
        send(s.open_stream(), b"x")
        t.join(10)
    assert isinstance(box.get("error"), KeyError)
    l.close()


def test_serve_again_after_an_exception(address):
    l = shmipc.Listener(address)
    calls = []

    def on_stream(st):
        calls.append(st)
        if len(calls) == 1:
            raise RuntimeError("first")

    t, box = run_serve(l, on_stream)
    with shmipc.connect(address, default_config()) as s:
        send(s.open_stream(), b"x")
        t.join(10)
    assert isinstance(box.get("error"), RuntimeError)
    t, box = run_serve(l, on_stream)
    with shmipc.connect(address, default_config()) as s:
        send(s.open_stream(), b"y")
        for _ in range(1000):
            if len(calls) == 2:
                break
            time.sleep(0.01)
        l.stop()
        t.join(10)
    assert box.get("returned") and len(calls) == 2
    l.close()


def test_stop_from_another_thread_and_streams_after_serve(address):
    l = shmipc.Listener(address)
    kept = []
    t, box = run_serve(l, kept.append)
    s = shmipc.connect(address, default_config())
    cs = s.open_stream()
    send(cs, b"x")
    for _ in range(1000):
        if kept:
            break
        time.sleep(0.01)
    l.stop()
    t.join(10)
    assert box.get("returned")
    # The kept stream is a valid object whose session serve() closed: what was received
    # drains, then reads fail.
    assert kept[0].read() == b"x"
    with pytest.raises(shmipc.ClosedError):
        kept[0].read()
    kept[0].close()
    s.close()
    l.close()


def test_stop_before_serve_returns_at_once(address):
    with shmipc.Listener(address) as l:
        l.stop()
        l.serve(lambda st: None)  # returns at once


def test_close_from_a_callback(address):
    l = shmipc.Listener(address)

    def on_stream(st):
        l.close()  # serving: stop now, close when serve returns

    t, box = run_serve(l, on_stream)
    with shmipc.connect(address, default_config()) as s:
        send(s.open_stream(), b"x")
        t.join(10)
    assert box.get("returned") and l.closed
    with pytest.raises(shmipc.ClosedError):
        l.accept(timeout=0)


def test_second_serve_is_refused(address):
    # The second serve() once the first serves (a stream reached its on_stream): after a
    # fixed 0.1 s the first one could still be starting, and the second would serve, for good.
    l = shmipc.Listener(address)
    serving = threading.Event()
    t, box = run_serve(l, lambda st: serving.set())
    with shmipc.connect(address, default_config()) as s:
        send(s.open_stream(), b"x")
        assert serving.wait(10)
        with pytest.raises(shmipc.Error) as ei:
            l.serve(lambda st: None)
        assert ei.value.name == "SHMIPC_EBUSY"
        l.stop()
        t.join(10)
    assert box.get("returned")
    l.close()


def test_callbacks_must_be_callable(address):
    with shmipc.Listener(address) as l:
        with pytest.raises(TypeError):
            l.serve(None)
        with pytest.raises(TypeError):
            l.serve(print, 42)


def test_ctrl_c_while_serving_with_traffic():
    code = r"""
import os, signal, sys, threading, time
import shmipc
address = sys.argv[1]
l = shmipc.Listener(address)
def client():
    with shmipc.connect(address) as s, s.open_stream() as st:
        for i in range(2000):
            st.write(b"x"); st.flush()
            time.sleep(0.01)
threading.Thread(target=client, daemon=True).start()
served = threading.Event()
def on_data(st):
    served.set()
    while st.read(nonblock=True):
        pass
# Ctrl-C once serve() runs with traffic (its on_data called), not after a fixed 0.3 s, which
# a loaded machine could spend before serve() began.
sent = []
def ctrl_c():
    served.wait(20)
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=ctrl_c, daemon=True).start()
try:
    l.serve(lambda st: None, on_data)
except KeyboardInterrupt:
    print("interrupted %.3f" % (time.monotonic() - sent[0]))
"""
    out = subprocess.run([sys.executable, "-c", code, unique_address("serve-int")],
                         capture_output=True, text=True, env=python_env(), timeout=30,
                         preexec_fn=sigint_default)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("interrupted"), out.stdout
    assert float(out.stdout.split()[1]) < 1.5
