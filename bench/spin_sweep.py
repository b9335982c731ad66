#!/usr/bin/env python3
"""spin_sweep.py: one-stream round-trip latency (p50, p99) and CPU per round trip against the
spin cap (shmipc_config_set_spin_us, here `shmipc-bench ipc --spin-us N` for the client and the
echo server alike).

Runs `shmipc-bench ipc --sizes SIZE --streams 1 --spin-us N` once per cap (each run its own
interleaved rounds; figures are the medians the bench reports), then writes the table as
JSON and markdown, and a figure (bench/plot.py's writers: PNG with matplotlib, else SVG):
p50, p99 and CPU per round trip (client + server) against the cap, one line per transport.
A cap of 0 (never spin) is drawn at the left end, labelled "off".

Usage (from the source tree, after `ninja -C build`):
  bench/spin_sweep.py [--bench build/bench/shmipc-bench] [--caps 0,1,2,5,10,20,50,100]
      [--transports v3,v4-eventfd] [--size 64] [--rounds 3] [--json FILE] [--md FILE]
      [--img-dir docs/img] [--svg] [--no-pin]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plot  # noqa: E402  (bench/plot.py: the SVG and PNG writers)

OFF_X = 0.5  # where a cap of 0 sits on the log axis


def run_one(bench, cap, o, tmp):
    js, md = os.path.join(tmp, f"cap{cap}.json"), os.path.join(tmp, f"cap{cap}.md")
    cmd = [bench, "ipc", "--sizes", str(o.size), "--streams", "1", "--transports",
           o.transports, "--rounds", str(o.rounds), "--spin-us", str(cap), "--idle-ms", "0",
           "--duration", "20", "--warmup", "5", "--json", js, "--md", md]
    if o.no_pin:
        cmd.append("--no-pin")
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(js) as f:
        data = json.load(f)
    rows = []
    for e in data["latency"]:
        rows.append({"spin_us": cap, "transport": e["transport"], "p50_us": e["p50_us"],
                     "p99_us": e["p99_us"], "cpu_us_per_rt": e["cpu_us_per_rt"]["total"],
                     "wall_us_mean": e["wall_us_mean"]})
    return rows, data["env"]


def xfmt(x):
    return "off" if x == OFF_X else f"{x:g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default=os.path.join("build", "bench", "shmipc-bench"))
    ap.add_argument("--caps", default="0,1,2,5,10,20,50,100")
    ap.add_argument("--transports", default="v3,v4-eventfd,uds")
    ap.add_argument("--size", default="64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="bench-spin-sweep.json")
    ap.add_argument("--md", default="bench-spin-sweep.md")
    ap.add_argument("--img-dir", default=None, help="write spin-sweep.png/.svg here")
    ap.add_argument("--svg", action="store_true")
    ap.add_argument("--no-pin", action="store_true")
    o = ap.parse_args()
    caps = [int(c) for c in o.caps.split(",")]
    rows, env = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for cap in caps:
            r, env = run_one(o.bench, cap, o, tmp)
            rows += r
    with open("/proc/loadavg") as f:
        load_end = " ".join(f.read().split()[:3])
    out = {"command": " ".join(sys.argv), "size": o.size, "rounds": o.rounds, "caps": caps,
           "env": env, "loadavg_end": load_end, "rows": rows}
    with open(o.json, "w") as f:
        json.dump(out, f, indent=1)
    transports = sorted({r["transport"] for r in rows}, key=lambda t: [r["transport"] for r in rows].index(t))
    with open(o.md, "w") as f:
        f.write(f"One stream, {o.size} B, closed loop; medians of {o.rounds} rounds per cap. "
                f"Load average {env['loadavg_start']} at the start, {load_end} at the end; "
                f"{env['pinning']}.\n\n")
        f.write("| spin cap (µs) | transport | p50 (µs) | p99 (µs) | CPU per round trip (µs) |\n")
        f.write("|---:|---|---:|---:|---:|\n")
        for r in rows:
            f.write(f"| {r['spin_us']} | {r['transport']} | {r['p50_us']:.2f} | "
                    f"{r['p99_us']:.1f} | {r['cpu_us_per_rt']:.2f} |\n")
    print(f"wrote {o.json} and {o.md}")
    if o.img_dir:
        xs = sorted({OFF_X if c == 0 else c for c in caps})

        def series(key):
            return {t: sorted((OFF_X if r["spin_us"] == 0 else r["spin_us"], r[key])
                              for r in rows if r["transport"] == t and r[key] > 0)
                    for t in transports}

        figs = [("spin-sweep", f"One stream {o.size} B: latency and CPU against the spin cap", [
            {"title": "p50 round trip", "series": series("p50_us"), "ylabel": "µs", "logy": True},
            {"title": "p99 round trip", "series": series("p99_us"), "ylabel": "µs", "logy": True},
            {"title": "CPU per round trip (client + server)", "series": series("cpu_us_per_rt"),
             "ylabel": "µs", "logy": True},
        ])]
        sub = f"{env['cpu_model']}, {env['cpus']} CPUs; load {env['loadavg_start']}"
        os.makedirs(o.img_dir, exist_ok=True)
        try:
            if o.svg:
                raise ImportError
            written = plot.plot_png(xs, figs, o.img_dir, sub, xfmt)
        except ImportError:
            written = plot.plot_svg(xs, figs, o.img_dir, sub, xfmt)
        print("wrote " + ", ".join(written))


if __name__ == "__main__":
    main()
