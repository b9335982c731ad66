"""The Python side of shmipc.Server: the request, response and header objects its handlers
see and return, turning a handler's return value into a response, and the error log.

The C part (server.c) builds a Request for each call, calls the handler on the worker thread
with the GIL held, and hands the return value to ``_normalize`` unless it is bytes or str.
"""

import atexit
import copyreg
import json
import logging
import weakref
from collections.abc import Mapping

from . import _shmipc

__all__ = ["Headers", "Request", "Response"]

log = logging.getLogger("shmipc.server")


class Headers(Mapping):
    """Header fields, in the order received, looked up without regard to case.

    ``headers["content-type"]`` is the first value of that name (KeyError when there is
    none), ``headers.get(name, default)`` likewise; ``headers.getall(name)`` is every value
    of the name; iteration yields each distinct name once (as first received);
    ``headers.items()`` yields (name, value) pairs; ``headers.raw`` is the list of all pairs,
    repeats included. Names and values are str (latin-1 decoded, as received).
    """

    __slots__ = ("raw", "_index")

    def __init__(self, pairs=()):
        if isinstance(pairs, Mapping):
            pairs = pairs.items()
        self.raw = [(str(k), str(v)) for k, v in pairs]
        self._index = None

    def _lookup(self):
        if self._index is None:
            index = {}
            for name, value in self.raw:
                index.setdefault(name.lower(), (name, value))
            self._index = index
        return self._index

    def __getitem__(self, name):
        return self._lookup()[name.lower()][1]

    def __contains__(self, name):
        return isinstance(name, str) and name.lower() in self._lookup()

    def __iter__(self):
        return (name for name, _ in self._lookup().values())

    def __len__(self):
        return len(self._lookup())

    def getall(self, name):
        """Every value of `name` (any case), in order; [] when there is none."""
        key = name.lower()
        return [v for n, v in self.raw if n.lower() == key]

    def __repr__(self):
        return f"Headers({self.raw!r})"


class Request(_shmipc._RequestBase):
    """One HTTP request, as a route handler gets it.

    Attributes: ``method`` ("GET"), ``path`` ("/items/7", without the query), ``query``
    (the text after "?", "" when there is none), ``wildcard`` (the part of the path a prefix
    route's "*" matched, else ""), ``version`` ("HTTP/1.1" or "HTTP/1.0"), ``headers``
    (:class:`Headers`), ``body`` (bytes, already de-chunked), ``client`` (the client's
    ``(host, port)``, None on a unix listener; the address is kept as the kernel gave it, in
    the C base, and decoded when read). Everything is a copy: a Request may be kept after the
    handler returned, copied, deep-copied or pickled (the client too). ``json()`` parses the
    body; ``args`` is the query parsed into a dict of lists (urllib.parse.parse_qs).
    """

    __slots__ = ("method", "path", "query", "wildcard", "version", "_headers", "body")

    def __init__(self, method, path, query, wildcard, version, headers, body):
        self.method = method
        self.path = path
        self.query = query
        self.wildcard = wildcard
        self.version = version
        self._headers = headers
        self.body = body

    def __getstate__(self):
        """copy, deepcopy and pickle: the slots and the client (the C half's address, which
        the default state leaves out: it refuses the type), and a subclass's own attributes
        (its instance dict and slots)."""
        names = copyreg._slotnames(type(self))  # what object's own reduce saves: every class's
        state = {n: getattr(self, n) for n in names if hasattr(self, n)}
        state["_client"] = self._client
        return getattr(self, "__dict__", None) or None, state

    @property
    def headers(self):
        h = self._headers
        if not isinstance(h, Headers):
            h = self._headers = Headers(h)
        return h

    @property
    def args(self):
        from urllib.parse import parse_qs

        return parse_qs(self.query, keep_blank_values=True)

    def json(self):
        """The body parsed as JSON (ValueError when it is not)."""
        return json.loads(self.body)

    def defer(self, timeout=None, on_end=None):
        """Answer later, from any thread: returns a :class:`shmipc.PendingResponse`, whose
        ``send(status, headers, body)`` answers (once). Only inside this request's own route
        handler, which then returns None. ``timeout`` (seconds): the client gets 504 when no
        answer was sent by then (None: no deadline). ``on_end(reason)`` runs once on the
        server's worker thread when the request stops waiting (docs/python.md, "Answers from
        any thread")."""
        if timeout is None:
            ms = -1
        else:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError("timeout must be a number of seconds or None")
            if not timeout > 0 or timeout > 3600:
                raise ValueError("timeout must be in (0, 3600] seconds, or None")
            ms = max(1, round(timeout * 1000))
        return _shmipc._defer(self, ms, on_end)

    def __repr__(self):
        q = "?" + self.query if self.query else ""
        return f"<shmipc.Request {self.method} {self.path}{q}>"


