#!/usr/bin/env bash
# Fails when the ABI of the built libshmipc.so is incompatible with the committed baseline
# bindings/abi/libshmipc.abi (abidw/abidiff from Debian's abigail-tools): a function removed,
# a parameter or return type changed, a public type changed. Added functions are listed and
# allowed, and so is a sized struct (scripts/check-abi-structs.py) that grows at its end.
# An intended incompatible change needs a version bump and a new baseline: docs/abi.md, and
# scripts/update-abi-baseline.sh, which uses `--dump FILE` to write the current ABI.
#
# Usage: check-abi-baseline.sh [--build DIR] [--dump FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build dump=
while [[ $# -gt 0 ]]; do
  case $1 in
  --build) build=$2; shift 2 ;;
  --dump) dump=$2; shift 2 ;;
  *) echo "usage: $0 [--build DIR] [--dump FILE]" >&2; exit 2 ;;
  esac
done
lib=$build/bindings/libshmipc.so
baseline=bindings/abi/libshmipc.abi
die() { echo "abi-baseline: $*" >&2; exit 1; }
for tool in abidw abidiff; do
  command -v $tool >/dev/null || die "$tool is missing (scripts/deps.sh installs abigail-tools)"
done
[[ -f $lib ]] || die "$lib is missing: build first"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The public interface only: types defined in shmipc.h, functions exported; no paths, line
# numbers or DT_NEEDED entries, so that the baseline changes only when the ABI does.
abidw --headers-dir bindings --drop-private-types --exported-interfaces-only \
  --no-corpus-path --no-comp-dir-path --no-show-locs --no-elf-needed --no-architecture \
  --type-id-style hash --out-file "$tmp/current.abi" "$lib"
if [[ -n $dump ]]; then
  cp "$tmp/current.abi" "$dump"
  exit 0
fi
[[ -f $baseline ]] || die "no $baseline: run scripts/update-abi-baseline.sh"

# Sized structs may gain fields at their end.
: >"$tmp/grow.suppr"
for name in $(scripts/check-abi-structs.py --list-sized); do
  printf '[suppress_type]\n  type_kind = struct\n  name = %s\n' "$name" >>"$tmp/grow.suppr"
  printf '  has_data_member_inserted_at = end\n' >>"$tmp/grow.suppr"
done

# The verdict ignores additions; the full report is shown when it is not clean.
rc=0
abidiff --no-added-syms --suppressions "$tmp/grow.suppr" "$baseline" "$tmp/current.abi" \
  >"$tmp/verdict.txt" 2>&1 || rc=$?
abidiff --suppressions "$tmp/grow.suppr" "$baseline" "$tmp/current.abi" >"$tmp/report.txt" 2>&1 \
  || true
added=$(grep -c "^  \[A\] " "$tmp/report.txt" || true)
if [[ $rc -ne 0 ]]; then
  cat "$tmp/verdict.txt" >&2
  echo "abi-baseline: libshmipc.so is not compatible with $baseline (abidiff exit $rc)." >&2
  echo "abi-baseline: restore compatibility, or make an incompatible release deliberately:" \
    "docs/abi.md, 'Changing the ABI'." >&2
  exit 1
fi
if [[ $added -gt 0 ]]; then
  sed -n 's/^  \[A\] /abi-baseline: added since the baseline: /p' "$tmp/report.txt"
fi
echo "abi-baseline: compatible with $baseline (version $(cat bindings/abi/VERSION));" \
  "$added functions added since"
