#!/usr/bin/env python3
"""Fails when the descriptor table bindings/abi.def, the public headers bindings/shmipc.h and
bindings/shmipc_abi.h and bindings/shmipc_serve.h (read as one), the version script bindings/libshmipc.map and the dynamic symbols of the built libshmipc.so
disagree:
  - every SHMIPC_API function of the header has a row with the same return type and the same
    parameter types and names, and every row a declaration; the same for callback types;
  - each row's vocabulary types fit their C types (docs/abi.md has the rules), pairs are
    complete, and GENERIC is set exactly when no type is OPAQUE;
  - the version script lists exactly the table's names, once each;
  - the library exports exactly those functions, each versioned with the node that lists it,
    and its SONAME is libshmipc.so.0.

Usage: check-abi-table.py [--build DIR]   (default build/)
       check-abi-table.py --draft         prints rows for the functions the table lacks
The other check-abi-*.py scripts load this file for its parsers."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "bindings", "shmipc.h")
# The public headers: the API (shmipc.h), the descriptor table's types (shmipc_abi.h) and the
# shmipc-serve frame codec (shmipc_serve.h).
HEADERS = [HEADER, os.path.join(ROOT, "bindings", "shmipc_abi.h"),
           os.path.join(ROOT, "bindings", "shmipc_serve.h")]
TABLE = os.path.join(ROOT, "bindings", "abi.def")
MAP = os.path.join(ROOT, "bindings", "libshmipc.map")
SONAME = "libshmipc.so.0"


# ---------------------------------------------------------------------------------------------
# C text helpers


def strip_comments(text):
    """Removes /* */ and // comments, keeping line breaks so that line numbers stay right."""
    out = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", out)


def strip_directives(text):
    """Removes preprocessor lines, with their continuations."""
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", "", text, flags=re.M)


def norm_type(t):
    """One spelling per C type: words separated by one space, '*' runs glued after a space."""
    toks = re.findall(r"[A-Za-z_]\w*|\*|\S", t)
    s = " ".join(toks)
    while "* *" in s:
        s = s.replace("* *", "**")
    return s.replace("( ", "(").replace(" )", ")").replace(" ,", ",")


