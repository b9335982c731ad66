"""API misuse from Python never crashes the process (issue 19, items 1 and 4).

Each scenario that could crash runs in a child interpreter, so a crash (SIGSEGV) is reported as
a failure of that test and not as a dead test run.
"""
import os
import subprocess
import sys
import textwrap

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
