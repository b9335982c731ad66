#!/usr/bin/env bash
# Installs what is missing, builds, and runs the demo. Until sessions and streams land
# (issue 3), the demo runs the examples that exist: the config builder from C, Python and Lua.
# Usage: scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build

echo "== C: examples/c/config_explain.c (defaults, then a small V2 buffer)"
build/examples/c/config_explain
build/examples/c/config_explain capacity=1048576 slices=16364:40,4076:60 queue=1024 memmap=devshm
echo "== C: a refused value"
build/examples/c/config_explain queue=8 || true
echo "== Python: examples/python/config.py"
PYTHONPATH=build/python /usr/bin/python3 examples/python/config.py
echo "== Lua: examples/lua/config.lua"
LUA_CPATH="build/lua/?.so;;" lua5.4 examples/lua/config.lua
