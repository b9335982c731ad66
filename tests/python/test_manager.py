"""SessionManager: pooled streams are reused, non-reusable ones are not, ownership and buffer
rules of put_back, close, and use from several threads."""
import io
import threading

import pytest

import shmipc
from conftest import EchoServer, default_config


def echo(st, data):
    st.write(data)
    st.flush()
    return st.readexactly(len(data))


def test_put_back_then_get_reuses_the_stream(echo_server):
    with shmipc.SessionManager(echo_server.address, default_config()) as m:
        st = m.get_stream()
        assert st.id == 2 and st.session is None
        assert echo(st, b"first") == b"first"
        m.put_back(st)
        assert st.closed
        with pytest.raises(shmipc.ClosedError):
            st.write(b"x")
        again = m.get_stream()
        assert again.id == 2 and again is not st
        assert echo(again, b"second") == b"second"
        m.put_back(again)


def test_stream_with_unread_data_is_not_reused(echo_server):
    with shmipc.SessionManager(echo_server.address, default_config()) as m:
        st = m.get_stream()
        st.write(b"echo me")
        st.flush()
        # The echo comes back as one message: 4 of its bytes stay unread, which makes the
        # stream unfit for reuse, so put_back closes it.
        assert st.readexactly(3) == b"ech" and st.available == 4
        m.put_back(st)
        other = m.get_stream()
        assert other.id == 3
        assert echo(other, b"fresh") == b"fresh"
        other.close()


def test_put_back_rules(echo_server):
    with shmipc.SessionManager(echo_server.address, default_config()) as m:
        st = m.get_stream()
        with pytest.raises(TypeError):
            m.put_back("stream")
        st.write(b"abc")
        st.flush()
        chunk = st.read_exact_bytes(3)
        mv = memoryview(chunk)
        with pytest.raises(BufferError):
            m.put_back(st)
        assert not st.closed
        mv.release()
        m.put_back(st)  # invalidates the Chunk
        assert chunk.released
        with pytest.raises(shmipc.ReleasedError):
            bytes(chunk)
        with shmipc.SessionManager(echo_server.address, default_config()) as other:
            foreign = other.get_stream()
            with pytest.raises(ValueError):
                m.put_back(foreign)
            other.put_back(foreign)


def test_pool_streams_have_no_descriptor(echo_server):
    with shmipc.SessionManager(echo_server.address, default_config()) as m:
        st = m.get_stream()
        with pytest.raises(io.UnsupportedOperation):
            st.fileno()
        st.close()


def test_close_is_hard_and_safe_twice(echo_server):
    m = shmipc.SessionManager(echo_server.address, default_config())
    st = m.get_stream()
    assert echo(st, b"x") == b"x"
    m.close()
    m.close()
    assert m.closed and "closed" in repr(m)
    with pytest.raises(shmipc.ClosedError):
        st.readexactly(1)
    with pytest.raises(shmipc.ClosedError):
        m.get_stream()
    m.put_back(st)  # the pool is gone: the stream is just closed
    assert st.closed


def test_sessions_round_robin(echo_server):
    cfg = default_config(session_num=2)
    with shmipc.SessionManager(echo_server.address, cfg) as m:
        # The reference moves to the next session every 32 calls: 64 calls use both.
        streams = [m.get_stream() for _ in range(64)]
        for i, st in enumerate(streams):
            assert echo(st, b"%d" % i) == b"%d" % i
        for st in streams:
            m.put_back(st)
    assert echo_server.streams == 64


def test_threads_share_a_manager(echo_server):
    errors = []
    with shmipc.SessionManager(echo_server.address, default_config()) as m:
        def worker(n):
            try:
                for i in range(100):
                    st = m.get_stream()
                    assert echo(st, b"%d/%d" % (n, i)) == b"%d/%d" % (n, i)
                    m.put_back(st)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors


def test_reconnects_after_the_server_restarts():
    import time

    server = EchoServer()
    address = server.address
    with shmipc.SessionManager(address, default_config(rebuild_interval=0.05)) as m:
        st = m.get_stream()
        assert echo(st, b"before") == b"before"
        m.put_back(st)
        server.stop()  # serve() returns and closes its sessions; nobody listens any more
        deadline = time.monotonic() + 10
        with pytest.raises(shmipc.Error):
            while time.monotonic() < deadline:  # until the manager sees the session dead
                st = m.get_stream()
                echo(st, b"lost")
                m.put_back(st)
        server = EchoServer(address=address)
        try:
            while True:  # a failed reconnect is retried after rebuild_interval
                try:
                    st = m.get_stream()
                    break
                except shmipc.Error:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
            assert echo(st, b"after") == b"after"
            st.close()
        finally:
            server.stop()


def test_connect_failure_raises(address):
    with pytest.raises(shmipc.Error):
        shmipc.SessionManager(address)