class Response:
    """What a handler may return: ``Response(body=b"", status=200, headers=None,
    content_type=None)``.

    `body` is bytes-like or str (UTF-8 encoded); `headers` a mapping or an iterable of
    (name, value) pairs; `content_type`, when given, is sent as Content-Type (else
    "text/plain; charset=utf-8" for a str body, none for bytes). ``Response.json(obj,
    status=200, headers=None)`` serialises `obj` as application/json. The server adds Date,
    Server, Content-Length and Connection itself (setting those raises).
    """

    __slots__ = ("body", "status", "headers", "content_type")

    def __init__(self, body=b"", status=200, headers=None, content_type=None):
        self.body = body
        self.status = status
        self.headers = headers
        self.content_type = content_type

    @classmethod
    def json(cls, obj, status=200, headers=None):
        return cls(json.dumps(obj, separators=(",", ":")).encode(), status, headers,
                   "application/json")

    def __repr__(self):
        return f"<shmipc.Response {self.status}>"


def _body(body, content_type):
    if isinstance(body, str):
        return body.encode(), content_type or "text/plain; charset=utf-8"
    if body is None:
        return b"", content_type
    return bytes(body), content_type


def _normalize(result):
    """A handler's return value (other than bytes and str) as (status, [(name, value)], body).

    Response (or anything with status/headers/body attributes); dict or list -> JSON;
    None -> 204 with no body; (body, status) or (body, status, headers) as in Flask.
    """
    if isinstance(result, Response) or hasattr(result, "status"):
        status = result.status
        headers = getattr(result, "headers", None)
        body, ctype = _body(getattr(result, "body", b""), getattr(result, "content_type", None))
    elif isinstance(result, (dict, list)):
        return 200, [("Content-Type", "application/json")], json.dumps(
            result, separators=(",", ":")).encode()
    elif result is None:
        return 204, [], b""
    elif isinstance(result, tuple) and 2 <= len(result) <= 3:
        body, status = result[0], result[1]
        headers = result[2] if len(result) == 3 else None
        if isinstance(body, (dict, list)):
            body, ctype = json.dumps(body, separators=(",", ":")).encode(), "application/json"
        else:
            body, ctype = _body(body, None)
    elif isinstance(result, (bytearray, memoryview)):
        return 200, [], bytes(result)
    else:
        raise TypeError("a handler returns bytes, str, dict, list, None, a Response or "
                        f"(body, status[, headers]), not {type(result).__name__}")
    if not isinstance(status, int):
        raise TypeError(f"response status must be an int, not {type(status).__name__}")
    pairs = []
    if headers is not None:
        if isinstance(headers, Mapping):
            headers = headers.items()
        for name, value in headers:
            pairs.append((str(name), str(value)))
            if str(name).lower() == "content-type":
                ctype = None
    if ctype is not None:
        pairs.insert(0, ("Content-Type", ctype))
    return status, pairs, body


def _log_error(exc, what):
    """Logs an exception raised by a callback (it is answered with 500 or dropped)."""
    log.error("%s raised %s", what, type(exc).__name__, exc_info=exc)


# Servers still open at interpreter exit are closed by atexit, while threads can still take
# the GIL: later, a worker thread that needs the GIL would be ended under the C server.
_live = weakref.WeakSet()


def _register(server):
    _live.add(server)


@atexit.register
def _close_all():
    for server in list(_live):
        try:
            server.close()
        except Exception:  # noqa: BLE001 - nothing sensible to do at exit
            pass
