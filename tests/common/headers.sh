#!/bin/sh
# Every public header compiles on its own as C11 (STYLE.md 2.2), the way
# llama.cpp's test-c.c checks ggml.h: a translation unit that includes just
# that header, with warnings as errors.
# usage: headers.sh SOURCE_ROOT BUILD_ROOT CC
set -u
src=$1
build=$2
cc=${3:-cc}
fail=0
n=0
for h in $(cd "$src" && find common config server scheduler blockmgr model kernels loadtest formats text sampler cli \
        -name '*.h' ! -path 'kernels/cuda/*' | sort); do
    n=$((n + 1))
    if ! printf '#include "%s"\n' "$h" | "$cc" -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror \
            -I"$src" -I"$build" -x c -fsyntax-only - 2>/tmp/hdr.$$; then
        echo "FAIL: $h does not compile on its own:"
        sed 's/^/    /' /tmp/hdr.$$
        fail=$((fail + 1))
    fi
done
rm -f /tmp/hdr.$$
echo "$n headers checked, $fail not self-contained"
[ "$fail" -eq 0 ]
