"""http_app: a small JSON API on shmipc.Server, the Python twin of examples/c/http_json_api.c.

    GET    /health        {"status":"ok"}               (a static response, served in C)
    GET    /items         [{"id":1,"item":{...}},...]   (?name=x filters on item["name"])
    POST   /items         stores the JSON object sent; 201 {"id":N,"count":M}
    GET    /items/<id>    the item, or 404 {"error":"no such item"}
    DELETE /items/<id>    204, or 404

Run from the repository after building:
    PYTHONPATH=build/python python3 examples/python/http_app.py [PORT [WORKERS]]
    curl -s -d '{"name":"apple"}' http://127.0.0.1:8080/items
    curl -s http://127.0.0.1:8080/items/1
(PORT 0 picks a free port; it prints "listening on PORT"; Ctrl-C stops it gracefully.)

Handlers run on the server's worker threads, several at once with several workers (each
holding the GIL while it runs), so the store is guarded by a lock.
"""
import sys
import threading

import shmipc
from shmipc import Response


class Store:
    def __init__(self):
        self.lock = threading.Lock()
        self.items = {}
        self.next_id = 1

    def add(self, item):
        with self.lock:
            item_id = self.next_id
            self.next_id += 1
            self.items[item_id] = item
            return item_id, len(self.items)


def make_server(port=8080, workers=1):
    store = Store()
    server = shmipc.Server(port=port, workers=workers)
    server.static("/health", '{"status":"ok"}', content_type="application/json")

    @server.route("GET", "/items")
    def list_items(req):
        name = req.args.get("name", [None])[0]
        with store.lock:
            return [{"id": i, "item": it} for i, it in sorted(store.items.items())
                    if name is None or it.get("name") == name]

    @server.route("POST", "/items")
    def create(req):
        try:
            item = req.json()
        except ValueError:
            return {"error": "the body is not JSON"}, 400
        if not isinstance(item, dict):
            return {"error": "send a JSON object"}, 400
        item_id, count = store.add(item)
        return Response.json({"id": item_id, "count": count}, status=201,
                             headers={"Location": f"/items/{item_id}"})

    def lookup(req):
        try:
            return int(req.wildcard)
        except ValueError:
            return None

    @server.route("GET", "/items/*")
    def fetch(req):
        item_id = lookup(req)
        with store.lock:
            if item_id in store.items:
                return {"id": item_id, "item": store.items[item_id]}
        return {"error": "no such item"}, 404

    @server.route("DELETE", "/items/*")
    def delete(req):
        with store.lock:
            if store.items.pop(lookup(req), None) is not None:
                return None  # 204
        return {"error": "no such item"}, 404

    return server


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    with make_server(port, workers) as server:
        server.start()
        print(f"listening on {server.port} ({server.backend})", flush=True)
        try:
            server.run()  # until Ctrl-C (or SIGTERM, below)
        except KeyboardInterrupt:
            pass
    print("stopped", flush=True)


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
    main()
