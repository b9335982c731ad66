"""Zero-copy buffers: the lifetime of Chunks and of the reserve() window, use after release,
close while a buffer is alive, and slices going back to shared memory."""
import ctypes
import gc
import os
import threading

import pytest

import shmipc
from conftest import default_config


@pytest.fixture
def streams(pair):
    return pair.streams()


def send(st, data):
    st.write(data)
    st.flush()


def test_chunk_is_a_read_only_buffer(streams):
    cs, ss = streams
    send(cs, b"hello world")
    chunk = ss.read_chunk()
    assert isinstance(chunk, shmipc.Chunk)
    assert len(chunk) == 11 and bool(chunk)
    assert bytes(chunk) == b"hello world" == chunk.tobytes()
    assert chunk == b"hello world" and chunk != b"other" and chunk == bytearray(b"hello world")
    with memoryview(chunk) as mv:
        assert mv.readonly and mv[0] == ord("h") and bytes(mv[6:]) == b"world"
        with pytest.raises(TypeError):
            mv[0] = 1
    assert b"hello world".startswith(chunk)  # accepted wherever a buffer is
    with pytest.raises(TypeError):
        hash(chunk)
    assert repr(chunk) == "<shmipc.Chunk len=11>"


def test_use_after_release_raises(streams):
    cs, ss = streams
    send(cs, b"abc")
    chunk = ss.read_chunk()
    assert not chunk.released
    chunk.release()
    chunk.release()  # twice is fine
    assert chunk.released and repr(chunk) == "<shmipc.Chunk released>"
    for use in (bytes, len, memoryview, lambda c: c == b"abc", lambda c: c.tobytes()):
        with pytest.raises(shmipc.ReleasedError) as ei:
            use(chunk)
        assert isinstance(ei.value, ValueError) and isinstance(ei.value, shmipc.ClosedError)
    with pytest.raises(ValueError):
        with chunk:
            pass


def test_context_manager_releases(streams):
    cs, ss = streams
    send(cs, b"abc")
    with ss.read_chunk() as chunk:
        assert chunk == b"abc"
    assert chunk.released


def test_release_refused_while_exported(streams):
    cs, ss = streams
    send(cs, b"abc")
    chunk = ss.read_chunk()
    mv = memoryview(chunk)
    with pytest.raises(BufferError):
        chunk.release()
    with pytest.raises(BufferError):
        ss.release()
    assert bytes(mv) == b"abc"
    mv.release()
    chunk.release()


def test_stream_release_invalidates_every_chunk(streams):
    cs, ss = streams
    send(cs, b"one")
    a = ss.read_chunk()
    send(cs, b"two")
    b = ss.read_exact_bytes(3)
    ss.release()
    assert a.released and b.released
    with pytest.raises(shmipc.ReleasedError):
        bytes(a)
    with pytest.raises(shmipc.ReleasedError):
        bytes(b)
    send(cs, b"three")
    assert ss.read_chunk() == b"three"  # the stream goes on


def test_close_while_a_chunk_is_alive(streams):
    cs, ss = streams
    send(cs, b"x" * 1000)
    chunk = ss.read_chunk()
    ss.close()
    assert chunk.released
    for use in (bytes, len, memoryview):
        with pytest.raises(shmipc.ReleasedError):
            use(chunk)
    del chunk
    gc.collect()


def test_close_refused_while_a_memoryview_is_alive(streams):
    cs, ss = streams
    send(cs, b"payload")
    chunk = ss.read_chunk()
    mv = memoryview(chunk)
    del chunk  # the memoryview keeps it alive
    with pytest.raises(BufferError):
        ss.close()
    assert not ss.closed and bytes(mv) == b"payload"  # still readable, nothing was freed
    mv.release()
    ss.close()
    assert ss.closed


def test_close_refused_while_the_reserve_window_is_alive(streams):
    cs, _ = streams
    buf = cs.reserve(8)
    for call in (cs.close, cs.flush, lambda: cs.commit(1), lambda: cs.write(b"x"),
                 lambda: cs.reserve(1)):
        with pytest.raises(BufferError):
            call()
    buf[:2] = b"ok"
    buf.release()
    cs.commit(2)
    cs.close()


