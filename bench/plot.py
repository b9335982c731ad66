#!/usr/bin/env python3
"""Plots the JSON that `shmipc-bench ipc`, `shmipc-bench-ws` and bench/serve_bench.py write.

Writes four figures into OUT_DIR (default docs/img):
  ipc-latency    one stream: p50 and p99 round-trip latency against payload size
  ipc-cpu        one stream: CPU time per round trip (client, server, both) against size
  ipc-throughput N streams in flight: MiB/s against payload size, one panel per N
  ipc-ratio      figures divided by the unix socket's (the bar of issue 3) and the one-stream
                 p50 divided by legacy V3's (the bar of issue 4: V4 eventfd at 64 B)
and, from `shmipc-bench-ws` JSON, two:
  ws-latency     p50 and p99 round-trip latency against connections, one panel per payload
  ws-ratio       p50 / the bare TCP echo's and p50 / Node.js ws's, with the bars of issue 6
and, from bench/serve_bench.py JSON, two:
  serve-rps      req/s against connections, one panel per body size and worker count
  serve-cpu      the server's CPU per request against connections, the same panels

With matplotlib (Debian: python3-matplotlib, for /usr/bin/python3) the figures are PNG;
without it, or with --svg, they are SVG written by hand, with no dependency at all.

Usage: bench/plot.py [--svg] [--out OUT_DIR] [bench-ipc.json | bench-ws.json | serve.json]
"""
import argparse
import json
import math
import os
import sys

COLORS = {"shmipc-v3": "#1f77b4", "shmipc-v2": "#2ca02c", "shmipc-v4": "#ff7f0e",
          "shmipc-v4-eventfd": "#9467bd", "shmipc-v4-polling": "#8c564b", "uds": "#d62728",
          "tcp": "#7f7f7f", "ours": "#1f77b4", "ours-io_uring": "#1f77b4", "ours-epoll": "#ff7f0e",
          "node": "#2ca02c",
          # bench/serve_bench.py: ours in blues and oranges, the peers in the other hues
          "shmipc-serve-wsgi": "#1f77b4", "shmipc-serve-asgi": "#17becf",
          "shmipc-serve-wsgi-spin0": "#aec7e8", "inproc-native": "#000000",
          "inproc-wsgi": "#ff7f0e", "inproc-asgi": "#ffbb78", "inproc-asgi-uvloop": "#bcbd22",
          "gunicorn-sync": "#d62728", "gunicorn-gthread": "#ff9896", "uwsgi": "#9467bd",
          "uvicorn-asyncio": "#8c564b", "uvicorn-uvloop": "#e377c2", "aiohttp": "#2ca02c"}


def size_label(v):
    if v >= 1 << 20 and v % (1 << 20) == 0:
        return f"{v >> 20} MiB"
    if v >= 1024 and v % 1024 == 0:
        return f"{v >> 10} KiB"
    return f"{v} B"


def load(path):
    with open(path) as f:
        data = json.load(f)
    if data.get("bench") not in ("ipc", "ws", "serve"):
        sys.exit(f"plot.py: {path} is not shmipc-bench ipc, shmipc-bench-ws or serve_bench.py "
                 "output")
    return data


def subtitle(data):
    env = data["env"]
    return (f"{env['cpu_model']}, {env['cpus']} CPUs, {env['kernel'].split()[1]}; "
            f"median of {data['config']['rounds']} rounds")


