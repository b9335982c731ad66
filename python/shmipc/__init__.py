"""shmipc: shared-memory IPC wire-compatible with cloudwego shmipc-go/shmipc-rs.

This package is a thin layer over libshmipc's public C ABI. What exists so far: the version,
the error hierarchy and ``Config``. Errors derive from :class:`shmipc.Error`, itself an
:class:`OSError`; ``errno`` holds the positive shmipc code, ``code`` the negative one and
``name`` its symbol.
"""

from ._shmipc import (
    Config,
    ClosedError,
    EndOfStreamError,
    Error,
    InvalidArgumentError,
    PeerGoneError,
    ProtocolError,
    TimeoutError,
    __version__,
    errname,
    errors,
    strerror,
    version_number,
)

__all__ = [
    "Config",
    "ClosedError",
    "EndOfStreamError",
    "Error",
    "InvalidArgumentError",
    "PeerGoneError",
    "ProtocolError",
    "TimeoutError",
    "__version__",
    "errname",
    "errors",
    "strerror",
    "version_number",
]
