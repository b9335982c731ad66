#!/usr/bin/env python3
"""Fails when an arrow between the layers points the wrong way (docs/design.md, "Layers").

    common  <-  shm  <-  ipc          core/: the engine; knows only shmipc__ internals
    common  <-  reactor  <-  net
    core/   <-  bindings/             the public shmipc_ functions, thin checked wrappers
    bindings/shmipc.h  <-  python/, lua/   the language modules see only the public headers

What it refuses:
  - a file under core/ that names a public API function (a call `shmipc_name(`, or its
    address), where the public functions are those the public headers (bindings/shmipc.h,
    bindings/shmipc_abi.h) declare with SHMIPC_API. Core may include shmipc.h for its types,
    enums and macros, nothing more; it may not include shmipc_abi.h (the ABI tables are the
    bindings' business);
  - a file under core/<dir>/ that includes a header of a core directory its layer may not use
    (the table ALLOWED below), or anything outside core/ but the public header;
  - a public function defined (SHMIPC_API) outside bindings/*.c;
  - a file under python/ or lua/ that includes a core header (or anything under core/ or
    bindings/ but the public headers) or names an internal that a core header declares, and a
    python/ or lua/ meson.build that hands its module the core include directory or the
    internal dependency.
Comments and string literals are ignored.

Usage: scripts/check-layers.py [--root DIR]   (DIR: the tree to check; default this one)
"""
import argparse
import glob
import os
import re
import sys

# Which core directories a core directory may include from (itself always).
ALLOWED = {
    "common": {"common"},
    "shm": {"common", "shm"},
    "reactor": {"common", "reactor"},
    "ipc": {"common", "shm", "ipc"},
    "net": {"common", "reactor", "net"},
    "serve": {"common", "shm", "ipc", "reactor", "net", "serve"},
}
PUBLIC_HEADERS = ("shmipc.h", "shmipc_abi.h", "shmipc_serve.h")
SOURCE_EXT = (".c", ".h")


def strip(text, keep_strings=False):
    """Blanks comments (and string and character literals unless keep_strings), keeping every
    newline so that line numbers stay true."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            lit = text[i:j]
            out.append(lit if keep_strings else c + re.sub(r"[^\n]", " ", lit[1:-1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def public_functions(root):
    """The names the public headers declare with SHMIPC_API."""
    names = set()
    for h in PUBLIC_HEADERS:
        path = os.path.join(root, "bindings", h)
        if not os.path.exists(path):
            continue
        text = strip(open(path, encoding="utf-8").read())
        for m in re.finditer(r"\bSHMIPC_API\b[^;{(]*?\b(shmipc_[A-Za-z0-9_]+)\s*\(", text):
            names.add(m.group(1))
    return names


def includes(text):
    """(line, quoted, path) of every #include, comments ignored."""
    clean = strip(text, keep_strings=True)
    for m in re.finditer(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^">\n]+)[">]', clean, re.M):
        yield line_of(clean, m.start()), m.group(1) == '"', m.group(2)


def sources(root, top):
    found = []
    for ext in SOURCE_EXT:
        found += glob.glob(os.path.join(root, top, "**", "*" + ext), recursive=True)
    return sorted(found)


def resolve(root, path, quoted, inc):
    """Where an include lands in the tree: the including file's directory first (quoted), then
    the build's include directories (bindings/ and core/). None when it is a system header."""
    if quoted and inc.startswith(("./", "../")):
        rel = os.path.relpath(os.path.normpath(os.path.join(os.path.dirname(path), inc)), root)
        return None if rel.startswith("..") else rel
    if os.path.basename(inc) in PUBLIC_HEADERS:
        return os.path.join("bindings", os.path.basename(inc))
    cands = []
    if quoted:
        cands.append(os.path.join(os.path.dirname(path), inc))
    cands += [os.path.join(root, "bindings", inc), os.path.join(root, "core", inc)]
    for c in cands:
        if os.path.exists(c):
            return os.path.relpath(os.path.normpath(c), root)
    if "core/" in inc or inc.split("/")[0] in ALLOWED:
        return os.path.normpath(os.path.join("core", inc.split("core/")[-1]))
    return None


