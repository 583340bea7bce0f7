"""kiln.patch on a tiny Stable Audio 3 DiT (diffusers' StableAudio3DiTModel, CPU): its RMSNorms,
whose scale is named ``gamma`` (normalised and scaled in fp32, rounded once), as kiln.rms_norm,
its feed-forwards' ``proj_out(h * silu(gate))`` over proj_in's packed halves (up first, SiLU
called as a function) as one kiln.swiglu, and its blocks' seams as kiln.adaln, kiln.gated_adaln
and kiln.gated_residual_; fp32 and bf16 against diffusers' forward, with autograd (gamma's
gradients too; the blocks diffusers'), with inpainting's local conditioning (the blocks
diffusers'); unpatch restores it."""

import pytest
import torch

import kiln
from kiln import activation_ops

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
sa3 = pytest.importorskip("diffusers.models.transformers.transformer_stable_audio3",
                          reason="this diffusers has no Stable Audio 3")

from test_patch_dit_cpu import Counter, _agree, _instance_forwards, _trains_as_diffusers  # noqa: E402

LAYERS = 2
# Each block: the self- and cross-attention's q and k norms twice each (differential attention:
# two maps a head); its pre-norm's seam (adaln), the cross-attention's and the feed-forward's
# (gated_adaln), its last gated residual; its feed-forward's gate.
CALLS = {"rms_norm": 8 * LAYERS, "adaln": LAYERS, "gated_adaln": 2 * LAYERS, "gated_residual_": LAYERS,
         "swiglu": LAYERS}
# The blocks diffusers' (autograd, inpainting): their three pre-norms kiln.rms_norm calls too.
UNFUSED_CALLS = {"rms_norm": 11 * LAYERS, "swiglu": LAYERS}
NORM = "rms_norm (scale named gamma)"
FEED_FORWARD = "mlp swiglu, one gate_up projection"
BLOCK = "stable-audio-3 block (adaln, gated residual + norm seams)"


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
            assert kinds[block] == BLOCK
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
    assert used == UNFUSED_CALLS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stable_audio3_inpainting_keeps_diffusers_blocks(dtype, monkeypatch):
    """local_add_cond (inpainting) adds each block's local projection between its cross-attention
    and its feed-forward: the blocks run diffusers' forward, their norms and feed-forwards kiln's."""
    model = _stable_audio3(dtype)
    inputs = _inputs(dtype)
    g = torch.Generator().manual_seed(5)
    inputs["local_add_cond"] = torch.randn(2, 5, 12, generator=g).to(dtype)
    with torch.no_grad():
        for block in model.transformer_blocks:  # its last projection starts at zero: a trained one's is not
            block.to_local_embed[-1].weight.normal_(0, 0.3)
        expected = model(**inputs)[0]
        kiln.patch(model)
        counter = Counter(monkeypatch, more=[(activation_ops, "swiglu")])
        actual = model(**inputs)[0]
    assert counter.used() == UNFUSED_CALLS
    _agree(actual, expected, dtype)


def test_a_block_gating_otherwise_is_left():
    """A block whose gated branches are scaled by their gate itself, not sigmoid(1 - gate), is left
    with the probe's reason; its norms and feed-forward are still kiln's."""

    class GatedByItself(sa3.StableAudio3DiTBlock):
        def forward(self, hidden_states, context, global_modulation, rope, context_mask=None, local_seq=None,
                    num_memory_tokens=0):
            modulation = self.to_scale_shift_gate + global_modulation
            scale_attn, shift_attn, gate_attn, scale_ff, shift_ff, gate_ff = modulation.chunk(6, dim=-1)
            h = hidden_states
            normed = self.pre_norm(h) * (1 + scale_attn.unsqueeze(1)) + shift_attn.unsqueeze(1)
            h = h + self.self_attn(normed, rope=rope) * gate_attn.unsqueeze(1)
            h = h + self.cross_attn(self.cross_attend_norm(h), context=context, context_mask=context_mask)
            normed = self.ff_norm(h) * (1 + scale_ff.unsqueeze(1)) + shift_ff.unsqueeze(1)
            return h + self.ff(normed) * gate_ff.unsqueeze(1)

    model = _stable_audio3(torch.float32)
    block = model.transformer_blocks[0]
    odd = GatedByItself(64, 64, dim_heads=32, local_add_cond_dim=5)
    odd.load_state_dict(block.state_dict())
    report = kiln.patch(torch.nn.ModuleList([odd]))
    [left] = report.left
    assert left.path == "0" and "does not compute Stable Audio 3's block seams" in left.reason
    assert {r.path for r in report.replaced} >= {"0.pre_norm", "0.ff"}


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
    """torch.compile traces the patched model: its feed-forwards kiln's ops in the graph, its blocks'
    seams and its norms diffusers' (Inductor fuses each norm into the modulation or rotation after it)."""
    from graph_model import calls_of
    from test_patch_dit_cpu import _compiled_patched_graphs

    graphs = _compiled_patched_graphs(_stable_audio3(torch.float32), _inputs(torch.float32))
    assert calls_of(graphs, torch.ops.kiln.rms_norm.default) == []
    assert len(calls_of(graphs, torch.rsqrt)) == UNFUSED_CALLS["rms_norm"]
    assert len(calls_of(graphs, torch.ops.kiln.swiglu.default)) == CALLS["swiglu"]
