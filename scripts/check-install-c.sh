#!/usr/bin/env bash
# The pkg-config route (issue 23): `meson install` of BUILD_DIR into a staging root, then the
# README's C example (examples/c/greeter_client.c) and its server built from outside the tree
# with nothing but `pkg-config --cflags --libs shmipc`, and one greeting run between them.
# Usage: scripts/check-install-c.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
tmp=$(mktemp -d /tmp/shmipc-pc.XXXXXX)
trap '[[ -n ${KEEP_TMP:-} ]] || rm -rf "$tmp"' EXIT

meson install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" >/dev/null
pcdir=$(dirname "$(find "$tmp/root" -name shmipc.pc | head -1)")
# The staged shmipc.pc names the real prefix; the sysroot variable maps it into the stage.
export PKG_CONFIG_PATH=$pcdir PKG_CONFIG_LIBDIR=$pcdir PKG_CONFIG_SYSROOT_DIR=$tmp/root
flags=$(pkg-config --cflags --libs shmipc)
cd "$tmp"
for prog in greeter_client greeter_server; do
  cp "$root/examples/c/$prog.c" .
  # shellcheck disable=SC2086
  cc -Wall -Wextra -Werror -o "$prog" "$prog.c" $flags
done
libdir=$PKG_CONFIG_SYSROOT_DIR$(PKG_CONFIG_SYSROOT_DIR='' pkg-config --variable=libdir shmipc)
readelf -d greeter_client | grep -q 'NEEDED.*libshmipc.so.0' || { echo "not linked to libshmipc"; exit 1; }
addr="unix:@shmipc-pc-$$"
LD_LIBRARY_PATH=$libdir ./greeter_server "$addr" 1 >server.log 2>&1 &
server=$!
ok=0
for _ in $(seq 50); do
  if LD_LIBRARY_PATH=$libdir ./greeter_client "$addr" >client.log 2>&1; then ok=1; break; fi
  sleep 0.1
done
wait "$server" || ok=0
cat client.log
if [[ $ok != 1 ]] || ! grep -q "server hello world" client.log; then cat server.log; exit 1; fi
echo "pkg-config route: built and ran greeter_client against greeter_server"
