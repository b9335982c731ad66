"""bench/serve_floors.py in its smallest form, so the script cannot rot: it runs, prints the
four figures, each a number, and refuses bad flags. It asserts no speed."""
import os
import re
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "bench", "serve_floors.py")


def test_prints_the_four_floors():
    r = subprocess.run([sys.executable, SCRIPT, "--n", "200", "--hops", "50", "--rounds", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in ("native", "eager", "task", "hop"):
        m = re.search(rf"^  {name}\s+([0-9.]+)$", r.stdout, re.M)
        assert m is not None, r.stdout
        assert float(m.group(1)) >= 0


def test_bad_flags():
    for bad in (["--n", "5"], ["--hops", "0"], ["--rounds", "0"], ["--n", "x"]):
        r = subprocess.run([sys.executable, SCRIPT] + bad, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
