#!/usr/bin/env python3
"""Fails when a public struct that may grow breaks the rule that lets it grow: a struct of
the public headers (bindings/shmipc.h, shmipc_abi.h, shmipc_serve.h) whose name ends in _opts or
_options, or whose doc comment says @sized, must start with `size_t size;` and may only gain
fields at its end, so its fields in the committed ABI baseline (bindings/abi/libshmipc.abi)
must be the first fields it has now.

Every other public struct (shmipc_slice_class, shmipc_abi_param) is a plain value type and
frozen: any change to it fails scripts/check-abi-baseline.sh, which also lets sized structs
grow at the end (it reads the list from `check-abi-structs.py --list-sized`).

Usage: check-abi-structs.py [--list-sized]"""
import importlib.util
import os
import re
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
spec = importlib.util.spec_from_file_location("abi_table", os.path.join(HERE, "check-abi-table.py"))
abi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(abi)

BASELINE = os.path.join(ROOT, "bindings", "abi", "libshmipc.abi")


def public_structs(paths=abi.HEADERS):
    """[(name, sized, [(ctype, member name)], "header:line")] for every struct defined in the
    public headers."""
    out = []
    for path in paths:
        out += header_structs(path)
    return out


def header_structs(path):
    raw = open(path).read()
    out = []
    pat = re.compile(r"(/\*\*(?:(?!\*/).)*\*/\s*)?(?:typedef\s+)?struct\s+(\w+)\s*\{(.*?)\}", re.S)
    for m in pat.finditer(raw):
        doc, name, body = m.group(1) or "", m.group(2), m.group(3)
        sized = name.endswith(("_opts", "_options")) or "@sized" in doc
        members = []
        for decl in abi.strip_comments(body).split(";"):
            decl = " ".join(decl.split())
            if decl:
                members.append(abi.split_param(decl))
        line = raw.count("\n", 0, m.start(2)) + 1
        out.append((name, sized, members, f"{os.path.basename(path)}:{line}"))
    return out


def baseline_members(path=BASELINE):
    """{struct name: [member names]} from the abidw baseline, or {} when there is none."""
    if not os.path.exists(path):
        return {}
    out = {}
    for cls in ET.parse(path).getroot().iter("class-decl"):
        if cls.get("is-declaration-only") == "yes":
            continue
        names = [v.get("name") for dm in cls.findall("data-member") for v in dm.findall("var-decl")]
        out[cls.get("name")] = names
    return out


def main(argv):
    structs = public_structs()
    if "--list-sized" in argv:
        for name, sized, _, _ in structs:
            if sized:
                print(name)
        return 0
    problems = []
    base = baseline_members()
    for name, sized, members, line in structs:
        if not sized:
            continue
        where = f"{line}: struct {name}"
        if not members or members[0] != ("size_t", "size"):
            first = f"{members[0][0]} {members[0][1]}" if members else "nothing"
            problems.append(f"{where} is a sized struct but starts with {first}, not size_t size")
        now = [n for _, n in members]
        old = base.get(name)
        if old is not None and now[:len(old)] != old:
            problems.append(f"{where}: its fields were {', '.join(old)} in the baseline and are "
                            f"{', '.join(now)} now; a sized struct only grows at the end")
    for p in problems:
        print("check-abi-structs:", p, file=sys.stderr)
    if problems:
        return 1
    sized = [n for n, s, _, _ in structs if s]
    values = [n for n, s, _, _ in structs if not s]
    print(f"abi-structs: sized (grow at the end): {', '.join(sized) or 'none'}; "
          f"frozen value types: {', '.join(values) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
