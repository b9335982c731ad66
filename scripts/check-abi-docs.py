#!/usr/bin/env python3
"""Fails when an exported function (a SHMIPC_API declaration of bindings/shmipc.h, or a row
of bindings/abi.def) is not named in docs/api.md, the API reference.

A function counts as named when docs/api.md has, in `code`:
  - its full name, shmipc_stream_read_chunk;
  - or the short form its table uses, `set_buffer_capacity(cfg, bytes)`, when no other
    exported function ends the same way, or when the heading of the section says which
    object it acts on ("## Config": shmipc_config_set_timeout_ms, not shmipc_stream_...);
  - or a wildcard that covers it, `shmipc_config_get_*`.

Usage: check-abi-docs.py [-v]   (-v shows how each function was found)"""
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
spec = importlib.util.spec_from_file_location("abi_table", os.path.join(HERE, "check-abi-table.py"))
abi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(abi)

DOC = os.path.join(ROOT, "docs", "api.md")


def main(argv):
    header = abi.Header()
    fns, _, _ = abi.parse_table()
    names = list(header.order) + [r.name for r in fns if r.name not in header.functions]
    doc = open(DOC).read()
    spans = re.findall(r"`([^`\n]+)`", doc)
    words = set(re.findall(r"\b(shmipc_\w+)\b", doc))
    wildcards = [s[:-1] for s in spans if re.fullmatch(r"shmipc_\w+_\*", s)]
    calls = {}  # short form -> headings of the sections that use it
    heading = ""
    for line in doc.splitlines():
        if line.startswith("#"):
            heading = line.lower()
        for s in re.findall(r"`([^`\n]+)`", line):
            for c in re.findall(r"(?<![\w.])(\w+)\s*\(", s):
                calls.setdefault(c, []).append(heading)

    def suffixes(name):
        parts = name.split("_")
        return ["_".join(parts[i:]) for i in range(2, len(parts))]

    owners = {}
    for n in names:
        for suf in suffixes(n):
            owners.setdefault(suf, set()).add(n)

    found, missing = {}, []
    for n in names:
        if n in words:
            found[n] = "full name"
            continue
        def in_section(suf):
            obj = n[len("shmipc_"):-len(suf) - 1]
            return any(re.search(r"\b%s\b" % obj.replace("_", " ?"), h) for h in calls[suf])

        short = [s for s in suffixes(n) if s in calls and (owners[s] == {n} or in_section(s))]
        if short:
            found[n] = f"`{short[0]}(`"
            continue
        cover = [w for w in wildcards if n.startswith(w)]
        if cover:
            found[n] = f"`{cover[0]}*`"
            continue
        missing.append(n)

    if "-v" in argv:
        for n in names:
            print(f"{n}: {found.get(n, 'MISSING')}")
    for n in missing:
        print(f"check-abi-docs: {n} is exported but docs/api.md does not name it", file=sys.stderr)
    if missing:
        print(f"check-abi-docs: {len(missing)} of {len(names)} exported functions are missing "
              "from docs/api.md", file=sys.stderr)
        return 1
    print(f"abi-docs: docs/api.md names all {len(names)} exported functions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
