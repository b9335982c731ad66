#!/usr/bin/env bash
# Writes the ABI baseline, bindings/abi/libshmipc.abi and bindings/abi/VERSION, from the
# built library; scripts/check-abi-baseline.sh compares every build with it.
#  - A compatible ABI (functions added, sized structs grown at the end) is recorded at once.
#  - An incompatible one is refused unless --incompatible is given and the release says so:
#    the version in meson.build must differ from bindings/abi/VERSION in its major number
#    (in its minor while the major is 0), and the SONAME must differ from the baseline's.
# Commit the two files with the change that needed them. See docs/abi.md.
#
# Usage: scripts/update-abi-baseline.sh [--incompatible] [--build DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build incompatible=0
while [[ $# -gt 0 ]]; do
  case $1 in
  --incompatible) incompatible=1; shift ;;
  --build) build=$2; shift 2 ;;
  *) echo "usage: $0 [--incompatible] [--build DIR]" >&2; exit 2 ;;
  esac
done
baseline=bindings/abi/libshmipc.abi
version_file=bindings/abi/VERSION
ninja -C "$build" >/dev/null

version=$(sed -n "s/^ *version: '\([^']*\)'.*/\1/p" meson.build | head -n1)
[[ -n $version ]] || { echo "update-abi-baseline: no version in meson.build" >&2; exit 1; }
release() { # the part of a version that changes with an incompatible release
  local major=${1%%.*} rest=${1#*.}
  if [[ $major == 0 ]]; then echo "0.${rest%%.*}"; else echo "$major"; fi
}
soname_of() { sed -n "s/.*<abi-corpus [^>]*soname='\([^']*\)'.*/\1/p" "$1" | head -n1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
scripts/check-abi-baseline.sh --build "$build" --dump "$tmp/new.abi"

compatible=1
[[ ! -f $baseline ]] || scripts/check-abi-baseline.sh --build "$build" >"$tmp/check.txt" 2>&1 \
  || compatible=0
if [[ $compatible -eq 0 ]]; then
  cat "$tmp/check.txt" >&2
  if [[ $incompatible -eq 0 ]]; then
    echo "update-abi-baseline: the change above is incompatible; the baseline stays." >&2
    echo "update-abi-baseline: to release it on purpose, bump the version and the SONAME," \
      "then run again with --incompatible (docs/abi.md)." >&2
    exit 1
  fi
  old_version=$(cat "$version_file")
  if [[ $(release "$version") == $(release "$old_version") ]]; then
    echo "update-abi-baseline: an incompatible change needs a new release: meson.build says" \
      "$version, the baseline $old_version" >&2
    exit 1
  fi
  if [[ $(soname_of "$tmp/new.abi") == $(soname_of "$baseline") ]]; then
    echo "update-abi-baseline: an incompatible change needs a new SONAME (soversion in" \
      "bindings/meson.build); it is still $(soname_of "$baseline")" >&2
    exit 1
  fi
  echo "update-abi-baseline: recording an incompatible ABI for $version"
fi

mkdir -p "$(dirname "$baseline")"
cp "$tmp/new.abi" "$baseline"
echo "$version" >"$version_file"
echo "update-abi-baseline: wrote $baseline ($(grep -c '<elf-symbol ' "$baseline") functions," \
  "$(soname_of "$baseline"), version $version)"
