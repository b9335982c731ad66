#!/usr/bin/env bash
# The pip route (issue 23), as a user takes it: a wheel built from a fresh clone with Debian's
# python3-build and python3-mesonpy (no PyPI), installed into a venv that sees the system's
# site packages (pytest, pytest-xdist), then the Python suite run against the installed package
# from a directory outside the clone, four tests at a time as scripts/test.sh runs it. The
# example programs the suite starts come from BUILD_DIR.
# Usage: scripts/check-install-python.sh [RESULTS_DIR [BUILD_DIR]]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
results=${1:-$root/build/test-results}
build=$(cd "${2:-$root/build}" && pwd)
mkdir -p "$results"
results=$(cd "$results" && pwd)
tmp=$(mktemp -d /tmp/shmipc-pip.XXXXXX)
trap '[[ -n ${KEEP_TMP:-} ]] || rm -rf "$tmp"' EXIT

# Only what is committed: a file missing from git fails here, as it would for a user.
git clone -q --no-checkout "$root" "$tmp/src"
git -C "$tmp/src" checkout -q "$(git -C "$root" rev-parse HEAD)"

/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
py=$tmp/venv/bin/python
(cd "$tmp/src" && "$py" -m build --wheel --no-isolation --outdir "$tmp/dist" . >"$tmp/build.log" 2>&1) ||
  { cat "$tmp/build.log"; exit 1; }
wheel=$(echo "$tmp"/dist/shmipc-*.whl)
version=$(sed -n "s/^  version: '\(.*\)',$/\1/p" "$root/meson.build")
[[ $(basename "$wheel") == shmipc-$version-* ]] || { echo "wheel $wheel is not version $version"; exit 1; }
listing=$("$py" -m zipfile -l "$wheel")
for f in shmipc/__init__.py shmipc/__init__.pyi shmipc/aio.py shmipc/aio.pyi shmipc/abi.pyi \
  shmipc/py.typed shmipc/__main__.py 'shmipc/_shmipc\..*\.so' 'shmipc/_serve\..*\.so' \
  shmipc/_serve.pyi \
  shmipc/serve/__init__.py shmipc/serve/__main__.py shmipc/serve/asgi.py shmipc/serve/inprocess.py shmipc/serve/worker.py \
  shmipc/serve/wsgi.py; do
  grep -Eq "^(shmipc-[^/]*\.data/purelib/)?$f " <<<"$listing" || { echo "wheel lacks $f"; exit 1; }
done
"$py" -m pip install -q --no-index --no-build-isolation "$wheel"

cd "$tmp"
unset PYTHONPATH
site=$("$py" -c 'import shmipc, os; print(os.path.dirname(shmipc.__file__))')
[[ $site == "$tmp/venv/"* ]] || { echo "shmipc imported from $site, not the venv"; exit 1; }
[[ $("$tmp/venv/bin/shmipc" --version) == "shmipc $version" ]]
env SHMIPC_TEST_INSTALLED=1 SHMIPC_BUILD_DIR="$build" "$py" -m pytest -q -p no:cacheprovider \
  -n 4 --junitxml="$results/python-installed.xml" "$tmp/src/tests/python"
