"""ws_echo: a WebSocket echo server on shmipc.Server.

Every message comes back as it was sent (text as text, binary as binary); the text "stats"
is answered with what this connection has seen so far, kept as attributes of its
shmipc.WebSocket. The subprotocol "echo.v1" is offered. GET /ws without an upgrade is
answered by a plain route on the same path, and GET / by a static page.

Run from the repository after building:
    PYTHONPATH=build/python python3 examples/python/ws_echo.py [PORT]
(PORT 0 picks a free port; it prints "listening on PORT"; Ctrl-C stops it gracefully.)
Try it from a browser console:
    ws = new WebSocket("ws://127.0.0.1:8080/ws", "echo.v1");
    ws.onmessage = (e) => console.log(e.data); ws.onopen = () => ws.send("hello");
"""
import sys

import shmipc


def make_server(port=8080):
    server = shmipc.Server(port=port, workers=1)
    server.static("/", "ws_echo: connect a WebSocket to /ws\n")
    server.route("GET", "/ws", lambda req: ("upgrade to a WebSocket here\n", 426))

    def on_open(ws, req):
        ws.messages = 0
        ws.bytes = 0
        return True  # False (or raising) refuses the upgrade with 403

    @server.websocket("/ws", on_open=on_open, subprotocols=["echo.v1"])
    def on_message(ws, data):
        ws.messages += 1
        ws.bytes += len(data)
        if data == "stats":
            ws.send(f"messages={ws.messages} bytes={ws.bytes} subprotocol={ws.subprotocol}")
        else:
            ws.send(data)

    return server


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    with make_server(port) as server:
        server.start()
        print(f"listening on {server.port} ({server.backend})", flush=True)
        try:
            server.run()
        except KeyboardInterrupt:
            pass
    print("stopped", flush=True)


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main()
