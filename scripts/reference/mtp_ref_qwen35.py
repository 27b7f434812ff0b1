#!/usr/bin/env python3
"""Reference of the Qwen3.5 MTP block for a model written by `spark-agent model gen --preset
qwen35-tiny --type bf16 --safetensors DIR` and shrunk by mtp_trim_qwen35.py (the vocabulary cut
to the ids used here, renumbered; BF16 storage of values that are BF16 anyway), for
tests/engine/test_mtp.c.

HF transformers 5.x's Qwen3_5MoeForCausalLM ignores the checkpoint's mtp.* tensors, so the MTP
forward is written here from the published design (vLLM/SGLang's Qwen3-Next/Qwen3.5 MTP), with
HF's own modules wherever one exists:
    e   = pre_fc_norm_embedding(embed_tokens(token p+1))        Qwen3_5Moe RMSNorm (1 + w)
    h   = pre_fc_norm_hidden(h_p)     h_p: the main model's last_hidden_state (after its norm)
    x   = fc(cat([e, h]))             mtp.fc [E, 2E], no bias, embedding half first
    x   = decoder_layer(x)            HF's Qwen3_5Moe decoder layer of a full-attention index
                                      (gated attention + MoE with shared expert), weights
                                      mtp.layers.0.*, causal over the MTP pairs, RoPE position p
    out = norm(x)                     mtp.norm;  logits = lm_head(out) (the shared head)
The pair at position p is (h_p, token p+1) for p < n - 1 (the prompt), then a chain: the pair at
n - 1 is (h_{n-1}, c_0), the pair at n - 1 + i is (out_{n-2+i}, c_i), c fixed chain ids.

Writes PREFIX.json (what made it, the vocabulary map, per prompt the ids in the ORIGINAL
vocabulary: prompt then chain, n_main, the stored positions) and PREFIX.bin: per stored row,
little-endian float32, `out` (E values) then the logits of the 64 kept ids in map order.
Usage: mtp_ref_qwen35.py --hf-dir TRIMMED --out PREFIX --seed N [--gen-version V]
                         [--device cpu|cuda]
"""
import argparse
import copy
import json
import os
import platform
import struct
import sys

CHAIN = 4


def lcg_ids(seed, n, hi=151000):
    out, x = [], seed
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(int((x >> 33) % hi))
    return out


# (name, prompt length, the stored prompt-pair positions: None = all)
PROMPTS = [("short", 12, None), ("long", 40, [0, 5, 11, 15, 16, 27, 32, 38])]


def prompt_ids(pi):
    """(prompt ids, chain ids) of prompt pi, original vocabulary."""
    return lcg_ids(1000 + pi, PROMPTS[pi][1]), lcg_ids(2000 + pi, CHAIN)


def all_ids():
    out = []
    for pi in range(len(PROMPTS)):
        a, b = prompt_ids(pi)
        out += a + b
    return out


