#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers for a model written by
`spark-agent model gen --safetensors DIR` (see tests/fixtures/reference/README.md).

Loads DIR with transformers (Qwen3MoeForCausalLM or Qwen3ForCausalLM from config.json) in
float32, checks that the checkpoint loads with no missing, unexpected or mismatched keys, runs
the fixed prompts below (token ids from the real Qwen3 tokenizer in DIR; one plain, one
chat-formatted, one longer than 64 tokens) and writes

  OUT.bin   the prompts' ids and, for selected positions, the logits of every STRIDE-th vocab
            id plus the top-K ids and logits of that position (format in the README)
  OUT.json  what made it: preset, type, seed, generator version, library versions, prompts

Usage: hf_logits.py --hf-dir DIR --out PREFIX --preset NAME --type T --seed N
                    [--gen-version V] [--device cpu|cuda]
"""
import argparse
import json
import platform
import struct
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

MAGIC = b"SPRKREF1"
VERSION = 1
STRIDE = 61        # every 61st vocab id: 2,491 of 151,936, spread over the whole vocabulary
TOP_K = 64
MAX_POSITIONS = 16  # per prompt: all positions of short prompts, else 16 spread evenly

PROMPTS = [
    ("plain", "The quick brown fox jumps over the lazy dog.", None),
    ("chat", None, [
        {"role": "system", "content": "You are a careful coding assistant."},
        {"role": "user", "content": "Write a C function that reverses a string in place."},
    ]),
    ("long",
     "/* ring buffer */\n"
     "static int rb_push(struct rb *r, int v) {\n"
     "    if (r->len == r->cap) return -1;\n"
     "    r->data[(r->head + r->len++) % r->cap] = v;\n"
     "    return 0;\n"
     "}\n\n"
     "Explain the code above in two sentences, then translate the comment into Chinese "
     "(环形缓冲区) and Japanese (リングバッファ). Numbers: 3.14159, 2026-11-29, 0x7fffffff. "
     "Emoji: \U0001F680\U0001F468\u200D\U0001F4BB done.",
     None),
]


def positions(n):
    if n <= MAX_POSITIONS:
        return list(range(n))
    return sorted({round(i * (n - 1) / (MAX_POSITIONS - 1)) for i in range(MAX_POSITIONS)})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf-dir", required=True)
    ap.add_argument("--out", required=True, help="output prefix: writes PREFIX.bin, PREFIX.json")
    ap.add_argument("--preset", required=True)
    ap.add_argument("--type", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--gen-version", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    tok = AutoTokenizer.from_pretrained(args.hf_dir)
    model, info = AutoModelForCausalLM.from_pretrained(
        args.hf_dir, dtype=torch.float32, output_loading_info=True,
        attn_implementation="eager")
    problems = {k: [str(x) for x in v] for k, v in info.items() if v}
    if problems:
        print(f"loading {args.hf_dir}: {json.dumps(problems)[:2000]}", file=sys.stderr)
        sys.exit(1)
    model.to(args.device).eval()
    cfg = model.config
    n_vocab = cfg.vocab_size
    # The checkpoint holds exactly the configured experts: a wrong split would not load above.
    print(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"vocab {n_vocab}", file=sys.stderr)

    strided = list(range(0, n_vocab, STRIDE))
    meta_prompts = []
    blob = bytearray()
    blob += MAGIC
    blob += struct.pack("<5I", VERSION, len(PROMPTS), n_vocab, STRIDE, TOP_K)
    for name, text, messages in PROMPTS:
        if messages is not None:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=args.device)).logits[0].float().cpu()
        pos = positions(len(ids))
        blob += struct.pack("<I", len(ids))
        blob += struct.pack(f"<{len(ids)}i", *ids)
        blob += struct.pack("<I", len(pos))
        greedy = []
        for p in pos:
            row = logits[p]
            top = torch.topk(row, TOP_K)
            blob += struct.pack("<I", p)
            blob += struct.pack(f"<{len(strided)}f", *row[strided].tolist())
            blob += struct.pack(f"<{TOP_K}i", *top.indices.tolist())
            blob += struct.pack(f"<{TOP_K}f", *top.values.tolist())
            greedy.append(int(top.indices[0]))
        meta_prompts.append({"name": name, "text": text, "n_tokens": len(ids), "ids": ids,
                             "positions": pos, "argmax": greedy})
        print(f"{name}: {len(ids)} tokens, argmax at the last position {greedy[-1]} "
              f"({tok.decode([greedy[-1]])!r}), max |logit| {logits.abs().max():.3f}",
              file=sys.stderr)

    with open(args.out + ".bin", "wb") as f:
        f.write(blob)
    meta = {
        "format": "SPRKREF1, see tests/fixtures/reference/README.md",
        "preset": args.preset, "type": args.type, "seed": args.seed,
        "generator_version": args.gen_version,
        "architecture": type(model).__name__,
        "n_vocab": n_vocab, "stride": STRIDE, "top_k": TOP_K,
        "transformers": transformers.__version__, "torch": torch.__version__,
        "python": platform.python_version(), "device": args.device,
        "attn_implementation": "eager", "dtype": "float32",
        "prompts": meta_prompts,
    }
    with open(args.out + ".json", "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out}.bin ({len(blob)} bytes) and {args.out}.json", file=sys.stderr)


if __name__ == "__main__":
    main()
