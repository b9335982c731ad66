#!/usr/bin/env bash
# Installs what is missing, builds, and runs the demo: the shmipc-go "helloworld" greeter in C,
# a server and a client talking over protocol V3 (memfd), V2 (/dev/shm files) and V4 (socket,
# eventfd and polling wakeups), then the config builder from Python and Lua.
# Usage: scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build

sock="unix:/tmp/shmipc-demo-$$.sock"
echo "== C: examples/c/greeter_server.c and greeter_client.c on $sock"
build/examples/c/greeter_server "$sock" 5 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do [[ -S ${sock#unix:} ]] && break; sleep 0.1; done
for mode in v3 v2 v4 v4-eventfd v4-polling; do
  build/examples/c/greeter_client "$sock" $mode
done
wait $server
trap - EXIT

echo "== C: examples/c/config_explain.c (what a client with a config would create)"
build/examples/c/config_explain capacity=1048576 slices=16364:40,4076:60 queue=1024 memmap=devshm
echo "== Python: examples/python/config.py"
PYTHONPATH=build/python /usr/bin/python3 examples/python/config.py
echo "== Lua: examples/lua/config.lua"
LUA_CPATH="build/lua/?.so;;" lua5.4 examples/lua/config.lua
