"""kiln.patch on a tiny SkyReels-V2 transformer on a GPU in bf16 (diffusers' fp32 modules kept):
text to video, diffusion forcing, and diffusion forcing in causal frame blocks, each as close to
the fp32 model as diffusers' own bf16 forward, with the calls test_patch_skyreels_cpu.py counts
(but GELU's: on CUDA the feed-forwards' tanh GELU joins its projection's epilogue)."""

import pytest

pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_dit_cuda import assert_tiny_bf16_model  # noqa: E402
from test_patch_skyreels_cpu import CALLS, CASES, _skyreels, _skyreels_inputs  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_skyreels_tiny_bf16_cuda(monkeypatch, case):
    config, forcing = CASES[case]
    assert_tiny_bf16_model(lambda dtype, device: _skyreels(dtype, device, **config),
                           lambda dtype, device: _skyreels_inputs(dtype, device, forcing), CALLS, monkeypatch)
