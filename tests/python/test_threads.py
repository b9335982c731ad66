"""Threads: blocking calls release the GIL, different streams of one session run in parallel,
one stream refuses a second thread, and close() from another thread ends a blocked call."""
import os
import threading
import time

import pytest

import shmipc
from conftest import default_config


def send(st, data):
    st.write(data)
    st.flush()


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return False


def blocked_in_kernel(tid):
    """True when thread `tid` sleeps in a system call (poll or a futex wait, not running)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state == "S"


def busy(stream):
    """True while another thread is inside a blocking call on `stream`."""
    try:
        stream.available
    except RuntimeError:
        return True
    return False


def test_reads_on_two_streams_block_at_once_and_both_finish(pair):
    (ca, sa), (cb, sb) = pair.streams(), pair.streams()
    results, tids = {}, {}

    def reader(name, st):
        tids[name] = threading.get_native_id()
        results[name] = st.readexactly(5)

    threads = [threading.Thread(target=reader, args=("a", sa)),
               threading.Thread(target=reader, args=("b", sb))]
    for t in threads:
        t.start()
    # Both readers are inside their reads at the same time, asleep in the kernel, and this
    # thread runs meanwhile: the reads hold neither the GIL nor a lock of the other stream.
    assert wait_until(lambda: busy(sa) and busy(sb))
    assert wait_until(lambda: len(tids) == 2 and all(blocked_in_kernel(t) for t in tids.values()))
    # Release b first while a stays blocked, then a.
    send(cb, b"bbbbb")
    threads[1].join(10)
    assert results.get("b") == b"bbbbb" and threads[0].is_alive() and busy(sa)
    send(ca, b"aaaaa")
    threads[0].join(10)
    assert results.get("a") == b"aaaaa"


def test_many_threads_many_streams(echo_server):
    session = shmipc.connect(echo_server.address, default_config())
    errors = []

    def client(seed):
        try:
            with session.open_stream() as st:
                for i in range(300):
                    msg = b"%d:%d:" % (seed, i) + os.urandom(seed * 37 % 500)
                    send(st, msg)
                    assert st.readexactly(len(msg)) == msg
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    session.close()
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)


def test_one_stream_refuses_a_second_thread(pair):
    cs, ss = pair.streams()
    t = threading.Thread(target=lambda: ss.read())
    t.start()
    assert wait_until(lambda: busy(ss))
    with pytest.raises(RuntimeError, match="another thread"):
        ss.read(nonblock=True)
    with pytest.raises(RuntimeError):
        ss.write(b"x")
    with pytest.raises(RuntimeError):
        ss.release()
    send(cs, b"go")
    t.join(10)
    assert not busy(ss)
    ss.write(b"x")  # usable again


def test_close_from_another_thread_ends_a_blocked_read(pair):
    cs, ss = pair.streams()
    ss.read_timeout = None  # forever: only the close can end it
    box = {}

    def reader():
        try:
            box["result"] = ss.read_chunk()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=reader)
    t.start()
    assert wait_until(lambda: busy(ss))
    ss.close()
    assert ss.closed
    t.join(5)
    assert not t.is_alive()
    assert isinstance(box.get("error"), shmipc.ClosedError), box
    # The peer saw the close (the handle was really closed by the reader thread).
    cs.read_timeout = 5
    assert cs.read() == b""


def test_session_close_from_another_thread_ends_accept_stream(pair):
    box = {}

    def acceptor():
        try:
            box["result"] = pair.server.accept_stream()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=acceptor)
    t.start()
    time.sleep(0.05)
    pair.server.close()
    assert pair.server.closed
    t.join(5)
    assert not t.is_alive()
    assert isinstance(box.get("error"), shmipc.ClosedError), box


def test_session_close_fails_blocked_stream_reads_at_once(pair):
    cs, ss = pair.streams()
    cs.read_timeout = None
    box = {}

    def reader():
        try:
            cs.read()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=reader)
    t.start()
    assert wait_until(lambda: busy(cs))
    pair.client.close()
    t.join(5)
    assert isinstance(box.get("error"), shmipc.ClosedError), box


def test_listener_close_from_another_thread_ends_accept(address):
    l = shmipc.Listener(address)
    box = {}

    def acceptor():
        try:
            box["result"] = l.accept()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=acceptor)
    t.start()
    time.sleep(0.05)
    l.close()
    t.join(5)
    assert not t.is_alive()
    assert isinstance(box.get("error"), shmipc.ClosedError), box
    with pytest.raises(shmipc.Error):
        shmipc.connect(address)  # nobody listens any more


def test_gil_is_released_while_flushing_and_connecting(echo_server):
    # Another Python thread keeps running while this one connects and round-trips.
    ticks = [0]
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        with shmipc.connect(echo_server.address, default_config()) as s, s.open_stream() as st:
            for _ in range(200):
                send(st, b"x" * 100)
                st.readexactly(100)
    finally:
        stop.set()
        t.join()
    assert ticks[0] > 0
