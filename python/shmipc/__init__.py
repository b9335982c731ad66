"""shmipc: shared-memory IPC wire-compatible with cloudwego shmipc-go/shmipc-rs.

This package is a thin layer over libshmipc's public C ABI:

- ``Config``: every setting of sessions, session managers and listeners;
- ``Session`` (``connect()``), ``Stream``, ``Chunk`` (zero-copy received bytes),
  ``SessionManager`` (a client pool) and ``Listener`` (``accept()`` or ``serve()``);
- ``Server``: an HTTP/1.1 server with Python route handlers (``Request``, ``Response``,
  ``Headers``) and static responses served in C;
- ``shmipc.aio``: awaitable stream reads and writes for asyncio.

Errors derive from :class:`shmipc.Error`, itself an :class:`OSError`; ``errno`` holds the
positive shmipc code, ``code`` the negative one and ``name`` its symbol. See docs/python.md.
"""

from ._shmipc import (
    Chunk,
    ClosedError,
    Config,
    EndOfStreamError,
    Error,
    InvalidArgumentError,
    Listener,
    PENDING_ABANDONED,
    PENDING_CLIENT_GONE,
    PENDING_FAILED,
    PENDING_SENT,
    PENDING_TIMEOUT,
    PeerGoneError,
    PendingResponse,
    ProtocolError,
    ReleasedError,
    Server,
    Session,
    SessionManager,
    Stream,
    TimeoutError,
    WebSocket,
    __version__,
    connect,
    errname,
    errors,
    strerror,
    version_number,
)
from ._server import Headers, Request, Response

__all__ = [
    "Chunk",
    "ClosedError",
    "Config",
    "EndOfStreamError",
    "Error",
    "InvalidArgumentError",
    "Listener",
    "PENDING_ABANDONED",
    "PENDING_CLIENT_GONE",
    "PENDING_FAILED",
    "PENDING_SENT",
    "PENDING_TIMEOUT",
    "PeerGoneError",
    "PendingResponse",
    "ProtocolError",
    "ReleasedError",
    "Request",
    "Response",
    "Headers",
    "Server",
    "Session",
    "SessionManager",
    "Stream",
    "TimeoutError",
    "WebSocket",
    "__version__",
    "connect",
    "errname",
    "errors",
    "strerror",
    "version_number",
]
