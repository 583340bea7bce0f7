"""kiln.patch on a tiny Lumina-Image 2.0 transformer on a GPU in bf16, a prompt padded: as close to
the fp32 model as diffusers' own bf16 forward, its feed-forwards gating in kiln.swiglu and its
RMSNorms kiln's, as test_patch_lumina2_cpu.py counts them."""

import pytest

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_dit_cuda import assert_tiny_bf16_model  # noqa: E402
from test_patch_lumina2_cpu import _lumina2, _lumina2_inputs  # noqa: E402


@pytest.mark.gpu
def test_lumina2_tiny_bf16_cuda(monkeypatch):
    # Every RMSNorm (the blocks' six, the attentions' q/k norms, the caption embedder's), the
    # four feed-forwards' gating, the output LayerNorm.
    assert_tiny_bf16_model(_lumina2, _lumina2_inputs, {"rms_norm": 25, "layer_norm": 1, "swiglu": 4}, monkeypatch,
                           more=((kiln.activation_ops, "swiglu"),))
