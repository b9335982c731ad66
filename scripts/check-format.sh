#!/usr/bin/env bash
# Fails when a C file differs from .clang-format. Fix with: clang-format -i FILE
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.c' '*.h' | grep -v '^build')
clang-format --dry-run --Werror "${files[@]}"
echo "format: ${#files[@]} files clean"
