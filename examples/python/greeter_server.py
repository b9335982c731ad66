"""greeter_server: the shmipc-go helloworld server in Python. It accepts a client, reads
"client say hello world!!!" from its first stream and answers "server hello world!!!".
examples/c/greeter_client, examples/python/greeter_client.py and Go's greeter_client all
work with it, over V2 (/dev/shm files) or V3 (memfd).

Run from the repository after building:
    PYTHONPATH=build/python python3 examples/python/greeter_server.py [ADDRESS [SESSIONS]]
(default unix:/tmp/shmipc_greeter.sock, 1 session; Ctrl-C stops it while it waits)
"""
import sys

import shmipc

REQUEST = b"client say hello world!!!"
REPLY = b"server hello world!!!"


def serve(session):
    with session.accept_stream(timeout=5.0) as stream:
        # Streams are byte streams: read exactly the request's length, as the Go server does.
        request = stream.readexactly(len(REQUEST))
        print(f"server receive request message:{request.decode()}")
        stream.write(REPLY)
        stream.flush()
        print(f"server reply response: {REPLY.decode()}")
        # Wait for the client to hang up before closing, so the reply is surely read.
        try:
            while stream.read():
                pass
        except shmipc.PeerGoneError:
            pass


def main(argv):
    address = argv[1] if len(argv) > 1 else "unix:/tmp/shmipc_greeter.sock"
    sessions = int(argv[2]) if len(argv) > 2 else 1
    status = 0
    with shmipc.Listener(address) as listener:
        print(f"greeter_server: listening on {address}", flush=True)
        for _ in range(sessions):
            try:
                with listener.accept(timeout=30.0) as session:
                    print(f"greeter_server: session with protocol V{session.version}")
                    serve(session)
            except shmipc.Error as e:
                print(f"greeter_server: {e.strerror} ({e.name})", file=sys.stderr)
                status = 1
            sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
