#!/bin/sh
# check_hash_key.sh - `kvserve hash-key` prints SHA-256 digests for the config.
# usage: check_hash_key.sh KVSERVE_BINARY
set -eu
kvs=$1
want=72ee9d4355ccb9d3a4c9dbf37382e38e75c1b1a225b5bd1f729ee91bbda30c20  # sha256("alice-key")
fail() { echo "FAIL: $*"; exit 1; }

[ "$("$kvs" hash-key alice-key)" = "$want" ] || fail "argument form"
[ "$(printf 'alice-key\n' | "$kvs" hash-key)" = "$want" ] || fail "stdin form"
[ "$(printf 'alice-key\r\n' | "$kvs" hash-key)" = "$want" ] || fail "stdin with CRLF"
[ "$(printf 'alice-key' | "$kvs" hash-key)" = "$want" ] || fail "stdin without newline"
printf '\n' | "$kvs" hash-key >/dev/null 2>&1 && fail "empty key accepted"
"$kvs" hash-key </dev/null >/dev/null 2>&1 && fail "no key accepted"
set +e
"$kvs" hash-key a b >/dev/null 2>&1
[ $? -eq 2 ] || fail "two arguments: want exit 2"
set -e
"$kvs" hash-key --help | grep -q api_key_sha256 || fail "--help"
"$kvs" --help | grep -q hash-key || fail "listed in kvserve --help"
echo OK
