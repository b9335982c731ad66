"""The extension imports under every Python 3 on the machine and links no libpython."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

import shmipc


def interpreters():
    found = {os.path.realpath("/usr/bin/python3"): "/usr/bin/python3"}
    on_path = shutil.which("python3")
    if on_path:
        found.setdefault(os.path.realpath(on_path), on_path)
    return sorted(found.values())


@pytest.mark.parametrize("exe", interpreters())
def test_imports_under(exe):
    pkg_parent = os.path.dirname(os.path.dirname(shmipc.__file__))
    env = dict(os.environ, PYTHONPATH=pkg_parent)
    out = subprocess.run(
        [exe, "-c", "import shmipc, sys; shmipc.Config().validate(); print(shmipc.__version__)"],
        capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == shmipc.__version__


def test_extension_does_not_link_libpython():
    ext = glob.glob(os.path.join(os.path.dirname(shmipc.__file__), "_shmipc*.so"))
    assert len(ext) == 1
    dyn = subprocess.run(["readelf", "-d", ext[0]], capture_output=True, text=True, check=True).stdout
    needed = [line for line in dyn.splitlines() if "(NEEDED)" in line]
    if os.environ.get("SHMIPC_TEST_INSTALLED") == "1" and not any("libshmipc" in l for l in needed):
        # A wheel's extension (-Dwheel=true) carries the library whole, with its symbols hidden
        # so that a libshmipc.so elsewhere in the process cannot interpose on them.
        syms = subprocess.run(["nm", "-D", "--defined-only", ext[0]], capture_output=True,
                              text=True, check=True).stdout.split()
        assert [s for s in syms if s.startswith("shmipc_")] == []
        assert "PyInit__shmipc" in syms
    else:
        assert any("libshmipc.so.0" in line for line in needed), needed
    assert not any("libpython" in line for line in needed), needed


def test_module_is_multi_phase_and_reloadable():
    import importlib

    import shmipc._shmipc as ext

    assert ext.__spec__ is not None
    again = importlib.reload(ext)
    # Each module object has its own state: its types and exceptions are fresh objects.
    assert again.Config().queue_capacity == 8192
