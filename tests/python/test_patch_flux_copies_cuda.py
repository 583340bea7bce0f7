"""kiln.patch on the FLUX copies (Bria 3.x, Bria FIBO, LongCat-Image, Ovis-Image) on a GPU in bf16:
each tiny model, and Ovis-Image's SwiGLU single block at its full width, as close to the fp32
computation as diffusers' own bf16 forward (test_patch_flux_copies_cpu.py has the rest)."""

import pytest
import torch

import kiln
from kiln import activation_ops

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")

from kiln.patching import replace  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original, assert_tiny_bf16_model  # noqa: E402
from test_patch_flux_copies_cpu import COPIES, _copy, _fused, _inputs  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("key", sorted(COPIES))
def test_flux_copy_tiny_bf16_cuda(key, monkeypatch):
    _, _, act, own = COPIES[key]
    assert_tiny_bf16_model(lambda dtype, device: _copy(key, dtype, device),
                           lambda dtype, device: _inputs(key, dtype, device), _fused(act, own), monkeypatch,
                           more=[(activation_ops, "swiglu")])


@pytest.mark.gpu
def test_ovis_image_single_block_at_full_width_cuda():
    """One Ovis-Image single block at its width (24 heads of 128, a gated MLP of 12288), 512
    text and 4096 image tokens: the SwiGLU written into proj_out's input beside the attention."""
    from diffusers.models.transformers.transformer_ovis_image import OvisImageSingleTransformerBlock

    torch.manual_seed(0)
    block = OvisImageSingleTransformerBlock(3072, 24, 128).cuda().eval()
    g = torch.Generator("cuda").manual_seed(1)
    h = torch.randn(1, 4096, 3072, device="cuda", generator=g)
    c = torch.randn(1, 512, 3072, device="cuda", generator=g)
    temb = torch.randn(1, 3072, device="cuda", generator=g)
    angles = 40 * torch.rand(4608, 64, device="cuda", generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))

    def run():
        dtype = block.proj_mlp.weight.dtype
        with torch.no_grad():
            return torch.cat(block(h.to(dtype), c.to(dtype), temb.to(dtype), image_rotary_emb=rope), dim=1)

    truth = run()
    block.to(torch.bfloat16)
    original = run()
    kiln.patch(block)
    assert replace.state_of(block).kind == "flux single block (swiglu into proj_out's input, gated residual)"
    _as_close_as_the_original(run(), original, truth)
