"""kiln.patch on a tiny Qwen-Image 2.1 transformer (CPU): its feed-forwards'
``out(silu(gate_layer(x)) * proj(x))`` as one kiln.swiglu between the projections, its
LayerNorms, q/k RMSNorms and text RMSNorm kiln's; fp32 and bf16 against diffusers' forward, with
autograd; unpatch restores it. Its blocks' modulated seams and its attention's rotation are still
diffusers'."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
if not hasattr(diffusers, "QwenImage21Transformer2DModel"):
    pytest.skip("this diffusers has no Qwen-Image 2.1", allow_module_level=True)

from gated_mlp_checks import assert_feed_forwards_gate_once, assert_trains_as_diffusers  # noqa: E402

LAYERS = 2


def _qwen_image21(dtype):
    torch.manual_seed(0)
    model = diffusers.QwenImage21Transformer2DModel(
        patch_size=1, in_channels=8, out_channels=8, num_layers=LAYERS, attention_head_dim=16, num_attention_heads=2,
        context_in_dim=24, mlp_ratio=2, axes_dims_rope=(4, 6, 6)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model.to(dtype)


def _inputs(dtype):
    """Two samples of a 4x6 latent grid (2x2 patches: 6 image tokens) after 7 text tokens, the
    second's text padded after 5."""
    g = torch.Generator().manual_seed(3)
    text, h, w = 7, 4, 6
    mask = torch.ones(2, text, dtype=torch.long)
    mask[1, 5:] = 0
    image_mask = torch.cat([torch.zeros(2, text, dtype=torch.bool), torch.ones(2, h * w // 4, dtype=torch.bool)], 1)
    return dict(hidden_states=torch.randn(2, h * w, 8, generator=g).to(dtype),
                encoder_hidden_states=torch.randn(2, text, 24, generator=g).to(dtype),
                timestep=torch.tensor([0.3, 0.7]).to(dtype), img_shapes=[[(1, h, w)]] * 2, img_mask=image_mask,
                encoder_hidden_states_mask=mask, return_dict=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen_image21_feed_forwards_gate_in_one_kiln_call(dtype, monkeypatch):
    assert_feed_forwards_gate_once(_qwen_image21(dtype), _inputs(dtype),
                                   [f"transformer_blocks.{i}.img_mlp" for i in range(LAYERS)],
                                   "mlp swiglu (gate_layer, proj, out)", dtype, monkeypatch)


def test_qwen_image21_trains_through_the_kiln_swiglu():
    assert_trains_as_diffusers(_qwen_image21(torch.float32), _inputs(torch.float32),
                               lambda m: [b.img_mlp.gate_layer.weight for b in m.transformer_blocks])
