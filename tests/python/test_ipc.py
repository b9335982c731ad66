"""Sessions and streams from Python: round trips, EOF, non-blocking reads, timeouts, errors,
closing, and the protocol versions (V2 over /dev/shm files, V3 over memfd, V4)."""
import errno
import os
import time

import pytest

import shmipc
from conftest import default_config, unique_address


def test_round_trip(pair):
    cs, ss = pair.streams()
    assert cs.id == ss.id == 2
    assert cs.write(b"hello") == 5
    cs.flush()
    assert ss.readexactly(5) == b"hello"
    ss.write(bytearray(b"world"))
    ss.write(memoryview(b"!!"))
    ss.flush()
    assert cs.read_exact_bytes(7) == b"world!!"


def test_session_attributes(pair):
    assert pair.client.role == "client" and pair.server.role == "server"
    assert pair.client.version == pair.server.version == 3
    assert pair.client.status == 0 and not pair.client.closed
    assert isinstance(pair.client.fileno(), int) and pair.client.fileno() >= 0
    assert pair.client.process() >= 0
    assert "client V3" in repr(pair.client)
    assert shmipc.Session.connect is not None and shmipc.connect is not None


def test_spin_before_sleeping(pair):
    # spin() for event loops: a message already queued is processed by it (True on a machine
    # with two CPUs); an idle spin gives up (False) and a later message still wakes fileno().
    import os
    import select

    cs = pair.client.open_stream()
    cs.write(b"tick")
    cs.flush()
    spun = pair.server.spin()
    assert spun is (os.cpu_count() > 1)
    if not spun:
        assert select.select([pair.server.fileno()], [], [], 5)[0]
        pair.server.process()
    ss = pair.server.accept_stream(nonblock=True)
    assert ss.readexactly(4, nonblock=True) == b"tick"
    for i in range(20):
        assert pair.server.spin() is False
        cs.write(b"tock")
        cs.flush()
        assert select.select([pair.server.fileno()], [], [], 5)[0], "a lost wakeup"
        pair.server.process()
        assert ss.readexactly(4, nonblock=True) == b"tock"
    with pytest.raises(TypeError):
        pair.server.spin(1)
    pair.server.close()
    with pytest.raises(shmipc.ClosedError):
        pair.server.spin()


def test_stream_ids_count_up(pair):
    ids = [pair.client.open_stream().id for _ in range(3)]
    assert ids == [2, 3, 4]


def test_many_streams_interleaved(pair):
    pairs = [pair.streams() for _ in range(8)]
    for i, (cs, _) in enumerate(pairs):
        cs.write(b"%d" % i)
        cs.flush()
    for i, (_, ss) in reversed(list(enumerate(pairs))):
        assert ss.read() == b"%d" % i


@pytest.mark.parametrize("size", [1, 100, 8172, 8173, 40000, 200000, 4 << 20])
def test_sizes_round_trip_exactly(pair, size):
    cs, ss = pair.streams()
    data = os.urandom(size)
    cs.write(data)
    cs.flush()
    got = ss.read_exact_bytes(size)
    assert len(got) == size and bytes(got) == data
    got.release()
    ss.write(data)
    ss.flush()
    parts = []
    while sum(map(len, parts)) < size:
        parts.append(cs.read(max=65536))
    assert b"".join(parts) == data


def test_read_chunk_max(pair):
    cs, ss = pair.streams()
    cs.write(b"abcdefgh")
    cs.flush()
    assert ss.read_chunk(3) == b"abc"
    assert ss.read_chunk(max=2) == b"de"
    assert ss.available == 3
    assert ss.read_chunk() == b"fgh"
    assert ss.available == 0


def test_reserve_commit_writes_in_place(pair):
    cs, ss = pair.streams()
    with cs.reserve(16) as buf:
        assert len(buf) == 16 and not buf.readonly
        buf[:5] = b"hello"
    cs.commit(5)
    cs.write(b" and more")
    cs.flush()
    assert ss.readexactly(14) == b"hello and more"


