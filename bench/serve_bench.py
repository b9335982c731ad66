#!/usr/bin/env python3
"""Application servers side by side, one load generator (wrk), one app (bench/serve_app.py):
shmipc-serve (WSGI, ASGI), the in-process adapters on shmipc.Server (and its native handler,
the reference of the adapters' CPU target) against gunicorn (sync, gthread), uWSGI (python3
plugin), uvicorn (asyncio, uvloop) and aiohttp (docs/benchmarks.md, "Application servers").

For each body size and worker count, every target is started (a missing one is skipped with a
line saying why), checked to answer the app's exact body, warmed up, then measured in
interleaved rounds (round 1: every target at every connection count, round 2: again, ...).
Figures: req/s and p99 from wrk, and CPU per request: the user+system CPU of the target's
process tree (from /proc/PID/stat, wrk excluded) over the measured requests. Medians of the
rounds. Writes JSON (bench/plot.py plots it) and markdown.

    bench/serve_bench.py --out bench/results/serve          # the whole matrix
    bench/serve_bench.py --quick --only ours                 # 1 s, our targets (the smoke test)

Loopback only; every wrk run is bounded by --duration; every server is stopped (SIGTERM, then
SIGKILL) before the next group starts.
"""
import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.environ.get("SHMIPC_BUILD_DIR", os.path.join(ROOT, "build"))
PY = "/usr/bin/python3"  # the Debian peers' interpreter; ours run under it too
TICK = os.sysconf("SC_CLK_TCK")


def _inprocess_cmd(kind):
    def cmd(port, workers):
        return [PY, os.path.abspath(__file__), "--run-inprocess", kind, "--port", str(port),
                "--workers", str(workers)]
    return cmd


def _have(*exes):
    missing = [e for e in exes if shutil.which(e) is None]
    return f"{', '.join(missing)} not installed" if missing else None


def _have_module(mod):
    r = subprocess.run([PY, "-c", f"import {mod}"], capture_output=True)
    return None if r.returncode == 0 else f"python3 module {mod} not installed"


def _serve_exe():
    exe = os.path.join(BUILD, "serve", "shmipc-serve")
    return exe if os.path.exists(exe) else None


def _serve_worker_exe():
    exe = os.path.join(BUILD, "serve", "shmipc-serve-worker")
    return exe if _serve_exe() and os.path.exists(exe) else None


def _serve_cmd(*app, extra=()):
    """argv(port, workers) of shmipc-serve with Python workers serving `app` (its APP words:
    "serve_app:app", or "--asgi", "serve_app:asgi"), then the options `extra`."""
    return lambda p, w: [_serve_exe(), *app, "--chdir", HERE, "--listen", f"127.0.0.1:{p}",
                         "--workers", str(w), "--python", PY, *extra]


def _serve_built():
    return None if _serve_exe() else "shmipc-serve is not built"


def _serve_c_app():
    return os.path.join(BUILD, "bench", "libserve_bench_app.so")


def _serve_c_cmd(*extra):
    return lambda p, w: [_serve_exe(), "--c", _serve_c_app(), "--listen", f"127.0.0.1:{p}",
                         "--workers", str(w), *extra]


def _serve_c_built():
    if not _serve_worker_exe():
        return "shmipc-serve-worker is not built"
    return None if os.path.exists(_serve_c_app()) else "bench/libserve_bench_app.so is not built"


