"""kiln.patch on tiny HunyuanVideo, HunyuanVideo 1.5 and HunyuanImage transformers on a GPU in bf16: as close to
the fp32 model as diffusers' own bf16 forward, with the calls test_patch_hunyuan_video_cpu.py counts
(but GELU's: on CUDA the feed-forwards' tanh GELU joins its projection's epilogue)."""

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_hunyuan_video15",
                    reason="this diffusers has no HunyuanVideo 1.5 transformer")

from test_patch_dit_cpu import Counter  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original  # noqa: E402
from test_patch_hunyuan_video_cpu import (HUNYUAN_IMAGE_CALLS, HUNYUAN_VIDEO_15_CALLS,  # noqa: E402
                                          HUNYUAN_VIDEO_CALLS, REFINER_FF, _hunyuan_image, _hunyuan_image_inputs,
                                          _hunyuan_video, _hunyuan_video_15, _hunyuan_video_15_inputs,
                                          _hunyuan_video_inputs)

MODELS = {"hunyuan-video": (_hunyuan_video, _hunyuan_video_inputs, HUNYUAN_VIDEO_CALLS),
          "hunyuan-video-1.5": (_hunyuan_video_15, _hunyuan_video_15_inputs, HUNYUAN_VIDEO_15_CALLS),
          "hunyuan-image": (_hunyuan_image, _hunyuan_image_inputs, HUNYUAN_IMAGE_CALLS)}


def _but_gelu(calls: dict) -> dict:
    return {op: n for op, n in calls.items() if op != "gelu"}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MODELS))
def test_hunyuan_video_tiny_bf16_cuda(monkeypatch, name):
    build, inputs_of, calls = MODELS[name]
    with torch.no_grad():
        truth = build(torch.float32, "cuda")(**inputs_of(torch.float32, "cuda"))[0]
        model = build(torch.bfloat16, "cuda")
        inputs = inputs_of(torch.bfloat16, "cuda")
        original = model(**inputs)[0]
        report = kiln.patch(model)
        assert [entry.path for entry in report.left] == [REFINER_FF]
        counter = Counter(monkeypatch)
        patched = model(**inputs)[0]
        assert _but_gelu(counter.used()) == _but_gelu(calls)
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(model(**inputs)[0], original)
