#!/usr/bin/env bash
# Description: the npm `ws` client against examples/c/ws_echo on each backend (issue 6); see
# interop.js for the cases. Installs `ws` with npm into WORK_DIR (kept for the next run); a
# `ws` that node already finds (Debian: node-ws, which scripts/deps.sh installs) serves when
# npm is missing.
# Usage: tests/ws_interop/run.sh WS_ECHO WORK_DIR   (exit 0 pass, 1 fail, 77 skip)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[[ $# -eq 2 ]] || { echo "usage: $0 WS_ECHO WORK_DIR" >&2; exit 2; }
echo_bin=$1
work=$2

if ! command -v node >/dev/null 2>&1; then
  echo "skip: node not found (Debian: apt-get install nodejs node-ws; or npm)"
  exit 77
fi
mkdir -p "$work"
# Debian's node-ws lives in /usr/share/nodejs, which Debian's node searches and other builds
# of node (NodeSource) do not.
export NODE_PATH="$work/node_modules:/usr/share/nodejs"
if [[ -f "$work/node_modules/ws/package.json" ]]; then
  : # installed by an earlier run
elif command -v npm >/dev/null 2>&1; then
  if ! npm install --prefix "$work" --cache "$work/npm-cache" --no-audit --no-fund --no-save \
      --loglevel=error ws@8; then
    echo "skip: npm install ws failed (is the npm registry reachable?)"
    exit 77
  fi
elif ! node -e "require('ws')" >/dev/null 2>&1; then
  echo "skip: npm not found and node finds no ws module (Debian: apt-get install node-ws)"
  exit 77
fi
echo "node $(node --version), ws $(node -p "require('ws/package.json').version")"
for backend in epoll io_uring; do
  node "$here/interop.js" "$echo_bin" --backend "$backend"
done
