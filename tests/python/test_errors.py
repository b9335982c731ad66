"""The error hierarchy and the code tables."""
import builtins
import errno

import pytest

import shmipc


def test_every_code_has_name_and_message():
    assert len(shmipc.errors) >= 20
    for name, code in shmipc.errors.items():
        assert code < 0
        assert shmipc.errname(code) == "SHMIPC_" + name
        assert shmipc.strerror(code) != "unknown error"


def test_codes_are_distinct():
    assert len(set(shmipc.errors.values())) == len(shmipc.errors)


def test_posix_codes_match_errno():
    assert shmipc.errors["EINVAL"] == -errno.EINVAL
    assert shmipc.errors["ETIMEDOUT"] == -errno.ETIMEDOUT
    assert shmipc.errors["ECONNRESET"] == -errno.ECONNRESET


def test_unknown_codes():
    assert shmipc.errname(0) is None
    assert shmipc.errname(-3999) is None
    assert shmipc.errname(1 << 70) is None
    assert shmipc.strerror(12345) == "unknown error"


@pytest.mark.parametrize(
    "name, cls, builtin",
    [
        ("ETIMEDOUT", shmipc.TimeoutError, builtins.TimeoutError),
        ("ECONNRESET", shmipc.PeerGoneError, ConnectionResetError),
        ("EINVAL", shmipc.InvalidArgumentError, ValueError),
        ("ERANGE", shmipc.InvalidArgumentError, ValueError),
        ("EEOF", shmipc.EndOfStreamError, EOFError),
        ("ECLOSED", shmipc.ClosedError, shmipc.Error),
        ("EPROTO", shmipc.ProtocolError, shmipc.Error),
        ("EVERSION", shmipc.ProtocolError, shmipc.Error),
        ("EREJECTED", shmipc.ProtocolError, shmipc.Error),
        ("ENOSHM", shmipc.Error, OSError),
    ],
)
def test_code_to_exception_class(name, cls, builtin):
    code = shmipc.errors[name]
    with pytest.raises(cls) as info:
        shmipc._shmipc._raise_for_code(code, "what: went wrong")
    e = info.value
    assert isinstance(e, builtin)
    assert isinstance(e, shmipc.Error)
    assert isinstance(e, OSError)
    assert e.errno == -code
    assert e.code == code
    assert e.name == "SHMIPC_" + name
    assert e.strerror == "what: went wrong"


def test_message_defaults_to_strerror():
    with pytest.raises(shmipc.Error) as info:
        shmipc._shmipc._raise_for_code(shmipc.errors["ENOSHM"])
    assert info.value.strerror == shmipc.strerror(shmipc.errors["ENOSHM"])


def test_hierarchy_is_catchable_as_oserror():
    with pytest.raises(OSError):
        shmipc.Config(buffer_capacity=1)


def test_version():
    major, minor, patch = (int(x) for x in shmipc.__version__.split("."))
    assert shmipc.version_number == major * 10000 + minor * 100 + patch
