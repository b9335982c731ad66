"""shmipc-serve end to end: the C front (tests/c/front_run.c: the HTTP server with
core/serve/front.c) in front of a real `python -m shmipc.serve.worker` process running a WSGI
app; unique bodies through it, and the worker killed mid-request answered 502 for that request
while the front lives on."""
import http.client
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import BUILD, python_env, unique_address

FRONT = os.path.join(BUILD, "tests", "c", "front_run")

APP = '''
import time

def app(environ, start_response):
    body = environ["wsgi.input"].read()
    if environ["PATH_INFO"] == "/slow":
        time.sleep(30)
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("X-Path", environ["PATH_INFO"])])
    return [b"echo:" + body]
'''

pytestmark = pytest.mark.skipif(not os.path.exists(FRONT), reason="front_run is not built")


def start_worker(tmp_path, address):
    (tmp_path / "feapp.py").write_text(APP)
    p = subprocess.Popen([sys.executable, "-m", "shmipc.serve.worker", "feapp:app",
                          "--address", address], cwd=tmp_path, env=python_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = p.stdout.readline()
    assert "ready on" in line, line
    return p


def start_front(*addresses, deadline_ms=10000):
    p = subprocess.Popen([FRONT, "--deadline-ms", str(deadline_ms), *addresses],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("port "), line
    return p, int(line.split()[1])


def stop(front, worker):
    front.stdin.close()
    assert front.wait(timeout=20) == 0
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=10)


def test_front_to_python_worker_unique_bodies(tmp_path):
    address = unique_address("front")
    worker = start_worker(tmp_path, address)
    front, port = start_front(address)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for i in range(200):
            body = f"request {i} {i * 7919:x}".encode()
            conn.request("POST", f"/p/{i}", body=body)
            r = conn.getresponse()
            assert r.status == 200
            assert r.getheader("X-Path") == f"/p/{i}"
            assert r.getheader("Content-Type") == "text/plain"
            assert r.read() == b"echo:" + body
        conn.close()
    finally:
        stop(front, worker)


def test_worker_killed_mid_request_is_502(tmp_path):
    address = unique_address("front")
    worker = start_worker(tmp_path, address)
    front, port = start_front(address)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        conn.request("GET", "/slow")
        time.sleep(0.5)  # the worker is inside the app
        worker.kill()
        worker.wait(timeout=10)
        r = conn.getresponse()
        assert r.status == 502
        r.read()
        conn.close()
        # a new worker process on the same address: the front reconnects and serves again
        worker = start_worker(tmp_path, address)
        deadline = time.monotonic() + 10
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
            conn.request("POST", "/again", body=b"x")
            r = conn.getresponse()
            data = r.read()
            conn.close()
            if r.status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.status == 200 and data == b"echo:x"
    finally:
        stop(front, worker)
