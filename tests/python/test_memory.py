"""100,000 small operations without memory growth: Python objects (tracemalloc) and C memory
(private resident pages from /proc/self/statm; the shared-memory mappings are not private)."""
import gc
import os
import tracemalloc

import shmipc
from conftest import default_config

PAGE = os.sysconf("SC_PAGE_SIZE")


def private_rss():
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    resident, shared = int(fields[1]), int(fields[2])
    return (resident - shared) * PAGE


def operations(session, n):
    """n operations of every kind the module has, against the echo server."""
    st = session.open_stream()
    for i in range(n):
        kind = i % 8
        msg = b"%08d" % i
        if kind == 0:
            st.write(msg)
            st.flush()
            assert st.readexactly(8) == msg
        elif kind == 1:
            st.write(msg)
            st.flush()
            with st.read_exact_bytes(8) as chunk:
                assert chunk == msg
        elif kind == 2:
            with st.reserve(8) as buf:
                buf[:] = msg
            st.commit(8)
            st.flush()
            chunk = st.read_exact_bytes(8)
            with memoryview(chunk) as mv:
                assert mv == msg
            del chunk
        elif kind == 3:
            st.write(msg)
            st.flush()
            got = b""
            while len(got) < 8:
                got += st.read(8 - len(got))
            assert got == msg
        elif kind == 4:
            assert st.read(nonblock=True) is None
            assert st.available == 0
        elif kind == 5:
            try:
                st.read_exact_bytes(1, nonblock=True).release()
            except AttributeError:
                pass  # None: nothing there, as expected
        elif kind == 6 and i % 64 == 6:
            st.close()
            st = session.open_stream()
        else:
            st.write(msg)
            st.flush()
            assert st.read_chunk(8) == msg
    st.close()


def test_100k_operations_without_memory_growth(echo_server):
    with shmipc.connect(echo_server.address, default_config()) as session:
        operations(session, 5000)  # warm up: caches, free lists, arenas
        gc.collect()
        tracemalloc.start()
        try:
            gc.collect()
            py_before = tracemalloc.get_traced_memory()[0]
            rss_before = private_rss()
            operations(session, 100_000)
            gc.collect()
            py_after = tracemalloc.get_traced_memory()[0]
            rss_after = private_rss()
        finally:
            tracemalloc.stop()
    # A leak of one small object per operation would be several megabytes.
    assert py_after - py_before < 256 * 1024, (py_before, py_after)
    assert rss_after - rss_before < 8 * 1024 * 1024, (rss_before, rss_after)
