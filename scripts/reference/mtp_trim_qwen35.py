#!/usr/bin/env python3
"""Shrink a generated qwen35-tiny checkpoint (`spark-agent model gen --preset qwen35-tiny
--type bf16 --safetensors DIR`) to what mtp_ref_qwen35.py needs, so that it fits the GPU
machine's 64 MiB transfer: the vocabulary cut to the token ids the reference uses (its prompts
and chain tokens) plus filler ids up to 64, renumbered 0..63 (embed_tokens and lm_head rows
selected, config vocab_size 64, vocab_map.json lists the original id of each new one), and every
matrix stored as BF16. The bf16 file type makes every matrix value exactly representable in
BF16 (the norms and A_log, which are not, stay F32), so the conversion loses nothing: the reference computes in float32 on exactly the weights the
engine reads from DIR. Pure Python (no torch or numpy needed).
Usage: mtp_trim_qwen35.py --hf-dir DIR --out OUTDIR
"""
import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mtp_ref_qwen35 as ref  # noqa: E402

K = 64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    keep = sorted(set(ref.all_ids()))
    fill = 0
    while len(keep) < K:
        fill += 2371
        if fill not in keep:
            keep.append(fill)
    keep = sorted(keep)
    assert len(keep) == K, len(keep)
    with open(os.path.join(args.hf_dir, "model.safetensors"), "rb") as f:
        data = f.read()
    hl = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + hl])
    body = memoryview(data)[8 + hl:]
    out_hdr, blobs, off = {}, [], 0
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        raw = bytes(body[a:b])
        shape = list(t["shape"])
        if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            row = shape[1] * 4
            raw = b"".join(raw[i * row:(i + 1) * row] for i in keep)
            shape[0] = K
        # F32 -> BF16: the high half of each little-endian float, when that is exact (the
        # matrices); the small tensors the converter transforms (norms - 1, A_log) stay F32
        lo = raw[0::4] + raw[1::4]
        if any(lo):
            bf, dt = raw, "F32"
        else:
            bf, dt = bytearray(len(raw) // 2), "BF16"
            bf[0::2] = raw[2::4]
            bf[1::2] = raw[3::4]
        out_hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(bf)]}
        blobs.append(bf)
        off += len(bf)
    os.makedirs(args.out, exist_ok=True)
    h = json.dumps(out_hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(args.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for bf in blobs:
            f.write(bf)
    with open(os.path.join(args.hf_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["vocab_size"] = K
    cfg["bos_token_id"] = 0
    cfg["eos_token_id"] = 0
    cfg["dtype"] = "bfloat16"
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(args.out, "vocab_map.json"), "w") as f:
        json.dump(keep, f)
    print(f"wrote {args.out}: {len(out_hdr)} tensors, {off} bytes, vocabulary {K}")


if __name__ == "__main__":
    main()
