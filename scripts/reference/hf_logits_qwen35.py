#!/usr/bin/env python3
"""Reference logits of HF transformers' Qwen3_5MoeForCausalLM (qwen35moe, Gated DeltaNet hybrid)
for a model written by `spark-agent model gen --preset qwen35-tiny --safetensors DIR`.

The same machinery and fixture format as hf_logits.py (SPRKREF1, tests/fixtures/reference/
README.md), with two differences: the model class is Qwen3_5MoeForCausalLM (explicitly: the
checkpoint is text-only), and every 211th vocabulary id is stored instead of every 61st, which
keeps the fixture under 200 KB. The forward runs in float32 on HF's pure-PyTorch paths: the
causal conv1d and the chunked gated delta rule (no `kernels`/FLA hub kernels are used).

Usage: hf_logits_qwen35.py --hf-dir DIR --out PREFIX --preset qwen35-tiny --type f32 --seed N
                           [--gen-version V] [--device cpu|cuda]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_logits  # noqa: E402
import transformers  # noqa: E402

hf_logits.STRIDE = 211
hf_logits.AutoModelForCausalLM = transformers.Qwen3_5MoeForCausalLM

if __name__ == "__main__":
    hf_logits.main()