def test_eof_conventions(pair):
    cs, ss = pair.streams()
    cs.write(b"tail")
    cs.flush()
    cs.close()
    # Data sent before the close drains first, then the stream ends.
    with pytest.raises(shmipc.EndOfStreamError) as ei:
        ss.read_exact_bytes(10)
    assert isinstance(ei.value, EOFError) and ei.value.name == "SHMIPC_EEOF"
    assert ss.available == 4  # the bytes stay unread
    assert ss.read() == b"tail"
    end = ss.read_chunk()
    assert len(end) == 0 and not end and end == b""
    assert ss.read() == b""
    assert ss.read(nonblock=True) == b""  # end of stream, not "no data yet"
    with pytest.raises(shmipc.EndOfStreamError):
        ss.readexactly(1)


def test_nonblocking_reads_return_none(pair):
    cs, ss = pair.streams()
    assert ss.read_chunk(nonblock=True) is None
    assert ss.read(nonblock=True) is None
    assert ss.read_exact_bytes(2, nonblock=True) is None
    cs.write(b"x")
    cs.flush()
    deadline = time.monotonic() + 10
    got = None
    while got is None and time.monotonic() < deadline:
        got = ss.read_exact_bytes(2, nonblock=True)  # one byte is not enough
        if got is None and ss.available == 1:
            break
    assert got is None
    cs.write(b"y")
    cs.flush()
    while got is None and time.monotonic() < deadline:
        got = ss.readexactly(2, nonblock=True)
    assert got == b"xy"


def test_read_timeout(make_pair):
    p = make_pair(server_config=shmipc.Config(read_timeout=0.2))
    cs, ss = p.streams()
    assert ss.read_timeout == 0.2
    t0 = time.monotonic()
    with pytest.raises(shmipc.TimeoutError) as ei:
        ss.read_chunk()
    elapsed = time.monotonic() - t0
    assert isinstance(ei.value, TimeoutError) and ei.value.errno == errno.ETIMEDOUT
    assert 0.15 <= elapsed < 5
    ss.read_timeout = 0.05
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        ss.readexactly(1)
    assert time.monotonic() - t0 < 5
    ss.read_timeout = None
    assert ss.read_timeout is None
    ss.read_timeout = 0  # do not wait (test_vocabulary.py)
    assert ss.read_timeout == 0.0
    ss.read_timeout = -1  # any negative: forever
    assert ss.read_timeout is None
    with pytest.raises(shmipc.InvalidArgumentError):
        ss.read_timeout = float("nan")
    # The stream still works after timeouts.
    cs.write(b"late")
    cs.flush()
    assert ss.readexactly(4) == b"late"


def test_read_timeout_longer_than_a_wait_slice(make_pair):
    p = make_pair(server_config=shmipc.Config(read_timeout=0.35))
    cs, ss = p.streams()
    t0 = time.monotonic()
    with pytest.raises(shmipc.TimeoutError):
        ss.read()
    assert 0.3 <= time.monotonic() - t0 < 5


def test_write_timeout_property(pair):
    cs, _ = pair.streams()
    assert cs.write_timeout is None
    cs.write_timeout = 1.5
    assert cs.write_timeout == 1.5
    cs.write_timeout = None
    assert cs.write_timeout is None


def test_accept_stream_timeouts(pair):
    t0 = time.monotonic()
    with pytest.raises(shmipc.TimeoutError):
        pair.server.accept_stream(timeout=0.2)
    assert 0.15 <= time.monotonic() - t0 < 5
    with pytest.raises(shmipc.TimeoutError):
        pair.server.accept_stream(timeout=0)
    assert pair.server.accept_stream(nonblock=True) is None
    with pytest.raises(shmipc.InvalidArgumentError):
        pair.server.accept_stream(timeout=float("nan"))
    # A negative timeout waits forever: test_vocabulary.py


def test_listener_accept_timeouts(address):
    with shmipc.Listener(address) as l:
        assert l.address == address
        t0 = time.monotonic()
        with pytest.raises(shmipc.TimeoutError):
            l.accept(timeout=0.2)
        assert 0.15 <= time.monotonic() - t0 < 5
        assert l.accept(nonblock=True) is None
        with pytest.raises(shmipc.TimeoutError):
            l.accept(0)
        assert l.fileno() >= 0


def test_connect_refused(address):
    with pytest.raises(shmipc.Error) as ei:
        shmipc.connect(address)
    assert ei.value.name in ("SHMIPC_ECONNREFUSED", "SHMIPC_ENOENT")


