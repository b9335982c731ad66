#!/usr/bin/env bash
# The luarocks route (issue 23): `luarocks --lua-version 5.4 make --tree DIR` in a fresh clone
# (Debian's luarocks and liblua5.4-dev), then the Lua suite run against that tree from outside
# the clone. The peer programs the suite starts come from BUILD_DIR.
# Usage: scripts/check-install-lua.sh [RESULTS_DIR [BUILD_DIR]]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
results=${1:-$root/build/test-results}
build=$(cd "${2:-$root/build}" && pwd)
mkdir -p "$results"
results=$(cd "$results" && pwd)
tmp=$(mktemp -d /tmp/shmipc-rock.XXXXXX)
trap '[[ -n ${KEEP_TMP:-} ]] || rm -rf "$tmp"' EXIT

git clone -q --no-checkout "$root" "$tmp/src"
git -C "$tmp/src" checkout -q "$(git -C "$root" rev-parse HEAD)"

# The rockspec's version is the meson project's, and its sources are meson's.
version=$(sed -n "s/^  version: '\(.*\)',$/\1/p" "$root/meson.build")
spec=$tmp/src/shmipc-$version-1.rockspec
[[ -f $spec ]] || { echo "no shmipc-$version-1.rockspec for meson version $version"; exit 1; }
want=$(cd "$tmp/src" && for f in lua/meson.build bindings/meson.build core/meson.build; do
  grep -o "'[a-z_/0-9]*\.c'" "$f" | tr -d "'" | sed "s|^|${f%/meson.build}/|"; done | sort)
got=$(grep -o '"[a-z_/0-9]*\.c"' "$spec" | tr -d '"' | sort)
[[ $want == "$got" ]] || { echo "rockspec sources differ from meson's:"; diff <(echo "$want") <(echo "$got"); exit 1; }

(cd "$tmp/src" && luarocks --lua-version 5.4 make --tree "$tmp/tree" "$spec" >"$tmp/build.log" 2>&1) ||
  { cat "$tmp/build.log"; exit 1; }

cd "$tmp"
unset LUA_PATH LUA_CPATH LUA_INIT LUA_PATH_5_4 LUA_CPATH_5_4
eval "$(luarocks --lua-version 5.4 path --tree "$tmp/tree")"
where=$(lua5.4 -e 'print(package.searchpath("shmipc", package.cpath))')
[[ $where == "$tmp/tree/"* ]] || { echo "shmipc found at $where, not in the rocks tree"; exit 1; }
SHMIPC_TEST_INSTALLED=1 SHMIPC_BUILD_DIR="$build" lua5.4 "$tmp/src/tests/lua/harness.lua" |
  tee "$results/lua-installed.txt"
