"""shmipc.aio: awaitable reads and writes on one asyncio loop, one reader registration per
session, no stream references held while idle, and replacing the stream under an adapter
(a pending read or a cached end of stream of the old stream never affects the new one)."""
import asyncio
import gc
import sys
import weakref

import pytest

import shmipc
from conftest import default_config
from shmipc import aio
from shmipc.aio import AsyncStream


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def send(st, data):
    st.write(data)
    st.flush()


async def settle(loop_turns=20):
    for _ in range(loop_turns):
        await asyncio.sleep(0)


CONFIGS = {
    "v3": lambda: default_config(),
    "v2": lambda: default_config(memmap="devshm"),
    "v4-eventfd": lambda: default_config().with_v4_eventfd(),
    "v4-polling": lambda: default_config().with_v4_event_queue_polling(500),
}


@pytest.mark.parametrize("mode", sorted(CONFIGS))
def test_round_trips_in_one_loop(make_pair, mode):
    p = make_pair(client_config=CONFIGS[mode]())
    cs, ss = p.streams()

    async def server():
        a = AsyncStream(ss)
        while True:
            chunk = await a.read_chunk()
            if not chunk:
                break
            a.write(chunk)
            chunk.release()
            await a.drain()
        assert a.at_eof()
        a.close()

    async def client():
        a = AsyncStream(cs)
        for i in range(300):
            msg = b"message %d " % i * (1 + i % 7)
            a.write(msg)
            await a.drain()
            assert await a.readexactly(len(msg)) == msg
        a.write(b"x" * 100000)
        await a.drain()
        got = await a.read_exact_bytes(100000)
        assert got == b"x" * 100000
        got.release()
        a.close()

    async def main():
        await asyncio.gather(server(), client())

    run(main())


def test_end_of_stream_conventions(pair):
    cs, ss = pair.streams()

    async def main():
        a = AsyncStream(ss)
        send(cs, b"abc")
        cs.close()
        with pytest.raises(shmipc.EndOfStreamError):
            await a.readexactly(4)
        assert await a.read() == b"abc"
        assert await a.read() == b""
        assert a.at_eof()
        end = await a.read_chunk()
        assert len(end) == 0
        with pytest.raises(shmipc.EndOfStreamError):
            await a.read_exact_bytes(1)

    run(main())


def test_reads_wait_without_blocking_the_loop(pair):
    cs, ss = pair.streams()

    async def main():
        a = AsyncStream(ss)
        ticks = 0
        read = asyncio.ensure_future(a.read())
        while not read.done():
            ticks += 1
            if ticks == 50:
                send(cs, b"late")
            await asyncio.sleep(0.001)
        assert read.result() == b"late" and ticks >= 50

    run(main())


def test_one_reader_registration_per_session(pair):
    (ca, sa), (cb, sb) = pair.streams(), pair.streams()
    fd = pair.server.fileno()

    async def main():
        loop = asyncio.get_running_loop()
        calls = {"add": 0, "remove": 0}
        add, remove = loop.add_reader, loop.remove_reader

        def counting_add(f, *args):
            if f == fd:
                calls["add"] += 1
            return add(f, *args)

        def counting_remove(f):
            if f == fd:
                calls["remove"] += 1
            return remove(f)

        loop.add_reader, loop.remove_reader = counting_add, counting_remove
        a, b = AsyncStream(sa), AsyncStream(sb)
        ra = asyncio.ensure_future(a.readexactly(2))
        rb = asyncio.ensure_future(b.readexactly(2))
        await settle()
        assert not ra.done() and not rb.done()
        assert calls == {"add": 1, "remove": 0}  # both reads wait on one registration
        send(ca, b"aa")
        assert await ra == b"aa"
        send(cb, b"bb")
        assert await rb == b"bb"
        assert calls["add"] == calls["remove"] >= 1  # nothing stays registered when idle
        del loop.add_reader, loop.remove_reader

    run(main())


def test_adapter_holds_no_extra_references_while_idle(pair):
    cs, ss = pair.streams()

    async def main():
        base = sys.getrefcount(ss)
        a = AsyncStream(ss)
        assert sys.getrefcount(ss) == base + 1
        send(cs, b"one")
        assert await a.read() == b"one"
        reader = asyncio.ensure_future(a.read())
        await settle()
        send(cs, b"two")
        assert await reader == b"two"
        del reader
        gc.collect()
        assert sys.getrefcount(ss) == base + 1  # nothing left in watchers, futures, callbacks
        assert not aio._watchers.get(asyncio.get_running_loop())
        assert a.detach() is ss
        assert sys.getrefcount(ss) == base

    run(main())


def test_replaced_stream_is_collectable(pair):
    async def main():
        cs, ss = pair.streams()
        a = AsyncStream(ss)
        send(cs, b"x")
        assert await a.read() == b"x"
        ref = weakref.ref(ss)
        a.stream = None
        del ss
        gc.collect()
        assert ref() is None  # the adapter kept nothing

    run(main())