def test_config_type_is_checked(address):
    with pytest.raises(TypeError):
        shmipc.connect(address, config="v3")
    with pytest.raises(TypeError):
        shmipc.Listener(address, {"read_timeout": 1})


def test_server_cannot_open_streams(pair):
    with pytest.raises(shmipc.Error) as ei:
        pair.server.open_stream()
    assert ei.value.name == "SHMIPC_ENOTSUP"
    with pytest.raises(shmipc.Error):
        pair.client.accept_stream(timeout=0)


def test_peer_gone(pair):
    cs, ss = pair.streams()
    pair.client.close()
    with pytest.raises(shmipc.PeerGoneError) as ei:
        ss.read_chunk()
    assert isinstance(ei.value, ConnectionResetError)
    assert pair.server.status == shmipc.errors["ECONNRESET"]
    with pytest.raises(shmipc.PeerGoneError):
        pair.server.process()


def test_session_close_is_a_hard_close(pair):
    cs, ss = pair.streams()
    ss.write(b"unread")
    ss.flush()
    pair.client.close()
    pair.client.close()  # twice is fine
    assert pair.client.closed and pair.client.status == shmipc.errors["ECLOSED"]
    with pytest.raises(shmipc.ClosedError):
        cs.read_chunk()
    with pytest.raises(shmipc.ClosedError):
        cs.write(b"x")
    with pytest.raises(shmipc.ClosedError):
        pair.client.open_stream()
    with pytest.raises(shmipc.ClosedError):
        pair.client.fileno()
    with pytest.raises(shmipc.ClosedError):
        cs.fileno()
    assert "closed" in repr(pair.client)
    cs.close()


def test_stream_close_twice_and_closed_errors(pair):
    cs, ss = pair.streams()
    cs.close()
    cs.close()
    assert cs.closed and "closed" in repr(cs)
    for call in (lambda: cs.write(b"x"), cs.flush, cs.read_chunk, lambda: cs.reserve(1),
                 lambda: cs.commit(0), lambda: cs.available, cs.release):
        with pytest.raises(shmipc.ClosedError):
            call()
    with pytest.raises(shmipc.ClosedError):
        with cs:
            pass


def test_context_managers(address):
    with shmipc.Listener(address) as l:
        import threading

        box = {}
        t = threading.Thread(target=lambda: box.setdefault("s", l.accept(timeout=10)))
        t.start()
        with shmipc.connect(address, default_config()) as c:
            t.join(10)
            with box["s"] as s, c.open_stream() as st:
                st.write(b"hi")
                st.flush()
                with s.accept_stream(timeout=10) as sst:
                    with sst.read_chunk() as chunk:
                        assert chunk == b"hi"
                    assert chunk.released
                assert sst.closed
            assert st.closed and s.closed
        assert c.closed
    assert l.closed
    l.close()


def test_streams_keep_their_session_alive(pair):
    import gc
    import weakref

    cs, ss = pair.streams()
    ref = weakref.ref(pair.client)
    session = pair.client
    pair.client = session  # the Pair keeps it; drop our own names below
    assert cs.session is session
    del session
    gc.collect()
    assert ref() is not None
    cs.write(b"ok")
    cs.flush()
    assert ss.readexactly(2) == b"ok"


def test_session_object_freed_with_its_last_stream(address):
    import gc
    import threading
    import weakref

    with shmipc.Listener(address) as l:
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("s", l.accept(timeout=10)))
        t.start()
        c = shmipc.connect(address, default_config())
        t.join(10)
        st = c.open_stream()
        ref = weakref.ref(c)
        del c
        gc.collect()
        assert ref() is not None  # the stream holds it
        st.write(b"x")
        st.flush()
        del st
        gc.collect()
        assert ref() is None
        box["s"].close()


def test_repr(pair):
    cs, _ = pair.streams()
    assert repr(cs) == "<shmipc.Stream id=2>"
    assert "Listener" in repr(pair.listener)


def test_types_are_not_instantiable():
    for cls in (shmipc.Session, shmipc.Stream, shmipc.Chunk):
        with pytest.raises(TypeError):
            cls()


