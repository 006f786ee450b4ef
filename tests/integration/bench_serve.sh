#!/bin/sh
# bench_serve.sh - the HTTP front end's cost: output tokens/s of the daemon at
# 64 concurrent streaming clients (kvs-loadtest) against the offline engine
# benchmark (`kvserve bench`) on the same work, in alternating rounds so that
# both see the same machine load. Also prints the CPU seconds the daemon's
# loop thread (HTTP, JSON, SSE, detokenizing) and engine thread spent.
# A benchmark: it prints figures and asserts nothing.
#
# usage: tests/integration/bench_serve.sh [BUILD_DIR] [ROUNDS] [THREADS]
#        (defaults: build 3 0; THREADS 0 = all cores)
set -eu
cd "$(dirname "$0")/../.."
B=${1:-build}
ROUNDS=${2:-3}
T=${3:-0}
N=256 IN=32 OUT=64 SEQS=64
KV=$(( SEQS * (IN + OUT) / 16 + 1 ))
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

echo "work: $N requests, $IN prompt + $OUT output tokens, $SEQS concurrent / max_num_seqs," \
     "$KV KV blocks, no prefix cache, threads $T"
printf "%-6s %14s %14s %8s %10s %10s %6s\n" round bench_tok_s serve_tok_s ratio loop_cpu_s eng_cpu_s load
i=1
while [ "$i" -le "$ROUNDS" ]; do
    bench=$("$B"/cli/kvserve bench --threads "$T" --num-prompts $N --input-len $IN \
        --output-len $OUT --max-num-seqs $SEQS --num-kv-blocks $KV 2>/dev/null |
        sed -n 's/^throughput .* \([0-9.]*\) output tokens\/s.*/\1/p')
    "$B"/cli/kvserve serve --threads "$T" --port 0 --max-num-seqs $SEQS \
        --no-enable-prefix-caching --num-kv-blocks $KV --max-model-len $(( IN + OUT )) \
        --swap-space 0 2>"$LOG" &
    pid=$!
    port=""
    while [ -z "$port" ]; do
        sleep 0.2
        port=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9]*\) .*/\1/p' "$LOG")
    done
    serve=$("$B"/loadtest/kvs-loadtest --url "http://127.0.0.1:$port" --concurrency $SEQS \
        --max-requests $N --input-len $IN --output-len $OUT --ignore-eos --stream \
        --no-progress 2>/dev/null | sed -n 's/^throughput .* \([0-9.]*\) output tok\/s.*/\1/p')
    loop=0 eng=0
    for t in /proc/$pid/task/*; do
        ticks=$(awk '{print $14 + $15}' "$t/stat")
        if [ "$(basename "$t")" = "$pid" ]; then
            loop=$ticks
        elif [ "$ticks" -gt "$eng" ]; then
            eng=$ticks
        fi
    done
    kill "$pid"
    wait "$pid" || true
    hz=$(getconf CLK_TCK)
    printf "%-6s %14s %14s %8s %10s %10s %6s\n" "$i" "$bench" "$serve" \
        "$(awk -v a="$serve" -v b="$bench" 'BEGIN { printf "%.3f", a / b }')" \
        "$(awk -v x="$loop" -v h="$hz" 'BEGIN { printf "%.2f", x / h }')" \
        "$(awk -v x="$eng" -v h="$hz" 'BEGIN { printf "%.2f", x / h }')" \
        "$(cut -d' ' -f1 /proc/loadavg)"
    i=$(( i + 1 ))
done
