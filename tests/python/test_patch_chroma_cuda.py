"""kiln.patch on a tiny Chroma transformer on a GPU in bf16, with the prompt's padding masked: as
close to the fp32 model as diffusers' own bf16 forward, with the calls test_patch_chroma_cpu.py
counts (but GELU's: on CUDA the feed-forwards' tanh GELU joins its projection's epilogue)."""

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")

from kiln.patching import replace  # noqa: E402
from test_patch_chroma_cpu import CALLS, _chroma, _chroma_inputs  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original, assert_tiny_bf16_model  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_chroma_tiny_bf16_cuda(monkeypatch, masked):
    assert_tiny_bf16_model(_chroma, lambda dtype, device: _chroma_inputs(dtype, device, masked), CALLS, monkeypatch)



@pytest.mark.gpu
def test_chroma_block_at_full_width_cuda():
    """One double and one single block at Chroma's width (3072, 24 heads of 128), 1024 image and
    512 text tokens, the prompt padded: patched as close to the fp32 blocks as diffusers' bf16."""
    from diffusers.models.transformers.transformer_chroma import ChromaSingleTransformerBlock, ChromaTransformerBlock

    torch.manual_seed(0)
    blocks = [ChromaTransformerBlock(3072, 24, 128).cuda().eval(),
              ChromaSingleTransformerBlock(3072, 24, 128).cuda().eval()]
    g = torch.Generator("cuda").manual_seed(1)
    h = torch.randn(1, 1024, 3072, device="cuda", generator=g)
    c = torch.randn(1, 512, 3072, device="cuda", generator=g)
    temb = 0.5 * torch.randn(1, 15, 3072, device="cuda", generator=g)
    angles = torch.randn(1536, 64, device="cuda", generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))
    mask = torch.ones(1, 1536, dtype=torch.bool, device="cuda")
    mask[:, 200:512] = False

    def run(dtype):
        with torch.no_grad():
            double, single = (b.to(dtype) for b in blocks)
            new_c, new_h = double(h.to(dtype), c.to(dtype), temb[:, :12].to(dtype), rope, mask)
            return single(torch.cat([new_c, new_h], dim=1), temb[:, 12:].to(dtype), rope, mask)

    truth = run(torch.float32)
    original = run(torch.bfloat16)
    assert torch.isfinite(truth).all() and torch.isfinite(original).all()
    for block in blocks:
        kiln.patch(block)
    assert all("chroma" in replace.state_of(b).kind for b in blocks)
    _as_close_as_the_original(run(torch.bfloat16), original, truth)
