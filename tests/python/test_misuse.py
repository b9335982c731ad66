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


def run_child(code, timeout=120, env=None):
    """Runs `code` in a fresh interpreter with the pair helpers importable; returns it done.
    `env`: more environment variables for it."""
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
        env={**python_env(), **(env or {})},
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


def test_listener_shutdown_wakes_accept_and_serve_and_fails_later_calls(address):
    listener = shmipc.Listener(address)
    ta, boxa = _in_thread(lambda: listener.accept())
    ts, boxs = _in_thread(lambda: listener.serve(lambda st: st.close()))
    assert _blocked(ta) and _blocked(ts)
    listener.shutdown()
    ta.join(5)
    ts.join(5)
    assert not ta.is_alive() and not ts.is_alive()
    assert isinstance(boxa.get("error"), shmipc.ClosedError), boxa
    assert isinstance(boxs.get("error"), shmipc.ClosedError), boxs
    listener.shutdown()  # twice is fine
    with pytest.raises(shmipc.ClosedError):
        listener.accept(timeout=0.1)
    with pytest.raises(shmipc.ClosedError):
        listener.serve(lambda st: st.close())
    listener.close()
    listener.shutdown()  # a no-op once closed
    assert listener.closed


def test_listener_shutdown_wakes_an_awaited_accept(address):
    import asyncio

    from shmipc import aio

    async def main():
        with shmipc.Listener(address) as listener:
            task = asyncio.ensure_future(aio.accept(listener))
            await asyncio.sleep(0.05)
            assert not task.done()
            threading.Thread(target=listener.shutdown).start()
            with pytest.raises(shmipc.ClosedError):
                await asyncio.wait_for(task, 10)

    asyncio.run(main())


def test_listener_close_from_another_thread_wakes_accept_and_serve(address):
    for kind in ("accept", "serve"):
        listener = shmipc.Listener(address + kind)
        if kind == "accept":
            t, box = _in_thread(lambda: listener.accept())
        else:
            t, box = _in_thread(lambda: listener.serve(lambda st: st.close()))
        assert _blocked(t)
        listener.close()
        t.join(5)
        assert not t.is_alive(), kind
        if kind == "accept":
            assert isinstance(box.get("error"), shmipc.ClosedError), box
        else:
            assert box == {"result": None}, box  # as after stop()
        assert listener.closed
        with pytest.raises(shmipc.ClosedError):
            listener.accept(timeout=0.1)


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


# ---- Item 1: random call sequences ---------------------------------------------------------

