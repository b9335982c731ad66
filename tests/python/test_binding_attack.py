"""Attack review of the Python binding (its non-server parts): arguments whose conversion runs
the caller's code, objects used from that code, close from another thread. Each scenario that
could crash runs in a child interpreter (test_misuse.run_child), so a crash fails one test."""
import pytest

import shmipc
from conftest import unique_address
from test_misuse import run_child


def test_reserve_and_commit_size_index_closing_the_stream_raises_closed():
    """Regression: reserve(n) and commit(n) took the stream's handle before converting n, so an
    __index__ that closed the stream left the call on a freed handle (use after free). The
    __index__ opens another stream after the close: malloc hands it the freed one's memory, so
    the old code's call went to that stream (it reserved there, or found no window) instead of
    reading a freed stream still marked closed, which raised ClosedError as if all was well."""
    run_child(
        """
        p = Pair(default_config(), default_config())
        for method in ("reserve", "commit"):
            st = p.client.open_stream()
            if method == "commit":
                with st.reserve(4) as w:
                    w[:] = b"abcd"
            others = []

            class Closer:
                def __index__(self):
                    st.close()
                    others.append(p.client.open_stream())
                    return 4

            try:
                getattr(st, method)(Closer())
            except shmipc.ClosedError:
                pass
            else:
                raise SystemExit(f"{method}(n) on a stream closed by n.__index__ did not raise")
            assert st.closed
            # The other stream was not touched: a window of its own, then its close.
            with others[0].reserve(4) as w:
                w[:] = b"efgh"
            others[0].close()
        p.close()
        """
    )



def test_accept_timeout_float_closing_the_owner_raises_closed():
    """Regression: Session.accept_stream() and Listener.accept() took the handle before
    converting the timeout, so a __float__ that closed the session (listener) left the wait on
    a freed handle (use after free). A closed listener is followed by a new one, which malloc
    gives the freed one's memory: the old code waited on that one (TimeoutError) instead of
    reading a freed listener that still looked closed (ClosedError, as if all was well)."""
    run_child(
        """
        import os

        p = Pair(default_config(), default_config())
        others = []

        class Closer:
            def __init__(self, obj):
                self.obj = obj

            def __float__(self):
                self.obj.close()
                if self.obj is p.listener:
                    others.append(shmipc.Listener(f"unix:@shmipc-py-attack-reuse-{os.getpid()}"))
                return 0.05

        for obj, call in ((p.listener, p.listener.accept), (p.server, p.server.accept_stream)):
            try:
                call(Closer(obj))
            except shmipc.ClosedError:
                pass
            else:
                raise SystemExit(f"{call.__name__}() with a timeout closing its owner did not raise")
            assert obj.closed
        for other in others:
            other.close()
        p.client.close()
        """
    )


def test_accept_signal_handler_closing_the_owner_raises_closed():
    """Regression: a signal handler that closed the session (listener) between two wait slices
    of accept_stream() (accept()) freed the handle, and the next slice waited on it (use after
    free). A closed listener is followed by a new one, which takes the freed one's memory: the
    old code waited on that one to the end of the timeout instead of raising ClosedError."""
    run_child(
        """
        import os
        import signal

        p = Pair(default_config(), default_config())
        others = []

        def close_owner(obj):
            obj.close()
            if obj is p.listener:
                others.append(shmipc.Listener(f"unix:@shmipc-py-attack-reuse-{os.getpid()}"))

        for obj, call in ((p.listener, p.listener.accept), (p.server, p.server.accept_stream)):
            signal.signal(signal.SIGALRM, lambda *a: close_owner(obj))
            signal.setitimer(signal.ITIMER_REAL, 0.15)
            try:
                call(5)
            except shmipc.ClosedError:
                pass
            else:
                raise SystemExit(f"{call.__name__}() closed by a signal handler did not raise")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            assert obj.closed
        for other in others:
            other.close()
        p.client.close()
        """
    )


def test_abi_listener_serve_refused_at_once_frees_its_callbacks():
    """Regression: shmipc_listener_serve() refused a NULL listener or callback (SHMIPC_EINVAL)
    without calling destroy(user_data), so shmipc.abi's registration, its libffi closures and
    the Python callables they hold leaked on every such call."""
    import sys

    import shmipc.abi as a

    def on_stream(st):
        pass

    _, cfg = a.call("shmipc_config_new")
    rc, lst = a.call("shmipc_listener_new", unique_address("attack"), cfg)
    assert rc == 0
    before = sys.getrefcount(on_stream)
    for which in range(3):
        args = [lst, on_stream, on_stream]
        args[which] = None
        assert a.call("shmipc_listener_serve", *args) == shmipc.errors["EINVAL"]
        del args
        assert sys.getrefcount(on_stream) == before, f"a refused call kept its callbacks ({which})"
    a.call("shmipc_listener_close", lst)
    a.call("shmipc_config_free", cfg)


def test_abi_log_sink_that_clears_itself_and_raises():
    """Regression: a shmipc.abi log sink that cleared itself (shmipc_set_log_sink(None)) and
    then raised had its closure freed under it: the report of its exception read the freed
    closure's callable (use after free, seen under ASan). The child runs with Python's debug
    allocator (PYTHONMALLOC=debug), which fills freed memory with 0xDD: the old code's read of
    the freed closure then crashes (SIGSEGV) instead of finding the callable still there."""
    proc = run_child(
        """
        import shmipc.abi as a

        p = Pair(default_config(buffer_capacity=1 << 20), default_config())
        calls = []

        def sink(level, line):
            calls.append(line)
            a.call("shmipc_set_log_sink", None)
            raise RuntimeError("sink failed after clearing itself")

        import threading

        st, peer = p.streams()
        reader = threading.Thread(target=lambda: peer.readexactly(4 << 20))
        reader.start()
        a.call("shmipc_set_log_sink", sink)
        st.write(b"x" * (4 << 20))
        st.flush()  # shared memory runs out: the flush falls back and warns
        reader.join(30)
        st.close()
        assert len(calls) == 1, calls
        p.close()
        print("done")
        """,
        env={"PYTHONMALLOC": "debug"},
    )
    assert "done" in proc.stdout
    assert "sink failed after clearing itself" in proc.stderr  # reported, as unraisable


def test_embedded_nul_in_names_is_refused():
    """Regression: Listener() passed its address to C through a NUL-terminated copy, so
    'unix:@name\\0rest' listened on 'unix:@name' while .address said otherwise; Config's
    memmap, set_wakeup() and slice_classes likewise read only the part before a NUL."""
    with pytest.raises(ValueError):
        shmipc.Listener(unique_address("attack-nul") + "\0rest")
    cfg = shmipc.Config()
    for field, value in (("memmap", "memfd\0x"), ("slice_classes", "1024:100\0junk")):
        with pytest.raises(ValueError):
            setattr(cfg, field, value)
    with pytest.raises(ValueError):
        cfg.set_wakeup("socket\0x")
    assert cfg.memmap == "memfd"
