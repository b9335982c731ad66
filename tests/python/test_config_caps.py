"""Config settings for what a peer may do to us, and the server's WebSocket limits: the peer-uid
allow-list, the listener's socket mode, server_v4, the session caps (max_pending_streams,
max_fallback_unread), and Server(ws_ping_timeout=, ws_idle_timeout=, ws_send_high_water=,
ws_send_limit=). Each setting: its default, good and bad values (errors naming the field), and
that it takes effect on a real listener, session or WebSocket connection."""
import itertools
import os
import socket
import tempfile
import threading
import time

import pytest

import shmipc
from conftest import default_config, unique_address
from test_server import started
from test_server_ws import PING, Events, WSClient

Invalid = shmipc.InvalidArgumentError


def refused(field, fn, *args, exc=Invalid, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert field in str(info.value), str(info.value)
    return info.value


# ---- values ------------------------------------------------------------------------------


def test_defaults():
    c = shmipc.Config()
    assert c.server_v4 is True
    assert c.server_v4_features == ("eventfd", "polling")
    assert c.peer_uids == []
    assert c.socket_mode == 0o600
    assert c.max_pending_streams == 4096
    assert c.max_fallback_unread == 128 << 20


def test_keyword_construction_and_copy():
    c = shmipc.Config(peer_uids=[7, 8], socket_mode=0o640, max_pending_streams=3,
                      max_fallback_unread=1 << 20, server_v4=False, server_v4_features=["polling"])
    d = c.copy()
    for cfg in (c, d):
        assert cfg.peer_uids == [7, 8]
        assert cfg.socket_mode == 0o640
        assert cfg.max_pending_streams == 3
        assert cfg.max_fallback_unread == 1 << 20
        assert cfg.server_v4 is False and cfg.server_v4_features == ("polling",)
    d.peer_uids = None
    assert c.peer_uids == [7, 8], "the copy is independent"


def test_peer_uids():
    c = shmipc.Config()
    c.peer_uids = (0, 1000, 4294967294)
    assert c.peer_uids == [0, 1000, 4294967294]
    c.peer_uids = (u for u in [5])  # any iterable
    assert c.peer_uids == [5]
    c.peer_uids.append(6)  # the getter returns a copy
    assert c.peer_uids == [5]
    c.peer_uids = list(range(64))
    assert len(c.peer_uids) == 64
    c.peer_uids = [5]
    refused("peer_uids", setattr, c, "peer_uids", [4294967295])  # (uid_t)-1
    refused("peer_uids", setattr, c, "peer_uids", [1 << 32])
    refused("peer_uids", setattr, c, "peer_uids", [-1])
    refused("at most 64", setattr, c, "peer_uids", list(range(65)))
    refused("at most 64", setattr, c, "peer_uids", itertools.count())  # read, not materialized

    def failing():
        yield 1
        raise RuntimeError("from the iterable")

    with pytest.raises(RuntimeError, match="from the iterable"):
        c.peer_uids = failing()
    assert c.peer_uids == [5], "unchanged after a refusal"
    for bad in ("1000", b"\x01", 1000, [1.5], [True], ["1000"], 3.0):
        with pytest.raises(TypeError, match="peer_uids"):
            c.peer_uids = bad
    assert c.peer_uids == [5]
    c.peer_uids = []
    assert c.peer_uids == []
    c.peer_uids = [5]
    c.peer_uids = None
    assert c.peer_uids == []
    with pytest.raises(AttributeError):
        del c.peer_uids


def test_socket_mode():
    c = shmipc.Config(socket_mode=0o666)
    assert c.socket_mode == 0o666
    c.socket_mode = 0
    assert c.socket_mode == 0o600, "0 restores the default"
    c.socket_mode = 0o777
    for bad in (0o1000, 0o4755, -1, 1 << 40):
        refused("socket_mode", setattr, c, "socket_mode", bad)
    assert c.socket_mode == 0o777
    for bad in ("0660", 0o660 + 0.0, None, True):
        with pytest.raises(TypeError, match="socket_mode"):
            c.socket_mode = bad


def test_session_caps_values():
    c = shmipc.Config()
    c.max_pending_streams = 1
    assert c.max_pending_streams == 1
    c.max_pending_streams = 65536
    assert c.max_pending_streams == 65536
    c.max_pending_streams = 0
    assert c.max_pending_streams == 4096, "0 restores the default"
    for bad in (65537, -1, 1 << 32, 1 << 80):
        refused("max_pending_streams", setattr, c, "max_pending_streams", bad)
    c.max_fallback_unread = 65536
    assert c.max_fallback_unread == 65536
    c.max_fallback_unread = 1 << 40
    assert c.max_fallback_unread == 1 << 40
    c.max_fallback_unread = 0
    assert c.max_fallback_unread == 128 << 20
    for bad in (65535, 1, (1 << 40) + 1, -1, 1 << 80):
        refused("max_fallback_unread", setattr, c, "max_fallback_unread", bad)
    assert c.max_fallback_unread == 128 << 20
    for field in ("max_pending_streams", "max_fallback_unread"):
        with pytest.raises(TypeError, match=field):
            setattr(c, field, "10")
        with pytest.raises(TypeError, match=field):
            setattr(c, field, 1e6)


def test_spin_us_values():
    c = shmipc.Config()
    env = os.environ.get("SHMIPC_SPIN_US")
    if env is None:
        assert c.spin_us == 50, "the default cap"
    c.spin_us = 0
    assert c.spin_us == 0, "0: never spin"
    c.spin_us = 100000
    assert c.spin_us == 100000
    for bad in (100001, -1, 1 << 32, 1 << 80):
        refused("spin_us", setattr, c, "spin_us", bad)
    assert c.spin_us == 100000, "unchanged after refusals"
    for bad in ("10", 1.5, None, True):
        with pytest.raises(TypeError, match="spin_us"):
            c.spin_us = bad
    assert shmipc.Config(spin_us=7).spin_us == 7
    refused("spin_us", shmipc.Config, spin_us=100001)


def test_spin_us_zero_and_max_sessions_work(make_pair):
    # Round trips with spinning off and at the cap both arrive (spin or no spin, no message is
    # lost and no wait hangs).
    for us in (0, 100000):
        p = make_pair(client_config=default_config(spin_us=us),
                      server_config=default_config(spin_us=us))
        cs, ss = p.streams()
        for i in range(200):
            msg = b"ping %d" % i
            cs.write(msg)
            cs.flush()
            assert ss.readexactly(len(msg)) == msg
            ss.write(msg.upper())
            ss.flush()
            assert cs.readexactly(len(msg)) == msg.upper()


def test_server_v4_values():
    c = shmipc.Config()
    c.server_v4_features = ["polling"]
    c.server_v4 = False
    assert (c.server_v4, c.server_v4_features) == (False, ("polling",)), "independent fields"
    c.server_v4 = True
    assert c.server_v4_features == ("polling",)
    c.server_v4_features = ()
    assert c.server_v4_features == ()
    c.server_v4_features = {"polling", "eventfd"}
    assert c.server_v4_features == ("eventfd", "polling")
    refused("server_v4_features", setattr, c, "server_v4_features", ["eventfd", "epoll"])
    assert c.server_v4_features == ("eventfd", "polling")
    with pytest.raises(TypeError, match="server_v4_features"):
        c.server_v4_features = "eventfd"  # a name, not a list of names
    with pytest.raises(TypeError, match="server_v4_features"):
        c.server_v4_features = [1]
    with pytest.raises(TypeError, match="server_v4"):
        c.server_v4 = 1
    with pytest.raises(TypeError, match="server_v4"):
        c.server_v4 = "no"


# ---- effects on listeners and sessions ---------------------------------------------------


def other_uid():
    """A uid that is not ours (nor -1)."""
    return os.getuid() + 1


def connect_in_thread(address, config):
    """Starts a client handshake on a thread (the listener's side runs inside accept());
    returns the thread and a box that gets "session" or "error"."""
    box = {}

    def connect():
        try:
            box["session"] = shmipc.connect(address, config)
        except shmipc.Error as e:
            box["error"] = e

    t = threading.Thread(target=connect)
    t.start()
    return t, box


def test_listener_allow_list_refuses_an_unlisted_client():
    address = unique_address("uids")
    with shmipc.Listener(address, default_config(peer_uids=[other_uid()])) as listener:
        t, box = connect_in_thread(address, default_config())
        t0 = time.monotonic()
        # The listener checks SO_PEERCRED first and hangs up: no session to accept.
        with pytest.raises(shmipc.TimeoutError):
            listener.accept(timeout=1)
        t.join(10)
        assert not t.is_alive()
        # Hung up on, not timed out: the client learns at once.
        assert "session" not in box and not isinstance(box["error"], shmipc.TimeoutError)
        assert time.monotonic() - t0 < 5


def test_listener_allow_list_admits_a_listed_client():
    address = unique_address("uids-ok")
    with shmipc.Listener(address, default_config(peer_uids=[other_uid(), os.getuid()])) as l:
        t, box = connect_in_thread(address, default_config(peer_uids=[os.getuid()]))
        server = l.accept(timeout=10)
        t.join(10)
        with box["session"] as client, server:
            cs = client.open_stream()
            cs.write(b"uid ok")
            cs.flush()
            assert server.accept_stream(timeout=10).readexactly(6) == b"uid ok"


def test_client_allow_list_refuses_an_unlisted_server():
    address = unique_address("uids-client")
    with shmipc.Listener(address) as listener:
        with pytest.raises(shmipc.Error) as info:
            shmipc.connect(address, default_config(peer_uids=[other_uid()]))
        assert info.value.name == "SHMIPC_EACCES"
        assert f"is uid {os.getuid()}" in str(info.value) and "peer_uids" in str(info.value)
        with pytest.raises(shmipc.Error):
            listener.accept(timeout=0.2)


def test_allow_list_needs_a_unix_socket():
    refused("unix socket", shmipc.Listener, "tcp:127.0.0.1:0",
            shmipc.Config(peer_uids=[os.getuid()]))


@pytest.mark.parametrize("mode", [None, 0o600, 0o640, 0o666])
def test_socket_mode_shows_in_stat(mode):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sock")
        cfg = shmipc.Config() if mode is None else shmipc.Config(socket_mode=mode)
        old = os.umask(0o077)  # the mode is the config's whatever the umask
        try:
            listener = shmipc.Listener("unix:" + path, cfg)
        finally:
            os.umask(old)
        with listener:
            assert os.stat(path).st_mode & 0o7777 == (mode or 0o600)
        assert not os.path.exists(path)


def test_server_v4_false_makes_v4_clients_fall_back(make_pair):
    p = make_pair(client_config=default_config().with_v4(),
                  server_config=default_config(server_v4=False))
    assert p.server.version == 3 and p.client.version == 3
    q = make_pair(client_config=default_config().with_v4(), server_config=default_config())
    assert q.server.version == 4


def open_and_announce(client, n):
    streams = []
    for _ in range(n):
        st = client.open_stream()
        st.write(b"x")
        st.flush()
        streams.append(st)
    return streams


def test_max_pending_streams_ends_the_session(make_pair):
    p = make_pair(server_config=default_config(max_pending_streams=2))
    # Two waiting streams are fine, and accepting them makes room again.
    open_and_announce(p.client, 2)
    for _ in range(2):
        assert p.server.accept_stream(timeout=10).readexactly(1) == b"x"
    # Three opened before the server looks: the third ends the session.
    open_and_announce(p.client, 3)
    err = refused("max_pending_streams is 2", p.server.accept_stream, 10,
                  exc=shmipc.ProtocolError)
    assert err.name == "SHMIPC_EPROTO"
    assert p.server.status == shmipc.errors["EPROTO"]


def test_default_pending_streams_take_three(make_pair):
    p = make_pair()
    open_and_announce(p.client, 3)
    for _ in range(3):
        assert p.server.accept_stream(timeout=10).readexactly(1) == b"x"


def fallback_transfer(make_pair, server_config):
    """The client writes more than its 1 MiB buffer holds, so the message goes over the socket
    (fallback); returns what the server read, or the error that ended it."""
    p = make_pair(client_config=default_config(buffer_capacity=1 << 20,
                                               connection_write_timeout=5.0),
                  server_config=server_config)
    payload = os.urandom((1 << 20) + (512 << 10))
    box = {}

    def write():
        try:
            st = p.client.open_stream()
            st.write(payload)
            st.flush()
        except shmipc.Error as e:  # the server hung up on us
            box["client"] = e

    t = threading.Thread(target=write)
    t.start()
    try:
        st = p.server.accept_stream(timeout=10)
        got = st.readexactly(len(payload))
        return got == payload, None
    except shmipc.Error as e:
        return False, e
    finally:
        t.join(15)
        assert not t.is_alive()


def test_max_fallback_unread_ends_the_session(make_pair):
    ok, err = fallback_transfer(make_pair, default_config(max_fallback_unread=65536))
    assert not ok
    assert isinstance(err, shmipc.ProtocolError), repr(err)
    assert "max_fallback_unread (65536 bytes)" in str(err)


def test_default_fallback_cap_takes_the_same_transfer(make_pair):
    ok, err = fallback_transfer(make_pair, default_config())
    assert err is None and ok


def test_memory_wait_values():
    c = shmipc.Config()
    assert c.memory_wait is False
    c.memory_wait = True
    assert c.memory_wait is True
    for bad in (1, 0, "yes", None, 1.0):
        with pytest.raises(TypeError):
            c.memory_wait = bad
    assert c.memory_wait is True
    assert shmipc.Config(memory_wait=True).memory_wait is True


def memory_wait_stream(make_pair, write_timeout):
    """A stream over a 1 MiB buffer whose writer waits for memory, and its accepted peer."""
    p = make_pair(client_config=default_config(buffer_capacity=1 << 20, memory_wait=True,
                                               write_timeout=write_timeout,
                                               initialize_timeout=10.0))
    st = p.client.open_stream()
    st.write(b"hi")
    st.flush()
    peer = p.server.accept_stream(timeout=10)
    assert peer.readexactly(2) == b"hi"
    return st, peer


def test_memory_wait_stops_the_writer_instead_of_falling_back(make_pair):
    # A 1 MiB buffer nobody reads: with memory_wait the writes stop (TimeoutError after the
    # write timeout, that write adding nothing), nothing goes over the socket; the reader then
    # gets exactly the bytes of the writes that succeeded, and writing works again.
    st, peer = memory_wait_stream(make_pair, write_timeout=0.2)
    sent = []
    with pytest.raises(shmipc.TimeoutError, match="memory_wait"):
        for i in range(64):
            chunk = bytes([i]) * (64 << 10)
            st.write(chunk)
            st.flush()
            sent.append(chunk)
    assert 0 < len(sent) < 64
    want = b"".join(sent)
    assert peer.readexactly(len(want)) == want
    assert peer.read(nonblock=True) is None
    st.write(b"again")
    st.flush()
    assert peer.readexactly(5) == b"again"


def test_memory_wait_write_lets_other_threads_run(make_pair):
    # A small write that waits for shared memory holds no GIL: another thread (a signal
    # handler, an event loop) runs meanwhile. Before, writes under 256 KiB kept the GIL, so
    # this thread froze until the write timed out.
    st, peer = memory_wait_stream(make_pair, write_timeout=3.0)
    state = {"done": False, "err": None}

    def writer():
        try:
            for _ in range(2048):  # 8 MiB in 4 KiB writes: blocks past 1 MiB
                st.write(b"w" * 4096)
                st.flush()
        except shmipc.Error as e:
            state["err"] = e
        state["done"] = True

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(0.5)
    ticks = 0
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        ticks += 1
        time.sleep(0.001)
    blocked = not state["done"]
    got = 0
    while not state["done"] or got < 1:
        part = peer.read(nonblock=True)
        if part is None:
            if state["done"]:
                break
            time.sleep(0.001)
            continue
        got += len(part)
    t.join(15)
    assert blocked and ticks > 50, (blocked, ticks)
    assert state["err"] is None and got > 0


# ---- server WebSocket settings ---------------------------------------------------------


def ws_echo(events=None):
    def setup(s):
        def on_close(ws, code, reason):
            if events:
                events.add("close", code)

        s.websocket("/ws", lambda ws, d: ws.send(d), on_close=on_close)

    return setup


def test_ws_ping_timeout_pings_a_silent_client():
    with started(shmipc, ws_echo(), ws_ping_timeout=0.2) as s:
        c = WSClient(s.port)
        c.sock.settimeout(5)
        t0 = time.monotonic()
        assert c.recv_frame() == (PING, b"")
        assert time.monotonic() - t0 >= 0.15
        c.close()
    with started(shmipc, ws_echo()) as s:  # the default: no pings
        c = WSClient(s.port)
        c.sock.settimeout(0.6)
        with pytest.raises(socket.timeout):
            c.recv_frame()
        c.drop()


def test_ws_idle_timeout_fails_a_silent_client():
    events = Events()
    with started(shmipc, ws_echo(events), ws_idle_timeout=0.3) as s:
        c = WSClient(s.port)
        c.send("hi")
        assert c.recv() == "hi"
        c.sock.settimeout(5)
        t0 = time.monotonic()
        with pytest.raises(EOFError):  # TCP closed without a close frame
            c.recv_frame()
        assert time.monotonic() - t0 >= 0.25
        assert events.wait_for("close")[0] == ("close", 1006)
        c.drop()


def test_ws_pongs_keep_a_connection_open_past_the_idle_timeout():
    with started(shmipc, ws_echo(), ws_ping_timeout=0.1, ws_idle_timeout=0.4) as s:
        c = WSClient(s.port)
        c.sock.settimeout(5)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            op, data = c.recv_frame()
            assert op == PING
            c.send_frame(0xA, data)  # pong
        c.send("still open")
        op, data = c.recv_frame()
        while op == PING:
            op, data = c.recv_frame()
        assert data == b"still open"
        c.drop()


def test_ws_send_limit_refuses_sends_to_a_peer_that_does_not_read():
    events = Events()
    chunk = b"z" * (64 << 10)

    def setup(s):
        def on_message(ws, data):
            sent = 0
            try:
                while sent < (16 << 20):
                    ws.send(chunk)
                    sent += len(chunk)
            except shmipc.Error as e:
                events.add("refused", sent, e.name)
                return
            events.add("refused", sent, None)

        s.websocket("/ws", on_message)

    with started(shmipc, setup, ws_send_high_water=64 << 10, ws_send_limit=128 << 10) as s:
        c = WSClient(s.port)
        c.send("flood")  # and never read
        _, sent, name = events.wait_for("refused")[0]
        # Refused before 16 MiB went out, which the default limit (16 MiB queued, on top of
        # what the kernel's socket buffers take: about 4 MB here) never does.
        assert name == "SHMIPC_EAGAIN", (sent, name)
        assert sent < (16 << 20)
        c.drop()


def test_ws_settings_refused():
    refused("ws_ping_timeout", shmipc.Server, port=0, ws_ping_timeout=1, ws_idle_timeout=0.5)
    refused("ws_idle_timeout", shmipc.Server, port=0, ws_idle_timeout=0)
    refused("ws_ping_timeout", shmipc.Server, port=0, ws_ping_timeout=0)
    refused("ws_ping_timeout", shmipc.Server, port=0, ws_ping_timeout=float("inf"))
    refused("ws_idle_timeout", shmipc.Server, port=0, ws_idle_timeout=3601)
    # A limit below the default high-water mark (1 MiB) needs a lower mark too.
    refused("ws_send_limit", shmipc.Server, port=0, ws_send_limit=1000)
    refused("ws_send_high_water", shmipc.Server, port=0, ws_send_high_water=(1 << 30) + 1)
    refused("ws_send_high_water", shmipc.Server, port=0, ws_send_high_water=2 << 20,
            ws_send_limit=1 << 20)
    refused("ws_send_limit", shmipc.Server, port=0, ws_send_limit=-1)
    with pytest.raises(TypeError):
        shmipc.Server(port=0, ws_ping_timeout="1s")
    with pytest.raises(TypeError):
        shmipc.Server(port=0, ws_send_limit="1M")
    # Accepted whatever order the keywords come in; negative means "never", and None the
    # default, which is never too.
    shmipc.Server(port=0, ws_send_limit=128 << 10, ws_send_high_water=64 << 10).close()
    shmipc.Server(port=0, ws_idle_timeout=0.5, ws_ping_timeout=0.1).close()
    shmipc.Server(port=0, ws_idle_timeout=-1, ws_ping_timeout=None).close()
