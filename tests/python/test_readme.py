"""The README's examples work as shown: the C one is compiled against the build and run
against the C greeter server, the Python and Lua ones are run as they stand."""
import os
import re
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("SHMIPC_BUILD_DIR", os.path.join(ROOT, "build"))


def snippet(lang):
    text = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```" + lang + r"\n(.*?)```", text, re.S)
    assert blocks, f"README has no {lang} example"
    return blocks[0]


def test_c_example(tmp_path):
    # The README's fixed socket path, made unique: two test runs at once must not collide.
    sock = str(tmp_path / "greeter.sock")
    code = snippet("c")
    assert "/tmp/shmipc_greeter.sock" in code
    src = tmp_path / "example.c"
    src.write_text(code.replace("/tmp/shmipc_greeter.sock", sock))
    exe = tmp_path / "example"
    libdir = os.path.join(BUILD, "bindings")
    subprocess.run(["cc", "-Wall", "-Wextra", "-Werror", str(src), "-I", os.path.join(ROOT, "bindings"),
                    "-L", libdir, "-lshmipc", f"-Wl,-rpath,{libdir}", "-o", str(exe)], check=True)
    server = subprocess.Popen([os.path.join(BUILD, "examples", "c", "greeter_server"), "unix:" + sock, "1"],
                              stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "server hello world!!!"
    finally:
        server.wait(timeout=30)
    assert server.returncode == 0


def test_python_example():
    out = subprocess.run([sys.executable, "-c", snippet("python")], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python")), timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "200 {'hello': 'world'}"


def test_lua_example(tmp_path):
    src = tmp_path / "example.lua"
    src.write_text(snippet("lua"))
    out = subprocess.run(["lua5.4", str(src)], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, LUA_CPATH=os.path.join(BUILD, "lua", "?.so") + ";;"))
    assert out.returncode == 0, out.stderr
    assert "queue_capacity" in out.stdout and "SHMIPC_EINVAL" in out.stdout
