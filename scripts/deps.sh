#!/usr/bin/env bash
# Installs the Debian packages shmipc needs that are missing; quick when all are present.
# Usage: scripts/deps.sh            (as root, or with sudo available)
#        scripts/deps.sh bench      also the "bench" group: the load generator and the peer
#                                   servers of bench/serve_bench.py (CI does not install it)
set -euo pipefail

packages=(
  gcc pkg-config meson ninja-build          # build
  libcmocka-dev                             # C tests
  liburing-dev                              # io_uring reactor backend
  libffi-dev                                # generic calls and callbacks from scripts
  python3 python3-dev python3-pytest        # import shmipc and its tests
  python3-pytest-xdist                      # the Python suite four tests at a time (-n 4)
  lua5.4 liblua5.4-dev lua-socket           # require "shmipc", its tests and benchmark
  clang-format cppcheck                     # format and static-analysis checks
  abigail-tools                             # ABI baseline: abidw, abidiff
  clang libclang-rt-14-dev                  # fuzz/: clang and its libFuzzer runtime (not a dependency of clang)
)
# The install routes of issue 23 (scripts/check-install-*.sh): pip into a venv with meson-python
# (no PyPI), luarocks, and dpkg-buildpackage with debhelper.
# patchelf: meson-python asks for it to build a wheel with an extension (a Recommends of
# python3-mesonpy, so --no-install-recommends leaves it out; without it the wheel build stops
# with "Missing dependencies: patchelf>=0.11.0").
packages+=(python3-venv python3-mesonpy python3-build patchelf luarocks dpkg-dev debhelper dh-python)
# tests/ws_interop (issue 6): node and Debian's `ws` for the interop test, offline (20 packages,
# 12 MB on a fresh Debian 12). Not npm: it pulls in 355 packages; the test uses it when present.
packages+=(nodejs node-ws)
# The "bench" group, only on request: wrk and the application servers bench/serve_bench.py
# measures ours against (a missing one is skipped there, never a failure).
if [[ ${1:-} == bench ]]; then
  packages+=(wrk gunicorn uwsgi uwsgi-plugin-python3 python3-uvicorn python3-uvloop python3-aiohttp)
elif [[ $# -gt 0 ]]; then
  echo "usage: scripts/deps.sh [bench]" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "deps: installing ${missing[*]}" >&2
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
install() { "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"; }
# Refresh the package lists only when the install cannot find what it needs.
if ! install >/dev/null 2>&1; then
  "${sudo[@]}" apt-get update -q
  install
fi