def test_reserve_window_ends_at_commit(streams):
    cs, ss = streams
    mv = cs.reserve(4)
    window = mv.obj
    mv[:] = b"abcd"
    mv.release()
    assert bytes(memoryview(window)) == b"abcd"  # valid until the commit
    cs.commit(4)
    with pytest.raises(ValueError):
        memoryview(window)  # the window ended with the commit
    cs.flush()
    assert ss.readexactly(4) == b"abcd"


def test_reserve_window_ends_at_flush_and_close(streams):
    cs, ss = streams
    mv = cs.reserve(4)
    owner = mv.obj
    mv.release()
    cs.flush()
    with pytest.raises(ValueError):
        memoryview(owner)
    mv = cs.reserve(4)
    owner = mv.obj
    mv.release()
    cs.close()
    with pytest.raises(ValueError):
        memoryview(owner)


def test_reserve_rejects_nonsense(streams):
    cs, _ = streams
    with pytest.raises(shmipc.InvalidArgumentError):
        cs.reserve(0)
    with pytest.raises(shmipc.InvalidArgumentError):
        cs.commit(1)  # nothing reserved
    with cs.reserve(2):
        pass
    with pytest.raises(shmipc.InvalidArgumentError):
        cs.commit(3)


def test_empty_chunk_at_end_of_stream(streams):
    cs, ss = streams
    cs.close()
    end = ss.read_chunk()
    assert len(end) == 0 and bytes(end) == b"" and not end.released
    ss.close()
    assert bytes(end) == b""  # it points at nothing of the stream
    end.release()
    assert end.released


def test_read_exact_chunk_survives_the_next_read(streams):
    """The bytes of read_exact_bytes() may sit in a buffer the next read reuses; the Chunk
    keeps its own copy then, so it stays correct."""
    cs, ss = streams
    a = b"A" * 5000
    b = b"B" * 5000
    # Two messages: 10000 bytes spanning slices force the copying path for each read.
    send(cs, a[:2500])
    send(cs, a[2500:] + b[:2500])
    send(cs, b[2500:])
    first = ss.read_exact_bytes(5000)
    second = ss.read_exact_bytes(5000)
    assert first == a and second == b
    assert "copied" in repr(first)
    third_msg = os.urandom(100)
    send(cs, third_msg)
    assert ss.read_chunk() == third_msg
    assert first == a and second == b


def test_read_exact_memoryview_must_be_released_before_the_next_read(streams):
    cs, ss = streams
    send(cs, b"12345678")
    first = ss.read_exact_bytes(4)
    mv = memoryview(first)
    with pytest.raises(BufferError):
        ss.read_exact_bytes(4)
    mv.release()
    assert ss.read_exact_bytes(4) == b"5678"
    assert first == b"1234"


def test_chunk_keeps_its_stream_alive(pair):
    import weakref

    cs, ss = pair.streams()
    send(cs, b"data")
    chunk = ss.read_chunk()
    ref = weakref.ref(ss)
    del ss
    gc.collect()
    assert ref() is not None and chunk == b"data"
    del chunk
    gc.collect()
    assert ref() is None


def test_session_close_keeps_chunks_readable(pair):
    cs, ss = pair.streams()
    send(ss, b"survivor")
    chunk = cs.read_chunk()
    pair.client.close()  # hard close: the memory stays mapped while the stream lives
    assert chunk == b"survivor"
    with pytest.raises(shmipc.ClosedError):
        cs.read_chunk()
    cs.close()
    with pytest.raises(shmipc.ReleasedError):
        bytes(chunk)


SMALL = dict(buffer_capacity=1 << 20, slice_classes="4096:100")


