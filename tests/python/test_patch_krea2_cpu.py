"""kiln.patch on a tiny Krea 2 transformer (CPU): its SwiGLU feed-forwards
(``down(F.silu(gate(x)) * up(x))``, the activation in the forward itself, identified by the probe)
as one kiln.swiglu between the projections, in its text-fusion and its main blocks; fp32 and bf16
against diffusers' forward, with autograd; unpatch restores it. Its blocks' modulated seams and
its attention's rotation are still diffusers'."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
if not hasattr(diffusers, "Krea2Transformer2DModel"):
    pytest.skip("this diffusers has no Krea 2", allow_module_level=True)

from gated_mlp_checks import assert_feed_forwards_gate_once, assert_trains_as_diffusers  # noqa: E402

LAYERS = 2


def _krea2(dtype):
    torch.manual_seed(0)
    model = diffusers.Krea2Transformer2DModel(
        in_channels=8, num_layers=LAYERS, attention_head_dim=16, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, timestep_embed_dim=16, text_hidden_dim=24, num_text_layers=3,
        text_num_attention_heads=2, text_num_key_value_heads=2, text_intermediate_size=48,
        num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 6, 6)).eval()
    return model.to(dtype)


def _inputs(dtype):
    """Two samples of 12 image tokens (a 3x4 grid) after 5 text tokens of 3 stacked layers."""
    g = torch.Generator().manual_seed(3)
    text = 5
    positions = torch.zeros(text + 12, 3)
    positions[:text, 0] = torch.arange(text)
    rows, cols = torch.meshgrid(torch.arange(3.0), torch.arange(4.0), indexing="ij")
    positions[text:, 0], positions[text:, 1], positions[text:, 2] = text, rows.flatten(), cols.flatten()
    return dict(hidden_states=torch.randn(2, 12, 8, generator=g).to(dtype),
                encoder_hidden_states=torch.randn(2, text, 3, 24, generator=g).to(dtype),
                timestep=torch.tensor([0.3, 0.7]).to(dtype), position_ids=positions, return_dict=False)


def _feed_forwards(model):
    return [path for path, m in model.named_modules() if type(m).__name__ == "Krea2SwiGLU"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_krea2_feed_forwards_gate_in_one_kiln_call(dtype, monkeypatch):
    model = _krea2(dtype)
    paths = _feed_forwards(model)
    assert len(paths) == LAYERS + 2  # the main blocks', the text fusion's two blocks'
    assert_feed_forwards_gate_once(model, _inputs(dtype), paths, "mlp swiglu (gate, up, down)", dtype, monkeypatch)


def test_krea2_trains_through_the_kiln_swiglu():
    assert_trains_as_diffusers(_krea2(torch.float32), _inputs(torch.float32),
                               lambda m: [p for n, p in m.named_parameters() if n.endswith(".gate.weight")])


class _GeluFF(torch.nn.Module):
    """A gated MLP of Krea 2's names whose forward calls the erf GELU itself."""

    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.gate(x)) * self.up(x))


def test_an_mlp_of_its_own_activation_is_identified_by_the_probe():
    ff = _GeluFF().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = ff(x)
    report = kiln.patch(ff)
    assert [r.kind for r in report.replaced] == ["mlp geglu (gate, up, down)"]
    with torch.no_grad():
        torch.testing.assert_close(ff(x), expected, rtol=1e-5, atol=1e-6)
