#!/bin/sh
# run.sh - builds the libFuzzer targets of tests/fuzz with clang-14
# (ASan + UBSan, -fsanitize=fuzzer) in build-fuzz/ and runs each for a
# bounded time, starting from the committed seed corpus and dictionary.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET [TARGET...]]
#
# SECONDS_PER_TARGET defaults to 25 (FUZZ_SECONDS overrides it). New inputs
# go to build-fuzz/corpus/<target> (not committed); a crash is written to
# build-fuzz/crash-<target>-* and fails the run: copy it to
# tests/fuzz/regress/<target>/ and fix the bug (the replay test then keeps it
# fixed). FUZZ_DIR picks another build directory. Targets run one after
# the other. Prints executions per target.
#
# Inputs are capped per format (-max_len): the tokenizer at 512 bytes, the
# request, chat and config targets at 4 KiB, the model headers at 64 KiB.
# Long inputs cost time linear in their size without reaching new code; the
# replay build's linearity cases cover them.
set -eu
cd "$(dirname "$0")/../.."
secs=${1:-${FUZZ_SECONDS:-25}}
[ $# -gt 0 ] && shift
targets=${*:-request chat tokenizer safetensors gguf config grammar}
dir=${FUZZ_DIR:-build-fuzz}
CC=${FUZZ_CC:-clang-14}
if ! command -v "$CC" >/dev/null; then
    echo "run.sh: $CC not found (tools/install-deps --test)"
    exit 77
fi
if [ ! -f "$dir/build.ninja" ]; then
    CC=$CC meson setup "$dir" -Dcuda=disabled -Dfuzz=true -Db_lundef=false \
        -Db_sanitize=address,undefined -Dc_args=-fsanitize=fuzzer-no-link >"$dir.setup.log" 2>&1 ||
        { cat "$dir.setup.log"; exit 1; }
fi
ninja -C "$dir" $(for t in $targets; do printf 'tests/fuzz/fuzz_%s ' "$t"; done) >"$dir.build.log" 2>&1 ||
    { tail -40 "$dir.build.log"; exit 1; }
export KVSERVE_SOURCE_ROOT="$PWD"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
for t in $targets; do
    mkdir -p "$dir/corpus/$t"
    case $t in
    tokenizer) max_len=512 ;;
    request | chat | config | grammar) max_len=4096 ;;
    *) max_len=65536 ;;
    esac
    log="$dir/fuzz-$t.log"
    rc=0
    "$dir/tests/fuzz/fuzz_$t" "$dir/corpus/$t" "tests/fuzz/corpus/$t" \
        -dict="tests/fuzz/dict/$t.dict" -max_total_time="$secs" -max_len="$max_len" \
        -timeout=20 -rss_limit_mb=2560 -print_final_stats=1 \
        -artifact_prefix="$dir/crash-$t-" >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    echo "fuzz $t: ${execs:-?} executions in ${secs}s, exit $rc"
    if [ "$rc" != 0 ]; then
        tail -40 "$log"
        status=1
    fi
done
exit $status