def test_pending_read_of_the_old_stream_does_not_touch_the_new_one(pair):
    (c_old, s_old), (c_new, s_new) = pair.streams(), pair.streams()

    async def main():
        a = AsyncStream(s_old)
        pending = asyncio.ensure_future(a.read_chunk())
        await settle()
        assert not pending.done()
        a.stream = s_new
        send(c_new, b"new data")
        assert await a.read() == b"new data"
        assert not pending.done()  # still waiting for the old stream, and only for it
        send(c_new, b"more new")
        send(c_old, b"old data")
        chunk = await pending
        assert chunk == b"old data"
        assert await a.read() == b"more new"
        # The old stream ends while a read of it is pending: the adapter's new stream is
        # not at its end.
        pending = asyncio.ensure_future(a.__class__(s_old).read())
        c_old.close()
        assert await pending == b""
        assert not a.at_eof()

    run(main())


def test_pending_read_that_ends_does_not_mark_the_new_stream_ended(pair):
    (c_old, s_old), (c_new, s_new) = pair.streams(), pair.streams()

    async def main():
        a = AsyncStream(s_old)
        pending = asyncio.ensure_future(a.read_chunk())
        await settle()
        a.stream = s_new
        c_old.close()
        end = await pending
        assert len(end) == 0
        assert not a.at_eof()  # the end belonged to the old stream
        send(c_new, b"fresh")
        assert await a.read() == b"fresh"

    run(main())


def test_cached_end_of_stream_is_forgotten_on_replace(pair):
    (c_old, s_old), (c_new, s_new) = pair.streams(), pair.streams()

    async def main():
        a = AsyncStream(s_old)
        c_old.close()
        assert await a.read() == b""
        assert a.at_eof()
        cached = await a.read_chunk()
        assert len(cached) == 0  # from the cache
        cached.release()
        assert len(await a.read_chunk()) == 0  # a released one is not handed out again
        a.stream = s_new
        assert not a.at_eof()
        send(c_new, b"alive")
        assert await a.read_chunk() == b"alive"

    run(main())


def test_pool_streams_through_the_adapter(echo_server):
    async def main():
        with shmipc.SessionManager(echo_server.address, default_config()) as m:
            a = AsyncStream(m.get_stream())
            for i in range(3):
                a.write(b"round %d" % i)
                await a.drain()
                assert await a.readexactly(7) == b"round %d" % i
                # Back to the pool and a (reused) stream from it under the same adapter.
                m.put_back(a.detach())
                a.stream = m.get_stream()
                assert a.stream.id == 2
            a.close()

    run(main())


def test_cancelled_read_leaves_nothing_registered(pair):
    cs, ss = pair.streams()

    async def main():
        loop = asyncio.get_running_loop()
        a = AsyncStream(ss)
        pending = asyncio.ensure_future(a.read())
        await settle()
        assert aio._watchers[loop]
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        assert not aio._watchers[loop]
        send(cs, b"after")
        assert await a.read() == b"after"

    run(main())


def test_accept_and_accept_stream(address):
    async def main():
        loop = asyncio.get_running_loop()
        with shmipc.Listener(address) as listener:
            connecting = loop.run_in_executor(None, shmipc.connect, address, default_config())
            server = await aio.accept(listener)
            client = await connecting
            accepting = asyncio.ensure_future(aio.accept_stream(server))
            await settle()
            assert not accepting.done()
            async with AsyncStream(client.open_stream()) as c:
                c.write(b"hi")
                await c.drain()
                async with AsyncStream(await accepting) as s:
                    assert await s.readexactly(2) == b"hi"
            client.close()
            server.close()

    run(main())


def test_errors(pair):
    cs, ss = pair.streams()

    async def main():
        a = AsyncStream()
        with pytest.raises(shmipc.ClosedError):
            await a.read()
        with pytest.raises(TypeError):
            a.stream = "not a stream"
        a.stream = ss
        pair.client.close()
        with pytest.raises(shmipc.PeerGoneError):
            await a.read()

    run(main())


def test_forward_echo_in_one_loop(pair):
    """An echo server that forwards the framed messages it receives, in the loop, while the
    client waits for each echo without blocking the loop."""
    cs, ss = pair.streams()

    async def server():
        a = AsyncStream(ss)
        while True:
            header = await a.read_exact_bytes(4)
            n = int.from_bytes(header, "big")
            if n == 0:
                break
            assert await a.forward(a, n) is True  # the header goes back too: it was read
            await a.drain()
        a.close()

    async def client():
        a = AsyncStream(cs)
        for size in (1, 100, 70000):
            message = size.to_bytes(4, "big") + bytes(range(256)) * (size // 256) + b"!" * (size % 256)
            a.write(message)
            await a.drain()
            assert await a.readexactly(len(message)) == message
        a.write((0).to_bytes(4, "big"))
        await a.drain()

    async def both():
        await asyncio.gather(server(), client())

    run(both())
