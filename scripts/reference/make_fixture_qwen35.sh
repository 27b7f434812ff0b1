#!/usr/bin/env bash
# The qwen35moe reference fixture: spark-agent model gen --preset qwen35-tiny (GGUF +
# safetensors) -> transformers Qwen3_5MoeForCausalLM (float32, CPU) ->
# tests/fixtures/reference/qwen35-tiny-f32-s1.{bin,json}. Same needs as make_fixture.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cli=${SPARK_CLI:-$root/build/spark-agent}
out=${1:-$root/tests/fixtures/reference}
device=${HF_DEVICE:-cpu}
gen_version=$(sed -n 's/^#define ENGINE_GEN_VERSION \([0-9]*\).*/\1/p' "$root/engine/gen/gen.h")
tok=()
[ -n "${SPARK_TOKENIZER_DIR:-}" ] && tok=(--tokenizer-dir "$SPARK_TOKENIZER_DIR")
[ -x "$cli" ] || { echo "make_fixture_qwen35: no spark-agent at $cli (set SPARK_CLI)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
seed=1
preset=qwen35-tiny
"$cli" model gen --preset "$preset" --type f32 -s "$seed" -o "$work/$preset.gguf" \
    --safetensors "$work/hf-$preset" "${tok[@]}"
python3 "$root/scripts/reference/hf_logits_qwen35.py" --hf-dir "$work/hf-$preset" \
    --out "$out/$preset-f32-s$seed" --preset "$preset" --type f32 --seed "$seed" \
    --gen-version "$gen_version" --device "$device"
ls -l "$out"
