#!/usr/bin/env python3
"""Turns the golden shared-memory vectors (tests/vectors/*.json) into a C header of fixture
structs for the cmocka tests, so that the JSON stays the single source of truth.

Usage: gen_vectors.py OUTPUT.h VECTOR.json...

Only the shared-memory parts are emitted: buffer and queue layouts, and the element, queue
header, chain, list header and slice header states of the exchanges. Before emitting, every
raw_hex is checked against the decoded fields beside it, and the echo payload pattern against
the recorded SHA-256, so a misread vector fails the build instead of a test.
"""
import hashlib
import json
import os
import struct
import sys

MAX_CLASSES = 4
MAX_CHAIN = 4
MAX_TRACKED = 8


class VectorError(Exception):
    pass


def need(cond, what):
    if not cond:
        raise VectorError(what)


def raw(obj, n, where):
    b = bytes.fromhex(obj["raw_hex"])
    need(len(b) == n, f"{where}: raw_hex has {len(b)} bytes, expected {n}")
    return b


def c_bytes(b):
    return "{" + ", ".join(f"0x{x:02x}" for x in b) + "}"


def parse_classes(text):
    out = []
    for part in text.split(","):
        size, percent = part.split(":")
        out.append((int(size), int(percent)))
    need(len(out) <= MAX_CLASSES, f"more than {MAX_CLASSES} slice classes")
    return out


def check_slice(s, where):
    b = raw(s, 20, where)
    need(struct.unpack("<5I", b) == (s["cap"], s["size"], s["start"], s["next"], s["flags"]),
         f"{where}: raw_hex disagrees with the fields")
    return b


def check_list_header(l, where):
    b = raw(l, 36, where)
    fields = struct.unpack("<iIIIIii", b[:28])
    need(fields == (l["size"], l["cap"], l["head"], l["tail"], l["capPerBuffer"],
                    l["counter_at_20"], l["counter_at_24"]),
         f"{where}: raw_hex disagrees with the fields")
    need(b[28:].hex() == l["bytes_28_35_hex"], f"{where}: bytes 28..35 disagree")
    need(l["region_offset"] == l["offset"] + 36, f"{where}: region_offset is not offset + 36")
    return b


def check_qheader(q, where):
    b = raw(q, 24, where)
    # x86-64 layout: cap u32 @0, head i64 @4, tail i64 @12, workingFlag u32 @20.
    need(struct.unpack("<IqqI", b) == (q["cap"], q["head"], q["tail"], q["workingFlag"]),
         f"{where}: raw_hex disagrees with the fields")
    return b


def check_elem(e, cap, base, where):
    b = raw(e, 12, where)
    need(struct.unpack("<3I", b) == (e["seqId"], e["offsetInShmBuf"], e["status"]),
         f"{where}: raw_hex disagrees with the fields")
    need(e["file_offset"] == base + 24 + 12 * (e["index"] % cap), f"{where}: file_offset")
    return b


class Out:
    def __init__(self):
        self.pre = []  # arrays referenced by pointer from the fixtures
        self.body = []
        self.n = 0

    def array(self, b):
        self.n += 1
        name = f"shmv_data_{self.n}"
        self.pre.append(f"static const uint8_t {name}[{len(b)}] SHMV_UNUSED = {c_bytes(b)};")
        return name


def slice_init(out, s, where, chain=False):
    b = check_slice(s, where)
    fields = [f".offset = {s['offset']}", f".raw = {c_bytes(b)}"]
    if chain:
        head = bytes.fromhex(s["data_head_hex"])
        tail = bytes.fromhex(s["data_tail_hex"])
        need(s["data_len"] == s["size"], f"{where}: data_len is not size")
        need(s["relative_offset_in_list_region"] >= 0, f"{where}: relative offset")
        fields += [f".list_index = {s['list_index']}", f".data_len = {s['data_len']}",
                   f".head_len = {len(head)}", f".data_head = {c_bytes(head)}",
                   f".tail_len = {len(tail)}", f".data_tail = {c_bytes(tail)}"]
        if "data_hex" in s:
            data = bytes.fromhex(s["data_hex"])
            need(len(data) == s["data_len"], f"{where}: data_hex length")
            need(data.startswith(head) and data.endswith(tail), f"{where}: data head/tail")
            need(hashlib.sha256(data).hexdigest() == s["data_sha256"], f"{where}: data sha256")
            fields += [f".full_len = {len(data)}", f".data = {out.array(data)}"]
    else:
        fields.append(".list_index = -1")
    return "{" + ", ".join(fields) + "}"


