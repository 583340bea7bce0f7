"""kiln.patch on a tiny FLUX.2 transformer on a GPU in bf16: as close to the fp32 model as
diffusers' own bf16 forward, with the calls test_patch_flux2_cpu.py counts."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
if not hasattr(diffusers, "Flux2Transformer2DModel"):
    pytest.skip("this diffusers has no FLUX.2 transformer", allow_module_level=True)

from test_patch_dit_cuda import _as_close_as_the_original  # noqa: E402
from test_patch_flux2_cpu import FLUX2_CALLS, _Calls, _flux2, _flux2_inputs  # noqa: E402


@pytest.mark.gpu
def test_flux2_tiny_bf16_cuda(monkeypatch):
    with torch.no_grad():
        truth = _flux2(torch.float32, "cuda")(**_flux2_inputs(torch.float32, "cuda"))[0]
        model = _flux2(torch.bfloat16, "cuda")
        inputs = _flux2_inputs(torch.bfloat16, "cuda")
        original = model(**inputs)[0]
        report = kiln.patch(model)
        assert report.left == []
        calls = _Calls(monkeypatch)
        patched = model(**inputs)[0]
        assert calls.used() == FLUX2_CALLS
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(model(**inputs)[0], original)
