"""A peer that shrinks the shared memory under our mapping (what a hostile peer holding the
memfd, or able to open the /dev/shm file, can do) ends that session with shmipc.Error (EPROTO)
instead of killing the interpreter with SIGBUS. pytest has installed faulthandler's SIGBUS
handler before the module loads: the library's guard must put itself in front of it."""
import errno
import os

import pytest

import shmipc
from conftest import default_config


def shm_files(tag, part, memmap):
    """Descriptors (memfd) or paths (/dev/shm) of this pair's shared memory named `part`."""
    if memmap == "devshm":
        return [os.path.join("/dev/shm", n) for n in os.listdir("/dev/shm") if tag in n and part in n]
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if "/memfd:" in target and tag in target and part in target:
            found.append(int(name))
    return found


@pytest.mark.parametrize("memmap", ["memfd", "devshm"])
def test_truncated_buffer_ends_the_session(make_pair, memmap):
    tag = f"pysigbus{os.getpid()}{memmap}"
    cfg = default_config(memmap=memmap, path_prefix=f"/dev/shm/{tag}", buffer_capacity=1 << 20)
    pair = make_pair(cfg, default_config())
    cs, ss = pair.streams()
    targets = shm_files(tag, "_buffer", memmap)
    assert targets, "the pair's buffer was not found"
    os.truncate(targets[0], 0)
    with pytest.raises(shmipc.Error) as info:
        cs.write(b"x" * 200_000)
        cs.flush()
    assert info.value.errno == errno.EPROTO
    assert "shrank" in str(info.value)
    with pytest.raises(shmipc.Error):
        ss.readexactly(1)
    # Other sessions of the process are untouched.
    other = make_pair()
    a, b = other.streams()
    a.write(b"still here")
    a.flush()
    assert b.readexactly(10) == b"still here"
