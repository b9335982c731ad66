"""shmipc.abi: call any function of libshmipc's ABI table by name, through libffi.

``call(name, *args)`` (or ``shmipc.abi.<name>(*args)``) marshals by the table's types
(``bindings/abi.def``, docs/abi.md): integers are range-checked, ``CSTR`` takes str or bytes
(or None for NULL), handles are :class:`Handle` objects of the right kind, a bytes-like object
fills a ``BYTES_IN``/``BYTES_LEN`` pair, and out-parameters come back after the return value
in a tuple. Integer return codes are returned as they are (a negative one is not raised; use
:func:`check`). See docs/python.md.
"""

import atexit as _atexit

from . import _shmipc

Handle = _shmipc.AbiHandle

__all__ = ["Handle", "call", "check", "describe", "names"]


def call(name, *args):
    """call(name, *args) -> result

    Call the GENERIC table entry `name` with `args` marshalled by the table's types. The result
    is the return value, or a tuple (return value, out-parameters...) when the function has
    out-parameters. Wrong argument counts or types raise TypeError (OverflowError, ValueError)
    before anything reaches C; a non-GENERIC entry raises NotImplementedError."""
    return _shmipc._abi_call(name, *args)


def check(rc):
    """check(rc) -> rc

    Raise the shmipc.Error subclass for a negative code, with this thread's last error detail;
    return rc otherwise."""
    if isinstance(rc, tuple):
        code = rc[0]
    else:
        code = rc
    if isinstance(code, int) and code < 0:
        _shmipc._raise_for_code(code, _shmipc._abi_call("shmipc_error_detail"))
    return rc


def describe(name):
    """describe(name) -> (flags, ret, params)

    The table row of `name`: flags (1 GENERIC, 2 BLOCKS), the return value and the parameters
    as (type, kind, ctype, name) tuples of the enum values of shmipc.h."""
    return _shmipc._abi_describe(name)


def names():
    """names() -> list[str]

    Every function in the table, GENERIC or not, in the order of shmipc.h."""
    return _shmipc._abi_names()


def __getattr__(name):
    if name.startswith("shmipc_") and name in _NAMES:
        def fn(*args):
            return _shmipc._abi_call(name, *args)

        fn.__name__ = fn.__qualname__ = name
        fn.__doc__ = f"{name}(...): shmipc.abi.call({name!r}, ...)"
        return fn
    raise AttributeError(f"module 'shmipc.abi' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _NAMES)


_NAMES = frozenset(_shmipc._abi_names())


def _reset_log_sink():
    # A Python log sink must not run once the interpreter is gone.
    try:
        _shmipc._abi_call("shmipc_set_log_sink", None)
    except Exception:
        pass


_atexit.register(_reset_log_sink)
