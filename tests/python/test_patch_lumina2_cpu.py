"""kiln.patch on Lumina-Image 2.0's transformer (diffusers' Lumina2Transformer2DModel), on the CPU:
its feed-forwards (``linear_2(silu(linear_1(x)) * linear_3(x))``, the SiLU in fp32) gate in one
kiln.swiglu and its RMSNorms are kiln's, against diffusers' own forward in fp32 and bf16 (a prompt
padded in one batch entry), under autograd; the feed-forward alone, and a look-alike whose
activation is not SiLU left to itself."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_dit_cpu import Counter, _agree, _instance_forwards, _norms_spread, _trains_as_diffusers  # noqa: E402

FEED_FORWARD = "mlp swiglu (linear_1, linear_3, linear_2)"


def _lumina2(dtype, device="cpu"):
    """A tiny Lumina2 transformer: two joint layers, one noise and one context refiner layer."""
    torch.manual_seed(0)
    model = diffusers.Lumina2Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, hidden_size=48, num_layers=2, num_refiner_layers=1,
        num_attention_heads=2, num_kv_heads=1, multiple_of=16, axes_dim_rope=(8, 8, 8), axes_lens=(64, 16, 16),
        cap_feat_dim=16).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _lumina2_inputs(dtype, device="cpu"):
    """Two 8 x 8 latents (16 tokens) and prompts of 6 tokens, the second's last two padding."""
    g = torch.Generator().manual_seed(3)
    return dict(hidden_states=torch.randn(2, 4, 8, 8, generator=g).to(device, dtype),
                timestep=torch.tensor([0.3, 0.7]).to(device, dtype),
                encoder_hidden_states=torch.randn(2, 6, 16, generator=g).to(device, dtype),
                encoder_attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]).to(device), return_dict=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lumina2_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model, inputs = _lumina2(dtype), _lumina2_inputs(dtype)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        feed_forwards = [p for p, k in kinds.items() if k == FEED_FORWARD]
        assert sorted(feed_forwards) == ["context_refiner.0.feed_forward", "layers.0.feed_forward",
                                         "layers.1.feed_forward", "noise_refiner.0.feed_forward"]
        counter = Counter(monkeypatch, more=((kiln.activation_ops, "swiglu"),))
        actual = model(**inputs)[0]
        assert counter.used()["swiglu"] == 4
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lumina_feed_forward_alone(dtype, monkeypatch):
    """The feed-forward at a width that is not a multiple of 8 (Lumina rounds its inner width to
    multiple_of): one kiln.swiglu between diffusers' projections, within the output's rounding."""
    from diffusers.models.transformers.transformer_lumina2 import LuminaFeedForward

    torch.manual_seed(1)
    module = LuminaFeedForward(dim=40, inner_dim=4 * 40, multiple_of=12).to(dtype).eval()
    x = torch.randn(3, 5, 40).to(dtype)
    with torch.no_grad():
        expected = module(x)
        assert [r.kind for r in kiln.patch(module).replaced] == [FEED_FORWARD]
        counter = Counter(monkeypatch, more=((kiln.activation_ops, "swiglu"),))
        actual = module(x)
    assert counter.used() == {"swiglu": 1}
    _agree(actual, expected, dtype)


def test_lumina_shaped_feed_forward_takes_the_activation_it_computes():
    """linear_1, linear_2, linear_3 and a ``silu`` attribute that computes GELU: one kiln.geglu;
    one that computes tanh: left, as neither."""
    from diffusers.models.transformers.transformer_lumina2 import LuminaFeedForward

    module = LuminaFeedForward(dim=16, inner_dim=32, multiple_of=8).eval()
    module.silu = torch.nn.GELU()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        expected = module(x)
        assert [r.kind for r in kiln.patch(module).replaced] == ["mlp geglu (linear_1, linear_3, linear_2)"]
        _agree(module(x), expected, torch.float32)
    kiln.unpatch(module)
    module.silu = torch.nn.Tanh()
    report = kiln.patch(module)
    assert report.replaced == [] and "is not SiLU or GELU" in report.left[0].reason


def test_lumina2_trains_as_diffusers(monkeypatch):
    """With autograd the feed-forwards stay kiln's (swiglu has a backward); every gradient agrees."""
    used = _trains_as_diffusers(_lumina2(torch.float32), _lumina2_inputs(torch.float32),
                                lambda: Counter(monkeypatch, more=((kiln.activation_ops, "swiglu"),)))
    assert used["swiglu"] == 4
