"""WebSocket in the Lua worker (serve/worker_lua.c over shmipc_serve_ws_*, docs/serve.md
"WebSocket in the C and Lua workers"): a real shmipc-serve-worker process running a Lua
handler, the front played over a shmipc client session with the WS_* frames, as
test_serve_asgi_ws.py does for the ASGI worker (the helpers of serve_ws_front.py). Echo of
text, binary, fragmented and 3 MiB messages, subprotocols and headers, a refusal (403), close
codes both ways, 1011 for a Lua error after the accept and 500 before it, the client gone
(1006), a stopping worker closing 1001, 2 workers with many connections, bad frames, and misuse
of the Lua API raising clear errors."""
import signal
import threading
import time

import pytest

from conftest import unique_address  # noqa: F401  (the fixture's addresses)

sf = pytest.importorskip("shmipc._serve")
from serve_ws_front import FIN, accepted, close_frame, closed, message, send, upgrade  # noqa: E402
from test_serve_native_worker import WORKER, Proc, has_lua  # noqa: E402
from test_serve_worker import frame  # noqa: E402

pytestmark = pytest.mark.skipif(not has_lua(), reason="the worker was built without Lua")

APP = r'''
LAST = "none"

local function echo(ws)
  while true do
    local data, typ, err = ws:recv_frame()
    if typ == "close" then
      LAST = "close " .. tostring(err) .. " " .. data
      io.stderr:write("ws closed " .. tostring(err) .. "\n")
      return
    end
    if not data then error("recv_frame: " .. tostring(err)) end
    local ok, e
    if typ == "text" then ok, e = ws:send_text(data) else ok, e = ws:send_binary(data) end
    if not ok then LAST = "send " .. tostring(e) return end
  end
end

local function errs(...)
  local ok, e = pcall(...)
  return ok and "no error" or tostring(e)
end

return function(req)
  local p = req.path
  if not req.websocket then
    if p == "/last" then return 200, {}, LAST end
    if p == "/kept" then return 200, {}, errs(KEPT.send_text, KEPT, "x") end
    if p == "/not-upgrade" then req:accept_websocket() end
    return 200, {}, "plain"
  end
  if p == "/refuse" then
    return 403, {}, table.concat(req.subprotocols, "|")
  elseif p == "/echo" then
    echo(req:accept_websocket())
  elseif p == "/proto" then
    local ws = req:accept_websocket{protocol = "superchat",
                                    headers = {["X-A"] = "1", ["Sec-WebSocket-Accept"] = "forged"}}
    ws:send_close(1000)
    echo(ws)
  elseif p == "/bad-proto" then
    req:accept_websocket{protocol = "nope"}
  elseif p == "/close4001" then
    local ws = req:accept_websocket()
    assert(ws:send_close(4001, "go \u{e9}"))
    local data, typ, code = ws:recv_frame()
    LAST = typ .. " " .. tostring(code) .. " | " .. errs(ws.send_text, ws, "late")
  elseif p == "/raise" then
    local ws = req:accept_websocket()
    ws:recv_frame()
    error("boom")
  elseif p == "/raise-before" then
    error("before")
  elseif p == "/gone" then
    local ws = req:accept_websocket()
    local data, typ, code = ws:recv_frame()
    local ok, err = ws:send_text("late")
    LAST = tostring(typ) .. " " .. tostring(code) .. " " .. tostring(ok) .. " " .. tostring(err)
  elseif p == "/misuse" then
    local ws = req:accept_websocket()
    KEPT = ws
    local e1 = errs(ws.send_text, ws, {})
    local e2 = errs(ws.send_close, ws, 999)
    local e3 = errs(ws.send_binary, ws)
    local e4 = errs(ws.send_text, ws, "\xff")
    local e5 = errs(ws.send_ping, ws, string.rep("p", 126))
    local e6 = errs(req.read, req)
    local e7 = errs(function() return req.body end)
    assert(ws:send_text(table.concat({e1, e2, e3, e4, e5, e6, e7}, "\n")))
    assert(ws:send_close(1000, "done"))
    LAST = errs(ws.send_text, ws, "after close") .. "\n" .. errs(ws.send_close, ws, 1000)
    ws:recv_frame()
  elseif p == "/timeout" then
    local ws = req:accept_websocket{timeout = 50}
    local data, typ, err = ws:recv_frame()
    ws:send_text(tostring(data) .. " " .. tostring(typ) .. " " .. tostring(err))
    ws:set_timeout(nil)
    echo(ws)
  elseif p == "/close-wait" then
    local ws = req:accept_websocket()
    ws:send_close(1000)
    local data, typ, code = ws:recv_frame()  -- no timeout: the front's answer
    io.stderr:write("close-wait " .. tostring(typ) .. " " .. tostring(code) .. "\n")
  elseif p == "/ping" then
    local ws = req:accept_websocket()
    assert(ws:send_ping("p"))
    assert(ws:send_pong())
    echo(ws)
  elseif p == "/small" then
    local ws = req:accept_websocket{max_payload_len = 4}
    local data, typ, err = ws:recv_frame()
    LAST = tostring(data) .. " " .. tostring(typ) .. " " .. tostring(err)
    ws:recv_frame()
  elseif p == "/small2" then
    local ws = req:accept_websocket{max_payload_len = 4}
    local _, _, e1 = ws:recv_frame()
    local d2, t2, e2 = ws:recv_frame()
    LAST = tostring(e1) .. " | " .. tostring(d2 and #d2) .. " " .. tostring(t2) .. " " .. tostring(e2)
  elseif p == "/poll" then
    local ws = req:accept_websocket{timeout = 0}  -- polls: only what arrived
    while true do
      local data, typ, err = ws:recv_frame()
      if typ == "close" then LAST = "poll close " .. tostring(err) return end
      if data then
        ws:send_binary(data)
      elseif err ~= "timeout" then
        LAST = "poll " .. tostring(err)
        return
      end
    end
  elseif p == "/push" then
    local ws = req:accept_websocket()
    local n = 0
    while true do  -- sends only, never receives
      n = n + 1
      local ok, err = ws:send_text("tick " .. n)
      if not ok then io.stderr:write("push " .. tostring(err) .. "\n") return end
      local t = os.clock() + 0.005
      while os.clock() < t do end
    end
  elseif p == "/return" then
    req:accept_websocket()
    return 200, {}, "ignored after the accept"
  end
end
'''