@pytest.mark.parametrize("memmap, version", [("memfd", 3), ("devshm", 2)])
def test_protocol_versions(make_pair, memmap, version):
    p = make_pair(client_config=default_config(memmap=memmap))
    assert p.client.version == p.server.version == version
    cs, ss = p.streams()
    for size in (10, 50000):
        data = os.urandom(size)
        cs.write(data)
        cs.flush()
        assert ss.readexactly(size) == data
        ss.write(data[::-1])
        ss.flush()
        assert cs.readexactly(size) == data[::-1]


def test_devshm_files_are_removed(make_pair, tmp_path):
    # The files are named PREFIX_PID_N_...: the "_" keeps another process's prefix (pid 123
    # beside our 12, under pytest-xdist or a second run) out of the count.
    prefix = f"/dev/shm/shmipc-pytest-{os.getpid()}"
    mine = os.path.basename(prefix) + "_"
    p = make_pair(client_config=default_config(memmap="devshm", path_prefix=prefix))
    cs, ss = p.streams()
    assert [f for f in os.listdir("/dev/shm") if f.startswith(mine)]
    cs.close()
    ss.close()
    p.close()
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(mine)]


V4_CONFIGS = {
    "v4-socket": lambda c: c.with_v4(),
    "v4-eventfd": lambda c: c.with_v4_eventfd(),
    "v4-polling": lambda c: c.with_v4_event_queue_polling(200),
}


@pytest.mark.parametrize("name", sorted(V4_CONFIGS))
def test_v4_modes_round_trip(make_pair, name):
    cfg = default_config()
    V4_CONFIGS[name](cfg)
    p = make_pair(client_config=cfg)
    assert p.client.version == p.server.version == 4
    cs, ss = p.streams()
    for i in range(50):
        cs.write(b"ping %d" % i)
        cs.flush()
        assert ss.readexactly(len(b"ping %d" % i)) == b"ping %d" % i
        ss.write(b"pong")
        ss.flush()
        assert cs.readexactly(4) == b"pong"


def test_flush_after_the_peer_closed_raises_end_of_stream(pair):
    cs, ss = pair.streams()
    cs.close()
    assert ss.read() == b""  # the close has been seen
    ss.write(b"too late")
    with pytest.raises(shmipc.EndOfStreamError):
        ss.flush()


def test_usable_in_a_subinterpreter():
    _testcapi = pytest.importorskip("_testcapi")
    code = (
        "import shmipc, os\n"
        "l = shmipc.Listener('unix:@shmipc-py-sub-%d' % os.getpid())\n"
        "assert l.accept(nonblock=True) is None\n"
        "l.close()\n"
    )
    assert _testcapi.run_in_subinterp(code) == 0
    assert shmipc.Listener is not None


def test_flush_close_sends_the_last_message_and_the_end(pair):
    cs, ss = pair.streams()
    cs.write(b"last ")
    cs.write(b"words")
    assert cs.flush_close() is None
    assert cs.closed
    assert ss.readexactly(10) == b"last words"
    assert ss.read() == b""  # then the end
    # Closed: every call raises as after close(); close() stays a no-op.
    for call in (cs.flush_close, cs.flush, lambda: cs.write(b"x")):
        with pytest.raises(shmipc.ClosedError):
            call()
    cs.close()
    # Nothing written: only the end goes.
    cs2 = pair.client.open_stream()
    cs2.write(b"x")
    cs2.flush()
    ss2 = pair.server.accept_stream(timeout=5)
    assert ss2.readexactly(1) == b"x"
    cs2.flush_close()
    assert ss2.read() == b""


def test_flush_close_misuse(pair):
    cs, ss = pair.streams()
    with pytest.raises(TypeError):
        cs.flush_close(1)
    # A window still open: refused, nothing closed.
    view = cs.reserve(4)
    with pytest.raises(BufferError):
        cs.flush_close()
    assert not cs.closed
    view.release()
    cs.commit(0)
    # A memoryview of a received chunk points into the stream's memory: refused as close() is.
    ss.write(b"chunk")
    ss.flush()
    chunk = cs.read_chunk()
    mv = memoryview(chunk)
    with pytest.raises(BufferError):
        cs.flush_close()
    assert not cs.closed
    mv.release()
    chunk.release()
    # Shut down: nothing more is sent, the error says so, and the stream is closed anyway.
    cs.write(b"unsent")
    cs.shutdown()
    with pytest.raises(shmipc.ClosedError):
        cs.flush_close()
    assert cs.closed
    assert ss.read() == b""  # "unsent" never went
