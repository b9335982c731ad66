#!/usr/bin/env bash
# Fails when a C file differs from .clang-format. Fix with: clang-format -i FILE
set -euo pipefail
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -co --exclude-standard -- '*.c' '*.h' | grep -v '^build')
else # an exported tree without git
  mapfile -t files < <(find . -path './build*' -prune -o -name '*.[ch]' -print | sed 's|^\./||')
fi
[[ ${#files[@]} -gt 0 ]] || { echo "format: no C files found" >&2; exit 1; }
clang-format --dry-run --Werror "${files[@]}"
echo "format: ${#files[@]} files clean"