@pytest.fixture
def lua(tmp_path):
    (tmp_path / "wsapp.lua").write_text(APP)
    procs = []

    def start(*args):
        w = Proc("lua", *args, app=["--lua", "wsapp"], cwd=tmp_path)
        procs.append(w)
        return w

    yield start
    for w in procs:
        if w.p.poll() is None:
            w.p.terminate()
        w.finish()


def last(front):
    return front.request(b"GET", b"/last")[4].decode()


def test_lua_ws_refused_with_403_sees_subprotocols(lua):
    front = lua().front
    st = upgrade(front, b"/refuse", protocols="chat, superchat")
    status, _, _, _, body, end, _ = front.response(st)
    st.close()
    assert (status, body, end) == (403, b"chat|superchat", sf.END)
    assert front.request(b"GET", b"/plain")[4] == b"plain"  # the worker serves on


def test_lua_ws_echo_text_binary_fragmented_and_large(lua):
    front = lua().front
    st = upgrade(front, b"/echo")
    assert accepted(front, st) == []
    send(st, frame(sf.WS_DATA, "h\u00e9".encode(), 1 | FIN))
    assert message(front, st)[:2] == (1, "h\u00e9".encode())
    send(st, frame(sf.WS_DATA, b"\0\1", 2 | FIN))
    assert message(front, st)[:2] == (2, b"\0\1")
    send(st, frame(sf.WS_DATA, b"", 2 | FIN))  # an empty message
    assert message(front, st)[:2] == (2, b"")
    # one message in three frames, a ping and a pong between them (the front's: ignored)
    send(st, frame(sf.WS_DATA, b"ab", 1), frame(sf.WS_PING, b"p"), frame(sf.WS_DATA, b"c", 0),
         frame(sf.WS_PONG, b""), frame(sf.WS_DATA, b"d", FIN))
    assert message(front, st)[:2] == (1, b"abcd")
    big = bytes(range(256)) * (4096 * 3 + 1)  # 3 MiB + 256: four frames each way
    pieces = [big[i:i + sf.MAX_CHUNK] for i in range(0, len(big), sf.MAX_CHUNK)]
    for i, p in enumerate(pieces):
        st.write(frame(sf.WS_DATA, p, (2 if i == 0 else 0) | (FIN if i == len(pieces) - 1 else 0)))
    st.flush()
    op, data, n = message(front, st)
    assert (op, data == big, n) == (2, True, 4)  # split at the protocol's 1 MiB
    send(st, close_frame(1000, b"bye"))
    assert closed(front, st) == (1000, "")  # the echo of the client's close
    st.close()
    assert last(front) == "close 1000 bye"


