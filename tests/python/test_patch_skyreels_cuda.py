"""kiln.patch on a tiny SkyReels-V2 transformer on a GPU in bf16 (diffusers' fp32 modules kept):
text to video, diffusion forcing, and diffusion forcing in causal frame blocks, each as close to
the fp32 model as diffusers' own bf16 forward, with the calls test_patch_skyreels_cpu.py counts
(but GELU's: on CUDA the feed-forwards' tanh GELU joins its projection's epilogue)."""

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_dit_cpu import Counter  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original  # noqa: E402
from test_patch_skyreels_cpu import CALLS, CASES, _skyreels, _skyreels_inputs  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_skyreels_tiny_bf16_cuda(monkeypatch, case):
    config, forcing = CASES[case]
    with torch.no_grad():
        truth = _skyreels(torch.float32, "cuda", **config)(**_skyreels_inputs(torch.float32, "cuda", forcing))[0]
        model = _skyreels(torch.bfloat16, "cuda", **config)
        inputs = _skyreels_inputs(torch.bfloat16, "cuda", forcing)
        original = model(**inputs)[0]
        kiln.patch(model)
        counter = Counter(monkeypatch)
        patched = model(**inputs)[0]
        used = counter.used()
        assert {op: n for op, n in used.items() if op != "gelu"} == {op: n for op, n in CALLS.items() if op != "gelu"}
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(model(**inputs)[0], original)
