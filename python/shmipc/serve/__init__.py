"""shmipc-serve: WSGI apps in supervised worker processes behind shmipc's HTTP front
(docs/serve.md). This package holds the Python worker: ``WSGIHandler`` serves one request
stream with a WSGI app, ``ASGIHandler`` (shmipc.serve.asgi) with an ASGI 3 app, ``Worker`` listens for the front and serves its streams;
``python -m shmipc.serve.worker APP --address ADDR`` runs one worker process."""

from .wsgi import RequestAborted, WSGIHandler

__all__ = ["RequestAborted", "WSGIHandler", "Worker"]


def __getattr__(name):
    # Imported on first use, so that `python -m shmipc.serve.worker` runs the module fresh.
    if name == "Worker":
        from .worker import Worker

        return Worker
    raise AttributeError(name)
