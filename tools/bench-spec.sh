#!/bin/sh
# bench-spec.sh - speculative decoding figures (issue 16): output tokens/s
# with and without --speculative-config, interleaved in one run (the
# machine is shared), repeated; prints every run, then medians and ratios.
#
#   tools/bench-spec.sh [BUILD] [MODEL] [REPEATS] [SPEC_JSON] [BATCH1_PROMPTS] [OUT_LEN]
#   (environment: THREADS=N forward threads, default 1; CASES="grounded_b1
#   free_b1 grounded_32" the cases to run, default all three)
#
# Cases: batch 1 on input-grounded prompts (a passage of the Austen
# fixture, then its first third again: the answer copies it), batch 1 on
# free generation (a plain passage), and 32 concurrent streams on grounded
# prompts.
set -eu
BUILD=${1:-build}
MODEL=${2:-models/austen-2.7m}
REP=${3:-3}
SPEC=${4:-'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'}
NB1=${5:-8}
OUT=${6:-128}
THREADS=${THREADS:-1}
CASES=${CASES:-grounded_b1 free_b1 grounded_32}
TEXT=tests/fixtures/austen-persuasion-ch24.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() { # case spec(0/1) rep args...
    c=$1; s=$2; r=$3; shift 3
    case " $CASES " in *" $c "*) ;; *) return 0 ;; esac
    if [ "$s" = 1 ]; then
        "$BUILD"/cli/kvserve bench --model "$MODEL" --prompt-file "$TEXT" "$@" \
            --threads "$THREADS" --speculative-config "$SPEC" 2>/dev/null >"$tmp/out"
    else
        "$BUILD"/cli/kvserve bench --model "$MODEL" --prompt-file "$TEXT" "$@" \
            --threads "$THREADS" 2>/dev/null >"$tmp/out"
    fi
    tps=$(awk '/^throughput/ {print $4}' "$tmp/out")
    cps=$(awk '/^cpu time/ {print $5}' "$tmp/out")
    acc=$(awk '/^speculative/ {print $12}' "$tmp/out" | tr -d '(%),')
    echo "$c spec=$s rep=$r output_tok/s=$tps output_tok/cpu-s=$cps accepted=${acc:--}"
    echo "$c $s $tps ${acc:-0} $cps" >>"$tmp/all"
}

for r in $(seq 1 "$REP"); do
    for s in 0 1; do
        run grounded_b1 $s $r --num-prompts "$NB1" --max-num-seqs 1 --input-len 96 \
            --output-len "$OUT" --prompt-kind grounded
        run free_b1 $s $r --num-prompts "$NB1" --max-num-seqs 1 --input-len 96 \
            --output-len "$OUT" --prompt-kind text
        run grounded_32 $s $r --num-prompts 64 --max-num-seqs 32 --input-len 96 \
            --output-len "$OUT" --prompt-kind grounded
    done
done
med() { # case spec column
    awk -v c="$1" -v s="$2" -v k="$3" '$1 == c && $2 == s {print $k}' "$tmp/all" | sort -n |
        awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
}
echo "medians: output tokens/s (elapsed) and output tokens per cpu-second, off -> on"
echo "case          tok/s off    tok/s on  ratio   tok/cpu-s off  tok/cpu-s on  ratio  accepted%"
for c in $CASES; do
    a=$(med $c 0 3); b=$(med $c 1 3); x=$(med $c 0 5); y=$(med $c 1 5)
    printf '%-12s %10s %11s %6.2f %15s %13s %6.2f %10s\n' "$c" "$a" "$b" \
        "$(echo "$b $a" | awk '{print $1 / $2}')" "$x" "$y" \
        "$(echo "$y $x" | awk '{print $1 / $2}')" "$(med $c 1 4)"
done