def panels(data):
    """The figures as data: a list of (name, title, [panel]), each panel a dict."""
    transports = data["transports"]
    lat = data["latency"]
    par = data["parallel"]
    sizes = sorted({e["size"] for e in lat} | {e["size"] for e in par})
    figs = []

    def lat_series(key):
        out = {}
        for t in transports:
            pts = [(e["size"], e[key]) for e in lat if e["transport"] == t and e[key] > 0]
            if pts:
                out[t] = sorted(pts)
        return out

    figs.append(("ipc-latency", "One stream, closed loop: round-trip latency", [
        {"title": "p50", "series": lat_series("p50_us"), "ylabel": "µs", "logy": True},
        {"title": "p99", "series": lat_series("p99_us"), "ylabel": "µs", "logy": True},
    ]))

    def cpu_series(key):
        out = {}
        for t in transports:
            pts = [(e["size"], e["cpu_us_per_rt"][key]) for e in lat
                   if e["transport"] == t and e.get("cpu_us_per_rt")
                   and e["cpu_us_per_rt"].get(key) is not None and e["cpu_us_per_rt"][key] > 0]
            if pts:
                out[t] = sorted(pts)
        return out

    cpu_total = cpu_series("total")
    if cpu_total or cpu_series("client"):
        ps = []
        if cpu_total:
            ps.append({"title": "client + server", "series": cpu_total, "ylabel": "µs CPU",
                       "logy": True})
        ps.append({"title": "client", "series": cpu_series("client"), "ylabel": "µs CPU",
                   "logy": True})
        if cpu_total:
            ps.append({"title": "echo server", "series": cpu_series("server"),
                       "ylabel": "µs CPU", "logy": True})
            busy = {}
            for t in transports:
                pts = [(e["size"], e["cpu_us_per_rt"]["total"] / e["wall_us_mean"]) for e in lat
                       if e["transport"] == t and e.get("cpu_us_per_rt")
                       and e["cpu_us_per_rt"].get("total") and e.get("wall_us_mean")]
                if pts:
                    busy[t] = sorted(pts)
            ps.append({"title": "CPUs kept busy (CPU time / wall time)", "series": busy,
                       "ylabel": "CPUs", "logy": False})
        figs.append(("ipc-cpu", "One stream, closed loop: CPU time per round trip", ps))

    requested = sorted({e["streams_requested"] for e in par})
    thr = []
    for n in requested:
        series = {}
        for t in transports:
            pts = [(e["size"], e["mib_per_s"]) for e in par
                   if e["transport"] == t and e["streams_requested"] == n and e["mib_per_s"] > 0]
            if pts:
                series[t] = sorted(pts)
        # Counts above --max-inflight / size run with fewer streams, or not at all when that
        # repeats a smaller count's cell.
        cell_sizes = {e["size"] for e in par if e["streams_requested"] == n}
        capped = any(e["streams"] < n for e in par if e["streams_requested"] == n) or \
            cell_sizes != {e["size"] for e in par}
        cap = data["config"]["max_inflight"] >> 20
        title = f"{n} stream{'s' if n != 1 else ''}"
        thr.append({"title": title + (f" (at most {cap} MiB in flight)" if capped else ""),
                    "series": series, "ylabel": "MiB/s", "logy": True})
    if thr:
        figs.append(("ipc-throughput", "N streams in flight: throughput (2 x payload x rt/s)", thr))

    if "uds" in transports:
        ratio_lat = {}
        for t in transports:
            if t == "uds":
                continue
            pts = [(e["size"], e["ratio_to_uds"]["p50"]) for e in lat
                   if e["transport"] == t and e["ratio_to_uds"]]
            if pts:
                ratio_lat[t] = sorted(pts)
        ps = [{"title": "one-stream p50 / UDS p50 (below 1: faster)",
               "series": ratio_lat, "ylabel": "ratio", "logy": True, "hlines": [1.0]}]
        if "shmipc-v3" in transports:
            # The bar of issue 4 compares V4 eventfd with legacy V3 as well.
            v3 = {e["size"]: e["p50_us"] for e in lat if e["transport"] == "shmipc-v3"}
            ratio_v3 = {}
            for t in transports:
                if t == "shmipc-v3":
                    continue
                pts = [(e["size"], e["p50_us"] / v3[e["size"]]) for e in lat
                       if e["transport"] == t and v3.get(e["size"]) and e["p50_us"] > 0]
                if pts:
                    ratio_v3[t] = sorted(pts)
            ps.append({"title": "one-stream p50 / legacy V3 p50 (below 1: faster)",
                       "series": ratio_v3, "ylabel": "ratio", "logy": True, "hlines": [1.0]})
        for n in requested:
            ratio_thr = {}
            for t in transports:
                if not t.startswith("shmipc"):
                    continue
                pts = [(e["size"], e["ratio_to_uds"]) for e in par
                       if e["transport"] == t and e["streams_requested"] == n
                       and e["ratio_to_uds"]]
                if pts:
                    ratio_thr[t] = sorted(pts)
            if ratio_thr:
                ps.append({"title": f"{n} stream{'s' if n != 1 else ''}: throughput / UDS "
                           "throughput (above 1: faster)", "series": ratio_thr,
                           "ylabel": "ratio", "logy": True, "hlines": [1.0, 2.0]})
        figs.append(("ipc-ratio", "Ratios (issue 3: p50 / UDS <= 1 at 64 B, throughput / UDS "
                     ">= 2 from 64 KiB; issue 4: V4 eventfd p50 below V3 and UDS at 64 B)", ps))
    return sizes, figs


