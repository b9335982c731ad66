"""bench/serve_bench.py in its smallest form (1 s, our targets, no peers), so the script cannot
rot: every target starts, answers the app's exact body, is measured, and the JSON, the
markdown and the plots come out. It asserts no speed."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

BENCH = os.path.join(ROOT, "bench", "serve_bench.py")
OURS = ["shmipc-serve-wsgi", "shmipc-serve-asgi", "shmipc-serve-c", "inproc-native", "inproc-wsgi",
        "inproc-asgi"]

pytestmark = pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")


def test_smallest_run_of_our_targets(tmp_path):
    out = tmp_path / "serve"
    env = dict(os.environ, SHMIPC_BUILD_DIR=BUILD)
    r = subprocess.run([sys.executable, BENCH, "--quick", "--only", *OURS, "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "serve.json").read_text())
    assert data["bench"] == "serve"
    measured = {c["target"] for c in data["results"]}
    expected = set(OURS) if os.path.exists(os.path.join(BUILD, "serve", "shmipc-serve")) else \
        {t for t in OURS if not t.startswith("shmipc-serve")}
    assert measured == expected, (data["skipped"], r.stdout)
    for c in data["results"]:
        assert (c["body"], c["workers"], c["conns"]) == (13, 1, 64)
        assert c["rps"] > 0 and c["rounds"][0]["requests"] > 0, c
        assert c["errors"] == 0, c
        assert c["cpu_us_per_req"] > 0, c
    md = (tmp_path / "serve.md").read_text()
    assert "| inproc-wsgi |" in md and "adapter / native" in md
    plots = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "plot.py"), "--svg",
                            "--out", str(tmp_path / "img"), str(tmp_path / "serve.json")],
                           capture_output=True, text=True, timeout=60)
    assert plots.returncode == 0, plots.stderr
    assert sorted(os.listdir(tmp_path / "img")) == ["serve-cpu.svg", "serve-rps.svg"]


def test_a_missing_peer_is_skipped_with_a_line_not_a_failure(tmp_path):
    # A PATH with wrk and taskset only: uwsgi is not there.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for exe in ("wrk", "taskset"):
        if shutil.which(exe):
            os.symlink(shutil.which(exe), bindir / exe)
    env = dict(os.environ, SHMIPC_BUILD_DIR=BUILD, PATH=str(bindir))
    r = subprocess.run([sys.executable, BENCH, "--quick", "--only", "uwsgi", "--out",
                        str(tmp_path / "serve")], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skipped uwsgi: uwsgi not installed" in r.stdout
    data = json.loads((tmp_path / "serve.json").read_text())
    assert data["results"] == [] and "uwsgi" in data["skipped"]


def test_list_and_bad_flags():
    r = subprocess.run([sys.executable, BENCH, "--list"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "uwsgi" in r.stdout and "inproc-wsgi" in r.stdout
    r = subprocess.run([sys.executable, BENCH, "--duration", "0"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "positive" in r.stderr