def test_lua_ws_subprotocol_and_headers(lua):
    front = lua().front
    st = upgrade(front, b"/proto", protocols="chat, superchat")
    fields = accepted(front, st)
    assert ("Sec-WebSocket-Protocol", "superchat") in fields and ("X-A", "1") in fields
    assert not any(n.lower() == "sec-websocket-accept" for n, _ in fields)
    assert closed(front, st) == (1000, "")
    send(st, close_frame(1000))
    st.close()
    assert last(front) == "close 1000 "


def test_lua_ws_subprotocol_not_offered_is_500(lua):
    front = lua().front
    st = upgrade(front, b"/bad-proto", protocols="chat")
    assert front.response(st)[0] == 500
    st.close()


def test_lua_ws_worker_closes_4001_with_reason_then_send_raises(lua):
    front = lua().front
    st = upgrade(front, b"/close4001")
    accepted(front, st)
    assert closed(front, st) == (4001, "go \u00e9")
    send(st, close_frame(4001))
    st.close()
    out = last(front)
    assert out.startswith("close 4001 | ") and "after the WebSocket's close" in out, out


@pytest.mark.parametrize("payload,code", [(close_frame(1000), 1000),
                                          (close_frame(4999, b"x"), 4999),
                                          (close_frame(), 1005)])
def test_lua_ws_client_close_code_reaches_handler_and_is_echoed(lua, payload, code):
    front = lua().front
    st = upgrade(front, b"/echo")
    accepted(front, st)
    send(st, payload)
    assert closed(front, st)[0] == (None if code == 1005 else code)
    st.close()
    assert last(front).startswith(f"close {code} ")


def test_lua_ws_error_after_accept_is_1011_before_is_500(lua):
    w = lua()
    st = upgrade(w.front, b"/raise")
    accepted(w.front, st)
    send(st, frame(sf.WS_DATA, b"x", 1 | FIN))
    assert closed(w.front, st) == (1011, "")
    send(st, close_frame(1011))
    st.close()
    st = upgrade(w.front, b"/raise-before")
    assert w.front.response(st)[0] == 500
    st.close()
    # a handler that returns after its accept: closed 1000, its return values ignored
    st = upgrade(w.front, b"/return")
    accepted(w.front, st)
    assert closed(w.front, st) == (1000, "")
    send(st, close_frame(1000))
    st.close()
    # accept_websocket on a request that is no upgrade: a Lua error, so a 500
    assert w.front.request(b"GET", b"/not-upgrade")[0] == 500


def test_lua_ws_client_gone_is_1006_to_the_handler(lua):
    front = lua().front
    st = upgrade(front, b"/gone")
    accepted(front, st)
    send(st, frame(sf.ABORT, b"", sf.ABORT_CLIENT_GONE))
    st.close()
    assert last(front) == "close 1006 nil closed"


