"""shmipc-serve: WSGI apps in supervised worker processes behind shmipc's HTTP front
(docs/serve.md). This package holds the Python worker: ``WSGIHandler`` serves one request
stream with a WSGI app, ``ASGIHandler`` (shmipc.serve.asgi) with an ASGI 3 app, ``Worker`` listens for the front and serves its streams
one at a time, ``ASGIWorker`` (shmipc.serve.asgi_worker) an ASGI app's many at once on one loop;
``python -m shmipc.serve.worker APP --address ADDR`` runs one worker process.
``wsgi_handler(app)`` / ``asgi_handler(app)`` (shmipc.serve.inprocess) serve the same apps on
the in-process shmipc.Server instead: ``server.route(None, "/*", wsgi_handler(app))``."""

from .wsgi import RequestAborted, WSGIHandler

__all__ = ["ASGIRoute", "ASGIWorker", "RequestAborted", "WSGIHandler", "WSGIRoute", "Worker",
           "asgi_handler", "wsgi_handler"]


def __getattr__(name):
    # Imported on first use, so that `python -m shmipc.serve.worker` runs the module fresh.
    if name == "Worker":
        from .worker import Worker

        return Worker
    if name == "ASGIWorker":
        from .asgi_worker import ASGIWorker

        return ASGIWorker
    if name in ("ASGIRoute", "WSGIRoute", "asgi_handler", "wsgi_handler"):
        # Not at import: a WSGI worker process needs no asyncio.
        from . import inprocess

        return getattr(inprocess, name)
    raise AttributeError(name)
