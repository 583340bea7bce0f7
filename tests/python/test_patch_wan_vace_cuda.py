"""kiln.patch on a tiny Wan VACE transformer on a GPU in bf16 (diffusers' fp32 modules kept): as
close to the fp32 model as diffusers' own bf16 forward, with the calls test_patch_wan_vace_cpu.py
counts (but GELU's: on CUDA the feed-forwards' tanh GELU joins its projection's epilogue)."""

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_dit_cpu import Counter  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original  # noqa: E402
from test_patch_wan_vace_cpu import CALLS, _vace, _vace_inputs  # noqa: E402


@pytest.mark.gpu
def test_wan_vace_tiny_bf16_cuda(monkeypatch):
    with torch.no_grad():
        truth = _vace(torch.float32, "cuda")(**_vace_inputs(torch.float32, "cuda"))[0]
        model = _vace(torch.bfloat16, "cuda")
        inputs = _vace_inputs(torch.bfloat16, "cuda")
        original = model(**inputs)[0]
        kiln.patch(model)
        counter = Counter(monkeypatch)
        patched = model(**inputs)[0]
        used = counter.used()
        assert {op: n for op, n in used.items() if op != "gelu"} == {op: n for op, n in CALLS.items() if op != "gelu"}
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(model(**inputs)[0], original)
