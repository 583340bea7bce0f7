"""Inputs of the GPU tests: fresh random tensors, and NaN left where the op's outputs will be
allocated (so an element a kernel fails to write shows up as NaN)."""

import torch


def poison_allocator(shape, dtype, count=2):
    """Leaves NaN in the caching allocator's free blocks that the op's outputs will reuse."""
    junk = [torch.full(shape, float("nan"), dtype=dtype, device="cuda") for _ in range(count)]
    del junk


def rand(*shape, dtype, gen, offset=0.0, scale=1.0):
    return (torch.randn(*shape, device="cuda", generator=gen) * scale + offset).to(dtype)
