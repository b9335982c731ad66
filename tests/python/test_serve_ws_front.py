"""WebSocket through shmipc-serve end to end (issue 22, items 1 and 4): a real shmipc-serve
(its front, core/serve/front_ws.c) before real `python -m shmipc.serve.worker --asgi`
processes serving an ASGI websocket app, reached with a raw RFC 6455 client. Echo of text,
binary and a multi-frame message, the subprotocol the app chose, close codes both ways, an
app that raises after the accept (1011), a refusal before the accept (403), the disconnect the
app gets when the client drops (1006), and 16 connections over 2 workers with unique messages
(no cross-talk). And the client's close frame with its socket closed or reset right behind
it, reaching the app of the ASGI, C and Lua workers as its code on both backends. Nothing
asserts on speed."""
import os
import socket
import struct
import threading
import time

import pytest

from test_serve_cli import SERVE, Serve
from test_server_ws import BINARY, CLOSE, TEXT, WSClient

pytestmark = pytest.mark.skipif(not os.path.exists(SERVE), reason="shmipc-serve is not built")

APP = '''
import os

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        raise RuntimeError("no lifespan here")
    if scope["type"] == "http":
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"http " + scope["path"].encode()})
        return
    tag = scope["query_string"].decode()
    assert (await receive())["type"] == "websocket.connect"
    if scope["path"] == "/deny":
        await send({"type": "websocket.close", "code": 1000})
        return
    sub = "chat" if "chat" in scope["subprotocols"] else None
    await send({"type": "websocket.accept", "subprotocol": sub})
    while True:
        m = await receive()
        if m["type"] == "websocket.disconnect":
            with open("disconnects.log", "a") as f:
                f.write("%s %d %s\\n" % (tag, m["code"], m.get("reason") or ""))
            return
        text = m.get("text")
        if text == "raise":
            raise RuntimeError("the app failed after the accept")
        if text is not None and text.startswith("close:"):
            _, code, reason = text.split(":")
            await send({"type": "websocket.close", "code": int(code), "reason": reason})
            continue  # the client's answer comes as websocket.disconnect
        if text == "pid":
            await send({"type": "websocket.send", "text": str(os.getpid())})
        elif text is not None:
            await send({"type": "websocket.send", "text": text})
        else:
            await send({"type": "websocket.send", "bytes": m["bytes"]})
'''


@pytest.fixture(params=[None, "1"], ids=["concurrent", "one-at-a-time"])
def server(tmp_path, request):
    # The ASGI workers as shmipc-serve runs them (64 sockets at once each), and one at a time
    # (--concurrency 1): every case runs against both.
    (tmp_path / "wsapp.py").write_text(APP)
    flags = () if request.param is None else ("--concurrency", request.param)
    s = Serve(tmp_path, *flags, workers=2, app=("--asgi", "wsapp:app"))
    s.dir = tmp_path
    s.concurrency = 64 if request.param is None else int(request.param)
    yield s
    assert s.stop() == 0, "".join(s.err)


def disconnects(s, tag, timeout=20):
    """The app's websocket.disconnect lines for `tag` (waits until one is there)."""
    path = s.dir / "disconnects.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            lines = [l.split(" ", 2) for l in path.read_text().splitlines()]
            got = [(int(code), reason) for t, code, reason in lines if t == tag]
            if got:
                return got
        time.sleep(0.05)
    return []


def recv_close(c):
    op, data = c.recv_frame()
    assert op == CLOSE, (op, data)
    return struct.unpack(">H", data[:2])[0], data[2:]


def test_echo_subprotocol_and_large_message(server):
    c = WSClient(server.port, "/echo?a", protocols=["x", "chat"])
    assert c.status == 101
    assert c.headers["sec-websocket-protocol"] == "chat"
    c.send("hello")
    assert c.recv() == "hello"
    c.send("h\u00e9llo \u2603")
    assert c.recv() == "h\u00e9llo \u2603"
    c.send(b"\x00\x01binary")
    assert c.recv() == b"\x00\x01binary"
    c.send_frame(TEXT, b"frag-", fin=False)
    c.send_frame(0, b"ment", fin=True)
    assert c.recv() == "frag-ment"
    big = os.urandom((2 << 20) + 3)  # 3 WS_DATA frames each way
    c.send(big)
    assert c.recv() == big
    assert c.close(1000) == 1000
    assert disconnects(server, "a") == [(1000, "")]
    # the worker is free again: plain HTTP through the same front
    assert server.request("GET", "/plain") == (200, b"http /plain")


