#!/usr/bin/env bash
# Configures (once) and builds a tree. Usage: scripts/build.sh [BUILD_DIR [meson options...]]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
if [[ -f "$dir/build.ninja" ]]; then
  [[ $# -eq 0 ]] || meson configure "$dir" "$@" >/dev/null
else
  meson setup "$dir" "$@" >/dev/null
fi
ninja -C "$dir" >/dev/null || ninja -C "$dir"
