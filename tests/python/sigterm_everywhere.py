"""``python sigterm_everywhere.py MODULE ARGS...`` runs ``python -m MODULE ARGS...``; from the
first run of MODULE's Python SIGTERM handler on (send the first SIGTERM from outside), it sends
itself a SIGTERM at each point (call, line, return) the main thread passes once: in that
first handler run, and then in everything the main thread runs until MODULE returns. So a
SIGTERM lands at any instant of the stop path: inside the handler of the one before, inside
the code that handler interrupted. A supervisor killed with SIGKILL can send its workers more
than one: the kernel sends the parent-death signal each time a thread of it that holds the
workers exits and hands them to the next.

CPython runs a Python handler on the main thread at the next point where it checks for
signals, whatever that thread is doing: a handler that takes a lock the interrupted code holds
(threading.Event.set() inside an Event.set() or an Event.wait()) waits for it forever, and so
does the process. A SIGTERM sent here is handled at once, inside this trace function, at the
very point traced; tracing starts in the first handler run (not before: a handler run inside
the trace function is not traced). Used by the tests of the Python worker and of
``python -m shmipc.serve``. Prints ``sigterm_everywhere: N sent, M inside the handler`` to
stderr when MODULE returns.
"""
import os
import runpy
import signal
import sys

depth = 0  # handler runs in progress on the main thread
seen = set()
sent = [0, 0]  # outside the handler, inside its first run


def trace(frame, event, arg):
    if depth > 1:
        return trace  # a handler run inside another: that one has its signals
    key = (frame.f_code, frame.f_lineno, event, depth)
    if key not in seen:
        seen.add(key)
        sent[depth] += 1
        os.kill(os.getpid(), signal.SIGTERM)
    return trace


def wrapping_signal(signum, handler, _signal=signal.signal):
    if signum == signal.SIGTERM and callable(handler):
        inner = handler

        def handler(signum, frame):
            global depth
            depth += 1
            try:
                if sys.gettrace() is None:
                    sys.settrace(trace)  # the first run: traced from its next call on
                return inner(signum, frame)
            finally:
                depth -= 1

    return _signal(signum, handler)


def run_and_stop(args, ready, what, min_sent, min_inside, **popen):
    """For the tests: runs ``python sigterm_everywhere.py ARGS...`` (with faulthandler), waits
    for the line containing `ready` on its stdout, sends it SIGTERM, and fails the test unless
    it ends within 20 s with exit 0 after at least `min_sent` SIGTERMs of its own, `min_inside`
    of them inside the handler (on a hang, faulthandler's stacks are in the failure)."""
    import re
    import subprocess

    import pytest

    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.Popen([sys.executable, "-X", "faulthandler", os.path.join(here, __name__ + ".py"),
                          *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         **popen)
    try:
        assert ready in p.stdout.readline()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)  # faulthandler prints where it waits
        _, err = p.communicate()
        pytest.fail(f"{what} did not end on SIGTERM: " + err[-3000:])
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err[-2000:]
    sent = re.findall(r"sigterm_everywhere: (\d+) sent, (\d+) inside the handler", err)
    assert sent and int(sent[0][0]) >= min_sent and int(sent[0][1]) >= min_inside, err[-2000:]


if __name__ == "__main__":
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    signal.signal = wrapping_signal
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.settrace(None)
        print(f"sigterm_everywhere: {sent[0]} sent, {sent[1]} inside the handler", file=sys.stderr,
              flush=True)
