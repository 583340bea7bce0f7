"""kiln.patch on FLUX.3 on a GPU in bf16 (the q/k norms in fp32, as diffusers' loader keeps them):
a tiny model with reference image tokens, one attention and one joint block at FLUX.3's width,
each as close to the fp32 computation as diffusers' own bf16 forward (test_patch_flux3_cpu.py has
the rest)."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
if not hasattr(diffusers, "Flux3Transformer2DModel"):
    pytest.skip("this diffusers has no FLUX.3", allow_module_level=True)

from kiln.patching import replace  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original, assert_tiny_bf16_model  # noqa: E402
from test_patch_flux3_cpu import _flux3, _flux3_inputs  # noqa: E402

# The modulated norms (a mode block's, one a stream in each joint block, the output's) and the
# gated residuals (two mode blocks of three modes, two joint blocks of two streams); every
# attention's norms and rotation.
CALLS = {"adaln": 11, "gated_residual": 10, "head_norm_rope": 8}


@pytest.mark.gpu
def test_flux3_tiny_bf16_cuda(monkeypatch):
    assert_tiny_bf16_model(_flux3, lambda dtype, device: _flux3_inputs(dtype, device, reference=True), CALLS,
                           monkeypatch)


@pytest.mark.gpu
def test_flux3_attention_at_full_width_cuda():
    """One joint attention at FLUX.3's width (24 heads of 128), 512 text and 4096 image tokens."""
    from diffusers.models.transformers.transformer_flux3 import Flux3Attention

    torch.manual_seed(0)
    attn = Flux3Attention(3072, heads=24, dim_head=128).cuda().eval()
    with torch.no_grad():
        attn.norm_q.weight.add_(0.2 * torch.randn_like(attn.norm_q.weight))
        attn.norm_k.weight.add_(0.2 * torch.randn_like(attn.norm_k.weight))
    g = torch.Generator("cuda").manual_seed(1)
    x = torch.randn(1, 4608, 3072, device="cuda", generator=g)
    angles = 40 * torch.rand(4608, 64, device="cuda", generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))

    def run():
        with torch.no_grad():
            return attn(x.to(attn.to_q.weight.dtype), image_rotary_emb=rope)

    truth = run()
    for name in ("to_q", "to_k", "to_v", "to_out"):
        getattr(attn, name).to(torch.bfloat16)  # the norms stay fp32
    original = run()
    kiln.patch(attn)
    assert replace.state_of(attn).kind == "flux.3 attention (per-head q/k rms_norm + rope)"
    _as_close_as_the_original(run(), original, truth)


@pytest.mark.gpu
@pytest.mark.parametrize("per_token", [False, True], ids=["per-sample", "per-token"])
def test_flux3_joint_block_at_full_width_cuda(per_token):
    """One joint block at FLUX.3's width (24 heads of 128, feed-forward 9216), 512 text and 4096
    image tokens, batch 2, its modulation one row a sample (expanded, as the patched transformer
    hands it over) or per token (the image's and a reference's concatenated)."""
    from diffusers.models.transformers.transformer_flux3 import Flux3SingleTransformerBlock

    torch.manual_seed(0)
    block = Flux3SingleTransformerBlock(3072, 24, 128).cuda().eval()
    g = torch.Generator("cuda").manual_seed(1)
    h = torch.randn(2, 4096, 3072, device="cuda", generator=g)
    c = torch.randn(2, 512, 3072, device="cuda", generator=g)
    mod = 0.5 * torch.randn(2, 4096 if per_token else 1, 3 * 3072, device="cuda", generator=g)
    c_mod = 0.5 * torch.randn(2, 1, 3 * 3072, device="cuda", generator=g)
    angles = 40 * torch.rand(4608, 64, device="cuda", generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))

    def run():
        dtype = block.ff.linear_in.weight.dtype
        with torch.no_grad():
            # Expanded after the cast, which would make the rows a tensor of their own.
            return torch.cat(block(h.to(dtype), c.to(dtype), mod.to(dtype).expand(2, 4096, -1),
                                   c_mod.to(dtype).expand(2, 512, -1), rope), dim=1)

    truth = run()
    for name, child in block.named_children():
        if name != "attn":
            child.to(torch.bfloat16)
    for name in ("to_q", "to_k", "to_v", "to_out"):
        getattr(block.attn, name).to(torch.bfloat16)  # the q/k norms stay fp32
    original = run()
    kiln.patch(block)
    assert replace.state_of(block).kind.startswith("flux.3 joint block")
    _as_close_as_the_original(run(), original, truth)