# The targets: name -> (group, argv(port, workers), why-not-available() or None[, extra env]).
# One line to add a server.
TARGETS = {
    "shmipc-serve-wsgi": ("ours", _serve_cmd("serve_app:app"), _serve_built),
    "shmipc-serve-asgi": ("ours", _serve_cmd("--asgi", "serve_app:asgi"), _serve_built),
    # The spin of shmipc's waits (SHMIPC_SPIN_US, default 50 µs) off: with the front and its
    # worker pinned to one CPU, a spinning waiter takes the CPU its peer needs.
    "shmipc-serve-wsgi-spin0": ("ours", _serve_cmd("serve_app:app"), _serve_built,
                                {"SHMIPC_SPIN_US": "0"}),
    # --pipeline 4: with every worker busy, up to 4 requests wait in each worker's own queue
    # (docs/serve.md, "HELLO and TAKEN"), so a worker takes the next without sleeping; 16,
    # the most, lets it find the next one waiting more often still.
    "shmipc-serve-wsgi-pipe4": ("ours", _serve_cmd("serve_app:app", extra=("--pipeline", "4")),
                                _serve_built),
    "shmipc-serve-wsgi-pipe16": ("ours",
                                 _serve_cmd("serve_app:app", extra=("--pipeline", "16")),
                                 _serve_built),
    "shmipc-serve-asgi-pipe4": ("ours", _serve_cmd("--asgi", "serve_app:asgi",
                                                   extra=("--pipeline", "4")), _serve_built),
    "shmipc-serve-lua": ("ours", lambda p, w: [
        _serve_exe(), "--lua", "serve_app", "--chdir", HERE, "--listen", f"127.0.0.1:{p}",
        "--workers", str(w)], lambda: None if _serve_worker_exe() else
        "shmipc-serve-worker (with Lua) is not built"),
    "shmipc-serve-lua-pipe16": ("ours", lambda p, w: [
        _serve_exe(), "--lua", "serve_app", "--chdir", HERE, "--listen", f"127.0.0.1:{p}",
        "--workers", str(w), "--pipeline", "16"], lambda: None if _serve_worker_exe() else
        "shmipc-serve-worker (with Lua) is not built"),
    # The C app (bench/serve_app.c): the pool with the cheapest worker, the floor under the
    # Python and Lua apps of the same cell (docs/benchmarks.md, "The pool's floor").
    "shmipc-serve-c": ("ours", _serve_c_cmd(), _serve_c_built),
    "shmipc-serve-c-pipe16": ("ours", _serve_c_cmd("--pipeline", "16"), _serve_c_built),
    "inproc-native": ("ours", _inprocess_cmd("native"), lambda: None),
    "inproc-wsgi": ("ours", _inprocess_cmd("wsgi"), lambda: None),
    "inproc-asgi": ("ours", _inprocess_cmd("asgi"), lambda: None),
    "inproc-asgi-uvloop": ("ours", _inprocess_cmd("asgi-uvloop"), lambda: _have_module("uvloop")),
    "gunicorn-sync": ("peer", lambda p, w: [
        PY, "-m", "gunicorn", "-k", "sync", "-w", str(w), "-b", f"127.0.0.1:{p}",
        "--chdir", HERE, "--log-level", "warning", "serve_app:app"],
        lambda: _have_module("gunicorn")),
    "gunicorn-gthread": ("peer", lambda p, w: [
        PY, "-m", "gunicorn", "-k", "gthread", "--threads", "4", "-w", str(w),
        "-b", f"127.0.0.1:{p}", "--chdir", HERE, "--log-level", "warning", "serve_app:app"],
        lambda: _have_module("gunicorn")),
    "uwsgi": ("peer", lambda p, w: [
        "uwsgi", "--plugin", "python3", "--http11-socket", f"127.0.0.1:{p}", "--chdir", HERE,
        "--module", "serve_app:app", "--processes", str(w), "--master", "--disable-logging",
        "--die-on-term", "--need-app", "--logto", "/dev/null"],
        lambda: _have("uwsgi") or (None if os.path.exists(
            "/usr/lib/uwsgi/plugins/python3_plugin.so") else "uwsgi-plugin-python3 not installed")),
    "uvicorn-asyncio": ("peer", lambda p, w: [
        PY, "-m", "uvicorn", "serve_app:asgi", "--app-dir", HERE, "--host", "127.0.0.1",
        "--port", str(p), "--workers", str(w), "--loop", "asyncio", "--no-access-log",
        "--log-level", "warning"], lambda: _have_module("uvicorn")),
    "uvicorn-uvloop": ("peer", lambda p, w: [
        PY, "-m", "uvicorn", "serve_app:asgi", "--app-dir", HERE, "--host", "127.0.0.1",
        "--port", str(p), "--workers", str(w), "--loop", "uvloop", "--no-access-log",
        "--log-level", "warning"],
        lambda: _have_module("uvicorn") or _have_module("uvloop")),
    "aiohttp": ("peer", lambda p, w: [
        PY, os.path.abspath(__file__), "--run-aiohttp", "--port", str(p), "--workers", str(w)],
        lambda: _have_module("aiohttp")),
}