def check(root):
    problems = []
    public = public_functions(root)
    if not public:
        return [f"no SHMIPC_API function found in {root}/bindings/shmipc.h"], {}
    counts = {"core": 0, "bindings": 0, "modules": 0}

    def bad(path, line, why):
        problems.append(f"{os.path.relpath(path, root)}:{line}: {why}")

    # core/: no public function, shmipc.h for its types only, includes by layer.
    for path in sources(root, "core"):
        counts["core"] += 1
        rel = os.path.relpath(path, os.path.join(root, "core"))
        layer = rel.split(os.sep)[0] if os.sep in rel else None
        text = open(path, encoding="utf-8", errors="replace").read()
        code = strip(text)
        for m in re.finditer(r"\b(shmipc_[A-Za-z0-9_]+)\b", code):
            if m.group(1) in public:
                bad(path, line_of(code, m.start()),
                    f"names the public function {m.group(1)}() (core calls shmipc__ internals)")
        for line, quoted, inc in includes(text):
            where = resolve(root, path, quoted, inc)
            if where is None:
                continue
            parts = where.split(os.sep)
            if parts[0] == "bindings":
                if parts[-1] == "shmipc.h" and len(parts) == 2:
                    continue
                bad(path, line, f'includes "{inc}" (core may include only shmipc.h, for types)')
            elif parts[0] == "core" and len(parts) >= 3 and layer in ALLOWED:
                if parts[1] not in ALLOWED[layer]:
                    bad(path, line, f'includes "{inc}": core/{layer} may not use core/{parts[1]} '
                        f"(allowed: {', '.join(sorted(ALLOWED[layer]))})")
            elif parts[0] not in ("core",):
                bad(path, line, f'includes "{inc}" from {parts[0]}/ (above core)')

    # Public functions are defined in bindings/*.c only.
    for top in ("core", "python", "lua"):
        for path in sources(root, top):
            code = strip(open(path, encoding="utf-8", errors="replace").read())
            defs = r"\bSHMIPC_API\b[^;{(]*?\b(shmipc_[A-Za-z0-9_]+)\s*\([^;{]*\{"
            for m in re.finditer(defs, code):
                bad(path, line_of(code, m.start()),
                    f"defines the public function {m.group(1)}() outside bindings/")
    counts["bindings"] = len(glob.glob(os.path.join(root, "bindings", "*.c")))

    # python/ and lua/: the public headers only. (Their own helpers may be named shmipc__lua_*
    # or the like; what they may not name is an internal that a core header declares.)
    internal = set()
    for path in sources(root, "core"):
        if path.endswith(".h"):
            text = strip(open(path, encoding="utf-8").read())
            internal |= set(re.findall(r"\bshmipc__[A-Za-z0-9_]+", text))
    for top in ("python", "lua"):
        for path in sources(root, top):
            counts["modules"] += 1
            text = open(path, encoding="utf-8", errors="replace").read()
            for line, quoted, inc in includes(text):
                where = resolve(root, path, quoted, inc)
                if where is None:
                    continue
                parts = where.split(os.sep)
                private = parts[0] == "bindings" and parts[-1] not in PUBLIC_HEADERS
                if parts[0] == "core" or private:
                    bad(path, line, f'includes "{inc}" ({top}/ sees only the public header)')
            code = strip(text)
            for m in re.finditer(r"\bshmipc__[A-Za-z0-9_]+", code):
                if m.group(0) in internal:
                    bad(path, line_of(code, m.start()),
                        f"names the core internal {m.group(0)} ({top}/ sees only the public "
                        "header)")
        build = os.path.join(root, top)
        for mb in glob.glob(os.path.join(build, "**", "meson.build"), recursive=True):
            code = open(mb, encoding="utf-8").read()
            for m in re.finditer(r"\b(core_inc|shmipc_internal_dep)\b", code):
                bad(mb, line_of(code, m.start()),
                    f"gives {top}/ {m.group(1)} ({top}/ sees only the public header)")
    return problems, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ap.parse_args()
    problems, counts = check(os.path.abspath(args.root))
    for p in problems:
        print("check-layers:", p, file=sys.stderr)
    if not problems:
        print(f"layers: {counts['core']} core files name no public function and include by layer; "
              f"{counts['modules']} python/lua files see only the public headers")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