def qheader_init(q, where):
    b = check_qheader(q, where)
    return f"{{.base = {q['base']}, .raw = {c_bytes(b)}}}"


def elem_init(e, cap, base, where):
    b = check_elem(e, cap, base, where)
    return (f"{{.index = {e['index']}, .file_offset = {e['file_offset']}, .seq_id = {e['seqId']}, "
            f".offset = {e['offsetInShmBuf']}, .status = {e['status']}, .raw = {c_bytes(b)}}}")


def classes_init(classes):
    items = ", ".join(f"{{{s}, {p}}}" for s, p in classes)
    return f".nclasses = {len(classes)}, .classes = {{{items}}}"


def layout_init(out, name, buffer_cap, classes, buf, queue_cap, queue_file_size, halves):
    hdr = buf["header"]
    hb = bytes.fromhex(hdr["raw_hex"])
    need(struct.unpack("<HHI", hb) == (hdr["listNum"], hdr["reserved"], hdr["usedLen"]),
         f"{name}: buffer header raw_hex")
    lists = []
    for i, l in enumerate(buf["lists"]):
        where = f"{name}.lists[{i}]"
        lb = check_list_header(l, where)
        need(l["slice_stride"] == l["capPerBuffer"] + 20, f"{where}: stride")
        need(l.get("slices_not_matching_initial_formula", 0) == 0, f"{where}: odd slices")
        firsts = [slice_init(out, s, f"{where}.first[{k}]") for k, s in enumerate(l["first_slices"])]
        lists.append(
            f"{{.offset = {l['offset']}, .cap = {l['cap']}, .slice_size = {l['capPerBuffer']}, "
            f".stride = {l['slice_stride']}, .region_offset = {l['region_offset']}, "
            f".raw = {c_bytes(lb)}, .nfirst = {len(firsts)}, .first = {{{', '.join(firsts)}}}, "
            f".last = {slice_init(out, l['last_slice'], where + '.last')}}}")
    need(len(lists) <= MAX_CLASSES, f"{name}: too many lists")
    qh = [qheader_init(h, f"{name}.queue[{i}]") for i, h in enumerate(halves)]
    return (f"{{.name = \"{name}\", .buffer_cap = {buffer_cap}, {classes_init(classes)}, "
            f".header_raw = {c_bytes(hb)}, .nlists = {len(lists)}, .lists = {{{', '.join(lists)}}}, "
            f".end_of_last_list = {hdr['usedLen'] + 8}, .queue_cap = {queue_cap}, "
            f".queue_file_size = {queue_file_size}, .halves = {{{', '.join(qh)}}}}}")


def stream_bytes(payload_len):
    return struct.pack(">I", payload_len) + bytes((i * 7) & 0xFF for i in range(payload_len))


def stage_init(out, name, st, cap, base, lists_key, tracked):
    where = f"{name}.{lists_key}"
    chain = [slice_init(out, s, f"{name}.chain[{i}]", chain=True) for i, s in enumerate(st["chain"])]
    need(len(chain) <= MAX_CHAIN, f"{name}: chain too long")
    parts = [f".elem = {elem_init(st['element'], cap, base, name + '.element')}",
             f".after_put = {qheader_init(st['queue_header_after_put_before_consumer'], name + '.after_put')}",
             f".after_drained = {qheader_init(st['queue_header_after_consumer_drained'], name + '.after_drained')}",
             f".nchain = {len(chain)}, .chain = {{{', '.join(chain)}}}"]
    lists = []
    for i, l in enumerate(st[lists_key]):
        b = check_list_header(l, f"{where}[{i}]")
        lists.append(f"{{.offset = {l['offset']}, .raw = {c_bytes(b)}}}")
    parts.append(f".nlists = {len(lists)}, .lists = {{{', '.join(lists)}}}")
    if tracked is not None:
        t = [slice_init(out, s, f"{name}.tracked[{i}]") for i, s in enumerate(tracked)]
        need(len(t) <= MAX_TRACKED, f"{name}: too many tracked slices")
        parts.append(f".ntracked = {len(t)}, .tracked = {{{', '.join(t)}}}")
    return "{" + ", ".join(parts) + "}"


def list_array(lists, where):
    items = []
    for i, l in enumerate(lists):
        b = check_list_header(l, f"{where}[{i}]")
        items.append(f"{{.offset = {l['offset']}, .raw = {c_bytes(b)}}}")
    return len(items), "{" + ", ".join(items) + "}"


