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


def vision_apply():
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision
    return apply_rotary_pos_emb_vision


def packed_qk(patches, head_dim, device="cuda"):
    """q and k as the towers' attentions unbind them from one qkv projection."""
    qkv = torch.randn(patches, 3, HEADS, head_dim, device=device, dtype=BF16).permute(1, 0, 2, 3)
    return qkv[0], qkv[1]


def table(patches, head_dim, device="cuda"):
    """The towers' fp32 cos/sin [patches, D]: each angle for both halves."""
    angles = torch.rand(patches, head_dim // 2, device=device) * 60.0
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# (name, patches, head dim): Qwen2.5-VL's tower (16 heads of 80) at a 448x448 image (32 x 32
# patches of 14), a 1008x1008 one (72 x 72) and a 16-frame 448x448 video (8 x 2 frames merged in
# time: 8 x 32 x 32); Qwen3-VL's (16 heads of 72) at a 1024x1024 image (64 x 64 patches of 16) and
# a 16-frame 512x512 video (8 x 32 x 32).
SHAPES = [("Qwen2.5-VL 448x448", 1024, 80), ("Qwen2.5-VL 1008x1008", 5184, 80),
          ("Qwen2.5-VL video 16x448x448", 8192, 80), ("Qwen3-VL 1024x1024", 4096, 72),
          ("Qwen3-VL video 16x512x512", 8192, 72)]


def cases(quick, device="cuda"):
    from kiln.patching.vision_rope import vision_rope

    apply = vision_apply()
    patched = vision_rope(apply)
    compiled = torch.compile(apply, dynamic=False) if device == "cuda" else apply
    for name, patches, head_dim in (SHAPES[1:2] + SHAPES[3:4] if quick else SHAPES):
        q, k = packed_qk(patches, head_dim, device)
        cos, sin = table(patches, head_dim, device)
        yield {
            "name": f"{name} q{list(q.shape)}",
            "bytes": 2 * (q.numel() + k.numel()) * 2 + 2 * cos.numel() * 4,
            "kiln": lambda q=q, k=k, c=cos, s=sin: patched(q, k, c, s),
            "peers": {"eager (transformers)": lambda q=q, k=k, c=cos, s=sin: apply(q, k, c, s),
                      "compiled": lambda q=q, k=k, c=cos, s=sin: compiled(q, k, c, s)},
            "launch_bound": False,
            "check": lambda q=q, k=k, c=cos, s=sin: max(
                rel_err(a, e) for a, e in zip(patched(q, k, c, s), apply(q, k, c, s))),
        }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="one image of each tower")
    parser.add_argument("--tag", default="", help="appended to the file names")
    args = parser.parse_args()
    common.eager_compiled_bench("vision_rope", "Vision towers' RoPE (fp32 table, q and k of one qkv)",
                                cases(args.quick), args.out, args.tag)


if __name__ == "__main__":
    main()