def split_top(s, sep=","):
    """Splits on `sep` outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def split_param(p):
    """'const shmipc_config *cfg' -> ('const shmipc_config *', 'cfg'); handles (*name)(...)."""
    m = re.match(r"^(.*)\(\s*\*\s*(\w+)\s*\)\s*(\(.*\))$", p, re.S)
    if m:
        return norm_type(m.group(1) + "(*)" + m.group(3)), m.group(2)
    m = re.match(r"^(.*?)(\w+)$", p, re.S)
    if not m or not m.group(1).strip():
        return norm_type(p), ""
    return norm_type(m.group(1)), m.group(2)


# ---------------------------------------------------------------------------------------------
# The header


class Header:
    def __init__(self, paths=None):
        paths = HEADERS if paths is None else [paths] if isinstance(paths, str) else paths
        self.raw = "\n".join(open(p).read() for p in paths)
        code = strip_directives(strip_comments(self.raw))
        self.functions = {}  # name -> (ret ctype, [(ctype, name)])
        self.order = []
        self.callbacks = {}  # typedef name -> (ret ctype, [(ctype, name)])
        for stmt in re.split(r"[;{}]", code):
            s = " ".join(stmt.split())
            # A deprecated function is still exported: its mark says what replaces it.
            s = re.sub(r'^SHMIPC_DEPRECATED\("[^"]*"\)\s*', "", s)
            m = re.match(r"^SHMIPC_API\s+(.*?)\b(\w+)\s*\((.*)\)$", s)
            if m:
                self.functions[m.group(2)] = (norm_type(m.group(1)), self._params(m.group(3)))
                self.order.append(m.group(2))
                continue
            m = re.search(r"typedef\s+(.*?)\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)$", s)
            if m:
                self.callbacks[m.group(2)] = (norm_type(m.group(1)), self._params(m.group(3)))
        self.kinds = {}  # KIND -> (value, ctype)
        km = re.search(r"#define\s+SHMIPC_ABI_KIND_MAP\(XX\)((?:[^\n]*\\\n)*[^\n]*)", self.raw)
        if km:
            for name, value, ctype in re.findall(r"XX\(\s*(\w+)\s*,\s*(\d+)\s*,\s*(\w+)\s*\)",
                                                 km.group(1)):
                self.kinds[name] = (int(value), ctype)
        self.types = set()
        em = re.search(r"enum\s+shmipc_abi_type\s*\{(.*?)\}", code, re.S)
        if em:
            self.types = set(re.findall(r"SHMIPC_ABI_(\w+)\s*=", em.group(1)))
        fm = re.search(r"enum\s+shmipc_abi_flag\s*\{(.*?)\}", code, re.S)
        self.flags = set(re.findall(r"SHMIPC_ABI_(\w+)\s*=", fm.group(1))) if fm else set()

    @staticmethod
    def _params(text):
        text = text.strip()
        if text in ("", "void"):
            return []
        return [split_param(p) for p in split_top(text)]


# ---------------------------------------------------------------------------------------------
# The table


class Row:
    def __init__(self, macro, name, flags, ret, params, line):
        self.macro, self.name, self.flags, self.ret, self.params, self.line = (
            macro, name, flags, ret, params, line)


def parse_slot(text, macro):
    """R(type, kind, ctype) or P(type, kind, ctype, name) -> dict."""
    m = re.match(r"^%s\s*\((.*)\)$" % macro, text.strip(), re.S)
    if not m:
        raise ValueError(f"expected {macro}(...), got {text.strip()!r}")
    args = split_top(m.group(1))
    want = 3 if macro == "R" else 4
    if len(args) != want:
        raise ValueError(f"{macro}(...) takes {want} arguments: {text.strip()!r}")
    return {"type": args[0], "kind": args[1], "ctype": norm_type(args[2]),
            "name": args[3] if macro == "P" else ""}


def parse_table(path=TABLE):
    """Returns (function rows, callback rows, problems)."""
    text = strip_comments(open(path).read())
    fns, cbs, problems = [], [], []
    for m in re.finditer(r"^\s*(FN0|FN|CB)\s*\(", text, re.M):
        start, depth, i = m.end(), 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        line = text.count("\n", 0, m.start()) + 1
        args = split_top(text[start:i - 1])
        try:
            if m.group(1) == "CB":
                cbs.append(Row("CB", args[1], "", parse_slot(args[2], "R"),
                               [parse_slot(a, "P") for a in args[3:]], line))
                cbs[-1].kind = args[0]
            else:
                params = [parse_slot(a, "P") for a in args[3:]]
                if (m.group(1) == "FN0") != (not params):
                    raise ValueError("FN0 is for functions without parameters, FN for the rest")
                fns.append(Row(m.group(1), args[0], args[1], parse_slot(args[2], "R"), params,
                               line))
        except (ValueError, IndexError) as e:
            problems.append(f"abi.def:{line}: {e}")
    return fns, cbs, problems


# ---------------------------------------------------------------------------------------------
# The vocabulary: which C types each table type may describe

SCALAR = {
    "I32": {"int", "int32_t"},
    "U32": {"uint32_t", "unsigned", "unsigned int"},
    "I64": {"int64_t"},
    "U64": {"uint64_t"},
    "SIZE": {"size_t"},
    "BYTES_LEN": {"size_t"},
    "CSTR": {"const char *"},
    "CHARS": {"const char *"},
    "BYTES_IN": {"const void *"},
    "OUT_CPTR": {"const void **"},
    "OUT_CPTR_N": {"const void **"},
    "OUT_WPTR_N": {"void **"},
    "OUT_CHARS": {"const char **"},
    "OUT_LEN": {"size_t *"},
    "OUT_I32": {"int *", "int32_t *"},
    "OUT_U32": {"uint32_t *", "unsigned *", "unsigned int *"},
    "OUT_I64": {"int64_t *"},
    "OUT_U64": {"uint64_t *"},
    "OUT_SIZE": {"size_t *"},
    "USER_DATA": {"void *"},
    "VOID": {"void"},
}
RETURN_TYPES = {"VOID", "I32", "U32", "I64", "U64", "SIZE", "CSTR", "CHARS", "OPAQUE"}
HANDLE_TYPES = {"HANDLE", "RELEASE", "OUT_HANDLE"}


def slot_problems(where, slot, header, is_return):
    """Problems of one R(...) or P(...) against the vocabulary."""
    t, k, c = slot["type"], slot["kind"], slot["ctype"]
    out = []
    if t not in header.types:
        return [f"{where}: {t} is not an enum shmipc_abi_type value"]
    if is_return and t not in RETURN_TYPES:
        out.append(f"{where}: {t} is not a return type ({', '.join(sorted(RETURN_TYPES))})")
    if not is_return and t in ("VOID", "CHARS"):
        out.append(f"{where}: {t} describes return values only")
    if k != "NONE" and k not in header.kinds:
        return out + [f"{where}: kind {k} is not in SHMIPC_ABI_KIND_MAP"]
    handle_kinds = {n: ct for n, (v, ct) in header.kinds.items() if v < 100}
    callback_kinds = {n: ct for n, (v, ct) in header.kinds.items() if v > 100}
    if t in HANDLE_TYPES:
        if k not in handle_kinds:
            return out + [f"{where}: {t} needs a handle kind, not {k}"]
        obj = handle_kinds[k]
        allowed = ({f"{obj} *", f"const {obj} *"} if t == "HANDLE" else
                   {f"{obj} *"} if t == "RELEASE" else {f"{obj} **"})
    elif t == "CALLBACK":
        if k not in callback_kinds:
            return out + [f"{where}: CALLBACK needs a callback kind, not {k}"]
        allowed = {callback_kinds[k]}
    else:
        if k != "NONE":
            out.append(f"{where}: {t} takes kind NONE, not {k}")
        allowed = SCALAR.get(t)
    if allowed is not None and c not in allowed:
        out.append(f"{where}: {t} describes {' or '.join(sorted(allowed))}, not {c}")
    return out


def shape_problems(where, row):
    """Pairs and links between parameters."""
    out = []
    types = [p["type"] for p in row.params]
    for i, t in enumerate(types):
        prev = types[i - 1] if i > 0 else None
        nxt = types[i + 1] if i + 1 < len(types) else None
        if t == "BYTES_IN" and nxt != "BYTES_LEN":
            out.append(f"{where}: BYTES_IN {row.params[i]['name']} is not followed by BYTES_LEN")
        if t == "BYTES_LEN" and prev != "BYTES_IN":
            out.append(f"{where}: BYTES_LEN {row.params[i]['name']} follows no BYTES_IN")
        if t in ("OUT_CPTR", "OUT_CHARS") and nxt != "OUT_LEN":
            out.append(f"{where}: {t} {row.params[i]['name']} is not followed by OUT_LEN")
        if t in ("OUT_CPTR_N", "OUT_WPTR_N") and prev != "SIZE":
            out.append(f"{where}: {t} {row.params[i]['name']} does not follow its SIZE")
    unpaired = [i for i, t in enumerate(types)
                if t == "OUT_LEN" and (i == 0 or types[i - 1] not in ("OUT_CPTR", "OUT_CHARS"))]
    if row.ret["type"] == "CHARS" and len(unpaired) != 1:
        out.append(f"{where}: a CHARS return needs exactly one OUT_LEN of its own")
    if row.ret["type"] != "CHARS" and unpaired:
        out.append(f"{where}: OUT_LEN {row.params[unpaired[0]]['name']} pairs with nothing")
    return out


def flag_problems(where, row, header):
    flags = [f.strip() for f in row.flags.split("|")]
    out = [f"{where}: unknown flag {f}" for f in flags if f != "0" and f not in header.flags]
    opaque = row.ret["type"] == "OPAQUE" or any(p["type"] == "OPAQUE" for p in row.params)
    if opaque == ("GENERIC" in flags):
        out.append(f"{where}: GENERIC must be set exactly when no type is OPAQUE")
    return out


def signature_problems(where, row, decl):
    ret, params = decl
    out = []
    if row.ret["ctype"] != ret:
        out.append(f"{where}: returns {row.ret['ctype']} in the table, {ret} in shmipc.h")
    if len(row.params) != len(params):
        out.append(f"{where}: {len(row.params)} parameters in the table, {len(params)} in shmipc.h")
        return out
    for i, (p, (ctype, name)) in enumerate(zip(row.params, params)):
        if p["ctype"] != ctype:
            out.append(f"{where}: parameter {i + 1} is {p['ctype']} in the table, {ctype} in "
                       "shmipc.h")
        if p["name"] != name:
            out.append(f"{where}: parameter {i + 1} is named {p['name']} in the table, {name} "
                       "in shmipc.h")
    return out


# ---------------------------------------------------------------------------------------------
# Drafts of missing rows


def guess_type(ctype, header, name, params, i, is_return):
    handles = {ct: n for n, (v, ct) in header.kinds.items() if v < 100}
    callbacks = {ct: n for n, (v, ct) in header.kinds.items() if v > 100}
    base = ctype.replace("const ", "").rstrip(" *")
    stars = ctype.count("*")
    if ctype in callbacks:
        return "CALLBACK", callbacks[ctype]
    if base in handles and stars == 1:
        releases = is_release(name) and i == len(params) - 1 and not ctype.startswith("const")
        return ("RELEASE" if releases else "HANDLE"), handles[base]
    if base in handles and stars == 2:
        return "OUT_HANDLE", handles[base]
    nxt = params[i + 1][0] if params and i + 1 < len(params) else None
    prev = params[i - 1][0] if params and i > 0 else None
    if is_return and ctype == "const char *":
        return ("CHARS" if any(p[0] == "size_t *" for p in params) else "CSTR"), "NONE"
    if ctype == "const void **":
        return ("OUT_CPTR" if nxt == "size_t *" else "OUT_CPTR_N"), "NONE"
    if ctype == "size_t" and prev == "const void *":
        return "BYTES_LEN", "NONE"
    if ctype == "size_t *":
        paired = prev in ("const void **", "const char **")
        returns_chars = header.functions.get(name, ("",))[0] == "const char *"
        return ("OUT_LEN" if paired or returns_chars else "OUT_SIZE"), "NONE"
    for t in ("I32", "U32", "I64", "U64", "SIZE", "CSTR", "BYTES_IN", "OUT_WPTR_N", "OUT_CHARS",
              "OUT_I32", "OUT_U32", "OUT_I64", "OUT_U64", "USER_DATA", "VOID"):
        if ctype in SCALAR[t]:
            return t, "NONE"
    return "OPAQUE", "NONE"


def is_release(name):
    return re.search(r"_(free|close)$", name) is not None


def draft_row(name, decl, header):
    ret, params = decl
    rt, rk = guess_type(ret, header, name, params, -1, True)
    ps = []
    for i, (ctype, pname) in enumerate(params):
        t, k = guess_type(ctype, header, name, params, i, False)
        ps.append(f"P({t}, {k}, {ctype}, {pname})")
    opaque = rt == "OPAQUE" or any(p.startswith("P(OPAQUE") for p in ps)
    flags = "0" if opaque else "GENERIC"
    return wrap(f"FN{'0' if not ps else ''}({name}, {flags}", f"R({rt}, {rk}, {ret})", ps)


def draft_callback(kind, name, decl, header):
    ret, params = decl
    rt, rk = guess_type(ret, header, name, params, -1, True)
    ps = [f"P({t}, {k}, {ctype}, {pname})" for (ctype, pname), (t, k) in
          zip(params, [guess_type(c, header, name, params, i, False)
                       for i, (c, _) in enumerate(params)])]
    return wrap(f"CB({kind}, {name}", f"R({rt}, {rk}, {ret})", ps)


def wrap(head, ret, params, width=100):
    """A row as abi.def writes it: continuation lines indented by four, at most `width`."""
    lines, line = [], head
    for part in [ret] + params:
        if len(line) + 2 + len(part) + 1 <= width:
            line += ", " + part
        else:
            lines.append(line + ",")
            line = "    " + part
    return "\n".join(lines + [line + ")"])


# ---------------------------------------------------------------------------------------------
# The version script and the built library


def parse_map(path=MAP):
    """Returns ([(node, [names])], problems)."""
    text = strip_comments(open(path).read())
    nodes, problems = [], []
    for m in re.finditer(r"(\w+(?:\.\w+)*)\s*\{(.*?)\}\s*([\w.]*)\s*;", text, re.S):
        body = m.group(2)
        glob = re.search(r"global:(.*?)(?:local:|$)", body, re.S)
        names = re.findall(r"(\w+)\s*;", glob.group(1)) if glob else []
        nodes.append((m.group(1), names))
        if not re.match(r"^SHMIPC_\d+\.\d+$", m.group(1)):
            problems.append(f"libshmipc.map: node {m.group(1)} is not named SHMIPC_<major>.<minor>")
    if nodes and "local:" not in text:
        problems.append("libshmipc.map: no 'local: *;' hides the other symbols")
    return nodes, problems


def library_path(build):
    return os.path.join(build, "bindings", "libshmipc.so")


def exported_symbols(lib):
    """{name: version} of the defined dynamic symbols, without the version definitions."""
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] == "A":
            continue
        name, _, version = parts[2].partition("@@")
        syms[name.split("@")[0]] = (version or None, parts[1])
    return syms


def soname(lib):
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[(.*?)\]", out)
    return m.group(1) if m else None


# ---------------------------------------------------------------------------------------------


def main(argv):
    build = os.path.join(ROOT, "build")
    if "--build" in argv:
        build = os.path.abspath(argv[argv.index("--build") + 1])
    header = Header()
    fns, cbs, problems = parse_table()
    rows = {}
    for r in fns:
        if r.name in rows:
            problems.append(f"abi.def:{r.line}: {r.name} has two rows")
        rows[r.name] = r

    if "--draft" in argv:
        for name in header.order:
            if name not in rows:
                print(draft_row(name, header.functions[name], header))
        return 0

    missing = [n for n in header.order if n not in rows]
    for name in missing:
        draft = draft_row(name, header.functions[name], header).replace("\n", "\n    ")
        problems.append(f"{name} is declared in shmipc.h but has no row in bindings/abi.def; "
                        f"draft:\n    {draft}")
    for r in fns:
        where = f"abi.def:{r.line}: {r.name}"
        if r.name not in header.functions:
            problems.append(f"{where}: no SHMIPC_API declaration in shmipc.h")
            continue
        problems += signature_problems(where, r, header.functions[r.name])
        problems += slot_problems(where + " return", r.ret, header, True)
        for i, p in enumerate(r.params):
            problems += slot_problems(f"{where} parameter {p['name'] or i + 1}", p, header, False)
        problems += shape_problems(where, r)
        problems += flag_problems(where, r, header)

    cb_kinds = {n: ct for n, (v, ct) in header.kinds.items() if v > 100}
    cb_rows = {r.kind: r for r in cbs}
    for kind, ctype in sorted(cb_kinds.items()):
        if kind not in cb_rows:
            draft = (draft_callback(kind, ctype, header.callbacks[ctype], header)
                     if ctype in header.callbacks else f"(no typedef {ctype} in shmipc.h)")
            problems.append(f"callback kind {kind} ({ctype}) has no CB row in bindings/abi.def; "
                            f"draft:\n    " + draft.replace("\n", "\n    "))
    for r in cbs:
        where = f"abi.def:{r.line}: callback {r.name}"
        if cb_kinds.get(r.kind) != r.name:
            problems.append(f"{where}: SHMIPC_ABI_KIND_MAP gives kind {r.kind} the type "
                            f"{cb_kinds.get(r.kind)}")
        if r.name not in header.callbacks:
            problems.append(f"{where}: no such function-pointer typedef in shmipc.h")
            continue
        problems += signature_problems(where, r, header.callbacks[r.name])
        problems += slot_problems(where + " return", r.ret, header, True)
        for p in r.params:
            problems += slot_problems(f"{where} parameter {p['name']}", p, header, False)
        problems += shape_problems(where, r)
        if any(p["type"] == "OPAQUE" for p in [r.ret] + r.params):
            problems.append(f"{where}: a callback type cannot be OPAQUE: closures are built "
                            "from it")

    nodes, map_problems = parse_map()
    problems += map_problems
    in_map = {}
    for node, names in nodes:
        for n in names:
            if n in in_map:
                problems.append(f"libshmipc.map: {n} is listed in {in_map[n]} and in {node}")
            in_map[n] = node
    for n in sorted(set(rows) - set(in_map)):
        problems.append(f"{n} has a table row but is not in libshmipc.map")
    for n in sorted(set(in_map) - set(rows)):
        problems.append(f"libshmipc.map lists {n}, which has no table row")

    lib = library_path(build)
    nsyms = 0
    if not os.path.exists(lib):
        problems.append(f"{lib} does not exist: build first (ninja -C {os.path.relpath(build)})")
    else:
        syms = exported_symbols(lib)
        nsyms = len(syms)
        for n in sorted(set(rows) - set(syms)):
            problems.append(f"{n} has a table row but libshmipc.so does not export it "
                            "(missing SHMIPC_API on the definition, or a stale build?)")
        for n in sorted(set(syms) - set(rows)):
            problems.append(f"libshmipc.so exports {n}, which has no table row")
        for n, (version, kind) in sorted(syms.items()):
            if n in in_map and version != in_map[n]:
                problems.append(f"libshmipc.so exports {n} as version {version}, the map says "
                                f"{in_map[n]}")
            if kind not in ("T", "W", "i"):
                problems.append(f"libshmipc.so exports {n} of nm type {kind}: not a function")
        so = soname(lib)
        if so != SONAME:
            problems.append(f"libshmipc.so has SONAME {so}, not {SONAME}")

    for p in problems:
        print("check-abi-table:", p, file=sys.stderr)
    if problems:
        print(f"check-abi-table: {len(problems)} problems; `scripts/check-abi-table.py --draft` "
              "prints rows for the functions the table lacks", file=sys.stderr)
        return 1
    print(f"abi-table: {len(rows)} functions and {len(cbs)} callback types agree with shmipc.h, "
          f"shmipc_abi.h and shmipc_serve.h, libshmipc.map ({len(nodes)} nodes) and the {nsyms} exported symbols; SONAME {SONAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
