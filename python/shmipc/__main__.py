"""The shmipc command line: what a user reaches for first when something does not connect.

    python3 -m shmipc --version        the library's version (and the package's, if they differ)
    python3 -m shmipc info             versions, protocols, io_uring availability, knobs in force
    python3 -m shmipc ping ADDR        one round trip on a stream against an echo server
    python3 -m shmipc echo ADDR        an echo server that `ping` works against

Installed by pip as the `shmipc` script too. Exit codes: 0 success, 1 a failed round trip or
start, 2 a usage error (argparse). Errors are one line on stderr, never a traceback.
"""
import argparse
import os
import sys
import time

import shmipc

# The SHMIPC_* variables libshmipc reads (docs/runtime-config.md, the rows whose reader is
# libshmipc; tests/python/test_cli.py checks this list against that table).
LIBRARY_KNOBS = (
    "SHMIPC_LOG_LEVEL",
    "SHMIPC_SPIN_US",
    "SHMIPC_TCP_PATH_MEMORY",
    "SHMIPC_V4_PROBE_TIMEOUT_MS",
    "SHMIPC_V4_LEGACY_CACHE_MS",
    "SHMIPC_SIGBUS_GUARD",
    "SHMIPC_REACTOR_BACKEND",
    "SHMIPC_RX_EPOLL",
    "SHMIPC_WORKERS",
    "SHMIPC_REACTOR_BATCH_US",
    "SHMIPC_HTTP_HEADER_TIMEOUT_MS",
    "SHMIPC_HTTP_KEEPALIVE_TIMEOUT_MS",
    "SHMIPC_HTTP_KEEPALIVE_REQUESTS",
    "SHMIPC_HTTP_REUSEPORT",
)

# The longest timeout shmipc.Config takes (INT_MAX ms), and the largest ping payload (1 GiB).
MAX_TIMEOUT_S = 2147483.647
MAX_PING_SIZE = 1 << 30

# Wire protocols this library speaks, as the C ABI selects them (enum shmipc_memmap and
# enum shmipc_protocol in shmipc.h).
PROTOCOLS = (
    ("V2", "legacy, /dev/shm files (memmap='devshm')"),
    ("V3", "legacy, memfd passed over the unix socket (memmap='memfd', the default)"),
    ("V4", "negotiated; eventfd or event-queue polling wakeups (Config.set_protocol('v4'))"),
)


def io_uring_status():
    """(True, None) when a server can run on io_uring here, else (False, reason).

    It starts a one-worker server on a loopback port with the io_uring backend forced (which
    fails instead of falling back to epoll) and stops it again: the same set-up a real server
    does, so the answer covers seccomp filters, kernel.io_uring_disabled and old kernels."""
    try:
        server = shmipc.Server("127.0.0.1", 0, workers=1, backend="io_uring")
    except shmipc.Error as e:
        return False, str(e)
    try:
        server.start()
        return True, None
    except shmipc.Error as e:
        return False, str(e)
    finally:
        server.close()


def cmd_info(args):
    print(f"shmipc {shmipc.__version__} (library version number {shmipc.version_number})")
    print(f"module {shmipc.__file__}")
    print("protocols:")
    for name, what in PROTOCOLS:
        print(f"  {name}  {what}")
    ok, why = io_uring_status()
    if ok:
        print("io_uring: available")
    else:
        print(f"io_uring: not available ({why}); servers fall back to epoll")
    inforce = [(k, os.environ[k]) for k in LIBRARY_KNOBS if k in os.environ]
    if inforce:
        print("knobs in force:")
        for k, v in inforce:
            print(f"  {k}={v}")
    else:
        print("knobs in force: none (every SHMIPC_* setting at its default)")
    return 0


def fail(what, err):
    print(f"shmipc: {what}: {err}", file=sys.stderr)
    return 1


def cmd_ping(args):
    payload = os.urandom(args.size)
    cfg = shmipc.Config(read_timeout=args.timeout, initialize_timeout=args.timeout)
    start = time.perf_counter()
    try:
        session = shmipc.connect(args.address, cfg)
    except (shmipc.Error, OSError) as e:
        return fail(f"cannot connect to {args.address}", e)
    connected = time.perf_counter()
    try:
        print(f"connected to {args.address}: protocol V{session.version}, "
              f"{(connected - start) * 1e3:.3f} ms")
        for i in range(args.count):
            stream = session.open_stream()
            try:
                t0 = time.perf_counter()
                stream.write(payload)
                stream.flush()
                got = stream.readexactly(len(payload))
                t1 = time.perf_counter()
            finally:
                stream.close()
            if got != payload:
                return fail(f"ping {args.address}", "the echo differs from what was sent "
                            "(is it an echo server? `python3 -m shmipc echo ADDR` is one)")
            print(f"{len(payload)} bytes round trip {i + 1}: {(t1 - t0) * 1e6:.1f} us")
    except (shmipc.Error, OSError) as e:
        return fail(f"ping {args.address}", f"{e} (is it an echo server? "
                    "`python3 -m shmipc echo ADDR` is one)")
    finally:
        session.close()
    return 0


def cmd_echo(args):
    def on_data(st):
        try:
            while True:
                chunk = st.read_chunk(nonblock=True)
                if chunk is None:
                    return
                if not chunk:
                    break
                st.write(chunk)
                chunk.release()
                st.flush()
        except shmipc.Error:
            pass  # the client went away
        st.close()

    try:
        listener = shmipc.Listener(args.address)
    except (shmipc.Error, OSError) as e:
        return fail(f"cannot listen on {args.address}", e)
    print(f"echoing on {args.address}", flush=True)
    try:
        listener.serve(lambda st: None, on_data)
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="shmipc" if argv is None and not sys.argv[0].endswith(
        "__main__.py") else "python3 -m shmipc",
        description="shmipc: shared-memory IPC and an io_uring/epoll HTTP server.")
    p.add_argument("--version", action="version", version=f"shmipc {shmipc.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("info", help="versions, protocols, io_uring availability, knobs in force")
    ping = sub.add_parser("ping", help="connect to ADDR and time round trips on a stream "
                          "against an echo server")
    ping.add_argument("address", metavar="ADDR", help="e.g. unix:/tmp/x.sock or unix:@name")
    ping.add_argument("-c", "--count", type=int, default=1, help="round trips (default 1)")
    ping.add_argument("-s", "--size", type=int, default=64,
                      help="bytes each, 1 .. 1073741824 (default 64)")
    ping.add_argument("-t", "--timeout", type=float, default=5.0,
                      help="seconds to wait for the connection and each echo, up to "
                      "2147483.647 (default 5)")
    echo = sub.add_parser("echo", help="serve ADDR, echoing every stream (for ping)")
    echo.add_argument("address", metavar="ADDR")
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 2
    if args.command == "ping" and (args.count < 1 or args.size < 1 or args.timeout <= 0):
        p.error("--count and --size must be at least 1, --timeout positive")
    # What shmipc.Config takes as a timeout, and a payload this process can make: else the
    # library or os.urandom raised, a traceback.
    if args.command == "ping" and not args.timeout <= MAX_TIMEOUT_S:
        p.error(f"--timeout must be at most {MAX_TIMEOUT_S} seconds")
    if args.command == "ping" and args.size > MAX_PING_SIZE:
        p.error(f"--size must be at most {MAX_PING_SIZE} bytes")
    try:
        return {"info": cmd_info, "ping": cmd_ping, "echo": cmd_echo}[args.command](args)
    except BrokenPipeError:
        # `shmipc info | head -1`: the reader left; exit quietly as other tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
