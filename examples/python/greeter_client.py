"""greeter_client: the shmipc-go helloworld client in Python. It sends
"client say hello world!!!" and reads "server hello world!!!", so it pairs with
examples/c/greeter_server, examples/python/greeter_server.py and Go's greeter_server.

Run from the repository after building (start a server first):
    PYTHONPATH=build/python python3 examples/python/greeter_client.py [ADDRESS [v2|v3]]
(default unix:/tmp/shmipc_greeter.sock, v3: memfd; v2 uses /dev/shm files as Go's default)
"""
import sys

import shmipc

REQUEST = b"client say hello world!!!"
REPLY = b"server hello world!!!"


def main(argv):
    address = argv[1] if len(argv) > 1 else "unix:/tmp/shmipc_greeter.sock"
    cfg = shmipc.Config(path_prefix="/dev/shm/client.ipc.shm", read_timeout=5.0)
    if len(argv) > 2 and argv[2] == "v2":
        cfg.memmap = "devshm"
    try:
        with shmipc.connect(address, cfg) as session, session.open_stream() as stream:
            print(f"client stream send request:{REQUEST.decode()} (protocol V{session.version})")
            stream.write(REQUEST)
            stream.flush()
            # Zero copy: the reply is read in place in shared memory, then given back.
            with stream.read_exact_bytes(len(REPLY)) as reply:
                print(f"client stream receive response {bytes(reply).decode()}")
                ok = reply == REPLY
    except shmipc.Error as e:
        print(f"greeter_client: {e.strerror} ({e.name})", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
