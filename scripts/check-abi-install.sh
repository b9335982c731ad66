#!/usr/bin/env bash
# Fails unless `meson install` installs what a C user needs: the library (with its SONAME
# link and the development link), the public headers (shmipc.h, and shmipc_abi.h and
# shmipc_serve.h beside it)
# and a pkg-config file with which a C example builds. examples/c/greeter_client.c is
# compiled against a DESTDIR copy with `pkg-config --cflags --libs shmipc`, run against the
# installed library, and must fail cleanly because nobody listens on the address it is given;
# a program that includes only <shmipc_abi.h> builds with the same flags and reads the table.
#
# Usage: check-abi-install.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
die() { echo "abi-install: $*" >&2; exit 1; }

[[ -f $build/build.ninja ]] || die "$build is not configured: build first"
meson install -C "$build" --destdir "$root" --no-rebuild --tags runtime,devel \
  >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log" >&2; die "meson install failed"; }

pc=$(find "$root" -name shmipc.pc -print -quit)
header=$(find "$root" -path '*/include/shmipc.h' -print -quit)
abi_header=$(find "$root" -path '*/include/shmipc_abi.h' -print -quit)
serve_header=$(find "$root" -path '*/include/shmipc_serve.h' -print -quit)
lib=$(find "$root" -name libshmipc.so.0 -print -quit)
[[ -n $pc ]] || die "no shmipc.pc was installed"
[[ -n $header ]] || die "no include/shmipc.h was installed"
[[ -n $abi_header ]] || die "no include/shmipc_abi.h was installed"
[[ -n $serve_header ]] || die "no include/shmipc_serve.h was installed"
[[ $(dirname "$serve_header") == "$(dirname "$header")" ]] \
  || die "shmipc_serve.h is not installed beside shmipc.h: $serve_header"
[[ $(dirname "$abi_header") == "$(dirname "$header")" ]] \
  || die "shmipc_abi.h is not installed beside shmipc.h: $abi_header"
[[ -n $lib ]] || die "no libshmipc.so.0 was installed"
[[ -e $(dirname "$lib")/libshmipc.so ]] || die "no libshmipc.so development link was installed"
cmp -s "$header" bindings/shmipc.h || die "the installed shmipc.h differs from bindings/shmipc.h"
cmp -s "$abi_header" bindings/shmipc_abi.h \
  || die "the installed shmipc_abi.h differs from bindings/shmipc_abi.h"
cmp -s "$serve_header" bindings/shmipc_serve.h \
  || die "the installed shmipc_serve.h differs from bindings/shmipc_serve.h"

# The .pc file names the install prefix; the sysroot maps it into the DESTDIR copy.
export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$root
flags=$(pkg-config --cflags --libs shmipc) || die "pkg-config cannot use $pc"
[[ $flags == *"-I$root"* || $flags != *-I* ]] || die "pkg-config points outside the install: $flags"
[[ $flags == *"-L$root"* ]] || die "pkg-config --libs does not point into the install: $flags"
# shellcheck disable=SC2086 # the flags are words
cc -std=gnu11 -Wall -Wextra -Werror -o "$tmp/greeter_client" examples/c/greeter_client.c $flags \
  || die "examples/c/greeter_client.c does not build against the installed library"

libdir=$(dirname "$lib")
# Read ldd's whole output first: with pipefail, `ldd | grep -q` fails whenever grep stops
# reading early and ldd dies of SIGPIPE.
deps=$(LD_LIBRARY_PATH=$libdir ldd "$tmp/greeter_client")
[[ $deps == *"libshmipc.so.0 => $libdir/"* ]] \
  || die "greeter_client does not load the installed libshmipc.so.0"
rc=0
LD_LIBRARY_PATH=$libdir "$tmp/greeter_client" "unix:@shmipc-install-check-$$" >"$tmp/run.txt" 2>&1 \
  || rc=$?
if [[ $rc -ne 1 ]] || ! grep -q "SHMIPC_ECONNREFUSED" "$tmp/run.txt"; then
  cat "$tmp/run.txt" >&2
  die "greeter_client should fail cleanly with SHMIPC_ECONNREFUSED (exit 1), got exit $rc"
fi
# The descriptor table's header, on its own (it includes shmipc.h), with the same flags.
cat >"$tmp/abi_count.c" <<'EOF'
#include <shmipc_abi.h>
#include <stdio.h>
int main(void)
{
    const shmipc_abi_fn *f = shmipc_abi_find("shmipc_abi_count");
    printf("%d\n", shmipc_abi_count());
    return f != NULL && f->size >= sizeof *f && shmipc_abi_count() > 0 ? 0 : 1;
}
EOF
# shellcheck disable=SC2086 # the flags are words
cc -std=gnu11 -Wall -Wextra -Werror -o "$tmp/abi_count" "$tmp/abi_count.c" $flags \
  || die "a program including <shmipc_abi.h> does not build against the installed library"
nfn=$(LD_LIBRARY_PATH=$libdir "$tmp/abi_count") \
  || die "the installed library's descriptor table does not describe shmipc_abi_count"
# The serve frame codec's header, on its own: a frame round trip against the installed library.
cat >"$tmp/serve_frame.c" <<'EOF'
#include <shmipc_serve.h>
#include <string.h>
int main(void)
{
    unsigned char buf[64];
    shmipc_serve_frame f = {.size = sizeof f};
    int64_t n = shmipc_serve_encode_frame(buf, sizeof buf, SHMIPC_SERVE_BODY, 0, "hi", 2);
    return n == 14 && shmipc_serve_decode(buf, (size_t)n, &f) == n && f.length == 2 &&
                   memcmp(f.payload, "hi", 2) == 0
               ? 0
               : 1;
}
EOF
# shellcheck disable=SC2086 # the flags are words
cc -std=gnu11 -Wall -Wextra -Werror -o "$tmp/serve_frame" "$tmp/serve_frame.c" $flags \
  || die "a program including <shmipc_serve.h> does not build against the installed library"
LD_LIBRARY_PATH=$libdir "$tmp/serve_frame" \
  || die "a frame round trip through the installed shmipc_serve.h calls failed"
echo "abi-install: installed ${lib#"$root"}, ${header#"$root"}, ${abi_header#"$root"}," \
  "${serve_header#"$root"} and" \
  "${pc#"$root"}; a <shmipc_abi.h> program reads $nfn descriptors;" \
  "greeter_client built with pkg-config and ran: $(tail -n1 "$tmp/run.txt")"
