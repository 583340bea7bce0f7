"""kiln.patch on a tiny Qwen-Image transformer on a GPU in bf16 (and Qwen-Image-Edit-2511's
per-token modulation): as close to the fp32 model as diffusers' own bf16 forward, with the
calls test_patch_qwen_image_cpu.py counts (the feed-forwards' tanh GELU in their projections'
cuBLASLt epilogue there)."""

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_qwenimage",
                    reason="this diffusers has no Qwen-Image transformer")

from test_patch_dit_cpu import Counter  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original, _count_epilogues, _on_cuda  # noqa: E402
from test_patch_qwen_image_cpu import QWEN_IMAGE_CALLS, _qwen_image, _qwen_image_inputs  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("edit", [False, True])
def test_qwen_image_tiny_bf16_cuda(monkeypatch, edit):
    images = 2 if edit else 1
    with torch.no_grad():
        truth = _qwen_image(torch.float32, "cuda", zero_cond_t=edit)(
            **_qwen_image_inputs(torch.float32, "cuda", images=images))[0]
        model = _qwen_image(torch.bfloat16, "cuda", zero_cond_t=edit)
        inputs = _qwen_image_inputs(torch.bfloat16, "cuda", images=images)
        original = model(**inputs)[0]
        report = kiln.patch(model)
        assert report.left == []
        counter = _count_epilogues(Counter(monkeypatch), monkeypatch)
        patched = model(**inputs)[0]
        assert counter.used() == _on_cuda(QWEN_IMAGE_CALLS)
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(model(**inputs)[0], original)
