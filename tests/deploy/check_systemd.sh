#!/bin/sh
# check_systemd.sh - deploy/systemd is valid and hardened.
#
# usage: check_systemd.sh SOURCE_ROOT KVSERVE_BINARY
# systemd-analyze verify must print nothing for kvserve.service (ExecStart
# pointed at the built binary, since verify checks that it exists); the unit
# carries the required directives; its offline security exposure is at most
# 3.0; as root, sysusers.d and tmpfiles.d entries are applied to a scratch
# root. Exits 77 (skip) without systemd-analyze.
set -eu
src=$1
bin=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
dir=$src/deploy/systemd
unit=$dir/kvserve.service

command -v systemd-analyze >/dev/null 2>&1 || { echo "no systemd-analyze: skip"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Required directives, exactly as the unit must carry them.
for d in 'Type=notify' 'NotifyAccess=main' 'WatchdogSec=[1-9]' 'User=kvserve' \
         'NoNewPrivileges=yes' 'ProtectSystem=strict' 'ProtectHome=yes' 'PrivateTmp=yes' \
         'CapabilityBoundingSet=$' 'RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX$' \
         'SystemCallFilter=@system-service$' 'DevicePolicy=closed' \
         'DeviceAllow=char-nvidia-frontend rw' 'DeviceAllow=/dev/nvidia-uvm rw' \
         'ExecStart=/usr/bin/kvserve serve --config /etc/kvserve/kvserve.conf$' \
         'StateDirectory=kvserve' 'KillSignal=SIGTERM' 'Restart=on-failure'; do
    grep -q "^$d" "$unit" || fail "kvserve.service lacks '$d'"
done
# Drain must finish before systemd's stop timeout: TimeoutStopSec > drain_timeout.
stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)$/\1/p' "$unit")
drain=$(sed -n 's/^# drain_timeout = \([0-9]*\)$/\1/p' "$src/config/kvserve.conf")
[ -n "$stop" ] && [ -n "$drain" ] && [ "$stop" -gt "$drain" ] ||
    fail "TimeoutStopSec ($stop) must exceed the default drain_timeout ($drain)"

sed "s|^ExecStart=/usr/bin/kvserve |ExecStart=$bin |" "$unit" >"$tmp/kvserve.service"
out=$(cd "$tmp" && systemd-analyze verify --man=no ./kvserve.service 2>&1) ||
    fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify is not clean: $out"
echo "systemd-analyze verify: clean"

if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
    sec=$(cd "$tmp" && systemd-analyze security --offline=yes --threshold=30 \
          ./kvserve.service 2>&1) || fail "security exposure above 3.0: $sec"
    echo "$sec" | grep 'Overall exposure'
fi

if [ "$(id -u)" = 0 ] && command -v systemd-sysusers >/dev/null 2>&1; then
    root=$tmp/root
    mkdir -p "$root/etc"
    touch "$root/etc/passwd" "$root/etc/group" "$root/etc/shadow" "$root/etc/gshadow"
    systemd-sysusers --root="$root" "$dir/kvserve.sysusers" >/dev/null 2>&1 ||
        fail "systemd-sysusers rejected kvserve.sysusers"
    grep -q '^kvserve:x:[0-9]*:[0-9]*:.*:/var/lib/kvserve:/usr/sbin/nologin$' "$root/etc/passwd" ||
        fail "kvserve user not created as expected"
    out=$(systemd-tmpfiles --root="$root" --create "$dir/kvserve.tmpfiles" 2>&1) ||
        fail "systemd-tmpfiles: $out"
    [ -z "$out" ] || fail "systemd-tmpfiles is not clean: $out"
    for d in etc/kvserve var/lib/kvserve/models var/cache/kvserve; do
        [ -d "$root/$d" ] || fail "tmpfiles did not create /$d"
    done
    [ "$(stat -c %a "$root/var/lib/kvserve")" = 750 ] || fail "/var/lib/kvserve mode"
    echo "sysusers.d and tmpfiles.d: applied to a scratch root"
else
    echo "not root: sysusers.d/tmpfiles.d application skipped"
fi
echo OK