def exchange_init(out, name, d):
    cfg = d["client_config"]
    classes = parse_classes(cfg["BufferSliceSizes"])
    cap = cfg["QueueCap"]
    half = 24 + 12 * cap
    msg = d["message"]
    data = stream_bytes(msg["payload_len"])
    need(len(data) == msg["stream_bytes"], f"{name}: stream length")
    need(hashlib.sha256(data).hexdigest() == msg["stream_bytes_sha256"],
         f"{name}: the payload pattern does not reproduce stream_bytes_sha256")
    req = stage_init(out, name + ".request", d["request"], cap, 0, "list_headers_after_client_alloc",
                     None)
    rep = stage_init(out, name + ".reply", d["reply"], cap, half,
                     "list_headers_after_server_alloc_and_request_recycle",
                     d["reply"]["tracked_slice_headers"])
    fin = d["after_client_recycled_reply"]
    nl, lists = list_array(fin["list_headers"], name + ".final")
    t = [slice_init(out, s, f"{name}.final_tracked[{i}]") for i, s in enumerate(fin["tracked_slice_headers"])]
    q = [qheader_init(h, f"{name}.final_queue[{i}]") for i, h in enumerate(fin["queue_headers"])]
    close = d["close"]
    return (f"{{.name = \"{name}\", .buffer_cap = {cfg['ShareMemoryBufferCap']}, "
            f"{classes_init(classes)}, .queue_cap = {cap}, .payload_len = {msg['payload_len']}, "
            f".stream_len = {msg['stream_bytes']}, .stream_id = {d['stream_id']}, "
            f".request = {req}, .reply = {rep}, .nfinal_lists = {nl}, .final_lists = {lists}, "
            f".nfinal_tracked = {len(t)}, .final_tracked = {{{', '.join(t)}}}, "
            f".final_queue = {{{', '.join(q)}}}, "
            f".close_elem = {elem_init(close['element'], cap, 0, name + '.close')}, "
            f".close_drained = {qheader_init(close['queue_header_after_consumer_drained'], name + '.close_drained')}}}")


def queue_full_init(name, d):
    cfg = d["client_config"]
    cap = cfg["QueueCap"]
    ql = d["queue_layout_for_cap_1"]
    need(ql["file_size"] == 2 * (24 + 12 * cap) and ql["half_size"] * 2 == ql["file_size"],
         f"{name}: queue size")
    after = d["after_server_ran"]
    nl, lists = list_array(after["list_headers"], name + ".after")
    q = [qheader_init(h, f"{name}.after_queue[{i}]") for i, h in enumerate(after["queue"]["halves"])]
    return (f"{{.name = \"{name}\", .buffer_cap = {cfg['ShareMemoryBufferCap']}, "
            f"{classes_init(parse_classes(cfg['BufferSliceSizes']))}, .queue_cap = {cap}, "
            f".queue_file_size = {ql['file_size']}, "
            f".data_elem = {elem_init(d['data_element'], cap, 0, name + '.data')}, "
            f".full = {qheader_init(d['queue_header_full'], name + '.full')}, "
            f".after_close_call = {qheader_init(d['queue_header_after_close_call'], name + '.close')}, "
            f".after_queue = {{{', '.join(q)}}}, .nafter_lists = {nl}, .after_lists = {lists}}}")