def series_color(name, i):
    for t, c in COLORS.items():
        if name == t or name.startswith(t + ","):
            return c
    return ["#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"][i % 5]


def series_style(name):
    """Dashes tell stream counts apart in the ratio panel."""
    if "," not in name:
        return "-"
    n = name.split(",")[1].strip().split()[0]
    return {"1": ":", "8": "--", "64": "-.", "200": "-"}.get(n, "-")


def ws_panels(data):
    """The shmipc-bench-ws figures: x is the number of connections, one panel per payload."""
    lat = data["latency"]
    servers = data["targets"]
    conns = sorted({e["conns"] for e in lat})
    payloads = sorted({e["size"] for e in lat})

    def series(key, size, only=None):
        out = {}
        for t in servers:
            if only is not None and not only(t):
                continue
            pts = [(e["conns"], e[key]) for e in lat
                   if e["server"] == t and e["size"] == size and e[key] > 0]
            if pts:
                out[t] = sorted(pts)
        return out

    figs = [("ws-latency", "WebSocket echo, closed loop, one message in flight per connection: "
             "round-trip latency", [])]
    for size in payloads:
        figs[0][2].append({"title": f"{size_label(size)}: p50", "series": series("p50_us", size),
                           "ylabel": "µs", "logy": True})
        figs[0][2].append({"title": f"{size_label(size)}: p99", "series": series("p99_us", size),
                           "ylabel": "µs", "logy": True})
    ratios = []
    ours = lambda t: t.startswith("ours")
    for size in payloads:
        bar = {64: [1.15], 1 << 20: [1.3]}.get(size, [])
        if "tcp" in servers:
            ratios.append({"title": f"{size_label(size)}: p50 / bare TCP echo p50",
                           "series": series("p50_vs_tcp", size, lambda t: t != "tcp"),
                           "ylabel": "ratio", "logy": True, "hlines": [1.0] + bar})
        if "node" in servers:
            ratios.append({"title": f"{size_label(size)}: p50 / Node.js ws p50 (below 1: faster)",
                           "series": series("p50_vs_node", size, ours),
                           "ylabel": "ratio", "logy": True, "hlines": [1.0]})
    if ratios:
        figs.append(("ws-ratio", "Ratios (issue 6: 64 B <= 1.15x and 1 MiB <= 1.3x the TCP echo; "
                     "below Node.js ws everywhere)", ratios))
    return conns, figs


def ws_subtitle(data):
    env = data["env"]
    rounds = data["config"]["rounds"]
    return (f"{env['kernel']}, {env['cpus']} CPUs, load {env['loadavg'][0]:.1f}-"
            f"{env['loadavg'][1]:.1f}; median of {rounds} round{'s' if rounds != 1 else ''}")


