"""`python3 -m shmipc` (also installed as the `shmipc` script): --version, info, ping, echo."""
import os
import re
import subprocess
import sys

from conftest import ROOT, EchoServer, python_env, unique_address


def run(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "shmipc", *args], capture_output=True,
                          text=True, env=env or python_env(), timeout=timeout)


def test_version(shmipc):
    r = run("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"shmipc {shmipc.__version__}"


def test_info_lists_versions_protocols_io_uring_and_knobs(shmipc):
    env = dict(python_env(), SHMIPC_SPIN_US="7", SHMIPC_WORKERS="2")
    env.pop("SHMIPC_LOG_LEVEL", None)
    r = run("info", env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"shmipc {shmipc.__version__}" in out
    for v in ("V2", "V3", "V4"):
        assert re.search(rf"^  {v}  ", out, re.M), out
    assert re.search(r"^io_uring: (available|not available \(.+\); servers fall back to epoll)$",
                     out, re.M), out
    assert "  SHMIPC_SPIN_US=7" in out and "  SHMIPC_WORKERS=2" in out
    assert "SHMIPC_LOG_LEVEL" not in out


def test_info_ignores_reactor_backend_knob_for_probe():
    # SHMIPC_REACTOR_BACKEND does not override a backend set in code, so info's io_uring probe
    # answers the same whatever the variable; it still lists it as in force.
    r = run("info", env=dict(python_env(), SHMIPC_REACTOR_BACKEND="epoll"))
    assert r.returncode == 0, r.stderr
    assert "  SHMIPC_REACTOR_BACKEND=epoll" in r.stdout


def test_knob_list_matches_runtime_config_doc():
    from shmipc.__main__ import LIBRARY_KNOBS

    doc = os.path.join(ROOT, "docs", "runtime-config.md")
    if not os.path.exists(doc):
        import pytest

        pytest.skip("docs/ not beside the tests")
    rows = re.findall(r"^\| `(SHMIPC_[A-Z0-9_]+)` \| libshmipc", open(doc).read(), re.M)
    assert sorted(rows) == sorted(LIBRARY_KNOBS)


def test_ping_against_echo_server():
    server = EchoServer()
    try:
        r = run("ping", "-c", "3", "-s", "1000", server.address)
    finally:
        server.stop()
    assert r.returncode == 0, r.stderr
    assert re.search(r"^connected to .*: protocol V\d, [\d.]+ ms$", r.stdout, re.M), r.stdout
    assert len(re.findall(r"^1000 bytes round trip \d: [\d.]+ us$", r.stdout, re.M)) == 3


def test_ping_against_cli_echo_server():
    address = unique_address("cli-echo")
    echo = subprocess.Popen([sys.executable, "-m", "shmipc", "echo", address],
                            stdout=subprocess.PIPE, text=True, env=python_env())
    try:
        assert echo.stdout.readline().startswith("echoing on")
        r = run("ping", address)
        assert r.returncode == 0, r.stderr
        assert "64 bytes round trip 1:" in r.stdout
    finally:
        echo.terminate()
        echo.wait(10)


def test_ping_wrong_address_is_one_line_error():
    r = run("ping", "-t", "1", unique_address("nobody"))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("shmipc: cannot connect to unix:@")
    assert len(r.stderr.strip().splitlines()) == 1


def test_ping_bad_address_syntax():
    r = run("ping", "-t", "1", "no-such-scheme:x")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and r.stderr.startswith("shmipc: cannot connect")


def test_usage_errors_exit_2():
    assert run().returncode == 2
    r = run("ping", "-c", "0", "unix:@x")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_ping_out_of_range_values_are_usage_errors():
    # A timeout that is no number of seconds the library takes (nan, inf, over 2147483.647 s)
    # raised from shmipc.Config() and a size too large to make raised from os.urandom(): a
    # traceback and exit 1. Now usage errors, one line, before anything connects.
    addr = unique_address("nobody")
    for args in (["-t", "nan"], ["-t", "inf"], ["-t", "1e10"], ["-s", str(2 ** 64)],
                 ["-s", str(2 ** 40)]):
        r = run("ping", *args, addr)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        assert "error: --" in r.stderr, (args, r.stderr)


def test_info_into_closed_pipe_has_no_traceback():
    r = subprocess.run(f"{sys.executable} -m shmipc info | head -c 1 >/dev/null; exit ${{PIPESTATUS[0]}}",
                       shell=True, executable="/bin/bash", capture_output=True, text=True,
                       env=python_env(), timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
