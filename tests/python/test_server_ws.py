"""shmipc.Server.websocket(): Python callbacks for WebSocket connections, tested with a small
raw-socket client (masked frames, as RFC 6455 requires of clients) on both backends: echo of
text and binary messages, subprotocols, per-connection attributes, refusal, server pings and
closes, callback exceptions (1011, logged, still serving), the WebSocket object being
invalid after on_close, and the client's close code when it closes or resets its socket right
behind its close frame (also while the server does not read it)."""
import base64
import fcntl
import hashlib
import logging
import os
import socket
import struct
import threading
import time

import pytest

from test_server import BACKENDS, started

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
TEXT, BINARY, CLOSE, PING, PONG = 1, 2, 8, 9, 10
_SIOCOUTQNSD = 0x894B  # linux/sockios.h: the bytes a socket has not sent yet


class WSClient:
    """A minimal RFC 6455 client: the upgrade, masked frames out, unmasked frames in."""

    def __init__(self, port, path="/ws", protocols=None, headers=""):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        key = base64.b64encode(os.urandom(16))
        proto = f"Sec-WebSocket-Protocol: {', '.join(protocols)}\r\n" if protocols else ""
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key.decode()}\r\n"
                           f"Sec-WebSocket-Version: 13\r\n{proto}{headers}\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        if self.status == 101:
            accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
            assert self.headers["sec-websocket-accept"] == accept

    def wait_sent(self, timeout=5.0):
        """Until the kernel has sent every byte written (SIOCOUTQNSD reads 0 unsent): a client
        that resets drops what its kernel still holds, so a test that sends its close frame
        and resets must see the frame leave first (Nagle, or a delayed ACK, can hold it)."""
        end = time.monotonic() + timeout
        while True:
            unsent = struct.unpack("i", fcntl.ioctl(self.sock.fileno(), _SIOCOUTQNSD,
                                                    b"\0\0\0\0"))[0]
            if unsent == 0:
                return
            assert time.monotonic() < end, f"{unsent} bytes still unsent after {timeout} s"
            time.sleep(0.001)

    def send_frame(self, opcode, payload, fin=True):
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([(0x80 if fin else 0) | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if n < 4096 else \
            (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")
             ).to_bytes(n, "big")
        self.sock.sendall(head + mask + masked)

    def send(self, msg):
        if isinstance(msg, str):
            self.send_frame(TEXT, msg.encode())
        else:
            self.send_frame(BINARY, msg)

    def _need(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("connection closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_frame(self):
        b0, b1 = self._need(2)
        assert not b1 & 0x80, "server frames are not masked"
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", self._need(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self._need(8))[0]
        return b0 & 0x0F, self._need(n)

    def recv(self):
        op, data = self.recv_frame()
        assert op in (TEXT, BINARY), (op, data)
        return data.decode() if op == TEXT else data

    def close(self, code=1000, reason=b""):
        self.send_frame(CLOSE, struct.pack(">H", code) + reason)
        op, data = self.recv_frame()
        assert op == CLOSE
        self.sock.close()
        return struct.unpack(">H", data[:2])[0] if data else None

    def drop(self):
        self.sock.close()


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


class Events:
    def __init__(self):
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.items = []

    def add(self, *item):
        with self.cond:
            self.items.append(item)
            self.cond.notify_all()

    def wait_for(self, kind, n=1, timeout=10):
        end = time.monotonic() + timeout
        with self.cond:
            while sum(1 for i in self.items if i[0] == kind) < n:
                left = end - time.monotonic()
                assert left > 0, f"no {kind}: {self.items}"
                self.cond.wait(left)
            return [i for i in self.items if i[0] == kind]


def echo_app(events):
    def setup(s):
        def on_open(ws, req):
            ws.count = 0  # per-connection state
            ws.name = req.args.get("name", ["?"])[0]
            events.add("open", ws, req.path, req.headers.get("x-test"))
            return req.query != "refuse"

        def on_message(ws, data):
            ws.count += 1
            if data == "bye":
                ws.close(4000, "done")
            elif data == "ping me":
                ws.ping(b"hi")
            elif data == "boom":
                raise ValueError("callback failed on purpose")
            elif data == "who":
                ws.send(f"{ws.name} {ws.count} {ws.subprotocol}")
            else:
                ws.send(data)

        def on_close(ws, code, reason):
            events.add("close", ws, code, reason, ws.count)

        s.websocket("/ws", on_message, on_open=on_open, on_close=on_close,
                    subprotocols=["chat.v2", "chat.v1"])
        s.route("GET", "/ws", lambda r: "plain GET")

        @s.websocket("/deco/*")
        def deco(ws, data):
            ws.send(data[::-1])

    return setup


def test_echo_and_attributes(shmipc, backend):
    events = Events()
    s = started(shmipc, echo_app(events), backend=backend)
    with s:
        c = WSClient(s.port, "/ws?name=ada", protocols=["chat.v1", "chat.v2"],
                     headers="X-Test: yes\r\n")
        assert c.status == 101 and c.headers["sec-websocket-protocol"] == "chat.v2"
        mine = c.sock.getsockname()
        ws = events.wait_for("open")[0][1]
        assert events.items[0][2:] == ("/ws", "yes")
        assert isinstance(ws, shmipc.WebSocket) and not ws.closed and ws.close_code is None
        c.send("hello")
        assert c.recv() == "hello"
        c.send(b"\x00\xffbin")
        assert c.recv() == b"\x00\xffbin"
        big = os.urandom(300_000)
        c.send(big)
        assert c.recv() == big
        c.send("héllo ✓")
        assert c.recv() == "héllo ✓"
        c.send("who")
        assert c.recv() == "ada 5 chat.v2"
        # The object belongs to its worker thread: another thread gets SHMIPC_EBUSY.
        with pytest.raises(shmipc.Error) as e:
            ws.send("from the main thread")
        assert e.value.name == "SHMIPC_EBUSY"
        assert c.close(1000) == 1000
        _, ws2, code, reason, count = events.wait_for("close")[0]
        assert ws2 is ws and code == 1000 and reason == "" and count == 5
        # Invalid after on_close: every method raises, attributes stay readable.
        assert ws.closed and ws.close_code == 1000 and ws.count == 5
        for call in (lambda: ws.send("x"), lambda: ws.ping(), lambda: ws.close(),
                     lambda: ws.subprotocol):
            with pytest.raises(shmipc.ClosedError):
                call()
        assert ws.request.path == "/ws" and "closed" in repr(ws)
        # The upgrade request's client, kept in the Request past the handshake and on_close.
        assert ws.request.client == ws.request.client == mine
        # The plain GET route on the same path still answers, and the decorator form works.
        import http.client

        h = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        h.request("GET", "/ws")
        assert h.getresponse().read() == b"plain GET"
        d = WSClient(s.port, "/deco/x")
        assert d.status == 101 and "sec-websocket-protocol" not in d.headers
        d.send("abc")
        assert d.recv() == "cba"
        d.close()


def test_refuse_ping_server_close_and_drop(shmipc, backend):
    events = Events()
    s = started(shmipc, echo_app(events), backend=backend)
    with s:
        assert WSClient(s.port, "/ws?refuse").status == 403
        c = WSClient(s.port, "/ws")
        c.send("ping me")
        assert c.recv_frame() == (PING, b"hi")
        c.send_frame(PONG, b"hi")
        c.send("bye")  # the server closes with 4000 "done"
        op, data = c.recv_frame()
        assert op == CLOSE and data == struct.pack(">H", 4000) + b"done"
        c.send_frame(CLOSE, data)  # the client's answer
        _, _, code, reason, _ = events.wait_for("close")[0]
        assert (code, reason) == (4000, "done")
        c.drop()
        d = WSClient(s.port, "/ws")
        d.send("x")
        assert d.recv() == "x"
        d.drop()  # no close frame: 1006
        closes = events.wait_for("close", 2)
        assert closes[1][2] == 1006
    assert len(events.wait_for("open", 3)) == 3  # the refused one was opened, then refused


def test_callback_exception_closes_1011_and_keeps_serving(shmipc, backend, caplog):
    caplog.set_level(logging.ERROR, logger="shmipc.server")
    events = Events()
    s = started(shmipc, echo_app(events), backend=backend)
    with s:
        for _ in range(3):
            c = WSClient(s.port, "/ws")
            c.send("boom")
            op, data = c.recv_frame()
            assert op == CLOSE and struct.unpack(">H", data[:2])[0] == 1011
            c.send_frame(CLOSE, data[:2])
            c.drop()
        c = WSClient(s.port, "/ws")
        c.send("still here")
        assert c.recv() == "still here"
        c.close()
    records = [r for r in caplog.records if r.name == "shmipc.server"]
    assert len(records) == 3 and records[0].exc_info[0] is ValueError
    assert "on_message" in records[0].getMessage()


def test_websocket_arguments(shmipc):
    with shmipc.Server(port=0, workers=1) as s:
        with pytest.raises(TypeError):
            s.websocket("/a", "not callable")
        with pytest.raises(TypeError):
            s.websocket("/a", lambda ws, d: None, on_open=3)
        s.websocket("/a", lambda ws, d: None)
        with pytest.raises(shmipc.Error) as e:
            s.websocket("/a", lambda ws, d: None)
        assert e.value.name == "SHMIPC_EEXIST"
        with pytest.raises(TypeError):
            shmipc.WebSocket()


def test_many_connections_memory_stable(shmipc):
    import tracemalloc

    events = Events()
    s = started(shmipc, echo_app(events), workers=2)
    with s:
        def round_(n):
            for _ in range(n):
                c = WSClient(s.port, "/ws")
                for i in range(5):
                    c.send(f"m{i}")
                    assert c.recv() == f"m{i}"
                c.close()
            events.wait_for("close", len(events.wait_for("open")))
            with events.lock:
                events.items.clear()

        round_(50)
        tracemalloc.start()
        s0 = tracemalloc.take_snapshot()
        round_(200)
        grown = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(s0, "filename"))
        tracemalloc.stop()
        assert grown < 256 * 1024, grown


def test_on_open_raising_refuses_and_message_limit(shmipc, caplog):
    caplog.set_level(logging.ERROR, logger="shmipc.server")

    def on_open(ws, req):
        if req.query == "raise":
            raise KeyError("refused on purpose")

    def setup(s):
        s.websocket("/ws", lambda ws, data: ws.send(data), on_open=on_open)

    s = started(shmipc, setup, max_ws_message=1000)
    with s:
        assert WSClient(s.port, "/ws?raise").status == 403
        assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records)
        c = WSClient(s.port, "/ws")
        c.send(b"a" * 1000)
        assert c.recv() == b"a" * 1000
        c.send(b"a" * 1001)  # above max_ws_message: the server closes with 1009
        op, data = c.recv_frame()
        assert op == CLOSE and struct.unpack(">H", data[:2])[0] == 1009
        c.drop()


def test_close_with_open_connections(shmipc):
    """close() with WebSocket connections open: each client gets a 1001 close frame, on_close
    runs for each (1006: these clients never answer), and close() returns after the stop
    timeout without a deadlock (the workers need the GIL for on_close)."""
    closes = []

    def setup(s):
        s.websocket("/ws", lambda ws, d: ws.send(d), on_close=lambda ws, c, r: closes.append(c))

    s = started(shmipc, setup, workers=2, stop_timeout=0.5)
    clients = [WSClient(s.port, "/ws") for _ in range(4)]
    for c in clients:
        c.send("x")
        assert c.recv() == "x"
    s.close()
    assert closes == [1006] * 4
    for c in clients:
        assert c.recv_frame() == (CLOSE, struct.pack(">H", 1001))
        c.drop()


# The client's close frame with its TCP connection gone right behind it (RFC 6455 §7.1.5:
# the frame's code is the close's; §7.4.1: 1006 only for a close without one).

def _gone(c, how):
    """The client leaves: "fin" (shutdown(SHUT_WR); it never reads again), "close" (a FIN, or
    a reset when the server's bytes wait unread in its socket) or "reset" (SO_LINGER 0)."""
    c.wait_sent()
    if how == "fin":
        c.sock.shutdown(socket.SHUT_WR)
        return
    if how == "reset":
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.sock.close()


@pytest.mark.parametrize("how", ["fin", "close", "reset"])
@pytest.mark.parametrize("paused", [False, True], ids=["reading", "paused"])
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_close_frame_then_gone_reports_its_code(shmipc, backend, paused, split, how):
    """The client sends its close frame (4001 "bye", whole or in two writes) and is gone at once:
    on_close gets 4001 "bye", while the server reads the client (the FIN or reset in the same
    receive as the frame, or the next), and while it does not: its 8 MiB answer to "big" waits
    unread (PAUSE), so close() is a reset and the server's send fails, or a FIN is heard while
    paused and the stall timeout (keep-alive, 0.3 s) gives the client up. In those the server
    told on_close 1006 without reading the frame. The text message behind the pause is not
    delivered (the client is gone; its input is only looked through for the close frame)."""
    events = Events()

    def setup(s):
        def on_message(ws, data):
            if data == "ok":
                ws.send(data)
                return
            events.add("message", data)
            if data == "big":
                ws.send(b"x" * (8 << 20))

        s.websocket("/ws", on_message, on_close=lambda ws, code, reason:
                    events.add("close", code, reason))

    s = started(shmipc, setup, backend=backend, keepalive_timeout=0.3)
    with s:
        c = WSClient(s.port, "/ws")
        # Each write leaves at once: a reset drops what the client's kernel still holds, and
        # Nagle would hold the close frame behind the unacknowledged message.
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if paused:
            c.send("big")
            events.wait_for("message")
            time.sleep(0.05)  # the server paused right after the message
        c.send("after")
        close = bytes([0x88, 0x85]) + b"\0\0\0\0" + struct.pack(">H", 4001) + b"bye"
        if split:
            c.sock.sendall(close[:3])
            time.sleep(0.02)
            c.sock.sendall(close[3:])
        else:
            c.sock.sendall(close)
        _gone(c, how)
        try:
            got = events.wait_for("close", timeout=6)[0]
        finally:
            c.sock.close()
        assert got[1:] == (4001, "bye")
        assert [m[1] for m in events.items if m[0] == "message"] == ["big" if paused else "after"]
        # And the server goes on.
        d = WSClient(s.port, "/ws")
        d.send("ok")
        assert d.recv() == "ok"
        d.close()
