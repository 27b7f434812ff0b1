#!/usr/bin/env bash
# The MTP reference fixture: spark-agent model gen --preset qwen35-tiny --type bf16 -s 1
# (+ safetensors) -> mtp_trim_qwen35.py (64 ids, BF16: fits the GPU machine's transfer) ->
# mtp_ref_qwen35.py (PyTorch + transformers 5.x, float32) ->
# tests/fixtures/reference/qwen35-tiny-mtp-bf16-s1.{bin,json}. Steps 1-2 need the spark-agent
# CLI, step 3 torch and transformers (run it where they are: MTP_STAGE=gen / MTP_STAGE=ref split
# the two halves; the work directory is $MTP_WORK, default .mtpref).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cli=${SPARK_CLI:-$root/build/spark-agent}
out=${1:-$root/tests/fixtures/reference}
work=${MTP_WORK:-$root/.mtpref}
stage=${MTP_STAGE:-all}
gen_version=$(sed -n 's/^#define ENGINE_GEN_VERSION \([0-9]*\).*/\1/p' "$root/engine/gen/gen.h")
tok=()
[ -n "${SPARK_TOKENIZER_DIR:-}" ] && tok=(--tokenizer-dir "$SPARK_TOKENIZER_DIR")
if [ "$stage" != ref ]; then
    [ -x "$cli" ] || { echo "make_fixture_mtp_qwen35: no spark-agent at $cli (set SPARK_CLI)" >&2; exit 1; }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$cli" model gen --preset qwen35-tiny --type bf16 -s 1 -o "$tmp/t.gguf" \
        --safetensors "$tmp/hf" "${tok[@]}"
    rm -rf "$work/hf"
    mkdir -p "$work"
    python3 "$root/scripts/reference/mtp_trim_qwen35.py" --hf-dir "$tmp/hf" --out "$work/hf"
    cp "$root/scripts/reference/mtp_ref_qwen35.py" "$work/"
fi
if [ "$stage" != gen ]; then
    mkdir -p "$out"
    PYTHONUNBUFFERED=1 python3 "$work/mtp_ref_qwen35.py" --hf-dir "$work/hf" \
        --out "$out/qwen35-tiny-mtp-bf16-s1" --seed 1 --gen-version "$gen_version" \
        --device "${HF_DEVICE:-cpu}"
fi