def test_lua_ws_recv_timeout(lua):
    front = lua().front
    st = upgrade(front, b"/timeout")
    accepted(front, st)
    assert message(front, st)[:2] == (1, b"nil nil timeout")
    send(st, frame(sf.WS_DATA, b"still there", 1 | FIN))  # no timeout any more
    assert message(front, st)[:2] == (1, b"still there")
    send(st, close_frame(1000))
    assert closed(front, st) == (1000, "")
    st.close()


def test_lua_ws_misuse_raises_clear_errors(lua):
    front = lua().front
    st = upgrade(front, b"/misuse")
    accepted(front, st)
    op, text, _ = message(front, st)
    e = text.decode().split("\n")
    assert "string expected, got table" in e[0], e
    assert "close code" in e[1] and "1000-1003" in e[1], e
    assert "string expected, got no value" in e[2], e
    assert "not UTF-8" in e[3], e
    assert "125" in e[4], e
    # The request's body after the accept: an error, not its end (shmipc_serve_read said 0).
    assert "a WebSocket now" in e[5] and "a WebSocket now" in e[6], e
    assert closed(front, st) == (1000, "done")
    send(st, close_frame(1000))
    st.close()
    after = last(front).split("\n")
    assert "after the WebSocket's close" in after[0] and "closed already" in after[1], after
    # the ws object kept past its handler
    assert "this WebSocket is over" in front.request(b"GET", b"/kept")[4].decode()


def test_lua_ws_bad_frames_are_abort_protocol(lua):
    w = lua()
    for bad in ([frame(sf.WS_DATA, b"x", 0 | FIN)],  # a continuation with no message
                [frame(sf.WS_DATA, b"a", 1), frame(sf.WS_DATA, b"b", 2 | FIN)],  # one inside one
                [frame(sf.BODY, b"x")],
                [frame(sf.END)],
                [frame(sf.WS_CLOSE, (1005).to_bytes(2, "little"))],  # a code never sent
                [frame(sf.WS_CLOSE, (1000).to_bytes(2, "little") + b"\xff")],  # not UTF-8
                [frame(sf.WS_CLOSE, b"\x01")],  # half a code
                [frame(sf.WS_DATA, b"x", 3 | FIN)],  # an unknown opcode
                [b"junk" * 3]):
        st = upgrade(w.front, b"/echo")
        accepted(w.front, st)
        send(st, *bad)
        typ, arg, _ = w.front.read_frame(st)
        assert (typ, arg) == (sf.ABORT, sf.ABORT_PROTOCOL)
        st.close()
    assert w.front.request(b"GET", b"/plain")[4] == b"plain"


def test_lua_ws_stopping_worker_closes_1001(lua):
    w = lua()
    st = upgrade(w.front, b"/echo")
    accepted(w.front, st)
    send(st, frame(sf.WS_DATA, b"before", 1 | FIN))
    assert message(w.front, st)[:2] == (1, b"before")
    w.p.send_signal(signal.SIGTERM)
    assert closed(w.front, st) == (1001, "")
    send(st, close_frame(1001))
    st.close()
    assert w.p.wait(10) == 0
    w.t.join(10)
    assert any("ws closed 1001" in line for line in w.err), w.err


