"""kiln.patch on a tiny Z-Image transformer on a GPU in bf16: as close to the fp32 model as
diffusers' own bf16 forward, with the calls test_patch_z_image_cpu.py counts."""

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_z_image", reason="this diffusers has no Z-Image transformer")

from test_patch_dit_cuda import _as_close_as_the_original  # noqa: E402
from test_patch_z_image_cpu import Z_IMAGE_CALLS, Calls, _first, _z_image, _z_image_inputs  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("caption_lengths", [(7, 5), (6, 6)])
def test_z_image_tiny_bf16_cuda(monkeypatch, caption_lengths):
    with torch.no_grad():
        truth = _first(_z_image(torch.float32, "cuda")(**_z_image_inputs(torch.float32, "cuda", caption_lengths)))
        model = _z_image(torch.bfloat16, "cuda")
        inputs = _z_image_inputs(torch.bfloat16, "cuda", caption_lengths)
        original = _first(model(**inputs))
        report = kiln.patch(model)
        assert report.left == []
        counter = Calls(monkeypatch)
        patched = _first(model(**inputs))
        assert counter.used() == Z_IMAGE_CALLS
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(_first(model(**inputs)), original)