# ---- the in-process and aiohttp runners (this file, started as the target) ------------------

def run_inprocess(kind, port, workers):
    sys.path.insert(0, HERE)
    import shmipc
    import shmipc.serve

    import serve_app

    route = None
    s = shmipc.Server(port=port, workers=workers)
    if kind == "native":
        s.route("GET", "/", serve_app.native)
    elif kind == "wsgi":
        s.route(None, "/*", shmipc.serve.wsgi_handler(serve_app.app))
    else:
        factory = None
        if kind == "asgi-uvloop":
            import uvloop

            factory = uvloop.new_event_loop
        route = shmipc.serve.asgi_handler(serve_app.asgi, loop_factory=factory)
        s.route(None, "/*", route)
    # The handler only sets a flag: a stop() from a SIGTERM that came before run() would stop
    # the started server and run() would start it again. And it takes no lock: a
    # threading.Event's set() could wait forever for the lock that the main thread, which runs
    # the handler, holds inside its own wait() (python -m shmipc.serve hung so).
    stopping = []
    signal.signal(signal.SIGTERM, lambda *a: stopping.append(True))
    with s:
        s.start()
        while not stopping:
            time.sleep(0.1)
        s.stop()
    if route is not None:
        route.close()


def run_aiohttp(port, workers):
    """aiohttp has no process manager of its own: N processes on one SO_REUSEPORT port."""
    sys.path.insert(0, HERE)
    from aiohttp import web

    import serve_app

    kids = []
    for _ in range(workers - 1):
        pid = os.fork()
        if pid == 0:
            kids = []
            break
        kids.append(pid)
    try:
        web.run_app(serve_app.aiohttp_app(), host="127.0.0.1", port=port, reuse_port=True,
                    access_log=None, print=None)
    finally:
        for pid in kids:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except OSError:
                pass


# ---- measuring ----------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_cpu(root):
    """CPU seconds (user + system) of `root` and its descendants, from /proc."""
    parent, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        rest = st[st.rfind(")") + 2:].split()
        parent[int(d)] = int(rest[1])
        cpu[int(d)] = (int(rest[11]) + int(rest[12])) / TICK
    total, todo = 0.0, [root]
    seen = set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += cpu.get(p, 0.0)
        todo += [c for c, pp in parent.items() if pp == p]
    return total


def wrk(port, conns, duration, cpu_list):
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", "--timeout", "5s",
           f"http://127.0.0.1:{port}/"]
    if cpu_list:
        cmd = ["taskset", "-c", cpu_list] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30).stdout
    m = re.search(r"(\d+) requests in", out)
    reqs = int(m.group(1)) if m else 0
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    rps = float(m.group(1)) if m else 0.0
    m = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\b", out, re.M)
    p99 = float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)] if m else 0.0
    errors = 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(x) for x in m.groups())
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errors += int(m.group(1))
    return reqs, rps, p99, errors, out


