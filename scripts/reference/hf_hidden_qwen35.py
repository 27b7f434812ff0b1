#!/usr/bin/env python3
"""Debug aid for the qwen35moe fixture: the hidden states after the embedding and after every
block (HF output_hidden_states) for the first prompt of hf_logits.PROMPTS, as raw float32
[n_layers + 1][n_tokens][hidden] in OUT, ids first as u32 count + i32[count].
Usage: hf_hidden_qwen35.py --hf-dir DIR --out FILE"""
import argparse
import os
import struct
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_logits  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--hf-dir", required=True)
ap.add_argument("--out", required=True)
a = ap.parse_args()
tok = transformers.AutoTokenizer.from_pretrained(a.hf_dir)
model = transformers.Qwen3_5MoeForCausalLM.from_pretrained(a.hf_dir, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
ids = tok(hf_logits.PROMPTS[0][1], add_special_tokens=False)["input_ids"]
with torch.no_grad():
    out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
with open(a.out, "wb") as f:
    f.write(struct.pack("<I", len(ids)) + struct.pack(f"<{len(ids)}i", *ids))
    for h in out.hidden_states:
        f.write(h[0].float().contiguous().numpy().tobytes())
print(f"{len(out.hidden_states)} hidden states of {len(ids)} tokens", file=sys.stderr)
