#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target into OUT/<target>/, from the wire vectors
(tests/vectors), the HTTP fixtures (tests/http), the WebSocket fixtures (tests/ws), and
shmipc-serve's config file and command lines (docs/serve.md, tests/c/test_serve_options.c),
plus a few hand-made messages. The committed corpora (fuzz/corpus/<target>/) are these seeds and what
the fuzzer found, minimized with -merge=1 (scripts/fuzz.sh merge).

Usage: fuzz/make_seeds.py OUT
"""
import glob
import hashlib
import json
import os
import re
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def header(length, version, type_):
    return struct.pack(">IHBB", length, 0x7758, version, type_)


def simple(version, type_):
    return header(8, version, type_)


def share(version, type_, queue, buffer):
    q, b = queue.encode(), buffer.encode()
    body = struct.pack(">H", len(q)) + q + struct.pack(">H", len(b)) + b
    return header(8 + len(body), version, type_) + body


def negotiation(text):
    body = text.encode()
    return header(8 + len(body), 0, 10) + body


REQUEST = ('{"supports_protocols":[4],"sdk_name":"shmipc-go","sdk_version":"v0.3",'
           '"supports_features":[%s],"settings":{%s}}')
RESPONSE = ('{"selected_protocol":%d,"sdk_name":"shmipc-c","sdk_version":"0.1.0",'
            '"selected_features":[%s],"settings":{%s}%s}')
POLL = '"event_queue_polling":{"polling_interval_us":100}'


def vector_messages():
    """Every captured socket message of tests/vectors, in order, per file and direction."""
    out = []

    def walk(node, acc):
        if isinstance(node, dict):
            if isinstance(node.get("hex"), str) and node.get("kind", "message") == "message":
                try:
                    acc.append((node.get("direction", ""), bytes.fromhex(node["hex"])))
                except ValueError:
                    pass
            for v in node.values():
                walk(v, acc)
        elif isinstance(node, list):
            for v in node:
                walk(v, acc)

    for path in sorted(glob.glob(os.path.join(ROOT, "tests/vectors/*.json"))):
        acc = []
        walk(json.load(open(path)), acc)
        out.append(acc)
    return out


def unescape(text):
    """The escapes of tests/http/README.md."""
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        e = text[i + 1]
        if e in "rnt0":
            out += {"r": b"\r", "n": b"\n", "t": b"\t", "0": b"\0"}[e]
            i += 2
        elif e == "x":
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        elif e == "*":
            m = re.match(r"\\\*(\d+)\{", text[i:])
            depth, j = 1, i + len(m.group(0))
            k = j
            while depth:
                if text[k] == "\\":
                    k += 2
                    continue
                depth += {"{": 1, "}": -1}.get(text[k], 0)
                k += 1
            out += unescape(text[j:k - 1]) * min(int(m.group(1)), 64)
            i = k
        else:
            out += e.encode()
            i += 2
    return bytes(out)


def sections(path):
    cur, out = None, {}
    for line in open(path, encoding="utf-8").read().split("\n"):
        if line.startswith("=== "):
            cur = line[4:].strip()
            out.setdefault(cur, []).append([])
        elif cur is not None:
            out[cur][-1].append(line)
    return out


def ws_frame(line):
    """One frame line of tests/ws/README.md, as the client sends it (masked)."""
    line = line.strip()
    reps = 1
    m = re.match(r"\*(\d+)\s+(.*)", line)
    if m:
        reps, line = min(int(m.group(1)), 8), m.group(2)
    if line.startswith("raw "):
        return bytes.fromhex(line[4:].replace(" ", "")) * reps
    ops = {"cont": 0, "text": 1, "binary": 2, "close": 8, "ping": 9, "pong": 10}
    parts = re.findall(r'"(?:[^"\\]|\\.)*"|\S+', line)
    word = parts[0]
    opcode = ops[word] if word in ops else int(word[2:])
    fin, rsv, mask, form, declared, payload = 1, 0, bytes.fromhex("37fa213d"), 0, None, b""
    for p in parts[1:]:
        if p == "more":
            fin = 0
        elif p.startswith("rsv="):
            rsv = int(p[4:])
        elif p.startswith("mask="):
            mask = bytes.fromhex(p[5:])
        elif p == "nomask":
            mask = None
        elif p in ("len16", "len64"):
            form = 16 if p == "len16" else 64
        elif p.startswith("len="):
            declared = int(p[4:])
        elif p.startswith("code="):
            payload += struct.pack(">H", int(p[5:]))
        elif p.startswith("hex:"):
            payload += bytes.fromhex(p[4:])
        elif p.startswith('"'):
            payload += unescape(p[1:-1].replace('\\"', '"'))
    payload = payload[:4096]
    n = len(payload) if declared is None else declared
    head = bytes([(fin << 7) | (rsv << 4) | opcode])
    mbit = 0x80 if mask else 0
    if form == 64 or n > 0xFFFF:
        head += bytes([mbit | 127]) + struct.pack(">Q", n)
    elif form == 16 or n > 125:
        head += bytes([mbit | 126]) + struct.pack(">H", n)
    else:
        head += bytes([mbit | n])
    if mask:
        head += mask
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return (head + payload) * reps


def sf(type_, payload=b"", arg=0):
    """A shmipc-serve frame (docs/serve.md): magic "SV", version 1, type, length, arg."""
    return b"SV" + struct.pack("<BBII", 1, type_, len(payload), arg) + payload


def sf_fields(fields):
    return b"".join(struct.pack("<HH", len(n), len(v)) + n + v for n, v in fields)


def sf_addr(family, port, addr):
    return struct.pack("<BBH", family, 0, port) + addr.ljust(16, b"\0")


def sf_request(method, target, fields, flags=1, minor=1, clen=0):
    fixed = struct.pack("<BBBBHHHHQ", 1, minor, 0, 0, len(method), len(target), len(fields), 0,
                        clen)
    fixed += sf_addr(1, 40000, bytes([127, 0, 0, 1])) + sf_addr(2, 8080, bytes(15) + b"\1")
    return sf(1, fixed + method + target + sf_fields(fields), flags)


def sf_response(status, fields, flags=0, clen=0):
    return sf(4, struct.pack("<HHIQ", status, len(fields), 0, clen) + sf_fields(fields), flags)


C_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "0": "\0", "\\": "\\", '"': '"'}


def c_strings(text):
    """The adjacent C string literals of `text`, joined and unescaped (\\n, \\xHH, ...)."""
    out = ""
    for lit in re.findall(r'"((?:[^"\\\n]|\\.)*)"', text):
        lit = re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), lit)
        out += re.sub(r"\\(.)", lambda m: C_ESCAPES.get(m.group(1), m.group(1)), lit)
    return out


def serve_options_seeds():
    """shmipc-serve's options (fuzz/serve_options_fuzz.c): mode 0 a config file, mode 1
    arguments split at NUL bytes, mode 2 (3) a 2-byte length, a file, then arguments (with
    --config FILE before them, or after them)."""
    doc = open(os.path.join(ROOT, "docs/serve.md"), encoding="utf-8").read()
    test = open(os.path.join(ROOT, "tests/c/test_serve_options.c"), encoding="utf-8").read()
    files = [m.group(1).encode() for m in re.finditer(r"```\n(# /etc/shmipc-serve/.*?)```",
                                                       doc, re.S)]
    # The test's files: write_text("name", "..." "...") and FILE_ERR("...", ...).
    for m in re.finditer(r'write_text\("[^"]*",\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\)', test):
        files.append(c_strings(m.group(1)).encode("latin-1"))
    for m in re.finditer(r'FILE_ERR\(("(?:[^"\\]|\\.)*")', test):
        files.append(c_strings(m.group(1)).encode("latin-1"))
    # The command lines: the test's ARGS(...) (a variable, a path, becomes --config's file) and
    # the examples at the top of docs/serve.md.
    argvs = []
    for m in re.finditer(r"ARGS\(((?:[^()]|\([^()]*\))*)\)", test):
        args, depth, quoted, cur = [], 0, False, ""
        for i, c in enumerate(m.group(1) + ","):
            if c == '"' and (i == 0 or m.group(1)[i - 1] != "\\"):
                quoted = not quoted
            elif not quoted and c in "()":
                depth += 1 if c == "(" else -1
            elif not quoted and depth == 0 and c == ",":
                cur = cur.strip()
                args.append(c_strings(cur) if cur.startswith('"') else "file")
                cur = ""
                continue
            cur += c
        argvs.append(args)
    for m in re.finditer(r"^shmipc-serve ([^`#\n]*)", doc, re.M):
        argvs.append(m.group(1).split())
    seeds = [b"\0" + f for f in files]
    seeds += [b"\1" + "\0".join(a).encode("latin-1") for a in argvs]
    for f, a in ((files[0], ["--workers", "8", "other:app"]), (files[0], ["--asgi"]),
                 (b"lua = h.lua\n", ["--config=file", "m:a"]),
                 (b"app = m:a\nasgi = true\n", ["--lua", "x.lua", "--", "-m:a"])):
        for mode in (2, 3):
            seeds.append(bytes([mode]) + struct.pack(">H", len(f)) + f + "\0".join(a).encode())
    return seeds


def main():
    out = sys.argv[1]
    seeds = {t: [] for t in ("proto", "handshake", "json", "shm", "http", "ws", "serve_frame",
                             "serve_options")}

    # proto: captured messages one by one and as whole streams, plus every type made here.
    for acc in vector_messages():
        for _, msg in acc:
            seeds["proto"].append(b"\0" + msg)
        for d in ("c2s", "s2c"):
            stream = b"".join(m for dd, m in acc if dd == d)
            if stream:
                seeds["proto"].append(b"\0" + stream[:4096])
    made = [simple(3, t) for t in (1, 4, 6, 7)] + [
        header(12, 3, 2) + struct.pack(">I", 7),
        header(21, 3, 3) + struct.pack(">II", 5, 1) + b"hello",
        header(16, 3, 8) + struct.pack(">Q", 42),
        header(16, 3, 9) + struct.pack(">Q", 42),
        share(2, 0, "/dev/shm/q", "/dev/shm/b"),
        share(3, 5, "/dev/shm/q", "/dev/shm/b"),
    ]
    seeds["proto"] += [b"\0" + m for m in made]
    seeds["proto"].append(b"\1" + negotiation(REQUEST % ('"eventfd_wakeup"', "")))
    seeds["proto"].append(b"\1" + simple(0, 7) + share(0, 5, "q", "b"))

    # handshake: the server's and the client's side of V2, V3 and V4.
    def hs(mode, data, at=0):
        return bytes([mode]) + struct.pack(">H", at) + data

    v2 = share(2, 0, "/dev/shm/fz_q", "/dev/shm/fz_b")
    seeds["handshake"].append(hs(0x00, v2))
    v3 = simple(3, 4) + share(3, 5, "/dev/shm/q", "/dev/shm/b")
    seeds["handshake"].append(hs(0x10, v3, len(v3)))
    seeds["handshake"].append(hs(0x50, v3, len(v3)))  # a 1-byte memfd
    seeds["handshake"].append(hs(0x70, v3, len(v3)))  # pipes
    for feats, settings, mode in (("", "", 0x32), ('"eventfd_wakeup"', "", 0xB2),
                                  ('"event_queue_polling"', POLL, 0x32)):
        v4 = negotiation(REQUEST % (feats, settings)) + share(0, 5, "/dev/shm/q", "/dev/shm/b")
        seeds["handshake"].append(hs(mode, v4, len(v4)))
    seeds["handshake"].append(hs(0x02, negotiation(REQUEST % ("", "")) + share(0, 0, "/dev/shm/fz_q", "/dev/shm/fz_b")))
    seeds["handshake"].append(hs(0x01, simple(3, 4) + simple(3, 7) + simple(3, 6)))
    seeds["handshake"].append(hs(0x01, simple(2, 4)))
    for feats, settings, mode in (("", "", 0x03), ('"eventfd_wakeup"', "", 0x07),
                                  ('"event_queue_polling"', POLL, 0x0B)):
        resp = negotiation(RESPONSE % (4, feats, settings, ""))
        seeds["handshake"].append(hs(mode, resp + simple(0, 7) + simple(0, 6)))
    seeds["handshake"].append(hs(0x03, negotiation(RESPONSE % (
        0, "", "", ',"error":{"code":"VERSION_NOT_SUPPORTED","message":"no"}'))))

    # json: requests and responses.
    for feats, settings in (("", ""), ('"eventfd_wakeup"', ""), ('"event_queue_polling"', POLL),
                            ('"eventfd_wakeup","event_queue_polling","x"', POLL)):
        for offered in (0, 6):
            seeds["json"].append(bytes([offered]) + (REQUEST % (feats, settings)).encode())
        seeds["json"].append(b"\1" + (RESPONSE % (4, feats, settings, "")).encode())
    seeds["json"].append(b"\1" + (RESPONSE % (0, "", "", ',"error":{"code":"E","message":"a\\nb\\u00e9"}')).encode())
    seeds["json"].append(b"\0" + b'{"a":[1,-2.5e3,true,false,null,"\\u0041\\t"],"b":{"c":{}}}')

    # shm: the laid-out buffer and queue with a few operation sequences, and raw memory.
    seeds["shm"] += [bytes([m]) + bytes(ops) for m in (0, 2, 4, 6) for ops in (
        [2, 0, 10, 2, 0, 100, 10, 0, 1, 0, 0, 0, 4, 6, 0, 0, 0, 7, 8],
        [9, 0, 4, 0, 4, 5, 0, 0, 0, 0, 3, 3, 0, 13, 12, 0, 8],
        [1, 0, 1, 0, 0, 0, 3, 1, 0, 7, 0, 0, 0, 52, 7],
    )]
    layout = bytearray(256)
    struct.pack_into("<HHI", layout, 0, 1, 0, 248)
    struct.pack_into("<iIIII", layout, 8, 3, 3, 0, 104, 32)
    for k in range(3):
        struct.pack_into("<IIIII", layout, 44 + 52 * k, 32, 0, 0, 52 * (k + 1) if k < 2 else 0,
                         1 if k < 2 else 0)
    queue = bytearray(2 * (24 + 12 * 16))
    struct.pack_into("<I", queue, 0, 16)
    struct.pack_into("<I", queue, len(queue) // 2, 16)
    seeds["shm"].append(b"\1" + struct.pack(">HH", len(layout), len(queue)) + bytes(layout)
                        + bytes(queue) + bytes([2, 0, 0, 7, 8]))

    # http: each fixture's request bytes, with the default and the small limits.
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/http/*.http"))):
        req = b"".join(unescape("".join(s)) for s in sections(path).get("request", []))[:8192]
        # Split in the middle: bits 2-7 of the mode byte are the split's high part.
        half = len(req) // 2
        for mode in (0, 1):
            seeds["http"].append(bytes([mode | (half >> 8) << 2, half & 255]) + req)

    # ws: each fixture's frames, and its upgrade request (mode bit 2).
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/ws/*.ws"))):
        sec = sections(path)
        frames = b""
        for block in sec.get("in", []):
            for line in block:
                if line.strip() and not line.startswith("#"):
                    try:
                        frames += ws_frame(line)
                    except (ValueError, KeyError, IndexError):
                        pass
        frames = frames[:16384]
        if frames:
            seeds["ws"].append(bytes([0]) + struct.pack(">H", len(frames) // 2) + frames)
        for block in sec.get("request", []):
            seeds["ws"].append(bytes([4, 0, 0]) + unescape("".join(block)))

    # serve_frame: whole exchanges as a front and a worker send them.
    host = [(b"Host", b"example.com"), (b"Accept", b"*/*")]
    seeds["serve_frame"] += [
        sf_request(b"GET", b"/", host) + sf(3),
        sf_request(b"POST", b"/upload?x=1", host + [(b"Content-Length", b"5")], 0x15, clen=5)
        + sf(2, b"hello") + sf(3),
        sf_request(b"PUT", b"/c", host, 0x0D, 0) + sf(2, b"ab") + sf(2, b"cd") + sf(3),
        sf_request(b"GET", b"/ws", host + [(b"Upgrade", b"websocket")], 0x03)
        + sf(6, b"hi", 0x101) + sf(6, b"\0\1", 2) + sf(6, b"", 0x100) + sf(7, b"p") + sf(8)
        + sf(9, struct.pack("<H", 1000) + b"bye"),
        sf_response(200, [(b"Content-Type", b"text/plain")], 1, 5) + sf(2, b"hello") + sf(3),
        sf_response(101, [(b"Upgrade", b"websocket")]) + sf(6, b"x", 0x101) + sf(9),
        sf_response(100, []) + sf_response(204, [(b"Set-Cookie", b"a=1")], 2),
        sf_request(b"GET", b"/", host) + sf(5, b"client went away", 1),
        sf_response(500, []) + sf(5, b"Traceback", 2),
    ]

    seeds["serve_options"] += serve_options_seeds()

    for target, items in seeds.items():
        d = os.path.join(out, target)
        os.makedirs(d, exist_ok=True)
        for data in items:
            name = hashlib.sha1(data).hexdigest()
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{target}: {len(items)} seeds")


if __name__ == "__main__":
    main()
