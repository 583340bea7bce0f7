"""fp64 restatements of the RoPE formulas kiln's ops must match, written from the libraries'
source:
- transformers: ``rotate_half`` and ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``
  (cos/sin [B, S, D]), with partial rotary as GPT-NeoX-style models slice it, and GPT-OSS's
  form of it (cos/sin [B, S, D / 2], each pair's angle once);
- diffusers: ``apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1)``
  (interleaved pairs) and LTX-Video's ``apply_rotary_emb`` on [B, S, C];
- diffusers' ``LTXVideoRotaryPosEmbed.forward`` (the video table) in fp64;
- the rotation inside diffusers' ``WanAttnProcessor.__call__`` (cos at even columns, sin at
  odd ones of [.., S, 1, D] tables)."""

import math

import torch


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """q, k [B, H, S, D]; cos, sin [B, S, R] (R <= D: the rest passes through)."""
    q, k, cos, sin = q.double(), k.double(), cos.double(), sin.double()
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    r = cos.shape[-1]
    q_rot, q_pass = q[..., :r], q[..., r:]
    k_rot, k_pass = k[..., :r], k[..., r:]
    q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)
    k_embed = (k_rot * cos) + (rotate_half(k_rot) * sin)
    return torch.cat([q_embed, q_pass], -1), torch.cat([k_embed, k_pass], -1)


def gpt_oss_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' GPT-OSS form: cos/sin [B, S, D / 2], one angle a pair (i, i + D / 2)."""
    def rotate(x, cos, sin):
        first, second = torch.chunk(x.double(), 2, dim=-1)
        return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)

    cos, sin = cos.double().unsqueeze(unsqueeze_dim), sin.double().unsqueeze(unsqueeze_dim)
    return rotate(q, cos, sin), rotate(k, cos, sin)