def serve_panels(data):
    """bench/serve_bench.py: x is the number of connections; a panel per body and workers."""
    res = data["results"]
    conns = sorted({r["conns"] for r in res})
    targets = list(dict.fromkeys(r["target"] for r in res))
    groups = sorted({(r["body"], r["workers"]) for r in res})

    def series(key, body, workers):
        out = {}
        for t in targets:
            pts = [(r["conns"], r[key]) for r in res
                   if r["target"] == t and r["body"] == body and r["workers"] == workers
                   and r[key] > 0]
            if pts:
                out[t] = sorted(pts)
        return out

    rps = [{"title": f"{size_label(b)} body, {w} worker{'s' if w > 1 else ''}: req/s",
            "series": series("rps", b, w), "ylabel": "req/s", "logy": True} for b, w in groups]
    cpu = [{"title": f"{size_label(b)} body, {w} worker{'s' if w > 1 else ''}: CPU/request",
            "series": series("cpu_us_per_req", b, w), "ylabel": "µs (server processes)",
            "logy": True} for b, w in groups]
    return conns, [("serve-rps", "Application servers, one app, wrk -t1: requests per second",
                    rps),
                   ("serve-cpu", "Application servers: the server's CPU per request "
                    "(user + system, /proc)", cpu)]


def conns_label(v):
    return str(v)


def plot_png(sizes, figs, out, sub, xfmt=size_label):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    written = []
    for name, title, ps in figs:
        cols = min(len(ps), 2)
        rows = math.ceil(len(ps) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.4 * rows), squeeze=False)
        for ax, p in zip(axes.flat, ps):
            for i, (label, pts) in enumerate(p["series"].items()):
                xs, ys = zip(*pts)
                ax.plot(xs, ys, series_style(label), marker="o", markersize=3,
                        color=series_color(label, i), label=label)
            for h in p.get("hlines", []):
                ax.axhline(h, color="black", linewidth=0.8, alpha=0.5)
            ax.set_xscale("log", base=2)
            if p["logy"]:
                ax.set_yscale("log")
            if p.get("hlines"):
                # Ratios read best as plain numbers at powers of two around 1.
                ys = [y for pts in p["series"].values() for _, y in pts] + p["hlines"]
                lo, hi = math.floor(math.log2(min(ys))), math.ceil(math.log2(max(ys)))
                ax.set_yticks([2.0 ** k for k in range(lo, hi + 1)])
                ax.yaxis.set_major_formatter(
                    matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_xticks(sizes)
            ax.set_xticklabels([xfmt(s) for s in sizes], rotation=45, fontsize=8)
            ax.minorticks_off()
            ax.set_title(p["title"], fontsize=10)
            ax.set_ylabel(p["ylabel"])
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(ps):]:
            ax.axis("off")
        fig.suptitle(f"{title}\n{sub}", fontsize=11)
        fig.tight_layout()
        path = os.path.join(out, name + ".png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg_panel(x0, y0, w, h, p, sizes, xfmt=size_label):
    """One chart as SVG elements: log2 x axis over the sizes, log10 (or linear) y axis."""
    left, right, top, bottom = 60, 10, 24, 50
    pw, ph = w - left - right, h - top - bottom
    ys = [y for pts in p["series"].values() for _, y in pts] + p.get("hlines", [])
    ys = [y for y in ys if y > 0]
    if not ys:
        return []
    lo, hi = min(ys), max(ys)
    if p["logy"]:
        lo, hi = 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))
        fy = lambda v: (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    else:
        lo = 0
        fy = lambda v: (v - lo) / (hi - lo or 1)
    xl, xh = math.log2(min(sizes)), math.log2(max(sizes))
    fx = lambda v: (math.log2(v) - xl) / ((xh - xl) or 1)
    X = lambda v: x0 + left + fx(v) * pw
    Y = lambda v: y0 + top + ph - fy(v) * ph
    el = [f'<text x="{x0 + w / 2}" y="{y0 + 15}" text-anchor="middle" font-size="12">'
          f'{esc(p["title"])}</text>',
          f'<rect x="{x0 + left}" y="{y0 + top}" width="{pw}" height="{ph}" fill="none" '
          f'stroke="#999"/>']
    for s in sizes:
        el.append(f'<line x1="{X(s):.1f}" y1="{y0 + top}" x2="{X(s):.1f}" y2="{y0 + top + ph}" '
                  f'stroke="#eee"/>')
        el.append(f'<text x="{X(s):.1f}" y="{y0 + top + ph + 14}" font-size="9" '
                  f'text-anchor="middle">{esc(xfmt(s))}</text>')
    if p["logy"]:
        d = math.floor(math.log10(lo))
        while 10 ** d <= hi * 1.0001:
            v = 10 ** d
            el.append(f'<line x1="{x0 + left}" y1="{Y(v):.1f}" x2="{x0 + left + pw}" '
                      f'y2="{Y(v):.1f}" stroke="#eee"/>')
            el.append(f'<text x="{x0 + left - 4}" y="{Y(v) + 3:.1f}" font-size="9" '
                      f'text-anchor="end">{v:g}</text>')
            d += 1
    el.append(f'<text x="{x0 + 12}" y="{y0 + top + ph / 2}" font-size="10" '
              f'transform="rotate(-90 {x0 + 12} {y0 + top + ph / 2})" text-anchor="middle">'
              f'{esc(p["ylabel"])}</text>')
    for v in p.get("hlines", []):
        el.append(f'<line x1="{x0 + left}" y1="{Y(v):.1f}" x2="{x0 + left + pw}" y2="{Y(v):.1f}" '
                  f'stroke="black" stroke-width="0.8"/>')
    dash = {"-": "", "--": ' stroke-dasharray="6 3"', ":": ' stroke-dasharray="2 2"',
            "-.": ' stroke-dasharray="6 2 2 2"'}
    for i, (label, pts) in enumerate(p["series"].items()):
        c = series_color(label, i)
        path = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)
        el.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="1.5"'
                  f'{dash[series_style(label)]}/>')
        for x, y in pts:
            el.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="2" fill="{c}"/>')
        ly = y0 + top + 12 + 12 * i
        el.append(f'<line x1="{x0 + left + 8}" y1="{ly - 3}" x2="{x0 + left + 24}" y2="{ly - 3}" '
                  f'stroke="{c}" stroke-width="1.5"{dash[series_style(label)]}/>')
        el.append(f'<text x="{x0 + left + 28}" y="{ly}" font-size="9">{esc(label)}</text>')
    return el


