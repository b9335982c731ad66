"""shmipc-serve end to end: the C front (tests/c/front_run.c: the HTTP server with
core/serve/front.c) in front of a real `python -m shmipc.serve.worker` process running a WSGI
app; unique bodies through it, and the worker killed mid-request answered 502 for that request
while the front lives on."""
import http.client
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import BUILD, python_env, unique_address

FRONT = os.path.join(BUILD, "tests", "c", "front_run")

APP = '''
import hashlib
import time

def big_body():
    for i in range(512):
        yield (b"%08d" % i) * 8192

def app(environ, start_response):
    if environ["PATH_INFO"] == "/big":
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return big_body()
    if environ["PATH_INFO"] == "/upload":
        h, n = hashlib.sha256(), 0
        while True:
            piece = environ["wsgi.input"].read(65536)
            if not piece:
                break
            h.update(piece)
            n += len(piece)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"%d %s" % (n, h.hexdigest().encode())]
    body = environ["wsgi.input"].read()
    if environ["PATH_INFO"] == "/slow":
        open("slow.started", "w").close()  # the test waits for it: the request is in the app
        time.sleep(30)
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("X-Path", environ["PATH_INFO"])])
    return [b"echo:" + body]
'''

import hashlib  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(FRONT), reason="front_run is not built")


def start_worker(tmp_path, address):
    (tmp_path / "feapp.py").write_text(APP)
    p = subprocess.Popen([sys.executable, "-m", "shmipc.serve.worker", "feapp:app",
                          "--address", address], cwd=tmp_path, env=python_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = p.stdout.readline()
    assert "ready on" in line, line
    return p


def start_front(*addresses, deadline_ms=10000, max_body=0):
    p = subprocess.Popen([FRONT, "--deadline-ms", str(deadline_ms), "--max-body", str(max_body),
                          *addresses],
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
        # The worker is inside the app (a fixed 0.5 s could come first on a loaded machine).
        deadline = time.monotonic() + 30
        while not (tmp_path / "slow.started").exists():
            assert time.monotonic() < deadline, "the request never reached the app"
            time.sleep(0.005)
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


def test_streamed_response_from_wsgi_generator(tmp_path):
    """A WSGI app yielding 32 MiB in 64 KiB pieces, no Content-Length: the client gets it
    chunked, exact, and the connection serves on afterwards."""
    address = unique_address("front")
    worker = start_worker(tmp_path, address)
    front, port = start_front(address)
    try:
        want = hashlib.sha256()
        for i in range(512):
            want.update((b"%08d" % i) * 8192)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(2):
            conn.request("GET", "/big")
            r = conn.getresponse()
            assert r.status == 200
            assert r.getheader("Transfer-Encoding") == "chunked"
            assert r.getheader("Content-Length") is None
            got, n = hashlib.sha256(), 0
            while True:
                piece = r.read(1 << 20)
                if not piece:
                    break
                got.update(piece)
                n += len(piece)
            assert n == 512 * 65536
            assert got.hexdigest() == want.hexdigest()
        conn.request("POST", "/after", body=b"y")
        r = conn.getresponse()
        assert r.status == 200 and r.read() == b"echo:y"
        conn.close()
    finally:
        stop(front, worker)


def test_chunked_upload_read_through_wsgi_input(tmp_path):
    """A chunked upload (Transfer-Encoding: chunked, pieces of odd sizes) reaches the app
    whole through wsgi.input, read 64 KiB at a time."""
    address = unique_address("front")
    worker = start_worker(tmp_path, address)
    front, port = start_front(address)
    try:
        pieces = [bytes([i % 251]) * (100 + i * 211) for i in range(64)]  # 432 KiB
        want = hashlib.sha256(b"".join(pieces)).hexdigest()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/upload", body=iter(pieces), encode_chunked=True,
                     headers={"Transfer-Encoding": "chunked"})
        r = conn.getresponse()
        assert r.status == 200
        assert r.read() == b"%d %s" % (sum(map(len, pieces)), want.encode())
        conn.close()
    finally:
        stop(front, worker)


def test_32mib_chunked_upload_streams_to_wsgi_input(tmp_path):
    """32 MiB chunked, in pieces of odd sizes, to a real WSGI worker that reads wsgi.input
    64 KiB at a time: the front streams the body as it arrives (it is far over what it would
    hold whole), and the hash the app echoes is the body's."""
    address = unique_address("front")
    worker = start_worker(tmp_path, address)
    front, port = start_front(address, deadline_ms=60000, max_body=64 << 20)
    try:
        total = 32 << 20
        h = hashlib.sha256()

        def pieces():
            sent, i = 0, 0
            while sent < total:
                n = min(total - sent, 1 + (i * 7919) % 200003)
                piece = bytes([(sent + k) % 253 for k in range(0, min(n, 256))]) * (n // 256 + 1)
                piece = piece[:n]
                h.update(piece)
                sent += n
                i += 1
                yield piece

        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/upload", body=pieces(), encode_chunked=True,
                     headers={"Transfer-Encoding": "chunked"})
        r = conn.getresponse()
        assert r.status == 200
        assert r.read() == b"%d %s" % (total, h.hexdigest().encode())
        conn.close()
    finally:
        stop(front, worker)


def test_client_gone_mid_upload_frees_the_python_worker(tmp_path):
    """A client that leaves mid-body (1 MiB of a declared 8 MiB, and a chunked one): the WSGI
    worker reading wsgi.input gets the front's ABORT, and the same worker (the only one)
    serves the next upload whole."""
    address = unique_address("front")
    worker = start_worker(tmp_path, address)
    front, port = start_front(address, max_body=16 << 20)
    try:
        for chunked in (False, True):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            framing = (b"Transfer-Encoding: chunked" if chunked
                       else b"Content-Length: %d" % (8 << 20))
            s.sendall(b"POST /upload HTTP/1.1\r\nHost: t\r\n" + framing + b"\r\n\r\n")
            piece = b"x" * 65536
            for _ in range(16):
                s.sendall((b"%x\r\n" % len(piece)) + piece + b"\r\n" if chunked else piece)
            time.sleep(0.2)
            s.close()
            body = bytes(range(256)) * 4096  # 1 MiB
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/upload", body=body)
            r = conn.getresponse()
            assert r.status == 200
            assert r.read() == b"%d %s" % (len(body), hashlib.sha256(body).hexdigest().encode())
            conn.close()
        assert worker.poll() is None
    finally:
        stop(front, worker)