# One batch of rounds, run in a child: random stream calls with edge sizes, checking that only
# documented exceptions come out and that the server reads exactly what the client flushed,
# in order (a flush that fails drops its message, as documented).
RANDOM_BATCH = r"""
import os, random
SEED, ROUNDS = int(os.environ["MISUSE_SEED"]), int(os.environ["MISUSE_ROUNDS"])
rnd = random.Random(SEED)
print("seed", SEED, "rounds", ROUNDS, flush=True)  # shown when the batch fails
EDGES = [0, 1, 2, 4095, 4096, 4097, 16384, 16385, 3 * 16384 + 7,
         2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**64, -1, -(2**63)]
ALLOWED = (shmipc.Error, ValueError, OverflowError, BufferError)
MAX_OUT = 96 * 1024
cfg = default_config(read_timeout=0.003, write_timeout=0.005,
                     buffer_capacity=2 << 20, slice_classes="4096:50,16384:50")
counter = 0
stats = {"read": 0, "flushed": 0, "raised": 0}

def data(n):
    global counter
    out = bytes(((counter + i) * 2654435761 >> 13) & 0xFF for i in range(n))
    counter += n
    return out

for r in range(ROUNDS):
    p = Pair(cfg, cfg)
    cs = p.client.open_stream()
    first = data(1)
    cs.write(first)
    cs.flush()
    ss = p.server.accept_stream(timeout=10)
    expected, pending, window = bytearray(first), bytearray(), 0
    closed_cs = closed_ss = False
    for _ in range(rnd.randrange(50, 200)):
        n = rnd.choice(EDGES)
        op = rnd.randrange(13)
        try:
            if op == 0:
                if not 0 <= n <= MAX_OUT // 2 or len(expected) + len(pending) + n > MAX_OUT:
                    n = rnd.randrange(64)
                b = data(n)
                cs.write(b)
                pending += b
                window = 0
            elif op == 1:
                window = 0
                w = cs.reserve(n)
                window = n
                k = rnd.randrange(min(n, 64) + 1)
                b = data(k)
                w[:k] = b
                w.release()
                cs.commit(k)
                pending += b
                window = 0
            elif op == 2:
                cs.commit(n)
                raise SystemExit(f"commit({n}) with no window open did not raise")
            elif op == 3:
                try:
                    cs.flush()
                    expected += pending
                    stats["flushed"] += len(pending)
                except (shmipc.TimeoutError, shmipc.Error) as e:
                    if closed_cs or isinstance(e, shmipc.ClosedError):
                        raise
                pending.clear()
                window = 0
            elif op == 4:
                c = ss.read_chunk(max(0, min(n, 1 << 20)), nonblock=rnd.random() < 0.75)
                if c is not None:
                    got = bytes(c)
                    c.release()
                    assert got and expected[:len(got)] == got, "read_chunk out of order"
                    del expected[:len(got)]
                    stats["read"] += len(got)
            elif op == 5:
                if rnd.random() < 0.5 and expected:
                    n = rnd.randrange(1, len(expected) + 1)
                c = ss.read_exact_bytes(n, nonblock=True)
                if c is not None:
                    got = bytes(c)
                    c.release()
                    assert len(got) == n and expected[:n] == got, "read_exact out of order"
                    del expected[:n]
                    stats["read"] += n
            elif op == 6:
                ss.release()
            elif op == 7:
                # Forward to itself and read nothing back: the bytes leave ss's receive side.
                k = rnd.randrange(len(expected) + 1) if rnd.random() < 0.5 else n
                if ss.forward(ss, k, nonblock=True) is not None:
                    del expected[:k]
                ss.release()
            elif op == 8:
                ss.read_timeout = rnd.choice([0.001, 0.003, None if False else 0.002, float("nan"), "x"])
            elif op == 9:
                (cs if rnd.random() < 0.5 else ss).available
            elif op == 10:
                ss.write(data(rnd.randrange(8)))
                ss.flush()
            elif op == 11:
                cs.commit(0)
                raise SystemExit("commit(0) with no window open did not raise")
            else:
                repr(cs); repr(ss); cs.id; ss.session
        except AssertionError:
            raise
        except ALLOWED as e:
            stats["raised"] += 1
            if op in (0,) and not isinstance(e, (shmipc.ClosedError,)):
                raise
        except TypeError:
            if op != 8:
                raise
    # End of the round: the client closes; the server drains what was flushed, then EOF.
    ending = rnd.randrange(3)
    if ending == 0:
        try:
            cs.flush()
            expected += pending
        except shmipc.Error:
            pass
        cs.close()
        cs.close()
        ss.read_timeout = 5
        ss.release()
        while True:
            c = ss.read_chunk()
            if not len(c):
                break
            got = bytes(c)
            c.release()
            assert expected[:len(got)] == got, "drain out of order"
            del expected[:len(got)]
        assert not expected, f"{len(expected)} bytes never arrived"
    elif ending == 1:
        ss.shutdown()
        ss.shutdown()
        for call in (lambda: ss.read(nonblock=True), lambda: ss.write(b"x")):
            try:
                call()
                raise SystemExit("a call after shutdown did not raise")
            except shmipc.ClosedError:
                pass
        ss.release()
    else:
        p.client.shutdown()
        try:
            cs.write(b"x")
            raise SystemExit("write after the session's shutdown did not raise")
        except shmipc.ClosedError:
            pass
    ss.close()
    ss.close()
    cs.close()
    for call in (lambda: cs.write(b"x"), lambda: ss.read(nonblock=True), lambda: cs.commit(0),
                 lambda: cs.reserve(1), lambda: ss.forward(ss, 0), lambda: cs.flush()):
        try:
            call()
            raise SystemExit("a call after close did not raise")
        except shmipc.ClosedError:
            pass
    p.close()
# The sequences did something: bytes went through, and misuse raised.
assert stats["read"] > 0 and stats["flushed"] > 0 and stats["raised"] > 0, stats
print("ok", SEED, ROUNDS, stats)
"""


@pytest.mark.parametrize("batch", range(4))
def test_random_stream_sequences(batch):
    base = int(os.environ.get("SHMIPC_MISUSE_SEED", "19"), 0)
    rounds = os.environ.get("SHMIPC_MISUSE_ROUNDS", "15")
    env_code = f"import os; os.environ['MISUSE_SEED'] = '{base * 1000 + batch}'; " \
               f"os.environ['MISUSE_ROUNDS'] = '{rounds}'\n"
    run_child(env_code + RANDOM_BATCH, timeout=300)
