# The shmipc-serve frame codec (docs/serve.md), in C: python/shmipc/serve.c.
from typing import Any, Awaitable, Callable, Iterable, Optional, Tuple, Union

_Buffer = Any  # anything with the buffer protocol
_Address = Union[Tuple[str, int], str, None]  # (host, port), "unix" or None
_Headers = Iterable[Tuple[Union[str, bytes], Union[str, bytes]]]

class FrameError(ValueError): ...

HOP_FIELDS: frozenset[str]

REQUEST_HEAD: int
BODY: int
END: int
RESPONSE_HEAD: int
ABORT: int
WS_DATA: int
WS_PING: int
WS_PONG: int
WS_CLOSE: int
HELLO: int
TAKEN: int
HELLO_SIZE: int
FEAT_TAKEN: int
HDR_SIZE: int
MAX_HEAD: int
MAX_CHUNK: int
MAX_ABORT_TEXT: int
REQ_KEEP_ALIVE: int
REQ_UPGRADE: int
REQ_HAS_BODY: int
REQ_CHUNKED: int
REQ_CONTENT_LENGTH: int
REQ_EXPECT_CONTINUE: int
REQ_TAKEN_WANTED: int
RESP_CONTENT_LENGTH: int
RESP_CLOSE: int
ABORT_CLIENT_GONE: int
ABORT_WORKER_ERROR: int
ABORT_TIMEOUT: int
ABORT_PROTOCOL: int
ABORT_TOO_LARGE: int
ABORT_SHUTDOWN: int

def decode_header(buf: _Buffer) -> Optional[Tuple[int, int, int]]: ...
def decode_request(frame: _Buffer, base: Optional[dict[str, Any]] = None) -> dict[str, Any]: ...
def decode_request_scope(frame: _Buffer) -> dict[str, Any]: ...
def asgi_start(
    message: dict[str, Any],
) -> tuple[int, list[tuple[bytes, bytes]], bool, int | None]: ...
def decode_response(frame: _Buffer) -> Tuple[int, int, int, list[Tuple[str, str]]]: ...
def encode_response_head(
    status: int, headers: _Headers, flags: int = 0, content_length: int = 0
) -> bytes: ...
def encode_request_head(
    method: bytes,
    target: bytes,
    headers: _Headers,
    flags: int = 0,
    content_length: int = 0,
    peer: _Address = None,
    local: _Address = None,
    version_minor: int = 1,
    scheme: int = 0,
) -> bytes: ...
def encode_frame(type: int, payload: _Buffer = b"", arg: int = 0) -> bytes: ...
def response_fields(
    pairs: Iterable[Tuple[bytes, bytes]], close: bool
) -> list[Tuple[bytes, bytes]]: ...

class WSGIResponse:
    """One WSGI response's state and PEP 3333's start_response (serve_wsgi.c)."""

    method: str
    status: Optional[str]
    headers: Optional[list[Tuple[str, str]]]
    length: Optional[int]
    code: int
    flags: int
    sent: int
    head_sent: bool
    def __init__(self, method: str) -> None: ...
    def start_response(
        self, status: str, headers: list[Tuple[str, str]], exc_info: Any = None
    ) -> Callable[[_Buffer], None]: ...
    def write(self, data: _Buffer) -> None: ...
    def collect(self, iterable: Iterable[_Buffer]) -> Tuple[int, list[Tuple[bytes, bytes]], bytes]: ...
    def _bodyless(self) -> bool: ...

class WSGIStreamResponse(WSGIResponse):
    """WSGIResponse that sends on its request's stream (serve_wsgi_worker.c; made by
    WSGIWorker.handle only)."""

    hold: bool

class WSGIExchange:
    """The worker's end of one request (serve_wsgi_worker.c; made by WSGIWorker.handle
    only): what wsgi.py's _Input and the rare turns call."""

    st: Any
    done: bool
    aborted: bool
    abort_reason: int
    end_queued: bool
    def next_body(self, nonblock: bool = False) -> Optional[bytes]: ...
    def check_abort(self) -> None: ...
    def queue(self, *parts: _Buffer) -> None: ...
    def send(self, *parts: _Buffer) -> None: ...
    def drain(self) -> None: ...
    def drain_end(self) -> bool: ...
    def abort(self, reason: int, text: str = "") -> None: ...
    def close(self) -> None: ...

class WSGIWorker:
    """The shmipc-serve WSGI worker's request in C (serve_wsgi_worker.c, for wsgi.py)."""

    app: Any
    def __init__(self, app: Any, base: dict[str, Any], hooks: dict[str, Any]) -> None: ...
    def handle(self, st: Any) -> Union[str, Tuple[bytes, Optional[bytes], float]]:
        """The outcome, or the first frame handed back (its header's bytes, its payload or None,
        and the time.monotonic() its rest is to be read by); RuntimeError until an __init__ has
        succeeded."""

class ASGISend:
    """The send() of one in-process ASGI http request (serve_asgi.c)."""

    complete: bool
    started: bool
    on_complete: Optional[Callable[[], object]]
    def __init__(self, method: str, pending: Any) -> None: ...
    def send(self, message: dict[str, Any]) -> Awaitable[None]: ...
