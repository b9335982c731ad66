"""Attack review of the Python binding (its non-server parts): arguments whose conversion runs
the caller's code, objects used from that code, close from another thread. Each scenario that
could crash runs in a child interpreter (test_misuse.run_child), so a crash fails one test."""
import pytest

import shmipc
from test_misuse import run_child


def test_reserve_and_commit_size_index_closing_the_stream_raises_closed():
    """Regression: reserve(n) and commit(n) took the stream's handle before converting n, so an
    __index__ that closed the stream left the call on a freed handle (use after free)."""
    run_child(
        """
        p = Pair(default_config(), default_config())
        for method in ("reserve", "commit"):
            st = p.client.open_stream()
            if method == "commit":
                with st.reserve(4) as w:
                    w[:] = b"abcd"

            class Closer:
                def __index__(self):
                    st.close()
                    return 4

            try:
                getattr(st, method)(Closer())
            except shmipc.ClosedError:
                pass
            else:
                raise SystemExit(f"{method}(n) on a stream closed by n.__index__ did not raise")
            assert st.closed
        p.close()
        """
    )

