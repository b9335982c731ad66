#!/usr/bin/env python3
"""Adds up the results of every suite and prints them, ending with the line
"N passed, N failed" (skips, if any, on the line before). Exits 1 when anything failed, or
when a step failed without a counted test failure (a crash, a build error).

Usage: summarize.py RESULTS_DIR [FAILED_STEP ...]
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET


def cmocka(path):
    """Counts cmocka cases in a meson testlog.json; an executable with no summary failed."""
    passed = failed = skipped = 0
    if not os.path.exists(path):
        return None
    with open(path) as f:
        for line in f:
            t = json.loads(line)
            out = (t.get("stdout") or "") + (t.get("stderr") or "")
            p = re.search(r"\[  PASSED  \] (\d+) test", out)
            fl = re.search(r"\[  FAILED  \] (\d+) test", out)
            sk = re.search(r"\[  SKIPPED \] (\d+) test", out)
            if t.get("result") == "SKIP":
                skipped += 1
                continue
            if p is None and fl is None:
                if t.get("result") == "OK":
                    passed += 1
                else:
                    failed += 1
                continue
            passed += int(p.group(1)) if p else 0
            failed += int(fl.group(1)) if fl else 0
            skipped += int(sk.group(1)) if sk else 0
            if t.get("result") != "OK" and not fl:
                failed += 1  # crashed or leaked after its cases passed
    return passed, failed, skipped


def pytest(path):
    if not os.path.exists(path):
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = sum(int(s.get("tests", 0)) for s in suites)
    fails = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skips = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - fails - skips, fails, skips


def last_line_counts(path):
    if not os.path.exists(path):
        return None
    m = None
    with open(path) as f:
        for line in f:
            m = re.match(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$", line.strip()) or m
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def checks(path):
    if not os.path.exists(path):
        return None
    lines = [l.split() for l in open(path) if l.strip()]
    ok = sum(1 for l in lines if l[0] == "ok")
    return ok, len(lines) - ok, 0


def main():
    results, failed_steps = sys.argv[1], sys.argv[2:]
    suites = [
        ("C", cmocka(os.path.join(results, "c.json"))),
        ("C asan+ubsan", cmocka(os.path.join(results, "c-asan.json"))),
        ("C tsan", cmocka(os.path.join(results, "c-tsan.json"))),
        ("Python", pytest(os.path.join(results, "python.xml"))),
        ("Lua", last_line_counts(os.path.join(results, "lua.txt"))),
        ("Python (pip)", pytest(os.path.join(results, "python-installed.xml"))),
        ("Lua (luarocks)", last_line_counts(os.path.join(results, "lua-installed.txt"))),
        ("install routes", checks(os.path.join(results, "install.txt"))),
        ("checks", checks(os.path.join(results, "checks.txt"))),
        ("fuzz", last_line_counts(os.path.join(results, "fuzz.txt"))),
    ]
    total = [0, 0, 0]
    print()
    for name, counts in suites:
        if counts is None:
            print(f"{name:14s} did not run")
            total[1] += 1
            continue
        print(f"{name:14s} {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped")
        for i in range(3):
            total[i] += counts[i]
    if failed_steps:
        print("failed steps: " + ", ".join(failed_steps))
        if total[1] == 0:
            total[1] = len(failed_steps)
    # The last line is exactly "N passed, N failed", as CI reads it; skips go just above.
    if total[2]:
        print(f"{total[2]} skipped")
    print(f"{total[0]} passed, {total[1]} failed")
    return 1 if total[1] else 0


if __name__ == "__main__":
    sys.exit(main())