def deepseek_apply_rotary_pos_emb_interleave(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' DeepSeek-V3 ``apply_rotary_pos_emb_interleave``: cos/sin [B, S, D] (each
    angle twice, cat(freqs, freqs)) of which the first half turns the pairs (2j, 2j + 1), written
    de-interleaved (the pair's results at j and j + D / 2)."""
    cos = cos.double()[..., : cos.shape[-1] // 2].unsqueeze(unsqueeze_dim)
    sin = sin.double()[..., : sin.shape[-1] // 2].unsqueeze(unsqueeze_dim)

    def rotate(x):
        x = x.double()
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    return rotate(q), rotate(k)


def diffusers_apply_rotary_emb(x, cos, sin):
    """use_real=True, use_real_unbind_dim=-1: x [B, H, S, D], cos/sin [S, D]."""
    x = x.double()
    cos, sin = cos.double()[None, None], sin.double()[None, None]
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return x * cos + x_rotated * sin


def ltx_apply_rotary_emb(x, cos, sin):
    """LTX-Video's: x [B, S, C], cos/sin [B, S, C]."""
    x = x.double()
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
    return x * cos.double() + x_rotated * sin.double()


def ltx_video_table(batch, dim, num_frames, height, width, rope_interpolation_scale=None,
                    base_num_frames=20, base_height=2048, base_width=2048, patch_size=1,
                    patch_size_t=1, theta=10000.0):
    """LTXVideoRotaryPosEmbed.forward in fp64: (cos, sin), each [B, F*H*W, dim]."""
    f64 = torch.float64
    grid_h = torch.arange(height, dtype=f64)
    grid_w = torch.arange(width, dtype=f64)
    grid_f = torch.arange(num_frames, dtype=f64)
    grid = torch.stack(torch.meshgrid(grid_f, grid_h, grid_w, indexing="ij"), dim=0)
    grid = grid.unsqueeze(0).repeat(batch, 1, 1, 1, 1)
    if rope_interpolation_scale is not None:
        grid[:, 0:1] = grid[:, 0:1] * rope_interpolation_scale[0] * patch_size_t / base_num_frames
        grid[:, 1:2] = grid[:, 1:2] * rope_interpolation_scale[1] * patch_size / base_height
        grid[:, 2:3] = grid[:, 2:3] * rope_interpolation_scale[2] * patch_size / base_width
    grid = grid.flatten(2, 4).transpose(1, 2)
    freqs = theta ** torch.linspace(math.log(1.0, theta), math.log(theta, theta), dim // 6, dtype=f64)
    freqs = freqs * math.pi / 2.0
    freqs = freqs * (grid.unsqueeze(-1) * 2 - 1)
    freqs = freqs.transpose(-1, -2).flatten(2)
    cos = freqs.cos().repeat_interleave(2, dim=-1)
    sin = freqs.sin().repeat_interleave(2, dim=-1)
    if dim % 6 != 0:
        cos = torch.cat([torch.ones_like(cos[:, :, : dim % 6]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(cos[:, :, : dim % 6]), sin], dim=-1)
    return cos, sin


def wan_apply_rotary_emb(x, cos, sin, heads):
    """x [B, S, H * D] split into heads, each rotated in interleaved pairs (2j, 2j + 1) by
    cos[..., 2j] and sin[..., 2j + 1] of cos/sin [B or 1, S, 1, D], as Wan's processor does;
    returned as [B, S, H * D] in fp64."""
    x = x.double().unflatten(2, (heads, -1))
    cos, sin = cos.double()[..., 0::2], sin.double()[..., 1::2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.flatten(2)


def assert_norm_rope_close(out, ref, normed, dtype):
    """A fused norm + rotation against the fp64 rotation of the norm rounded to `dtype`
    (`normed`): one rounding of the output (relative to max(1, |ref|)), plus where the kernel's
    fp32 norm rounds to the neighbouring value of `dtype`, that ulp carried through the
    rotation (|cos|, |sin| <= 1): eps(dtype) times the pair's |x| + |y|."""
    from reference import TOLERANCE

    assert out.shape == ref.shape and not torch.isnan(out).any()
    pair = normed.double().abs().unflatten(-1, (-1, 2)).sum(-1).repeat_interleave(2, -1)
    allowed = TOLERANCE[dtype] * ref.abs().clamp_min(1.0) + torch.finfo(dtype).eps * pair
    excess = ((out.double() - ref).abs() - allowed).max().item()
    assert excess <= 0, f"error exceeds one rounding plus the norm's ulp by {excess:.3e}"


def unrelated_cos_sin(batch, seq, dim, device="cpu"):
    """fp32 [B, S, 1, D] cos and sin tables of an angle drawn for each column of each, so no
    column's value follows from another's (a kernel reading the wrong column is caught), yet
    of unit size as rotation tables are."""
    angles = 2 * math.pi * torch.rand(2, batch, seq, 1, dim, device=device)
    return angles[0].cos(), angles[1].sin()


def rms_norm_across_heads(x, weight, eps, dtype):
    """torch.nn.RMSNorm(C) in fp64, rounded to `dtype` as the module's output is."""
    x = x.double()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    return y.to(dtype)


def rms_norm_per_head(x, weight, eps, dtype):
    """Qwen3's ``q_norm`` / FLUX's ``norm_q`` (an RMSNorm of the head dim, the last dimension
    of x) in fp64, weight or None, rounded to `dtype` as the module's output is."""
    x = x.double()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    return y.to(dtype)


def flux_prologue(x, weight, cos, sin, eps, dtype):
    """FLUX's attention prologue in fp64 for x [B, S, H, D]: ``norm_q`` per head (rounded to
    `dtype`, as the module's output is), then diffusers' interleaved rotation by cos/sin [S, D]."""
    return diffusers_apply_rotary_emb(rms_norm_per_head(x, weight, eps, dtype).transpose(1, 2),
                                      cos, sin).transpose(1, 2)


def transformers_qk(batch, heads_q, heads_k, seq, dim, dtype, heads_inner, device="cuda", generator=None):
    """Random q [B, Hq, S, D] and k [B, Hk, S, D] of `dtype`: with heads_inner as transformers'
    attentions hand them over (views of [B, S, H, D] projections), else contiguous."""
    def one(heads):
        shape = (batch, seq, heads, dim) if heads_inner else (batch, heads, seq, dim)
        x = torch.randn(*shape, device=device, generator=generator).to(dtype)
        return x.transpose(1, 2) if heads_inner else x
    return one(heads_q), one(heads_k)


def llama_cos_sin(batch, seq, dim, base=10000.0, positions=None):
    """LlamaRotaryEmbedding's table (fp32): cat(freqs, freqs) of inv_freq x positions."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if positions is None:
        positions = torch.arange(seq).expand(batch, seq)
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()
