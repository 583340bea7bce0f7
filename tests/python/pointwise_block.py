"""A small module for the training tests: RoPE on q/k, a packed SwiGLU and a biased GELU,
through kiln's ops or through the plain torch formulas (the reference)."""

import torch

import kiln


class TinyBlock(torch.nn.Module):
    """A rotary attention-free block: RoPE on q/k, a SwiGLU and a biased GELU MLP."""

    def __init__(self, dim=16, hidden=24, use_kiln=True):
        super().__init__()
        self.use_kiln = use_kiln
        self.qk = torch.nn.Linear(dim, 2 * dim)
        self.gate_up = torch.nn.Linear(dim, 2 * hidden)
        self.down = torch.nn.Linear(hidden, dim, bias=False)
        self.bias = torch.nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        q, k = self.qk(x).view(b, s, 2, 4, d // 4).unbind(2)  # [B, S, 4 heads, D/4]
        gu = self.gate_up(x)
        if self.use_kiln:
            q, k = kiln.rope(q, k, cos, sin, layout="bshd")
            h = self.down(kiln.swiglu(gu))
            return (kiln.gelu(h + q.flatten(2) * k.flatten(2), self.bias, approximate="tanh")).sum()
        half = cos.shape[-1] // 2
        rot = lambda t: torch.cat([-t[..., half:], t[..., :half]], -1)  # noqa: E731
        c, s_ = cos[None, :, None], sin[None, :, None]
        q, k = q * c + rot(q) * s_, k * c + rot(k) * s_
        g, u = gu.chunk(2, -1)
        h = self.down(torch.nn.functional.silu(g) * u)
        return torch.nn.functional.gelu(h + q.flatten(2) * k.flatten(2) + self.bias,
                                        approximate="tanh").sum()
