"""One vocabulary (issue 20 item 4) from Python: timeouts are float seconds where None and any
negative value wait forever and 0 does not wait (Config, Stream, Session, Listener, Server);
reserve() beyond the largest slice raises the EMSGSIZE error and leaves the stream on shared
memory; objects holding a peer, an fd or threads end with close()."""
import http.client
import threading
import time

import pytest

import shmipc
from conftest import default_config


def refused(field, fn, *args, **kwargs):
    with pytest.raises(shmipc.InvalidArgumentError) as ei:
        fn(*args, **kwargs)
    assert field in str(ei.value)


def test_config_timeouts_negative_is_forever_zero_does_not_wait():
    c = shmipc.Config()
    for v in (-1, -2.5, -1e300, float("-inf")):
        c.read_timeout = v
        assert c.read_timeout is None
        c.write_timeout = v
        assert c.write_timeout is None
        c.initialize_timeout = v
        assert c.initialize_timeout is None
        c.connection_write_timeout = v
        assert c.connection_write_timeout is None
    c.read_timeout = 0
    assert c.read_timeout == 0.0
    c.write_timeout = 0.0
    assert c.write_timeout == 0.0
    c.initialize_timeout = None
    assert c.initialize_timeout is None
    # A handshake cannot take no time.
    refused("initialize_timeout", setattr, c, "initialize_timeout", 0)
    refused("connection_write_timeout", setattr, c, "connection_write_timeout", 0)
    refused("read_timeout", setattr, c, "read_timeout", float("nan"))
    refused("read_timeout", setattr, c, "read_timeout", float("inf"))
    with pytest.raises(TypeError):
        c.read_timeout = "soon"
    c2 = shmipc.Config(read_timeout=0, write_timeout=-3, initialize_timeout=-1)
    assert c2.read_timeout == 0.0 and c2.write_timeout is None and c2.initialize_timeout is None


def test_read_timeout_zero_takes_pending_data_and_does_not_wait(make_pair):
    p = make_pair(server_config=default_config(read_timeout=0))
    cs = p.client.open_stream()
    cs.write(b"one")
    cs.flush()
    ss = p.server.accept_stream(timeout=10)
    assert ss.read_timeout == 0.0
    assert ss.readexactly(3) == b"one"
    t0 = time.monotonic()
    with pytest.raises(shmipc.TimeoutError):
        ss.read()
    assert time.monotonic() - t0 < 5
    cs.write(b"two")
    cs.flush()
    time.sleep(0.05)  # "two" waits, unprocessed, in the server's queue
    assert ss.readexactly(3) == b"two"
    with pytest.raises(shmipc.TimeoutError):
        ss.read_chunk()
    ss.read_timeout = -1
    assert ss.read_timeout is None


def test_stream_read_timeout_negative_waits_forever(pair):
    cs, ss = pair.streams()
    ss.read_timeout = -2
    got = []
    t = threading.Thread(target=lambda: got.append(ss.readexactly(3)))
    t.start()
    time.sleep(0.3)
    assert t.is_alive()  # still waiting
    cs.write(b"abc")
    cs.flush()
    t.join(10)
    assert got == [b"abc"]


def test_write_timeout_zero_fails_a_full_queue_at_once(make_pair):
    cfg = default_config(queue_capacity=16)
    p = make_pair(client_config=cfg, server_config=cfg)
    cs = p.client.open_stream()
    cs.write_timeout = 0
    assert cs.write_timeout == 0.0
    with pytest.raises(shmipc.TimeoutError):
        for _ in range(1000):  # nobody drains the server: the queue fills
            cs.write(b"q")
            cs.flush()


@pytest.mark.parametrize("timeout", [-1, -2, -1e9, float("-inf")])
def test_accept_stream_negative_timeout_waits_forever(pair, timeout):
    got = []
    t = threading.Thread(target=lambda: got.append(pair.server.accept_stream(timeout=timeout)))
    t.start()
    time.sleep(0.3)
    assert t.is_alive()  # still waiting (the old binding refused negative timeouts)
    cs = pair.client.open_stream()
    cs.write(b"x")
    cs.flush()
    t.join(10)
    assert len(got) == 1 and got[0].readexactly(1) == b"x"
    got[0].close()
    cs.close()


def test_listener_accept_negative_timeout_waits_forever(address):
    with shmipc.Listener(address) as l:
        got = []
        t = threading.Thread(target=lambda: got.append(l.accept(timeout=-5)))
        t.start()
        time.sleep(0.3)
        assert t.is_alive()
        with shmipc.connect(address):
            t.join(10)
            assert len(got) == 1
            got[0].close()
        with pytest.raises(shmipc.TimeoutError):
            l.accept(timeout=0)


def test_reserve_beyond_the_largest_slice_raises_emsgsize(pair):
    largest = max(size for size, _ in shmipc.Config().slice_classes)
    cs, ss = pair.streams()
    with cs.reserve(largest) as w:
        w[:2] = b"ok"
    cs.commit(2)
    cs.flush()
    assert ss.readexactly(2) == b"ok"
    for n in (largest + 1, (64 << 20) - 16, 2**62):
        with pytest.raises(shmipc.Error) as ei:
            cs.reserve(n)
        assert ei.value.name == "SHMIPC_EMSGSIZE", n
    with pytest.raises(shmipc.InvalidArgumentError):
        cs.commit(0)  # no window is open
    big = bytes(range(256)) * ((2 * largest) // 256 + 1)
    cs.write(big)  # write() still splits across slices
    cs.flush()
    assert ss.readexactly(len(big)) == big


def test_server_timeout_kwargs_follow_the_rule():
    # 0 where "no wait" means nothing is refused; negative is never.
    refused("header_timeout", shmipc.Server, port=0, header_timeout=0)
    refused("ws_ping_timeout", shmipc.Server, port=0, ws_ping_timeout=0)
    refused("ws_idle_timeout", shmipc.Server, port=0, ws_idle_timeout=0)
    s = shmipc.Server(port=0, header_timeout=-1, keepalive_timeout=-1, stop_timeout=-1,
                      ws_ping_timeout=-1, ws_idle_timeout=-1)
    s.close()
    assert s.closed


def test_server_keepalive_zero_closes_after_each_response():
    s = shmipc.Server(port=0, keepalive_timeout=0, stop_timeout=1.0)
    s.static("/", "hi", content_type="text/plain")
    s.start()
    try:
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        c.request("GET", "/")
        r = c.getresponse()
        assert r.status == 200 and r.read() == b"hi"
        assert r.getheader("Connection") == "close"
        c.close()
    finally:
        s.close()
