"""kiln.patch on tiny SD3 and SD3.5 Medium transformers on a GPU in bf16: as close to the fp32
model as diffusers' own bf16 forward, with the calls test_patch_sd3_cpu.py counts (but GELU's: on
CUDA the feed-forwards' tanh GELU joins its projection's epilogue)."""

import pytest

pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_dit_cuda import assert_tiny_bf16_model  # noqa: E402
from test_patch_sd3_cpu import CALLS, MODELS, _sd3, _sd3_inputs  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MODELS))
def test_sd3_tiny_bf16_cuda(monkeypatch, name):
    assert_tiny_bf16_model(lambda dtype, device: _sd3(dtype, device, **MODELS[name]), _sd3_inputs, CALLS[name],
                           monkeypatch)