def test_no_subprotocol_when_none_offered(server):
    c = WSClient(server.port, "/echo?b")
    assert c.status == 101 and "sec-websocket-protocol" not in c.headers
    c.send("x")
    assert c.recv() == "x"
    assert c.close(1001) == 1001


def test_close_codes_both_ways(server):
    c = WSClient(server.port, "/echo?c1")
    c.send_frame(CLOSE, struct.pack(">H", 4002) + b"bye")
    assert recv_close(c) == (4002, b"")
    c.sock.close()
    assert disconnects(server, "c1") == [(4002, "bye")]
    c = WSClient(server.port, "/echo?c2")
    c.send("close:4001:later")
    assert recv_close(c) == (4001, b"later")
    c.send_frame(CLOSE, struct.pack(">H", 4001))
    c.sock.settimeout(10)
    assert c.sock.recv(10) == b""  # the front closes once the handshake went both ways
    c.sock.close()
    assert disconnects(server, "c2") == [(4001, "")]


def test_app_raises_after_accept_is_1011(server):
    c = WSClient(server.port, "/echo?r")
    c.send("raise")
    assert recv_close(c)[0] == 1011
    c.sock.close()
    assert server.request("GET", "/after") == (200, b"http /after")
    assert server.wait_err("the app failed after the accept"), "".join(server.err)


def test_refused_before_accept_is_403(server):
    c = WSClient(server.port, "/deny?d")
    assert c.status == 403
    assert c.headers.get("connection") == "close"
    c.sock.close()


def test_client_drop_is_disconnect_1006(server):
    c = WSClient(server.port, "/echo?gone")
    c.send("x")
    assert c.recv() == "x"
    c.drop()
    assert disconnects(server, "gone") == [(1006, "")]
    assert server.request("GET", "/after") == (200, b"http /after")


def test_two_workers_16_connections_unique_messages(server):
    bad, pids = [], set()
    lock = threading.Lock()

    def run(i):
        try:
            c = WSClient(server.port, f"/echo?x{i}")
            if c.status != 101:
                bad.append((i, c.status))
                return
            c.send("pid")
            pid = c.recv()
            for k in range(5):
                msg = f"{i}-{k}-{os.urandom(8).hex()}" * (1 + (i * 37 + k) % 50)
                c.send(msg)
                if c.recv() != msg:
                    bad.append((i, k))
                blob = os.urandom(1000 + i * 100 + k)
                c.send(blob)
                if c.recv() != blob:
                    bad.append((i, k, "bytes"))
            if c.close(1000) != 1000:
                bad.append((i, "close"))
            with lock:
                pids.add(pid)
        except (OSError, EOFError, AssertionError) as e:
            bad.append((i, repr(e)))

    if server.concurrency == 1:
        # Both ready before the load: a worker still importing on a loaded machine would
        # leave every connection to the other one (the check below is of the spread).
        assert len(server.worker_pids(count=2)) == 2
    ts = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert bad == []
    if server.concurrency == 1:
        assert len(pids) == 2  # both workers served (each holds one socket at a time)
    for i in range(16):
        assert disconnects(server, f"x{i}") == [(1000, "")]


def test_sixteen_sockets_open_at_once(server):
    # Every client holds its socket open until all 16 are open and echoed: the concurrent
    # workers hold them together; one at a time, two workers hold two and the rest wait for
    # the 20 s deadline of the front (not run: it is the case that cannot pass).
    if server.concurrency < 16:
        pytest.skip("needs 16 sockets at once over two workers")
    opened = threading.Barrier(16, timeout=30)
    bad = []

    def run(i):
        try:
            c = WSClient(server.port, f"/echo?b{i}")
            if c.status != 101:
                bad.append((i, c.status))
                opened.abort()
                return
            c.send(f"hello {i}")
            if c.recv() != f"hello {i}":
                bad.append((i, "echo"))
            opened.wait()
            c.send(f"bye {i}")
            if c.recv() != f"bye {i}":
                bad.append((i, "echo 2"))
            if c.close(1000) != 1000:
                bad.append((i, "close"))
        except (OSError, EOFError, AssertionError, threading.BrokenBarrierError) as e:
            bad.append((i, repr(e)))

    ts = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert bad == []


# ---- the client's close frame with its TCP connection gone right behind it ----

