"""fp64 references of the activation ops, written from their definitions (not from torch's
activation functions), and helpers shared by the activation tests."""

import math

import torch


def split_packed(packed, up_first):
    half = packed.shape[-1] // 2
    first, second = packed[..., :half], packed[..., half:]
    return (second, first) if up_first else (first, second)


def silu_fp64(x):
    x = x.double()
    return x / (1 + torch.exp(-x))


def gelu_fp64(x, approximate):
    x = x.double()
    if approximate == "tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def swiglu_fp64(gate, up=None, up_first=False):
    if up is None:
        gate, up = split_packed(gate, up_first)
    return silu_fp64(gate) * up.double()


def geglu_fp64(gate, up=None, approximate="tanh", up_first=False):
    if up is None:
        gate, up = split_packed(gate, up_first)
    return gelu_fp64(gate, approximate) * up.double()


def bias_gelu_fp64(x, bias=None, approximate="tanh"):
    x = x.double()
    if bias is not None:
        x = x + bias.double()
    return gelu_fp64(x, approximate)


def gated_residual_fp64(h, y, gate):
    return h.double() + y.double() * gate.double()


def fresh(shape, dtype, device="cpu", scale=2.0, generator=None):
    """Random values of both signs, never all zeros, spanning the activations' curved part."""
    x = torch.randn(shape, device=device, generator=generator) * scale + 0.1
    return x.to(dtype)


def clamped_swiglu_fp64(gate_up, alpha=1.702, limit=7.0, interleaved=True):
    """GPT-OSS's expert gate (transformers' GptOssExperts._apply_gate) in fp64."""
    x = gate_up.double()
    gate, up = (x[..., ::2], x[..., 1::2]) if interleaved else split_packed(x, False)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * gate * torch.sigmoid(gate * alpha)


def gpt_oss_gate_up(shape, dtype, device="cpu", limit=7.0, generator=None):
    """A packed gate_up whose values cross both clamps: N(0, limit) spans +-2 limits, with a
    few elements set to exactly +-limit, where the clamps' gradient still passes."""
    x = torch.randn(shape, device=device, generator=generator) * limit + 0.1
    flat = x.view(-1)
    flat[::7] = limit
    flat[3::11] = -limit
    return x.to(dtype)
