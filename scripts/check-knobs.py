#!/usr/bin/env python3
"""Fails when the SHMIPC_* environment variables the code reads and the ones documented in
docs/runtime-config.md differ, or when library code calls getenv() directly instead of
shmipc__getenv() (which is what makes every knob findable here)."""
import os
import re
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(root)
git = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], capture_output=True, text=True)
if git.returncode == 0:
    files = git.stdout.split()
else:  # not a git checkout (an exported tree): every file outside the build trees
    files = [os.path.relpath(os.path.join(d, f)) for d, _, fs in os.walk(".") for f in fs]
files = [f for f in files if not f.startswith(("build", ".git/")) and os.path.isfile(f)]

read_patterns = [
    re.compile(r'(?:shmipc__getenv|getenv|secure_getenv)\(\s*"(SHMIPC_[A-Z0-9_]+)"'),  # C
    re.compile(r'os\.(?:environ(?:\.get)?|getenv)\s*[\(\[]\s*["\'](SHMIPC_[A-Z0-9_]+)'),  # Python
    re.compile(r'os\.getenv\(\s*["\'](SHMIPC_[A-Z0-9_]+)'),  # Lua
    re.compile(r'\$\{?(SHMIPC_[A-Z0-9_]+)'),  # shell
]
read = {}
problems = []
for f in files:
    if not f.endswith((".c", ".h", ".py", ".lua", ".sh")) and not f.startswith(".ci/"):
        continue
    text = open(f, errors="replace").read()
    for pat in read_patterns:
        for name in pat.findall(text):
            read.setdefault(name, f)
    if f.startswith(("core/", "bindings/")) and f != "core/common/env.c":
        if re.search(r'(?<![_a-z])getenv\(', text):
            problems.append(f"{f}: reads the environment with getenv(); use shmipc__getenv()")

doc = open("docs/runtime-config.md").read()
documented = set(re.findall(r"^\|\s*`(SHMIPC_[A-Z0-9_]+)`", doc, re.M))
for name in sorted(set(read) - documented):
    problems.append(f"{name} is read in {read[name]} but not documented in docs/runtime-config.md")
for name in sorted(documented - set(read)):
    problems.append(f"{name} is documented in docs/runtime-config.md but nothing reads it")
for p in problems:
    print("check-knobs:", p, file=sys.stderr)
if not problems:
    print(f"knobs: {len(documented)} documented, all read, none undocumented")
sys.exit(1 if problems else 0)
