"""kiln.patch on a tiny Qwen-Image 2.1 transformer on a GPU in bf16: as close to the fp32
computation as diffusers' own bf16 forward (test_patch_qwen_image21_cpu.py has the rest)."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
if not hasattr(diffusers, "QwenImage21Transformer2DModel"):
    pytest.skip("this diffusers has no Qwen-Image 2.1", allow_module_level=True)

from kiln import activation_ops  # noqa: E402
from test_patch_dit_cuda import assert_tiny_bf16_model  # noqa: E402
from test_patch_qwen_image21_cpu import LAYERS, _inputs, _qwen_image21  # noqa: E402


@pytest.mark.gpu
def test_qwen_image21_tiny_bf16_cuda(monkeypatch):
    # Each block's feed-forward gates in one kiln.swiglu; its two LayerNorms a block and the
    # output's, its q/k RMSNorms and the text's are kiln's modules.
    assert_tiny_bf16_model(lambda dtype, device: _qwen_image21(dtype).to(device),
                           lambda dtype, device: {k: v.to(device) if isinstance(v, torch.Tensor) else v
                                                  for k, v in _inputs(dtype).items()},
                           {"swiglu": LAYERS, "layer_norm": 2 * LAYERS + 1, "rms_norm": 2 * LAYERS + 1}, monkeypatch, more=[(activation_ops, "swiglu")])
