"""kiln.patch on a tiny Stable Audio 3 DiT on a GPU in bf16: as close to the fp32 model as diffusers'
own bf16 forward, with the calls test_patch_stable_audio3_cpu.py counts."""

import pytest

pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_stable_audio3",
                    reason="this diffusers has no Stable Audio 3")

from kiln import activation_ops  # noqa: E402
from test_patch_dit_cuda import assert_tiny_bf16_model  # noqa: E402
from test_patch_stable_audio3_cpu import CALLS, _inputs, _stable_audio3  # noqa: E402


@pytest.mark.gpu
def test_stable_audio3_tiny_bf16_cuda(monkeypatch):
    assert_tiny_bf16_model(_stable_audio3, _inputs, CALLS, monkeypatch, more=[(activation_ops, "swiglu")])
