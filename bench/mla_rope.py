"""RoPE of multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash and their kin): kiln.rope
with deinterleave=True beside transformers' apply_rotary_pos_emb_interleave (rope_interleave,
the default) eager and under torch.compile, bf16, on q_rot and k_rot as the attention hands
them over: the last 64 columns of each q head of [B, S, H, 128 + 64] memory viewed
[B, H, S, 64], and one k head, the last 64 columns of the compressed kv row [B, S, 512 + 64].
Both rotate from the model's bf16 table [B, S, 64] (kiln reads its first half, as the formula
does). Bytes count q_rot and k_rot read and written once and the half table read once.

Usage: python bench/mla_rope.py [--out DIR] [--quick]
Writes DIR/mla_rope-<date>-<device>.json and .md; prints the table last."""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

BF16 = torch.bfloat16
ROPE, NOPE, KV_LORA = 64, 128, 512


def deepseek_apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """transformers' DeepSeek-V3 apply_rotary_pos_emb_interleave, restated (used where the
    import fails)."""
    cos = cos[..., : cos.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    sin = sin[..., : sin.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    q1, q2 = q[..., 0::2], q[..., 1::2]
    k1, k2 = k[..., 0::2], k[..., 1::2]
    return (torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1),
            torch.cat([k1 * cos - k2 * sin, k2 * cos + k1 * sin], dim=-1))


def interleave_apply():
    try:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave
        return apply_rotary_pos_emb_interleave, "transformers"
    except ImportError:
        return deepseek_apply_rotary_pos_emb_interleave, "local copy"


def latent_qk(batch, heads, seq, device="cuda"):
    """q_rot and k_rot as DeepSeek-V3's attention slices them from its projections."""
    q = torch.randn(batch, seq, heads, NOPE + ROPE, device=device, dtype=BF16).transpose(1, 2)
    kv = torch.randn(batch, seq, KV_LORA + ROPE, device=device, dtype=BF16)
    return q[..., NOPE:], kv[..., KV_LORA:].view(batch, 1, seq, ROPE)


def table(batch, seq, start=0, device="cuda"):
    """DeepseekV3RotaryEmbedding's cos/sin (cat(freqs, freqs)) of positions from `start`, in
    the model's dtype."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, ROPE, 2, device=device).float() / ROPE))
    positions = (start + torch.arange(seq, device=device)).float().expand(batch, seq)
    emb = torch.cat([positions[..., None] * inv_freq] * 2, -1)
    return emb.cos().to(BF16), emb.sin().to(BF16)


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# (name, batch, q heads, positions, first position): DeepSeek-V3's 128 heads at a 4096-token
# prefill, a batch of 2048-token prefills and a decode step of 64 sequences at position 4096;
# GLM-4.7-Flash's 20 heads.
SHAPES = [("DeepSeek-V3 prefill", 1, 128, 4096, 0), ("DeepSeek-V3 prefill x4", 4, 128, 2048, 0),
          ("DeepSeek-V3 decode x64", 64, 128, 1, 4096), ("GLM-4.7-Flash prefill", 1, 20, 4096, 0)]


def cases(quick, device="cuda"):
    import kiln

    apply, source = interleave_apply()
    compiled = torch.compile(apply, dynamic=False) if device == "cuda" else apply
    for name, b, h, s, start in (SHAPES[:1] + SHAPES[2:3] if quick else SHAPES):
        q, k = latent_qk(b, h, s, device)
        cos, sin = table(b, s, start, device)
        half = (cos[..., :ROPE // 2], sin[..., :ROPE // 2])
        yield {
            "name": f"{name} q{list(q.shape)} k{list(k.shape)}",
            "bytes": 2 * (q.numel() + k.numel()) * 2 + 2 * half[0].numel() * 2,
            "kiln": lambda q=q, k=k, t=half: kiln.rope(q, k, *t, rotary_dim=ROPE, deinterleave=True),
            "peers": {f"eager ({source})": lambda q=q, k=k, c=cos, s_=sin: apply(q, k, c, s_),
                      "compiled": lambda q=q, k=k, c=cos, s_=sin: compiled(q, k, c, s_)},
            "launch_bound": s == 1,
            "check": lambda q=q, k=k, t=half, c=cos, s_=sin: max(
                rel_err(a, e) for a, e in zip(kiln.rope(q, k, *t, rotary_dim=ROPE, deinterleave=True),
                                              apply(q, k, c, s_))),
        }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--quick", action="store_true", help="the first prefill and the decode step")
    parser.add_argument("--tag", default="", help="appended to the file names")
    args = parser.parse_args()
    common.eager_compiled_bench("mla_rope", "Latent attention RoPE (de-interleaved)", cases(args.quick), args.out,
                                args.tag)


if __name__ == "__main__":
    main()
