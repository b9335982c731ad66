#!/usr/bin/env bash
# The Debian route (issue 23): `dpkg-buildpackage -us -uc -b` on a copy of the committed tree
# (so no build artifact lands in the clone; suites off: DEB_BUILD_OPTIONS=nocheck, they run
# elsewhere in scripts/test.sh), the five packages installed with apt-get, a smoke test from
# /tmp with no build tree in reach (Python, Lua, a C program linked via pkg-config, the
# benchmarks), and the packages purged again so later steps test the build tree. As root or with sudo.
# Usage: scripts/check-install-deb.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/shmipc-deb.XXXXXX)
packages=(libshmipc0 libshmipc-dev python3-shmipc lua-shmipc shmipc-tools)
export DEBIAN_FRONTEND=noninteractive
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
cleanup() {
  "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=300 purge -y -q "${packages[@]}" >/dev/null 2>&1 || true
  [[ -n ${KEEP_TMP:-} ]] || rm -rf "$tmp"
}
trap cleanup EXIT

mkdir "$tmp/src"
git -C "$root" archive HEAD | tar -x -C "$tmp/src"
(cd "$tmp/src" && DEB_BUILD_OPTIONS="nocheck noddebs parallel=$(nproc)" \
  dpkg-buildpackage -us -uc -b >"$tmp/build.log" 2>&1) || { tail -40 "$tmp/build.log"; exit 1; }
debs=()
for p in "${packages[@]}"; do
  deb=$(echo "$tmp/${p}_"*.deb)
  [[ -f $deb ]] || { echo "no $p package built"; exit 1; }
  debs+=("$deb")
done
ls -l "${debs[@]}"
"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${debs[@]}" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; exit 1; }

# The smoke test: a new shell in /tmp, nothing pointing at a build tree.
mkdir "$tmp/smoke"
cp "$root/examples/c/greeter_client.c" "$root/examples/c/greeter_server.c" "$tmp/smoke/"
cd "$tmp/smoke"
# shellcheck disable=SC2016 # the script's $ expand in the inner shell
env -u PYTHONPATH -u LUA_PATH -u LUA_CPATH -u SHMIPC_BUILD_DIR -u LD_LIBRARY_PATH bash -euo pipefail -c '
  where=$(/usr/bin/python3 -c "import shmipc; print(shmipc.__file__)")
  [[ $where == /usr/lib/python3/dist-packages/shmipc/* ]] || { echo "python: $where"; exit 1; }
  /usr/bin/python3 -m shmipc --version
  /usr/bin/python3 -c "import shmipc.aio"
  lua5.4 -e "local s = require \"shmipc\"; print(\"lua\", package.searchpath(\"shmipc\", package.cpath))"
  for p in greeter_client greeter_server; do
    cc -Wall -Werror -o $p $p.c $(pkg-config --cflags --libs shmipc)
  done
  addr=unix:@shmipc-deb-$$
  ./greeter_server $addr 1 >server.log 2>&1 &
  for _ in $(seq 50); do ./greeter_client $addr >client.log 2>&1 && break; sleep 0.1; done
  wait $!
  grep "server hello world" client.log
  /usr/bin/python3 -m shmipc echo unix:@shmipc-deb-echo-$$ >echo.log &
  echo_pid=$!
  for _ in $(seq 50); do grep -q echoing echo.log && break; sleep 0.1; done
  /usr/bin/python3 -m shmipc ping unix:@shmipc-deb-echo-$$
  kill $echo_pid
  command -v shmipc-bench shmipc-bench-http shmipc-bench-ws shmipc-serve shmipc-serve-worker
  shmipc-serve --version
'
dpkg-query -W "${packages[@]}"
echo "debian route: ${packages[*]} built, installed, smoke-tested"
