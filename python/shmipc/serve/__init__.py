"""shmipc-serve: WSGI apps in supervised worker processes behind shmipc's HTTP front
(docs/serve.md). This package holds the Python worker: ``WSGIHandler`` serves one request
stream with a WSGI app, ``Worker`` listens for the front and serves its streams."""

from .worker import Worker
from .wsgi import RequestAborted, WSGIHandler

__all__ = ["RequestAborted", "WSGIHandler", "Worker"]
