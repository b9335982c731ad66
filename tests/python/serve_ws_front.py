"""The front's half of a WebSocket over the shmipc-serve frames (docs/serve.md, "Exchanges"),
shared by the tests that play the front to a worker: test_serve_asgi_ws.py (the ASGI worker)
and test_serve_lua_ws.py (the Lua worker). A `front` is test_serve_worker.Front (or one made
by test_serve_native_worker.connect_front)."""
import pytest

sf = pytest.importorskip("shmipc._serve")
from test_serve_worker import frame, head  # noqa: E402

FIN = 0x100


def upgrade(front, target=b"/ws", protocols=None):
    headers = [("Host", "h"), ("Upgrade", "websocket"), ("Connection", "Upgrade"),
               ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
               ("Sec-WebSocket-Version", "13")]
    if protocols:
        headers.append(("Sec-WebSocket-Protocol", protocols))
    st = front.session.open_stream()
    st.write(head(b"GET", target, headers, flags=sf.REQ_UPGRADE | sf.REQ_KEEP_ALIVE))
    st.write(frame(sf.END))
    st.flush()
    return st


def accepted(front, st):
    """Read the 101 and its END; the fields it adds."""
    typ, arg, payload = front.read_frame(st)
    assert typ == sf.RESPONSE_HEAD
    status, _, _, fields = sf.decode_response(frame(typ, payload, arg))
    assert status == 101
    assert front.read_frame(st)[0] == sf.END
    return fields


def close_frame(code=0, reason=b""):
    return frame(sf.WS_CLOSE, code.to_bytes(2, "little") + reason if code else b"")


def send(st, *frames):
    for f in frames:
        st.write(f)
    st.flush()


def message(front, st):
    """One whole message the worker sent: (opcode, data, frames it took)."""
    parts, op, n = [], None, 0
    while True:
        typ, arg, payload = front.read_frame(st)
        assert typ == sf.WS_DATA, (typ, payload)
        n += 1
        if op is None:
            op = arg & 0xFF
            assert op in (1, 2)
        else:
            assert arg & 0xFF == 0
        parts.append(payload)
        if arg & FIN:
            return op, b"".join(parts), n


def closed(front, st):
    typ, arg, payload = front.read_frame(st)
    assert typ == sf.WS_CLOSE, (typ, payload)
    if not payload:
        return None, ""
    return int.from_bytes(payload[:2], "little"), payload[2:].decode()
