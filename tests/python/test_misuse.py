"""API misuse from Python never crashes the process (issue 19, items 1 and 4).

Each scenario that could crash runs in a child interpreter, so a crash (SIGSEGV) is reported as
a failure of that test and not as a dead test run.
"""
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import shmipc
from conftest import python_env

HERE = os.path.dirname(os.path.abspath(__file__))


def run_child(code, timeout=120):
    """Runs `code` in a fresh interpreter with the pair helpers importable; returns it done."""
    prelude = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {HERE!r})
        import shmipc
        from conftest import Pair, default_config
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode} "
        f"(negative: killed by signal {-proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


def test_commit_zero_without_reserve_raises_instead_of_crashing():
    """Regression: st.commit(0) on a fresh stream indexed segs[UINT32_MAX] (SIGSEGV)."""
    run_child(
        """
        p = Pair(default_config(), default_config())
        st = p.client.open_stream()
        for n in (0, 1):
            try:
                st.commit(n)
            except shmipc.InvalidArgumentError:
                pass
            else:
                raise SystemExit(f"commit({n}) with nothing reserved did not raise")
        with st.reserve(4) as w:
            w[:4] = b"abcd"
        st.commit(4)
        try:
            st.commit(0)  # the window is gone
        except ValueError:
            pass
        else:
            raise SystemExit("a second commit did not raise")
        st.flush()
        ss = p.server.accept_stream(timeout=10)
        assert ss.readexactly(4) == b"abcd"
        p.close()
        """
    )


# ---- Wrong types and sizes raise, never crash ----------------------------------------------


def test_wrong_types_and_sizes_raise(pair):
    cs, ss = pair.streams()
    for call, exc in [
        (lambda: cs.commit("1"), TypeError),
        (lambda: cs.commit(None), TypeError),
        (lambda: cs.commit(1.5), TypeError),
        (lambda: cs.commit(-1), ValueError),
        (lambda: cs.commit(2**64), OverflowError),
        (lambda: cs.reserve(-1), ValueError),
        (lambda: cs.reserve(0), ValueError),
        (lambda: cs.reserve(2**64), OverflowError),
        (lambda: cs.reserve("8"), TypeError),
        (lambda: cs.write(123), TypeError),
        (lambda: cs.write(None), TypeError),
        (lambda: ss.read_exact_bytes(-1), ValueError),
        (lambda: ss.read_exact_bytes(2**64), OverflowError),
        (lambda: ss.read_exact_bytes("1"), TypeError),
        (lambda: ss.readexactly(-1), ValueError),
        (lambda: ss.read_chunk(-1), ValueError),
        (lambda: ss.read_chunk("x"), TypeError),
        (lambda: ss.forward(None), TypeError),
        (lambda: ss.forward(cs, -1), ValueError),
    ]:
        with pytest.raises(exc):
            call()
    # Sizes past what a read can ever hold fail cleanly (a u32 limit in the C API).
    with pytest.raises(ValueError):
        ss.read_exact_bytes(2**32, nonblock=True)
    # The streams still work.
    cs.write(b"ok")
    cs.flush()
    assert ss.readexactly(2) == b"ok"


# ---- Item 4: shutdown from another thread --------------------------------------------------


def _in_thread(fn):
    box = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # reported to the test
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, box


def _blocked(t):
    """Gives the thread time to get into its call; True while it has not returned."""
    time.sleep(0.05)
    return t.is_alive()


def test_session_shutdown_wakes_accept_and_fails_later_calls(pair):
    t, box = _in_thread(lambda: pair.server.accept_stream())
    assert _blocked(t)
    pair.server.shutdown()
    t.join(5)
    assert not t.is_alive()
    assert isinstance(box.get("error"), shmipc.ClosedError), box
    pair.server.shutdown()  # twice is fine
    assert not pair.server.closed
    assert pair.server.status == shmipc.errors["ECLOSED"]
    with pytest.raises(shmipc.ClosedError):
        pair.server.accept_stream(timeout=0.1)
    pair.server.close()
    pair.server.shutdown()  # a no-op once closed
    assert pair.server.closed


def test_stream_shutdown_wakes_a_blocked_read_and_the_session_goes_on(pair):
    (cs, ss), (cs2, ss2) = pair.streams(), pair.streams()
    ss.read_timeout = None
    t, box = _in_thread(lambda: ss.read_chunk())
    assert _blocked(t)
    ss.shutdown()
    t.join(5)
    assert not t.is_alive()
    assert isinstance(box.get("error"), shmipc.ClosedError), box
    ss.shutdown()
    with pytest.raises(shmipc.ClosedError):
        ss.write(b"x")
    with pytest.raises(shmipc.ClosedError):
        ss.read(nonblock=True)
    ss.release()
    # Another stream of the session is unaffected.
    cs2.write(b"still")
    cs2.flush()
    assert ss2.readexactly(5) == b"still"
    ss.close()
    ss.shutdown()  # a no-op once closed
    cs.read_timeout = 5
    assert cs.read() == b""  # the peer heard the close


def test_close_from_another_thread_wakes_each_blocking_call(pair):
    for kind in ("read_chunk", "readexactly", "forward", "accept"):
        if kind == "accept":
            target = pair.server
            t, box = _in_thread(lambda: target.accept_stream())
        else:
            cs, ss = pair.streams()
            ss.read_timeout = None
            target = ss
            call = {
                "read_chunk": lambda: ss.read_chunk(),
                "readexactly": lambda: ss.readexactly(100),
                "forward": lambda: ss.forward(ss, 100),
            }[kind]
            t, box = _in_thread(call)
        assert _blocked(t)
        target.close()
        t.join(5)
        assert not t.is_alive(), kind
        assert isinstance(box.get("error"), shmipc.ClosedError), (kind, box)


def test_asyncio_cancel_and_shutdown_of_awaited_reads(pair):
    import asyncio

    from shmipc.aio import AsyncStream

    cs, ss = pair.streams()

    async def main():
        a = AsyncStream(ss)
        # Cancelling a pending read drops only the wait: the stream reads on afterwards.
        task = asyncio.ensure_future(a.readexactly(3))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cs.write(b"abc")
        cs.flush()
        assert await a.readexactly(3) == b"abc"
        # A shutdown from another thread ends an awaited read with ClosedError.
        task = asyncio.ensure_future(a.read())
        await asyncio.sleep(0.05)
        threading.Thread(target=ss.shutdown).start()
        with pytest.raises(shmipc.ClosedError):
            await asyncio.wait_for(task, 5)
        a.close()

    asyncio.run(main())