def plot_svg(sizes, figs, out, sub, xfmt=size_label):
    written = []
    for name, title, ps in figs:
        cols = min(len(ps), 2)
        rows = math.ceil(len(ps) / cols)
        w, h, head = 520, 340, 44
        el = [f'<text x="{cols * w / 2}" y="18" text-anchor="middle" font-size="14">'
              f'{esc(title)}</text>',
              f'<text x="{cols * w / 2}" y="34" text-anchor="middle" font-size="10">'
              f'{esc(sub)}</text>']
        for i, p in enumerate(ps):
            el += svg_panel((i % cols) * w, head + (i // cols) * h, w, h, p, sizes, xfmt)
        svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * w}" '
               f'height="{head + rows * h}" font-family="sans-serif">\n'
               f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(el) + "\n</svg>\n")
        path = os.path.join(out, name + ".svg")
        with open(path, "w") as f:
            f.write(svg)
        written.append(path)
    return written


def main():
    ap = argparse.ArgumentParser(description="Plots shmipc-bench ipc, shmipc-bench-ws or serve_bench.py JSON.")
    ap.add_argument("json", nargs="?", default="bench-ipc.json")
    ap.add_argument("--out", default=os.path.join("docs", "img"), help="output directory")
    ap.add_argument("--svg", action="store_true", help="write SVG even if matplotlib is there")
    args = ap.parse_args()
    data = load(args.json)
    if data["bench"] == "ws":
        (sizes, figs), sub, xfmt = ws_panels(data), ws_subtitle(data), conns_label
    elif data["bench"] == "serve":
        (sizes, figs), sub, xfmt = serve_panels(data), ws_subtitle(data), conns_label
    else:
        (sizes, figs), sub, xfmt = panels(data), subtitle(data), size_label
    os.makedirs(args.out, exist_ok=True)
    written = None
    if not args.svg:
        try:
            written = plot_png(sizes, figs, args.out, sub, xfmt)
        except ImportError:
            print("plot.py: matplotlib is not installed; writing SVG instead", file=sys.stderr)
    if written is None:
        written = plot_svg(sizes, figs, args.out, sub, xfmt)
    for p in written:
        print(p)


if __name__ == "__main__":
    main()
