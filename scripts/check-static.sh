#!/usr/bin/env bash
# Static analysis of the library (core/ and bindings/) and of shmipc-serve's serve/ with cppcheck;
# clean means no finding.
set -euo pipefail
cd "$(dirname "$0")/.."
cppcheck --quiet --error-exitcode=1 --std=c11 --enable=warning,performance,portability \
  --inline-suppr -D_GNU_SOURCE -D__linux__ -DSHMIPC_BUILDING_LIBRARY -I bindings -I core \
  --suppress=missingIncludeSystem core bindings serve
echo "static: cppcheck clean over core/, bindings/ and serve/"
