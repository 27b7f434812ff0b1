#!/usr/bin/env bash
# Regenerate the HF reference fixture end to end: spark-agent model gen (GGUF + safetensors)
# -> transformers (float32) -> tests/fixtures/reference/<preset>-f32-s<seed>.{bin,json}.
#
#   scripts/reference/make_fixture.sh [OUT_DIR]
#
# Needs: a built spark-agent (SPARK_CLI, default build/spark-agent; an engine-only build is
# enough), python3 with torch and transformers (5.x), and the Qwen3 tokenizer: embedded in the
# build, or SPARK_TOKENIZER_DIR pointing to a folder with tokenizer.json and
# tokenizer_config.json. HF_DEVICE=cuda runs the reference on the GPU (TF32 is switched off);
# the default is the CPU. Models go to a temporary folder that is removed at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cli=${SPARK_CLI:-$root/build/spark-agent}
out=${1:-$root/tests/fixtures/reference}
device=${HF_DEVICE:-cpu}
gen_version=$(sed -n 's/^#define ENGINE_GEN_VERSION \([0-9]*\).*/\1/p' "$root/engine/gen/gen.h")
tok=()
[ -n "${SPARK_TOKENIZER_DIR:-}" ] && tok=(--tokenizer-dir "$SPARK_TOKENIZER_DIR")
[ -x "$cli" ] || { echo "make_fixture: no spark-agent at $cli (set SPARK_CLI)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
seed=1
for preset in tiny qwen3-tiny; do
    "$cli" model gen --preset "$preset" --type f32 -s "$seed" -o "$work/$preset.gguf" \
        --safetensors "$work/hf-$preset" "${tok[@]}"
    python3 "$root/scripts/reference/hf_logits.py" --hf-dir "$work/hf-$preset" \
        --out "$out/$preset-f32-s$seed" --preset "$preset" --type f32 --seed "$seed" \
        --gen-version "$gen_version" --device "$device"
done
ls -l "$out"
