"""kiln.patch on a tiny Stable Audio 3 DiT (diffusers' StableAudio3DiTModel, CPU): its RMSNorms,
whose scale is named ``gamma`` (normalised and scaled in fp32, rounded once), as kiln.rms_norm,
and its feed-forwards' ``proj_out(h * silu(gate))`` over proj_in's packed halves (up first, SiLU
called as a function) as one kiln.swiglu; fp32 and bf16 against diffusers' forward, with
autograd (gamma's gradients too); unpatch restores it."""

import pytest
import torch

import kiln
from kiln import activation_ops

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
sa3 = pytest.importorskip("diffusers.models.transformers.transformer_stable_audio3",
                          reason="this diffusers has no Stable Audio 3")

from test_patch_dit_cpu import Counter, _agree, _instance_forwards, _trains_as_diffusers  # noqa: E402

LAYERS = 2
# Each block: its pre-norm, the cross-attention's and the feed-forward's, and the self- and
# cross-attention's q and k norms twice each (differential attention: two maps a head); and its
# feed-forward's gate.
CALLS = {"rms_norm": 11 * LAYERS, "swiglu": LAYERS}
NORM = "rms_norm (scale named gamma)"
FEED_FORWARD = "mlp swiglu, one gate_up projection"


def _stable_audio3(dtype, device="cpu"):
    """A tiny model, its norms' gammas and its modulation spread as a trained model's."""
    torch.manual_seed(0)
    model = sa3.StableAudio3DiTModel(io_channels=8, embed_dim=64, depth=LAYERS, num_heads=2, cond_token_dim=16,
                                     global_cond_dim=16, local_add_cond_dim=5, timestep_features_dim=16,
                                     num_memory_tokens=4).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.add_(0.3 * torch.randn_like(p))
    return model.to(device=device, dtype=dtype)


def _inputs(dtype, device="cpu"):
    g = torch.Generator().manual_seed(3)
    return dict(hidden_states=torch.randn(2, 8, 12, generator=g).to(device, dtype),
                timestep=torch.tensor([0.2, 0.7]).to(device, dtype),
                encoder_hidden_states=torch.randn(2, 5, 16, generator=g).to(device, dtype),
                global_hidden_states=torch.randn(2, 16, generator=g).to(device, dtype), return_dict=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stable_audio3_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model = _stable_audio3(dtype)
    inputs = _inputs(dtype)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        assert report.left == []
        kinds = {r.path: r.kind for r in report.replaced}
        for i in range(LAYERS):
            block = f"transformer_blocks.{i}"
            assert kinds[f"{block}.ff"] == FEED_FORWARD
            assert all(kinds[f"{block}.{n}"] == NORM for n in ("pre_norm", "self_attn.q_norm", "self_attn.k_norm",
                                                                "cross_attend_norm", "cross_attn.q_norm",
                                                                "cross_attn.k_norm", "ff_norm"))
        counter = Counter(monkeypatch, more=[(activation_ops, "swiglu")])
        actual = model(**inputs)[0]
        assert counter.used() == CALLS
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)


def test_stable_audio3_trains_as_diffusers(monkeypatch):
    """With autograd: the norms' and the feed-forwards' kiln ops (which have backwards) still run,
    and every parameter's gradient (gamma's too) is diffusers'."""
    model = _stable_audio3(torch.float32).train()
    assert any(name.endswith("gamma") for name, _ in model.named_parameters())
    used = _trains_as_diffusers(model, _inputs(torch.float32),
                                lambda: Counter(monkeypatch, more=[(activation_ops, "swiglu")]))
    assert used == CALLS


def test_a_norm_computed_in_its_input_dtype_is_left_or_agrees():
    """Stable Audio 3's norm without force_fp32 computes in bf16: kiln computes in fp32, so where
    the probe takes it the outputs agree within the probe's tolerance."""
    norm = sa3.StableAudio3RMSNorm(64, force_fp32=False).to(torch.bfloat16)
    with torch.no_grad():
        norm.gamma.add_(0.3 * torch.randn(64).to(torch.bfloat16))
    x = torch.randn(4, 64).to(torch.bfloat16) + 0.5
    with torch.no_grad():
        expected = norm(x)
        report = kiln.patch(torch.nn.Sequential(norm))
        if report.replaced:
            _agree(norm(x), expected, torch.bfloat16)
        else:
            assert "does not compute an RMSNorm scaled by its gamma" in report.left[0].reason


def test_stable_audio3_patched_model_compiles():
    """torch.compile traces the patched model: its feed-forwards kiln's ops in the graph, its norms
    diffusers' (Inductor fuses each into the modulation or rotation after it)."""
    from graph_model import calls_of
    from test_patch_dit_cpu import _compiled_patched_graphs

    graphs = _compiled_patched_graphs(_stable_audio3(torch.float32), _inputs(torch.float32))
    assert calls_of(graphs, torch.ops.kiln.rms_norm.default) == []
    assert len(calls_of(graphs, torch.rsqrt)) == CALLS["rms_norm"]
    assert len(calls_of(graphs, torch.ops.kiln.swiglu.default)) == CALLS["swiglu"]
