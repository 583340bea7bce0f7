"""kiln.patch on Qwen-Image 2.1 on a GPU in bf16: a tiny transformer and one block at full width,
each as close to the fp32 computation as diffusers' own bf16 forward
(test_patch_qwen_image21_cpu.py has the rest)."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
if not hasattr(diffusers, "QwenImage21Transformer2DModel"):
    pytest.skip("this diffusers has no Qwen-Image 2.1", allow_module_level=True)

import kiln  # noqa: E402
from kiln import activation_ops  # noqa: E402
from kiln.patching import replace  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original, assert_tiny_bf16_model  # noqa: E402
from test_patch_qwen_image21_cpu import CALLS, LAYERS, _inputs, _qwen_image21  # noqa: E402


@pytest.mark.gpu
def test_qwen_image21_tiny_bf16_cuda(monkeypatch):
    # Each block's feed-forward gates in one kiln.swiglu, its seams are three kiln calls and its
    # attention's norms and rotation one; the output's LayerNorm and the text's RMSNorm kiln's.
    assert_tiny_bf16_model(lambda dtype, device: _qwen_image21(dtype).to(device),
                           lambda dtype, device: {k: v.to(device) if isinstance(v, torch.Tensor) else v
                                                  for k, v in _inputs(dtype).items()},
                           {"swiglu": LAYERS, **CALLS}, monkeypatch,
                           more=[(activation_ops, "swiglu")])


@pytest.mark.gpu
@pytest.mark.parametrize("causal_condition", [True, False], ids=["per-token", "per-sample"])
def test_qwen_image21_block_at_full_width_cuda(causal_condition):
    """One block at Qwen-Image 2.1's width (32 heads of 128, a feed-forward of 3x), 1024 prefix and
    4096 target image tokens, batch 2; its attention replaced by an elementwise stand-in (the block
    seams are what is checked; the attention runs segments of the prefix)."""
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21TransformerBlock

    torch.manual_seed(0)
    block = QwenImage21TransformerBlock(4096, 32, 128).cuda().eval()
    g = torch.Generator("cuda").manual_seed(1)
    w = torch.randn(4096, device="cuda", generator=g)
    block.attn.forward = lambda hidden_states, **kwargs: torch.tanh(hidden_states * w.to(hidden_states.dtype))
    h = torch.randn(2, 5120, 4096, device="cuda", generator=g)
    modulation = 0.5 * torch.randn(3 if causal_condition else 2, 4 * 4096, device="cuda", generator=g)
    mask = torch.arange(5120, device="cuda") >= 1024 if causal_condition else None

    def run():
        dtype = block.img_mlp.proj.weight.dtype
        with torch.no_grad():
            return block(h.to(dtype), modulation.to(dtype), target_token_mask=mask)

    truth = run()
    block.to(torch.bfloat16)
    original = run()
    kiln.patch(block)
    assert replace.state_of(block).kind == "qwen-image 2.1 block (adaln, gated residual + norm seams)"
    _as_close_as_the_original(run(), original, truth)
