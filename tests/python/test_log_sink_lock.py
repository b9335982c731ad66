"""Issue 19 item 3: no log sink runs with a library lock held, from Python.

Thread A blocks in accept_stream; the peer goes away, and A's session logs. The Python sink
(it needs the GIL) waits until thread B, holding the GIL, is about to call into the same
session with a call that takes the session lock and keeps the GIL (session_process). If the sink
ran under the session lock (the old code), B waits for the lock with the GIL held and the
sink waits for the GIL: a deadlock. The scenario runs in a subprocess with a timeout, so a
deadlock fails the test instead of hanging the suite.
"""
import os
import subprocess
import sys

import shmipc

SCENARIO = r"""
import os, sys, threading, time
import shmipc.abi as a

rc, cfg = a.call('shmipc_config_new')
addr = f'unix:@shmipc-pysinklock-{os.getpid()}'
rc, lst = a.call('shmipc_listener_new', addr, cfg)
assert rc == 0, rc
box = {}
t = threading.Thread(target=lambda: box.update(r=a.call('shmipc_listener_accept', lst, 10000)))
t.start()
rc, client = a.call('shmipc_session_connect', addr, cfg)
t.join()
assert rc == 0, rc
rc, server = box['r']
assert rc == 0, rc

in_sink = threading.Event()
b_calling = threading.Event()
result = {}

def sink(level, line):
    if threading.current_thread() is thread_a and not in_sink.is_set():
        in_sink.set()
        b_calling.wait(10)
        # Sleeping drops the GIL: B takes it and enters session_process. Returning from here
        # needs the GIL back, which B keeps while it waits for the session lock (old code).
        time.sleep(0.5)

def accept():
    result['accept'] = a.call('shmipc_session_accept_stream', server, 10000)

a.call('shmipc_set_log_sink', sink)
thread_a = threading.Thread(target=accept)
thread_a.start()
time.sleep(0.2)  # A is blocked in accept_stream
a.call('shmipc_session_close', client)  # A's session finds EOF and logs
if not in_sink.wait(10):
    print('thread A never logged', file=sys.stderr)
    sys.exit(3)
b_calling.set()
rc = a.call('shmipc_session_process', server)  # holds the GIL, takes the session lock
thread_a.join(10)
assert not thread_a.is_alive()
a.call('shmipc_set_log_sink', None)
a.call('shmipc_session_close', server)
a.call('shmipc_listener_close', lst)
print('ok', rc)
"""


def test_python_log_sink_and_gil_holder_do_not_deadlock():
    env = dict(os.environ, SHMIPC_LOG_LEVEL="debug",
               PYTHONPATH=os.path.dirname(os.path.dirname(shmipc.__file__)))
    try:
        r = subprocess.run([sys.executable, "-c", SCENARIO], env=env, capture_output=True,
                           text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("deadlock: the log sink ran under the session lock while a "
                             "thread holding the GIL waited for that lock") from None
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok"), r.stdout
