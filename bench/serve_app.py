"""The app every server of bench/serve_bench.py serves: GET / answers SERVE_BENCH_BODY bytes
(13: "Hello, World!"; otherwise that many bytes) with Content-Type text/plain and
Content-Length. ``app`` is the WSGI callable, ``asgi`` the ASGI 3 one (with lifespan),
``native`` a shmipc.Server handler, ``aiohttp_app()`` the aiohttp application: the same
response from each."""
import os

_N = int(os.environ.get("SERVE_BENCH_BODY", "13"))
BODY = b"Hello, World!" if _N == 13 else (b"0123456789abcdef" * (_N // 16 + 1))[:_N]
_LEN = str(len(BODY))
_HEADERS = [("Content-Type", "text/plain"), ("Content-Length", _LEN)]
_AHEADERS = [(b"content-type", b"text/plain"), (b"content-length", _LEN.encode())]


def app(environ, start_response):
    start_response("200 OK", _HEADERS)
    return [BODY]


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            await send({"type": msg["type"] + ".complete"})
            if msg["type"] == "lifespan.shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": _AHEADERS})
    await send({"type": "http.response.body", "body": BODY})


_TEXT = BODY.decode()


def native(request):
    # A str: the C server sends it as text/plain (UTF-8), the cheapest return of its API.
    return _TEXT


def aiohttp_app():
    from aiohttp import web

    async def hello(request):
        return web.Response(body=BODY, content_type="text/plain")

    a = web.Application()
    a.router.add_get("/", hello)
    return a