def pump(make_pair, hold, messages):
    """Sends `messages` 3 KiB messages through a 1 MiB buffer (256 slices); the reader drops
    each Chunk unless `hold`. Returns whether the writer's session stayed healthy (a session
    whose memory ran out falls back to the socket and refuses new streams for 30 s)."""
    p = make_pair(client_config=default_config(**SMALL), server_config=default_config(**SMALL))
    cs, ss = p.streams()
    kept = []
    for i in range(messages):
        send(cs, bytes([i % 251]) * 3000)
        chunk = ss.read_exact_bytes(3000)
        assert chunk.tobytes()[:1] == bytes([i % 251])
        if hold:
            kept.append(chunk)
        del chunk
    try:
        p.client.open_stream().close()
        return True
    except shmipc.Error as e:
        assert e.name == "SHMIPC_EUNHEALTHY"
        return False


def test_dropped_chunks_give_slices_back(make_pair):
    assert pump(make_pair, hold=False, messages=2000)


def test_held_chunks_hold_slices(make_pair):
    # The counter-test: holding every Chunk exhausts the 256 slices and forces the fallback.
    assert not pump(make_pair, hold=True, messages=400)


def buffer_address(obj):
    """Where the bytes of a (read-only) buffer start: PyObject_GetBuffer through ctypes,
    since ctypes.c_char.from_buffer takes writable buffers only."""
    view = (ctypes.c_char * 256)()  # room for a Py_buffer, whose first field is `buf`
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
    assert get(obj, view, 0) == 0
    try:
        return ctypes.c_void_p.from_buffer(view).value
    finally:
        ctypes.pythonapi.PyBuffer_Release.argtypes = [ctypes.c_void_p]
        ctypes.pythonapi.PyBuffer_Release(view)


def test_multi_slice_echo_reuses_hot_slices(make_pair):
    """Issue 7: a ping-pong of messages that fill 4 slices each, through a list of 63
    slices, must keep to a few slices instead of walking the whole FIFO free list. While a
    session kept only a sixteenth of a list for reuse (3 slices here), every message sent one
    slice to the back of the list and took the coldest one from its front: all 63 came round
    (with 1 MiB slices, a page fault on every page of each fresh one, in each process: 5 ms
    per 4 MiB round trip instead of 0.6 until the whole list had been used once)."""
    cfg = dict(buffer_capacity=63 * 65556 + 4096, slice_classes="65536:100")
    p = make_pair(client_config=default_config(**cfg), server_config=default_config(**cfg))
    cs, ss = p.streams()
    message = bytes(range(256)) * (4 * 65536 // 256)
    seen = {"server": [], "client": []}

    def take(st, side):
        """Reads one message chunk by chunk (a chunk is one slice here), noting its slices."""
        got = []
        while sum(map(len, got)) < len(message):
            chunk = st.read_chunk()
            seen[side].append(buffer_address(chunk))
            got.append(chunk)
        return got

    for _ in range(80):
        send(cs, message)
        chunks = take(ss, "server")
        for chunk in chunks:
            ss.write(chunk)
        del chunks, chunk
        ss.release()
        ss.flush()
        echo = take(cs, "client")
        assert b"".join(echo) == message
        del echo
        cs.release()
    # Past the first rounds each side reads the same few slices over and over: the 4 the
    # peer just wrote, drawn from the slices it read the round before.
    for side, addresses in seen.items():
        later = set(addresses[len(addresses) // 4:])
        assert len(later) <= 12, f"{side}: {len(later)} distinct slices in 60 round trips"


def test_chunk_from_another_thread_is_released_later(pair):
    """Dropping a Chunk while another thread blocks in a read of the same stream must not
    release under it; the release happens once the stream is idle again."""
    cs, ss = pair.streams()
    send(cs, b"first")
    chunk = ss.read_chunk()
    box = {}
    started = threading.Event()

    def reader():
        started.set()
        box["second"] = ss.read(max=100)

    t = threading.Thread(target=reader)
    t.start()
    started.wait(10)
    del chunk  # maybe while the reader is blocked: the release is deferred
    gc.collect()
    send(cs, b"second")
    t.join(10)
    assert box["second"] == b"second"
