"""kiln.patch on a tiny Wan VACE transformer on a GPU in bf16 (diffusers' fp32 modules kept): as
close to the fp32 model as diffusers' own bf16 forward, with the calls test_patch_wan_vace_cpu.py
counts (but GELU's: on CUDA the feed-forwards' tanh GELU joins its projection's epilogue)."""

import pytest

pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_dit_cuda import assert_tiny_bf16_model  # noqa: E402
from test_patch_wan_vace_cpu import CALLS, _vace, _vace_inputs  # noqa: E402


@pytest.mark.gpu
def test_wan_vace_tiny_bf16_cuda(monkeypatch):
    assert_tiny_bf16_model(_vace, _vace_inputs, CALLS, monkeypatch)
