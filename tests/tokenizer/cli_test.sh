#!/bin/sh
# cli_test.sh KVSERVE SOURCE_ROOT - `kvserve tokenize` flags, input modes,
# model path kinds and errors.
set -u
kvs=$1
root=$2
fail=0

check() { # check NAME EXPECTED ACTUAL
    if [ "$2" != "$3" ]; then
        echo "FAIL $1: expected [$2] got [$3]"
        fail=1
    else
        echo "ok   $1"
    fi
}

out=$("$kvs" tokenize --help); check "--help exit" 0 $?
case $out in *"--no-special"*) check "--help text" 1 1 ;; *) check "--help text" 1 0 ;; esac
"$kvs" tokenize --bogus >/dev/null 2>&1; check "bad flag exit" 2 $?
err=$("$kvs" tokenize --bogus 2>&1 >/dev/null)
case $err in *usage:*) check "bad flag usage" 1 1 ;; *) check "bad flag usage" 1 0 ;; esac
"$kvs" tokenize --model >/dev/null 2>&1; check "missing value exit" 2 $?
"$kvs" tokenize --model "$root/no/such/model" --text hi >/dev/null 2>&1
check "missing model exit" 1 $?

dir="$root/models/austen-2.7m"
check "--text dir" "[1,781,468,512,266,699,278,918,267,525]" \
    "$("$kvs" tokenize --model "$dir" --text "Emma Woodhouse, handsome")"
check "--text=... --no-special" "[781,468,512,266,699,278,918,267,525]" \
    "$("$kvs" tokenize --model="$dir" --no-special --text="Emma Woodhouse, handsome")"
check "tokenizer.json file" "[1,781,468,512,266,699,278,918,267,525]" \
    "$("$kvs" tokenize --model "$dir/tokenizer.json" --text "Emma Woodhouse, handsome")"
check "gguf file" "[1,781,468,512,266,699,278,918,267,525]" \
    "$("$kvs" tokenize --model "$dir/model-f32.gguf" --text "Emma Woodhouse, handsome")"
check "special parsed" "[1,1,781]" "$("$kvs" tokenize --model "$dir" --text "<s>Emma")"

got=$(printf '"Emma"\n""\n"<s>"\n' | "$kvs" tokenize --model "$dir" --no-special)
want=$(printf '[781]\n[]\n[%s]' "$("$kvs" tokenize --model "$dir" --no-special --text "<s>" | tr -d '[]')")
check "stdin lines" "$want" "$got"
# An escaped NUL is part of the text (it was cut there): "a", <0x00>, "b".
check "stdin embedded NUL" "[326,3,280]" \
    "$(printf '"a\\u0000b"\n' | "$kvs" tokenize --model "$dir" --no-special)"
check "stdin surrogate pair" "$("$kvs" tokenize --model "$dir" --text "$(printf '\360\237\230\200!')")" \
    "$(printf '"\\ud83d\\ude00!"\n' | "$kvs" tokenize --model "$dir")"
printf 'not json\n' | "$kvs" tokenize --model "$dir" >/dev/null 2>&1
check "stdin not a JSON string" 1 $?

vocab="$root/tests/fixtures/vocab/ggml-vocab-gpt-2.gguf"
check "vocab-only gguf" "[15496,995]" "$("$kvs" tokenize --model "$vocab" --text "Hello world")"
exit $fail
