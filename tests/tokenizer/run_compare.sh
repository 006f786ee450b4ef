#!/bin/sh
# run_compare.sh KVSERVE SOURCE_ROOT - runs compare_hf.mjs (kvserve tokenize
# against @huggingface/tokenizers). Exit 77 (meson SKIP) without node or
# without node_modules (`npm ci` at the repository root installs them).
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node not found"
    exit 77
fi
if [ ! -d "$2/node_modules/@huggingface/tokenizers" ]; then
    echo "SKIP: node_modules missing (run npm ci at the repository root)"
    exit 77
fi
exec node "$2/tests/tokenizer/compare_hf.mjs" "$1" "$2"