class Target:
    def __init__(self, name, spec, body, workers, pin):
        self.name, self.port = name, free_port()
        argv = spec[1]
        env = dict(os.environ, **(spec[3] if len(spec) > 3 else {}), SERVE_BENCH_BODY=str(body),
                   PYTHONPATH=os.pathsep.join(filter(None, [
                       os.path.join(BUILD, "python"), os.environ.get("PYTHONPATH")])))
        argv = argv(self.port, workers)
        if pin:
            argv = ["taskset", "-c", pin] + argv
        self.argv = argv
        self.log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                     f"serve-bench-{name}-{os.getpid()}.log"), "w+")
        self.p = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                  start_new_session=True, cwd=HERE)

    def ready(self, expect, timeout=30.0):
        """The exact body of the app at GET /, within timeout; else the reason."""
        end = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < end:
            if self.p.poll() is not None:
                self.log.seek(0)
                return f"exited {self.p.returncode}: {self.log.read()[-400:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=2) as r:
                    got = r.read()
                    if r.status == 200 and got == expect:
                        return None
                    last = f"answered {r.status} with {len(got)} bytes"
            except OSError as e:
                last = str(e)
            time.sleep(0.1)
        return f"not ready in {timeout:.0f} s: {last}"

    def cpu(self):
        return tree_cpu(self.p.pid)

    def stop(self):
        if self.log.closed:
            return
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=5)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)  # a straggling child of the group
        except ProcessLookupError:
            pass
        self.log.close()
        os.unlink(self.log.name)


