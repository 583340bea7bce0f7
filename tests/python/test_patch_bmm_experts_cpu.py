"""kiln.patch of Llama 4's MoE layers on the CPU: the experts' batched matmuls over one packed
gate_up parameter gated by one kiln.swiglu, the shared expert and the dense layers' MLP (their
activation in ``activation_fn``) as gated MLPs; what a class computing otherwise leaves;
autograd, unpatch and torch.compile."""

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from graph_model import calls_of, logits_of, patched_and_compiled  # noqa: E402
from test_patch_experts_cpu import _count_swiglu, _ids  # noqa: E402

# Two layers: the first dense (MLP of 96), the second MoE (4 experts of 32 and a shared expert).
LLAMA4 = dict(vocab_size=128, hidden_size=64, intermediate_size=32, intermediate_size_mlp=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
              interleave_moe_layer_step=2, pad_token_id=0)


def _model(dtype=torch.float32):
    config = transformers.AutoConfig.for_model("llama4_text", **LLAMA4)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama4_experts_shared_expert_and_dense_mlp_are_swiglus(dtype, monkeypatch):
    model = _model(dtype)
    ids = _ids()
    with torch.no_grad():
        expected = model(ids).logits
    report = kiln.patch(model)
    kinds = {r.path: r.kind for r in report.replaced}
    assert kinds["model.layers.1.feed_forward.experts"] == \
        "moe experts swiglu (batched matmuls, one packed gate_up, gate first)"
    assert kinds["model.layers.1.feed_forward.shared_expert"] == "mlp swiglu"
    assert kinds["model.layers.0.feed_forward"] == "mlp swiglu"
    assert not report.left
    calls = _count_swiglu(monkeypatch)
    with torch.no_grad():
        actual = model(ids).logits
    # The dense MLP: gate and up apart, [2, 9, 96]; the shared expert the same over the MoE's
    # flattened 18 tokens; the experts every expert's copy of them, gate and up packed.
    assert sorted(calls) == [((2, 9, 96), False, False), ((4, 18, 64), True, False), ((18, 32), False, False)]
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(actual, expected, **tolerance)
    kiln.unpatch(model)
    assert "forward" not in model.model.layers[1].feed_forward.experts.__dict__
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)


def test_experts_computing_otherwise_are_left_with_the_reason():
    """A class whose experts clamp the gate first: the probes see it, the module is left."""
    model = _model()
    experts = model.model.layers[1].feed_forward.experts

    class ClampedExperts(type(experts)):
        def forward(self, hidden_states):
            hidden_states = hidden_states.view(self.gate_up_proj.shape[0], -1, self.hidden_size)
            gate, up = torch.bmm(hidden_states, self.gate_up_proj).chunk(2, dim=-1)
            return torch.bmm(up * self.act_fn(gate.clamp(max=7.0)), self.down_proj).view(-1, self.hidden_size)

    experts.__class__ = ClampedExperts
    report = kiln.patch(model)
    (left,) = [entry for entry in report.left if entry.path == "model.layers.1.feed_forward.experts"]
    assert "does not compute bmm(up * act(gate), down_proj)" in left.reason
    kiln.unpatch(model)


def test_up_first_experts_are_found_by_the_probe(monkeypatch):
    model = _model()
    experts = model.model.layers[1].feed_forward.experts

    class UpFirstExperts(type(experts)):
        def forward(self, hidden_states):
            hidden_states = hidden_states.view(self.gate_up_proj.shape[0], -1, self.hidden_size)
            up, gate = torch.bmm(hidden_states, self.gate_up_proj).chunk(2, dim=-1)
            return torch.bmm(up * self.act_fn(gate), self.down_proj).view(-1, self.hidden_size)

    experts.__class__ = UpFirstExperts
    ids = _ids()
    with torch.no_grad():
        expected = model(ids).logits
    report = kiln.patch(model)
    assert {r.path: r.kind for r in report.replaced}["model.layers.1.feed_forward.experts"].endswith("up first)")
    calls = _count_swiglu(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-4, atol=1e-4)
    assert ((4, 18, 64), True, True) in calls
    kiln.unpatch(model)


def test_gradients_flow_through_the_experts_gate():
    model, reference = _model(), _model()
    kiln.patch(model)
    ids = _ids()
    model(ids).logits.square().mean().backward()
    reference(ids).logits.square().mean().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert grads["model.layers.1.feed_forward.experts.gate_up_proj"].abs().sum() > 0
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_compiled_llama4_runs_the_swiglus_in_one_graph():
    model = _model()
    expected, actual, graphs = patched_and_compiled(model, logits_of(_ids()))
    assert len(graphs) == 1 and len(calls_of(graphs, torch.ops.kiln.swiglu.default)) == 3
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    kiln.unpatch(model)
