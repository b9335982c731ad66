"""examples/python/http_app.py and ws_echo.py run as they stand: each is started on a free
port, used over real sockets, and stopped by SIGINT (Ctrl-C) or SIGTERM."""
import http.client
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, python_env, sigint_default
from test_server_ws import WSClient

EXAMPLES = os.path.join(ROOT, "examples", "python")


def start(name):
    proc = subprocess.Popen([sys.executable, os.path.join(EXAMPLES, name), "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=python_env(), preexec_fn=sigint_default)
    line = proc.stdout.readline()
    assert line.startswith("listening on "), (line, proc.stderr.read() if proc.poll() else "")
    return proc, int(line.split()[2])


def stop(proc, sig=signal.SIGINT):
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == "stopped"


def call(c, method, path, body=None):
    c.request(method, path, body=json.dumps(body) if body is not None else None)
    r = c.getresponse()
    data = r.read()
    is_json = r.getheader("Content-Type") == "application/json"
    return r.status, (json.loads(data) if is_json else data or None), r


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_http_app(sig):
    proc, port = start("http_app.py")
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        assert call(c, "GET", "/health")[:2] == (200, {"status": "ok"})
        assert call(c, "GET", "/items")[:2] == (200, [])
        st, body, r = call(c, "POST", "/items", {"name": "apple"})
        assert (st, body, r.getheader("Location")) == (201, {"id": 1, "count": 1}, "/items/1")
        assert call(c, "POST", "/items", {"name": "pear"})[:2] == (201, {"id": 2, "count": 2})
        assert call(c, "GET", "/items/2")[:2] == (200, {"id": 2, "item": {"name": "pear"}})
        assert call(c, "GET", "/items?name=apple")[:2] == (200, [{"id": 1, "item": {"name": "apple"}}])
        assert call(c, "POST", "/items", [1])[0] == 400
        c.request("POST", "/items", body=b"{nope")
        r = c.getresponse()
        assert r.status == 400 and b"not JSON" in r.read()
        assert call(c, "DELETE", "/items/1")[:2] == (204, None)
        assert call(c, "DELETE", "/items/1")[:2] == (404, {"error": "no such item"})
        assert call(c, "GET", "/items/x")[:2] == (404, {"error": "no such item"})
        assert call(c, "PUT", "/items")[0] == 405
        c.close()
    finally:
        stop(proc, sig)


def test_ws_echo():
    proc, port = start("ws_echo.py")
    try:
        ws = WSClient(port, "/ws", protocols=["echo.v1"])
        assert ws.status == 101 and ws.headers["sec-websocket-protocol"] == "echo.v1"
        ws.send("hello")
        assert ws.recv() == "hello"
        ws.send(b"\x01\x02")
        assert ws.recv() == b"\x01\x02"
        ws.send("stats")
        assert ws.recv() == "messages=3 bytes=12 subprotocol=echo.v1"
        assert ws.close() == 1000
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/ws")
        assert c.getresponse().status == 426
        c.close()
    finally:
        stop(proc)
