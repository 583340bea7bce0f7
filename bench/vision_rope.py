"""RoPE of multimodal models' vision towers (Qwen2.5-VL, Qwen3-VL and their kin): what kiln.patch
runs for transformers' ``apply_rotary_pos_emb_vision`` (one kiln.rope of the fp32 table, q and k
as the attention hands them over) beside that function eager and under torch.compile, bf16. q
and k are [patches, 16 heads, D] views of one packed qkv projection [patches, 3, 16, D] (the
function reads them strided, every patch 3 x 16 x D apart); cos and sin [patches, D] in fp32, as
the towers' rotary embeddings make them. Bytes count q and k read and written once and both
tables read once.

Usage: python bench/vision_rope.py [--out DIR] [--quick] [--tag TAG]
Writes DIR/vision_rope-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

BF16 = torch.bfloat16
HEADS = 16


def vision_apply(model="qwen2_5_vl"):
    """transformers' apply_rotary_pos_emb_vision of the model's module."""
    import importlib
    return importlib.import_module(f"transformers.models.{model}.modeling_{model}").apply_rotary_pos_emb_vision


def packed_qk(patches, head_dim, device="cuda"):
    """q and k as the towers' attentions unbind them from one qkv projection."""
    qkv = torch.randn(patches, 3, HEADS, head_dim, device=device, dtype=BF16).permute(1, 0, 2, 3)
    return qkv[0], qkv[1]


def table(patches, head_dim, device="cuda", rotated=None, dtype=torch.float32):
    """The towers' cos/sin [patches, rotated] (default the head dim; fp32 as the Qwen towers make
    them): each angle for both halves."""
    angles = torch.rand(patches, (rotated or head_dim) // 2, device=device) * 60.0
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def separate_qk(patches, head_dim, device="cuda"):
    """q and k as MiniMax-M3-VL's attention views its q_proj and k_proj outputs: [1, S, H, D]
    (transformers 5.17 batches them; later versions pass [S, H, D], which its rotation takes too)."""
    return (torch.randn(1, patches, HEADS, head_dim, device=device, dtype=BF16) for _ in range(2))


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# (name, patches, head dim, model): Qwen2.5-VL's tower (16 heads of 80) at a 448x448 image (32 x 32
# patches of 14), a 1008x1008 one (72 x 72) and a 16-frame 448x448 video (8 x 2 frames merged in
# time: 8 x 32 x 32); Qwen3-VL's (16 heads of 72) at a 1024x1024 image (64 x 64 patches of 16) and
# a 16-frame 512x512 video (8 x 32 x 32); MiniMax-M3-VL's (16 heads of 80, the first 78 columns
# rotated in bf16 by a bf16 table, q and k from separate projections) at 448x448 and 1008x1008.
SHAPES = [("Qwen2.5-VL 448x448", 1024, 80, "qwen2_5_vl"), ("Qwen2.5-VL 1008x1008", 5184, 80, "qwen2_5_vl"),
          ("Qwen2.5-VL video 16x448x448", 8192, 80, "qwen2_5_vl"), ("Qwen3-VL 1024x1024", 4096, 72, "qwen2_5_vl"),
          ("Qwen3-VL video 16x512x512", 8192, 72, "qwen2_5_vl"), ("MiniMax-M3-VL 448x448", 1024, 80, "minimax_m3_vl"),
          ("MiniMax-M3-VL 1008x1008", 5184, 80, "minimax_m3_vl")]
MINIMAX_ROTATED = 78  # 2 * (80 // 3 // 2) columns per axis of its 3-D RoPE, three axes


def cases(quick, device="cuda"):
    from kiln.patching.vision_rope import compare, vision_rope

    functions = {}
    for name, patches, head_dim, model in (SHAPES[1:2] + SHAPES[3:4] + SHAPES[6:7] if quick else SHAPES):
        if model not in functions:
            apply = vision_apply(model)
            form, text = compare(apply)
            compiled = torch.compile(apply, dynamic=False) if device == "cuda" else apply
            functions[model] = None if form is None else (apply, vision_rope(apply, form), compiled)
            if form is None:
                print(f"{model}: skipped: kiln.patch leaves this transformers' rotation ({text})")
        if functions[model] is None:
            continue
        apply, patched, compiled = functions[model]
        if model == "minimax_m3_vl":
            q, k = separate_qk(patches, head_dim, device)
            cos, sin = table(patches, head_dim, device, MINIMAX_ROTATED, BF16)
        else:
            q, k = packed_qk(patches, head_dim, device)
            cos, sin = table(patches, head_dim, device)
        yield {
            "name": f"{name} q{list(q.shape)}",
            "bytes": 2 * (q.numel() + k.numel()) * 2 + 2 * cos.numel() * cos.element_size(),
            "kiln": lambda q=q, k=k, c=cos, s=sin, f=patched: f(q, k, c, s),
            "peers": {"eager (transformers)": lambda q=q, k=k, c=cos, s=sin, f=apply: f(q, k, c, s),
                      "compiled": lambda q=q, k=k, c=cos, s=sin, f=compiled: f(q, k, c, s)},
            "launch_bound": False,
            "check": lambda q=q, k=k, c=cos, s=sin, f=patched, a=apply: max(
                rel_err(x, e) for x, e in zip(f(q, k, c, s), a(q, k, c, s))),
        }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="one image of each tower")
    parser.add_argument("--tag", default="", help="appended to the file names")
    args = parser.parse_args()
    common.eager_compiled_bench("vision_rope", "Vision towers' RoPE (each tower's table and q, k as its attention hands them over)",
                                cases(args.quick), args.out, args.tag)


if __name__ == "__main__":
    main()