HEADER = """\
/* Generated by tests/c/gen_vectors.py from the JSON files in tests/vectors. Do not edit:
 * change the generator or, for new captures, the JSON. */
#ifndef SHMIPC_TESTS_SHM_VECTORS_H
#define SHMIPC_TESTS_SHM_VECTORS_H

#include <stdint.h>

/* Every test file includes this header and uses part of it. */
#define SHMV_UNUSED __attribute__((unused))

struct shmv_class {
    uint32_t size, percent;
};

/* A slice header; chain slices also carry their list and data. */
struct shmv_slice {
    uint32_t offset;
    uint8_t raw[20];
    int32_t list_index; /* -1 unless a chain slice */
    uint32_t data_len;
    uint32_t head_len;
    uint8_t data_head[32];
    uint32_t tail_len;
    uint8_t data_tail[16];
    uint32_t full_len; /* 0 when the capture kept only head and tail */
    const uint8_t *data;
};

struct shmv_list {
    uint32_t offset, cap, slice_size, stride, region_offset;
    uint8_t raw[36];
    uint32_t nfirst;
    struct shmv_slice first[3];
    struct shmv_slice last;
};

struct shmv_list_header {
    uint32_t offset;
    uint8_t raw[36];
};

struct shmv_qheader {
    uint32_t base;
    uint8_t raw[24];
};

struct shmv_elem {
    uint32_t index, file_offset, seq_id, offset, status;
    uint8_t raw[12];
};

/* A freshly formatted buffer and queue pair. */
struct shmv_layout {
    const char *name;
    uint32_t buffer_cap;
    uint32_t nclasses;
    struct shmv_class classes[4]; /* as configured, not sorted */
    uint8_t header_raw[8];
    uint32_t nlists;
    struct shmv_list lists[4];
    uint32_t end_of_last_list;
    uint32_t queue_cap, queue_file_size;
    struct shmv_qheader halves[2];
};

/* One direction of an echo round trip. */
struct shmv_stage {
    struct shmv_elem elem;
    struct shmv_qheader after_put, after_drained;
    uint32_t nchain;
    struct shmv_slice chain[4];
    uint32_t nlists; /* after the sender's alloc (request); after alloc + recycle (reply) */
    struct shmv_list_header lists[4];
    uint32_t ntracked;
    struct shmv_slice tracked[8];
};

/* An echo: client request, server reply (recycling the request), client recycles the reply,
 * then the client closes the stream. */
struct shmv_exchange {
    const char *name;
    uint32_t buffer_cap;
    uint32_t nclasses;
    struct shmv_class classes[4];
    uint32_t queue_cap;
    uint32_t payload_len, stream_len, stream_id;
    struct shmv_stage request, reply;
    uint32_t nfinal_lists;
    struct shmv_list_header final_lists[4];
    uint32_t nfinal_tracked;
    struct shmv_slice final_tracked[8];
    struct shmv_qheader final_queue[2];
    struct shmv_elem close_elem;
    struct shmv_qheader close_drained;
};

/* A queue of cap 1 filled by one data element, so the close element does not fit. */
struct shmv_queue_full {
    const char *name;
    uint32_t buffer_cap;
    uint32_t nclasses;
    struct shmv_class classes[4];
    uint32_t queue_cap, queue_file_size;
    struct shmv_elem data_elem;
    struct shmv_qheader full, after_close_call;
    struct shmv_qheader after_queue[2];
    uint32_t nafter_lists;
    struct shmv_list_header after_lists[4];
};
"""


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    vectors = {}
    for path in argv[2:]:
        with open(path) as f:
            vectors[os.path.basename(path)[:-5]] = json.load(f)
    out = Out()
    layouts, exchanges, fulls = [], [], []
    for name, d in sorted(vectors.items()):
        try:
            if name.startswith("layout-"):
                cfg, buf, q = d["client_config"], d["buffer"], d["queue"]
                need(q["all_bytes_zero_except_cap_fields"], f"{name}: queue not zero")
                need(q["file_size"] == 2 * q["half_size"] == 2 * (24 + 12 * q["QueueCap"]),
                     f"{name}: queue size")
                layouts.append(layout_init(out, name, cfg["ShareMemoryBufferCap"],
                                           parse_classes(cfg["BufferSliceSizes_as_configured"]),
                                           buf, q["QueueCap"], q["file_size"], q["halves"]))
            elif name == "exchange-fallback":
                # Its buffer (one slice, never handed out) and idle queue are a layout too.
                cfg = d["client_config"]
                qh = d["queue_state_after_request"]
                layouts.append(layout_init(out, name, cfg["ShareMemoryBufferCap"],
                                           parse_classes(cfg["BufferSliceSizes_as_configured"]),
                                           d["buffer_layout"], cfg["QueueCap"],
                                           2 * (24 + 12 * cfg["QueueCap"]), qh))
            elif name.startswith("exchange-echo-"):
                exchanges.append(exchange_init(out, name, d))
            elif name == "exchange-streamclose-queue-full":
                fulls.append(queue_full_init(name, d))
        except (KeyError, ValueError, VectorError) as e:
            sys.exit(f"gen_vectors: {name}: {e!r}")
    need(layouts and exchanges and fulls, "missing vectors")
    text = [HEADER]
    text += out.pre
    text.append("")
    text.append(f"static const struct shmv_layout shmv_layouts[{len(layouts)}] SHMV_UNUSED = {{")
    text += [f"    {x}," for x in layouts]
    text.append("};")
    text.append(f"static const struct shmv_exchange shmv_exchanges[{len(exchanges)}] SHMV_UNUSED = {{")
    text += [f"    {x}," for x in exchanges]
    text.append("};")
    text.append(f"static const struct shmv_queue_full shmv_queue_full SHMV_UNUSED = {fulls[0]};")
    text.append(f"#define SHMV_NLAYOUTS {len(layouts)}")
    text.append(f"#define SHMV_NEXCHANGES {len(exchanges)}")
    text.append("")
    text.append("#endif")
    tmp = argv[1] + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(text) + "\n")
    os.replace(tmp, argv[1])


if __name__ == "__main__":
    main(sys.argv)