def env_info():
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            cpu_model = m.group(1) if m else ""
    except OSError:
        pass

    def version(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip() \
                .splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"
    return {
        "kernel": " ".join(platform.uname()[2:4]), "cpus": os.cpu_count(), "cpu_model": cpu_model,
        "loadavg": list(os.getloadavg()), "python": version([PY, "--version"]),
        "wrk": version(["wrk", "-v"]),
        "versions": {
            "gunicorn": version([PY, "-c", "import gunicorn; print(gunicorn.__version__)"]),
            "uwsgi": version(["uwsgi", "--version"]),
            "uvicorn": version([PY, "-c", "import uvicorn; print(uvicorn.__version__)"]),
            "uvloop": version([PY, "-c", "import uvloop; print(uvloop.__version__)"]),
            "aiohttp": version([PY, "-c", "import aiohttp; print(aiohttp.__version__)"]),
        },
        "backend": os.environ.get("SHMIPC_REACTOR_BACKEND", "auto"),
    }


def run(args):
    names = [n for n in TARGETS if args.only is None or n in args.only
             or TARGETS[n][0] in args.only]
    if args.skip:
        names = [n for n in names if n not in args.skip]
    skipped = {}
    for n in names:
        why = TARGETS[n][2]()
        if why:
            skipped[n] = why
            print(f"skipped {n}: {why}", flush=True)
    names = [n for n in names if n not in skipped]
    if shutil.which("wrk") is None:
        sys.exit("serve_bench: wrk is not installed (Debian: apt-get install wrk)")
    two = (os.cpu_count() or 1) >= 2 and not args.no_pin
    cells = []
    info = env_info()
    print(f"# {info['kernel']}, {info['cpus']} CPUs ({info['cpu_model']}), load "
          f"{info['loadavg'][0]:.2f}; {info['python']}; wrk -t1, {args.duration} s per run, "
          f"{args.rounds} interleaved rounds", flush=True)
    for body in args.bodies:
        expect = (b"Hello, World!" if body == 13 else
                  (b"0123456789abcdef" * (body // 16 + 1))[:body])
        for workers in args.workers:
            # One worker: the server on CPU 0, wrk on CPU 1. More: the server is not pinned.
            pin = "0" if two and workers == 1 else None
            started, samples = {}, {}
            # Started together (their start-up overlaps), then each checked.
            launched = []
            try:
                for n in names:
                    launched.append(Target(n, TARGETS[n], body, workers, pin))
                for t in launched:
                    why = t.ready(expect)
                    if why:
                        print(f"skipped {t.name} (body {body}, {workers} workers): {why}",
                              flush=True)
                        skipped[f"{t.name}/{body}/{workers}"] = why
                        t.stop()
                        continue
                    started[t.name] = t
                for t in started.values():
                    if args.warmup:
                        wrk(t.port, min(args.conns), args.warmup, "1" if two else None)
                samples = {(n, c): [] for n in started for c in args.conns}
                for rnd in range(args.rounds):
                    for c in args.conns:
                        for n, t in started.items():
                            c0 = t.cpu()
                            reqs, rps, p99, errors, out = wrk(t.port, c, args.duration,
                                                              "1" if two else None)
                            cpu = t.cpu() - c0
                            samples[(n, c)].append({
                                "rps": rps, "p99_ms": p99, "requests": reqs, "errors": errors,
                                "cpu_s": cpu, "cpu_us_per_req": cpu / reqs * 1e6 if reqs else 0.0})
                            print(f"round {rnd + 1} body {body} workers {workers} conns {c} "
                                  f"{n}: {rps:.0f} req/s, p99 {p99:.2f} ms, "
                                  f"{cpu / reqs * 1e6 if reqs else 0:.1f} µs CPU/req"
                                  + (f", {errors} errors" if errors else ""), flush=True)
            finally:
                for t in launched:
                    t.stop()
            for (n, c), rs in samples.items():
                cells.append({
                    "target": n, "group": TARGETS[n][0], "body": body, "workers": workers,
                    "conns": c, "rps": statistics.median(r["rps"] for r in rs),
                    "p99_ms": statistics.median(r["p99_ms"] for r in rs),
                    "cpu_us_per_req": statistics.median(r["cpu_us_per_req"] for r in rs),
                    "errors": sum(r["errors"] for r in rs), "rounds": rs})
    # The machine may be shared: its load at the end beside the start's.
    info["loadavg_end"] = list(os.getloadavg())
    return {"bench": "serve", "env": info,
            "config": {"rounds": args.rounds, "duration_s": args.duration,
                       "warmup_s": args.warmup, "bodies": args.bodies, "workers": args.workers,
                       "conns": args.conns, "pinned": two,
                       "targets": {n: " ".join(TARGETS[n][1](0, 1)[:3]) for n in names}},
            "skipped": skipped, "results": cells}


# ---- report --------------------------------------------------------------------------------------

# The targets of issue 22, item 6: (ours, peer, what, the bar).
BARS = [("shmipc-serve-wsgi", "uwsgi", "req/s", 3.0),
        ("shmipc-serve-wsgi-pipe4", "uwsgi", "req/s", 3.0),
        ("shmipc-serve-wsgi-pipe16", "uwsgi", "req/s", 3.0),
        ("shmipc-serve-asgi", "uvicorn-uvloop", "req/s", 1.5),
        ("shmipc-serve-asgi-pipe4", "uvicorn-uvloop", "req/s", 1.5)]
ADAPTERS = [("inproc-wsgi", "inproc-native"), ("inproc-asgi", "inproc-native"),
            ("inproc-asgi-uvloop", "inproc-native")]


def index(data):
    return {(r["target"], r["body"], r["workers"], r["conns"]): r for r in data["results"]}


def markdown(data):
    env, cfg = data["env"], data["config"]
    lines = [f"Run: {env['kernel']}, {env['cpus']} CPUs ({env['cpu_model']}), load average "
             f"{env['loadavg'][0]:.2f} at the start"
             + (f", {env['loadavg_end'][0]:.2f} at the end" if "loadavg_end" in env else "")
             + f"; {env['python']}; {env['wrk']}; "
             f"median of {cfg['rounds']} interleaved rounds of {cfg['duration_s']} s "
             f"(wrk -t1{', pinned to CPU 1, one-worker servers to CPU 0' if cfg['pinned'] else ''})."
             f" CPU/req: the server's process tree, from /proc.", ""]
    for name, why in sorted(data["skipped"].items()):
        lines.append(f"- skipped {name}: {why}")
    if data["skipped"]:
        lines.append("")
    idx = index(data)
    targets = list(dict.fromkeys(r["target"] for r in data["results"]))
    for body in cfg["bodies"]:
        for workers in cfg["workers"]:
            lines += [f"**{body} B body, {workers} worker{'s' if workers > 1 else ''}**", "",
                      "| target | " + " | ".join(
                          f"{c} conns: req/s | p99 ms | µs CPU/req" for c in cfg["conns"]) + " |",
                      "|---|" + "---:|---:|---:|" * len(cfg["conns"])]
            for t in targets:
                cols = []
                for c in cfg["conns"]:
                    r = idx.get((t, body, workers, c))
                    cols += ([f"{r['rps']:.0f}" + (f" ({r['errors']} err)" if r["errors"] else ""),
                              f"{r['p99_ms']:.2f}", f"{r['cpu_us_per_req']:.1f}"]
                             if r else ["-", "-", "-"])
                lines.append(f"| {t} | " + " | ".join(cols) + " |")
            lines.append("")
    lines += ["**Against the targets of issue 22, item 6** (ratios of medians; CPU: ours / "
              "peer's, the bar is <= 0.4)", "",
              "| cell | ours / peer req/s (bar) | ours / peer CPU per request |", "|---|---:|---:|"]
    for body in cfg["bodies"]:
        for workers in cfg["workers"]:
            for c in cfg["conns"]:
                for ours, peer, _, bar in BARS:
                    a, b = idx.get((ours, body, workers, c)), idx.get((peer, body, workers, c))
                    if a and b and b["rps"] and b["cpu_us_per_req"]:
                        lines.append(
                            f"| {ours} / {peer}, {body} B, {workers}w, {c}c | "
                            f"{a['rps'] / b['rps']:.2f} (>= {bar}) | "
                            f"{a['cpu_us_per_req'] / b['cpu_us_per_req']:.2f} |")
    lines += ["", "**In-process adapters against the native handler** (CPU per request; the "
              "bar is <= 1.3)", "", "| cell | adapter / native CPU per request |", "|---|---:|"]
    for body in cfg["bodies"]:
        for workers in cfg["workers"]:
            for c in cfg["conns"]:
                for ad, nat in ADAPTERS:
                    a, b = idx.get((ad, body, workers, c)), idx.get((nat, body, workers, c))
                    if a and b and b["cpu_us_per_req"]:
                        lines.append(f"| {ad}, {body} B, {workers}w, {c}c | "
                                     f"{a['cpu_us_per_req'] / b['cpu_us_per_req']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bodies", type=int, nargs="+", default=[13, 10240])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--conns", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    ap.add_argument("--warmup", type=int, default=1, help="seconds of warm-up per target")
    ap.add_argument("--only", nargs="+", help="target names, or the groups 'ours' / 'peer'")
    ap.add_argument("--skip", nargs="+", help="target names to leave out")
    ap.add_argument("--quick", action="store_true",
                    help="the smallest run: 1 s, 1 round, no warm-up, 13 B, 1 worker, 64 conns")
    ap.add_argument("--no-pin", action="store_true", help="no taskset")
    ap.add_argument("--out", help="write OUT.json and OUT.md")
    ap.add_argument("--list", action="store_true", help="list the targets and exit")
    ap.add_argument("--run-inprocess", choices=["native", "wsgi", "asgi", "asgi-uvloop"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--run-aiohttp", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_inprocess:
        return run_inprocess(args.run_inprocess, args.port, args.workers[0])
    if args.run_aiohttp:
        return run_aiohttp(args.port, args.workers[0])
    if args.list:
        for n, spec in TARGETS.items():
            group, w = spec[0], spec[2]()
            print(f"{n:22} {group:5} {'missing: ' + w if w else 'available'}")
        return 0
    if args.quick:
        args.bodies, args.workers, args.conns = [13], [1], [64]
        args.rounds, args.duration, args.warmup = 1, 1, 0
    if any(x <= 0 for x in args.bodies + args.workers + args.conns) or args.rounds < 1 or \
            not 1 <= args.duration <= 600 or args.warmup < 0:
        ap.error("sizes, workers, conns, rounds and duration (<= 600 s) must be positive")
    data = run(args)
    md = markdown(data)
    print(md)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".json", "w") as f:
            json.dump(data, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
