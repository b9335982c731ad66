#!/usr/bin/env python3
"""Fails when a test file would go unrun: a tests/c/test_*.c not registered in
tests/c/meson.build (or registered without a file, or absent from the configured build), or
a tests/python/test_*.py from which pytest collects nothing. Lua test files are discovered
by the harness itself, which fails a file that defines no test."""
import glob
import json
import os
import re
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(root)
problems = []

text = open("tests/c/meson.build").read()
listed = set(re.findall(r"'([a-z0-9_]+)'", re.search(r"c_tests = \[(.*?)\]", text, re.S).group(1)))
files = {os.path.basename(p)[5:-2] for p in glob.glob("tests/c/test_*.c")}
for name in sorted(files - listed):
    problems.append(f"tests/c/test_{name}.c is not listed in c_tests in tests/c/meson.build")
for name in sorted(listed - files):
    problems.append(f"c_tests lists '{name}' but tests/c/test_{name}.c does not exist")
if os.path.exists("build/build.ninja"):
    intro = subprocess.run(["meson", "introspect", "--tests", "build"], capture_output=True, text=True)
    registered = {t["name"] for t in json.loads(intro.stdout or "[]") if "c" in t.get("suite", [])
                  or any(s.endswith(":c") for s in t.get("suite", []))}
    for name in sorted(files - registered):
        problems.append(f"tests/c/test_{name}.c is not a test in the configured build")

env = dict(os.environ)
env["PYTHONPATH"] = os.path.join(root, "build", "python")
collect = subprocess.run(
    ["/usr/bin/python3", "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/python"],
    capture_output=True, text=True, env=env)
collected = {line.split("::")[0] for line in collect.stdout.splitlines() if "::" in line}
for path in sorted(glob.glob("tests/python/test_*.py")):
    if path not in collected:
        problems.append(f"{path}: pytest collects no test from it")

for p in problems:
    print("check-tests:", p, file=sys.stderr)
if not problems:
    print(f"tests: {len(files)} C files registered, {len(collected)} Python files collected")
sys.exit(1 if problems else 0)