def test_lua_ws_two_workers_many_connections_unique_messages(lua):
    """2 worker processes, a thread each driving 15 connections one after the other with
    unique messages of several sizes: no message ever comes back wrong."""
    workers = [lua(), lua()]
    errors = []

    def drive(k, w):
        try:
            for i in range(15):
                st = upgrade(w.front, b"/echo")
                accepted(w.front, st)
                for j in range(4):
                    m = f"w{k}-c{i}-m{j}-".encode() * (300 * j + 1)
                    op = 1 if j % 2 else 2
                    send(st, frame(sf.WS_DATA, m, op | FIN))
                    if message(w.front, st)[:2] != (op, m):
                        errors.append((k, i, j))
                send(st, close_frame(1000))
                if closed(w.front, st) != (1000, ""):
                    errors.append((k, i, "close"))
                st.close()
        except Exception as e:  # noqa: BLE001 (reported below; a thread never asserts)
            errors.append(repr(e))

    ts = [threading.Thread(target=drive, args=(k, w)) for k, w in enumerate(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts)
    assert errors == []
    assert WORKER  # (the worker program the fixture runs)


def test_lua_ws_stop_while_waiting_for_the_answer_to_its_own_close(lua):
    """The handler closed and waits, without a timeout, for the front's answer, which never
    comes: a SIGTERM still ends the wait (5 s at most, then 1006) and the worker exits."""
    w = lua()
    st = upgrade(w.front, b"/close-wait")
    accepted(w.front, st)
    assert closed(w.front, st) == (1000, "")
    w.p.send_signal(signal.SIGTERM)
    assert w.p.wait(20) == 0
    w.t.join(10)
    assert any("close-wait close 1006" in line for line in w.err), w.err
    st.close()


def test_lua_ws_ping_pong_and_max_payload_len(lua):
    w = lua()
    st = upgrade(w.front, b"/ping")
    accepted(w.front, st)
    assert w.front.read_frame(st) == (sf.WS_PING, 0, b"p")
    assert w.front.read_frame(st) == (sf.WS_PONG, 0, b"")
    send(st, frame(sf.WS_DATA, b"x", 1 | FIN))
    assert message(w.front, st)[:2] == (1, b"x")
    send(st, close_frame(1000))
    assert closed(w.front, st) == (1000, "")
    st.close()
    st = upgrade(w.front, b"/small")
    accepted(w.front, st)
    send(st, frame(sf.WS_DATA, b"abcd", 2), frame(sf.WS_DATA, b"e", FIN))  # 5 bytes over 2 frames
    assert closed(w.front, st) == (1009, "")
    send(st, close_frame(1009))
    st.close()
    assert last(w.front) == "nil nil message too big"


def test_lua_ws_rest_of_a_message_too_big_is_not_a_message(lua):
    """A single 100000-byte frame over max_payload_len 4: the first 64 KiB piece already
    closes 1009 ("message too big"); the next recv_frame is the client's answering close, not
    the message's last 34464 bytes handed over as a message of their own (before)."""
    w = lua()
    st = upgrade(w.front, b"/small2")
    accepted(w.front, st)
    send(st, frame(sf.WS_DATA, b"z" * 100000, 2 | FIN))
    assert closed(w.front, st) == (1009, "")
    send(st, close_frame(1009))
    st.close()
    assert last(w.front) == "message too big | 0 close 1009"


def test_lua_ws_polling_recv_waits_for_a_payload_still_arriving(lua):
    """recv_frame with timeout 0 finds a frame's header whose payload is not there yet: the
    payload is waited for (it was read with what was left of the caller's 0 ms, and the client
    taken for gone: 1006)."""
    w = lua()
    st = upgrade(w.front, b"/poll")
    accepted(w.front, st)
    whole = frame(sf.WS_DATA, b"0123456789", 2 | FIN)
    send(st, whole[:12])
    time.sleep(0.3)
    send(st, whole[12:])
    assert message(w.front, st)[:2] == (2, b"0123456789")
    send(st, close_frame(1000))
    assert closed(w.front, st) == (1000, "")
    st.close()
    assert last(w.front) == "poll close 1000"


def test_lua_ws_stop_while_the_handler_only_sends_closes_1001(lua):
    """A handler that pushes messages and never calls recv_frame: SIGTERM still closes its
    socket 1001 (its next send returns nil, "closed"), and the worker exits."""
    w = lua()
    st = upgrade(w.front, b"/push")
    accepted(w.front, st)
    assert message(w.front, st)[1] == b"tick 1"
    w.p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10  # a tick every 5 ms: bounded, whatever the worker does
    while time.monotonic() < deadline:
        typ, arg, payload = w.front.read_frame(st)
        if typ != sf.WS_DATA:
            break
    assert typ == sf.WS_CLOSE and payload == (1001).to_bytes(2, "little"), (typ, payload)
    send(st, close_frame(1001))
    st.close()
    assert w.p.wait(20) == 0
    w.t.join(10)
    assert any("push closed" in line for line in w.err), w.err