# The same application for each kind of worker: an echo whose end (the close code and reason
# the worker got: websocket.disconnect, shmipc_serve_ws_closed(), recv_frame's close) is
# appended to disconnects.log as "TAG CODE REASON", TAG the query; "big" is answered with one
# 8 MiB binary message, "slow" echoed after 300 ms (the C and Lua ones: for
# test_serve_native_worker.py).
GONE_ASGI = '''
async def app(scope, receive, send):
    if scope["type"] != "websocket":
        raise RuntimeError("websocket only")
    await receive()
    await send({"type": "websocket.accept"})
    while True:
        m = await receive()
        if m["type"] == "websocket.disconnect":
            with open("disconnects.log", "a") as f:
                f.write("%s %d %s\\n" % (scope["query_string"].decode(), m["code"],
                                         m.get("reason") or ""))
            return
        if m.get("text") == "big":
            await send({"type": "websocket.send", "bytes": b"b" * (8 << 20)})
        elif m.get("text") is not None:
            await send({"type": "websocket.send", "text": m["text"]})
        else:
            await send({"type": "websocket.send", "bytes": m["bytes"]})
'''

GONE_LUA = '''
return function(req)
  if not req.websocket then return 404, {}, "" end
  local ws = req:accept_websocket()
  while true do
    local data, typ, code = ws:recv_frame()
    if typ == "close" or not typ then
      local f = assert(io.open("disconnects.log", "a"))
      f:write(string.format("%s %s %s\\n", req.query, tostring(code), data or ""))
      f:close()
      return
    end
    if data == "slow" then
      local t = os.clock() + 0.3
      while os.clock() < t do end
    end
    if data == "big" then
      ws:send_binary(string.rep("b", 8 * 1024 * 1024))
    elseif typ == "text" then
      ws:send_text(data)
    else
      ws:send_binary(data)
    end
  end
end
'''

GONE_C = os.path.join(os.path.dirname(SERVE), "..", "tests", "c", "libserve_wsclose.so")


@pytest.fixture(params=[(k, b) for k in ("asgi", "c", "lua") for b in ("epoll", "io_uring")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def gone_server(tmp_path, request):
    kind, backend = request.param
    if kind == "c" and not os.path.exists(GONE_C):
        pytest.skip("libserve_wsclose.so is not built")
    if kind == "asgi":
        (tmp_path / "goneapp.py").write_text(GONE_ASGI)
        app = ("--asgi", "goneapp:app")
    elif kind == "lua":
        (tmp_path / "goneapp.lua").write_text(GONE_LUA)
        app = ("--lua", "goneapp")
    else:
        app = ("--c", os.path.abspath(GONE_C))
    # The stall timeout (keep-alive) short: it gives up a client that stopped reading.
    env = {"SHMIPC_REACTOR_BACKEND": backend, "SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS": "300"}
    s = Serve(tmp_path, workers=1, app=app, env=env)
    s.dir = tmp_path
    if kind == "lua" and s.request("GET", "/x")[0] != 404:
        s.stop()
        pytest.skip("the worker was built without Lua")
    yield s
    assert s.stop() == 0, "".join(s.err)


@pytest.mark.parametrize("paused", [False, True], ids=["reading", "paused"])
@pytest.mark.parametrize("how", ["fin", "close", "reset"])
def test_close_frame_then_gone_reaches_the_app(gone_server, paused, how):
    """The client's close frame (4001 "bye") with its TCP connection gone right behind it
    (RFC 6455 §7.1.5: the frame's code is the close's, 1006 only without one): the app gets
    4001 "bye" from each kind of worker, on both backends, while the front reads the client,
    and while it does not: the app's 8 MiB message waits for a client that read one byte of
    it, so the client's next message made the front's server stop reading it (PAUSE); then
    close() is a reset that fails the server's send, and a FIN is heard while paused and the
    stall timeout (keep-alive, 300 ms) gives the client up. Those were 1006 (ABORT
    CLIENT_GONE to the worker): the server closed without reading the frame."""
    tag = f"{how}{int(paused)}"
    c = WSClient(gone_server.port, "/ws?" + tag)
    assert c.status == 101
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if paused:
        c.send("big")
        c.sock.settimeout(20)
        assert c.sock.recv(1) == b"\x82"  # the message is queued at the front
        c.send("after")  # read while the queue is above the mark: PAUSE
        time.sleep(0.2)
    else:
        c.send("hello")
        assert c.recv() == "hello"
    c.sock.sendall(bytes([0x88, 0x85]) + b"\0\0\0\0" + struct.pack(">H", 4001) + b"bye")
    c.wait_sent()  # a reset drops what the client's kernel has not sent
    if how == "fin":
        c.sock.shutdown(socket.SHUT_WR)
    else:
        if how == "reset":
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.sock.close()
    try:
        assert disconnects(gone_server, tag) == [(4001, "bye")]
    finally:
        c.sock.close()