def main():
    import torch
    import transformers
    from safetensors.torch import load_file

    ap = argparse.ArgumentParser()
    ap.add_argument("--hf-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="qwen35-tiny")
    ap.add_argument("--type", default="bf16")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--gen-version", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = args.device
    with open(os.path.join(args.hf_dir, "vocab_map.json")) as f:
        vmap = json.load(f)
    new_id = {o: i for i, o in enumerate(vmap)}

    model, info = transformers.Qwen3_5MoeForCausalLM.from_pretrained(
        args.hf_dir, dtype=torch.float32, output_loading_info=True, attn_implementation="eager")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print("loading info:", {k: [str(x) for x in v][:8] for k, v in info.items() if v})
    model.to(dev).eval()
    cfg = model.config
    E = cfg.hidden_size
    full = cfg.layer_types.index("full_attention")
    LayerCls = type(model.model.layers[full])
    NormCls = type(model.model.norm)
    print(f"decoder layer {full}: {LayerCls.__module__}.{LayerCls.__name__}; norm "
          f"{NormCls.__name__}; rotary {type(model.model.rotary_emb).__name__}")
    for n, mod in model.model.layers[full].named_modules():
        print(f"  {n or '<layer>'}: {type(mod).__name__}")

    sd = load_file(os.path.join(args.hf_dir, "model.safetensors"))
    mtp = {k: v.float() for k, v in sd.items() if k.startswith("mtp.")}
    print("mtp tensors:", sorted((k, tuple(v.shape)) for k, v in mtp.items()))
    lcfg = copy.deepcopy(cfg)
    lcfg._attn_implementation = "eager"
    layer = LayerCls(lcfg, full)
    lsd = {k[len("mtp.layers.0."):]: v for k, v in mtp.items() if k.startswith("mtp.layers.0.")}
    try:
        print("mtp layer load:", layer.load_state_dict(lsd, strict=True))
    except RuntimeError as e:
        print("mtp layer load failed:", e)
        print("layer keys:", sorted(layer.state_dict().keys()))
        raise
    enorm, hnorm, onorm = (NormCls(E, eps=cfg.rms_norm_eps) for _ in range(3))
    enorm.load_state_dict({"weight": mtp["mtp.pre_fc_norm_embedding.weight"]})
    hnorm.load_state_dict({"weight": mtp["mtp.pre_fc_norm_hidden.weight"]})
    onorm.load_state_dict({"weight": mtp["mtp.norm.weight"]})
    fc = torch.nn.Linear(2 * E, E, bias=False)
    fc.load_state_dict({"weight": mtp["mtp.fc.weight"]})
    for mod in (layer, enorm, hnorm, onorm, fc):
        mod.to(dev).float().eval()
    rotary = model.model.rotary_emb

    def pos_emb(x, L):
        pos = torch.arange(L, device=dev)[None]
        try:  # Qwen3.5's interleaved MRoPE takes [3, B, L] position ids (all equal for text)
            return rotary(x, pos[None].expand(3, 1, L)), pos
        except Exception as e:  # noqa: BLE001
            print("rotary with 3-D positions failed, 2-D:", e)
            return rotary(x, pos), pos

    def run_layer(mod, x, L):
        pe, pos = pos_emb(x, L)
        mask = torch.full((L, L), float("-inf"), device=dev).triu(1)[None, None]
        try:
            y = mod(x, position_embeddings=pe, attention_mask=mask, position_ids=pos)
        except TypeError as e:
            print("decoder layer call:", e, "- retrying with cache_position")
            y = mod(x, position_embeddings=pe, attention_mask=mask, position_ids=pos,
                    past_key_values=None, cache_position=torch.arange(L, device=dev))
        return y[0] if isinstance(y, tuple) else y

    # the way run_layer drives a decoder layer reproduces the model's own use of layer `full`
    seen = {}

    def hook(mod, a, kw, out):
        seen["in"] = a[0] if a else kw["hidden_states"]
        seen["out"] = out[0] if isinstance(out, tuple) else out

    hd = model.model.layers[full].register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        probe = prompt_ids(1)[0]
        model.model(torch.tensor([[new_id[t] for t in probe]], device=dev))
        hd.remove()
        again = run_layer(model.model.layers[full], seen["in"], len(probe))
        d = (again - seen["out"]).abs().max().item()
    print(f"decoder layer {full} driven as the MTP layer vs inside the model: max diff {d:.3g}")
    layer_check = d  # recorded in the JSON; test_mtp requires it tiny

    def mtp_forward(hid, toks):
        """hid [L, E] hidden inputs, toks [L] new ids -> (out [L, E], logits [L, K])."""
        L = hid.shape[0]
        e = enorm(model.model.embed_tokens(torch.tensor(toks, device=dev)))
        x = fc(torch.cat([e, hnorm(hid)], dim=-1))[None]
        out = onorm(run_layer(layer, x, L)[0])
        return out, model.lm_head(out)

    blob = bytearray()
    meta_prompts = []
    for pi, (name, n, keep) in enumerate(PROMPTS):
        ids, chain = prompt_ids(pi)
        nid = [new_id[t] for t in ids]
        with torch.no_grad():
            h = model.model(torch.tensor([nid], device=dev)).last_hidden_state[0]
            ref = model(torch.tensor([nid], device=dev)).logits[0]
            print(f"{name}: lm_head(last_hidden_state) vs logits: max diff "
                  f"{(model.lm_head(h) - ref).abs().max().item():.3g}")
            hid = h.clone()
            toks = nid[1:] + [new_id[chain[0]]]
            rows = {}
            out, logits = mtp_forward(hid, toks)
            for p in range(n):
                rows[p] = (out[p], logits[p])
            for i in range(1, CHAIN):
                hid = torch.cat([hid, out[-1:]], dim=0)
                toks = toks + [new_id[chain[i]]]
                out, logits = mtp_forward(hid, toks)
                rows[n - 1 + i] = (out[-1], logits[-1])
                d = (logits[n - 1] - rows[n - 1][1]).abs().max().item()
                assert d < 1e-4, f"not causal: {d}"
        pos = sorted((keep if keep is not None else list(range(n - 1))) +
                     list(range(n - 1, n - 1 + CHAIN)))
        for p in pos:
            o, lg = rows[p]
            blob += struct.pack(f"<{E}f", *o.float().cpu().tolist())
            blob += struct.pack(f"<{len(vmap)}f", *lg.float().cpu().tolist())
        meta_prompts.append({"name": name, "n_main": n, "ids": ids + chain, "positions": pos})
        print(f"{name}: {n} prompt + {CHAIN} chain tokens, {len(pos)} rows, |out| max "
              f"{max(rows[p][0].abs().max().item() for p in pos):.3f}")
    with open(args.out + ".bin", "wb") as f:
        f.write(blob)
    meta = {
        "format": "rows of float32: the MTP block's normed output (n_embd), then the logits of "
                  "vocab_map's ids; scripts/reference/mtp_ref_qwen35.py",
        "preset": args.preset, "type": args.type, "seed": args.seed,
        "generator_version": args.gen_version, "architecture": "Qwen3_5MoeMTP",
        "n_embd": E, "vocab_map": vmap,
        "transformers": transformers.__version__, "torch": torch.__version__,
        "python": platform.python_version(), "device": dev,
        "attn_implementation": "eager", "dtype": "float32", "prompts": meta_prompts,
        "layer_check_max_diff": layer_check,
    }
    with open(args.out + ".json", "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}.bin ({len(blob)} bytes)")


if __name__ == "__main__":
    main()
