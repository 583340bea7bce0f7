"""kiln.patch of transformers' MoE experts (their ``_apply_gate``, which the grouped_mm and
batched_mm experts implementations call on every routed token's packed gate_up), on the CPU:
what is replaced and left, the packed call kiln makes, unpatch, deep copies, autograd and
torch.compile."""

import copy

import pytest
import torch

import kiln
from kiln import activation_ops

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from graph_model import calls_of, logits_of, patched_and_compiled  # noqa: E402

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, pad_token_id=0)
# Each family's routed experts: 4 experts of 32, two a token.
FAMILIES = {
    "qwen3_moe": dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2),
    "mixtral": dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2),
    "olmoe": dict(intermediate_size=32, num_experts=4, num_experts_per_tok=2),
}


def _model(family, implementation="grouped_mm", dtype=torch.float32):
    config = transformers.AutoConfig.for_model(family, **dict(BASE, **FAMILIES[family]))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, experts_implementation=implementation)
    return model.eval().to(dtype)


def _ids():
    return torch.randint(1, 128, (2, 9), generator=torch.Generator().manual_seed(1))


def _count_swiglu(monkeypatch):
    calls = []
    real = activation_ops.swiglu
    monkeypatch.setattr(activation_ops, "swiglu", lambda x, up=None, up_first=False: calls.append(
        (tuple(x.shape), up is None, up_first)) or real(x, up, up_first))
    return calls


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_experts_gate_is_one_packed_swiglu(family, implementation, dtype, monkeypatch):
    model = _model(family, implementation, dtype)
    ids = _ids()
    with torch.no_grad():
        expected = model(ids).logits
    report = kiln.patch(model)
    experts = [r for r in report.replaced if r.kind.startswith("moe experts")]
    assert [r.path for r in experts] == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    assert all(r.op == "swiglu" and r.kind == "moe experts swiglu (their _apply_gate over the packed gate_up)"
               for r in experts)
    calls = _count_swiglu(monkeypatch)
    with torch.no_grad():
        actual = model(ids).logits
    # Each layer's 36 routed (token, expert) pairs (18 tokens, two experts each), gate and up packed
    # [S, 2 x 32], gate first.
    assert calls == [((36, 64), True, False)] * 2
    tol = 1e-5 if dtype == torch.float32 else 0.05 * expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)
    kiln.unpatch(model)
    assert all("_apply_gate" not in model.get_submodule(r.path).__dict__ for r in experts)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected)


def test_the_eager_experts_loop_is_left_with_the_reason():
    report = kiln.patch(_model("qwen3_moe", "eager"))
    left = [entry for entry in report.left if entry.path.endswith("mlp.experts")]
    assert len(left) == 2 and not any(r.kind.startswith("moe experts") for r in report.replaced)
    assert 'eager loop (experts_implementation "eager")' in left[0].reason


def test_a_class_gating_otherwise_is_left_with_the_reason():
    """An experts class of its own _apply_gate (a clamped gate, as GPT-OSS's) is left."""
    model = _model("qwen3_moe")
    experts = model.model.layers[0].mlp.experts

    class ClampedExperts(type(experts)):
        def _apply_gate(self, gate_up_out):
            gate, up = gate_up_out.chunk(2, dim=-1)
            return self.act_fn(gate.clamp(max=7.0)) * up

    experts.__class__ = ClampedExperts
    report = kiln.patch(model)
    (left,) = [entry for entry in report.left if entry.path == "model.layers.0.mlp.experts"]
    assert "does not compute act(gate) * up of its input's halves" in left.reason
    assert "model.layers.1.mlp.experts" in {r.path for r in report.replaced}


def _gpt_oss(implementation="grouped_mm", dtype=torch.float32):
    config = transformers.AutoConfig.for_model("gpt_oss", **dict(BASE, intermediate_size=32, num_local_experts=4,
                                                                 num_experts_per_tok=2))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, experts_implementation=implementation)
    # Projections of unit-sized weights, so the routed gate_up crosses GPT-OSS's clamps at +-7.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.normal_(0, 1.0)
    return model.eval().to(dtype)


def _count_clamped(monkeypatch):
    calls = []
    real = activation_ops.clamped_swiglu
    monkeypatch.setattr(activation_ops, "clamped_swiglu", lambda x, alpha=1.702, limit=7.0, interleaved=True: calls.append(
        (tuple(x.shape), alpha, limit, interleaved)) or real(x, alpha, limit, interleaved))
    return calls


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpt_oss_experts_gate_is_one_clamped_swiglu(implementation, dtype, monkeypatch):
    """GPT-OSS's experts gate without an act_fn (a clamped, alpha-scaled gate over interleaved
    pairs, seven kernels): one kiln.clamped_swiglu with the module's alpha and limit; its norms
    and RoPE are replaced too."""
    model = _gpt_oss(implementation, dtype)
    ids = _ids()
    with torch.no_grad():
        expected = model(ids).logits
    report = kiln.patch(model)
    experts = [r for r in report.replaced if r.kind.startswith("moe experts")]
    assert [r.path for r in experts] == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    assert all(r.op == "clamped_swiglu" and "interleaved pairs" in r.kind for r in experts)
    assert {r.op for r in report.replaced} >= {"rms_norm", "fused_add_rms_norm", "rope", "clamped_swiglu"}
    calls = _count_clamped(monkeypatch)
    with torch.no_grad():
        actual = model(ids).logits
    assert calls == [((36, 64), 1.702, 7.0, True)] * 2
    tol = 1e-4 if dtype == torch.float32 else 0.05 * expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)
    kiln.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected)


def test_gpt_oss_gate_reads_the_modules_scalars_at_each_call(monkeypatch):
    model = _gpt_oss()
    kiln.patch(model)
    experts = model.model.layers[0].mlp.experts
    experts.alpha, experts.limit = 1.25, 3
    gate_up = torch.randn(5, 64, generator=torch.Generator().manual_seed(2)) * 6
    with torch.no_grad():
        torch.testing.assert_close(experts._apply_gate(gate_up), type(experts)._apply_gate(experts, gate_up))


def test_a_clamped_gate_over_halves_is_taken_and_another_gate_left():
    model = _gpt_oss()
    first, second = (layer.mlp.experts for layer in model.model.layers)

    class HalvesExperts(type(first)):
        def _apply_gate(self, gate_up):
            gate, up = gate_up.chunk(2, dim=-1)
            gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
            return (up + 1) * gate * torch.sigmoid(gate * self.alpha)

    class OtherExperts(type(first)):
        def _apply_gate(self, gate_up):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            return up * gate * torch.sigmoid(gate * self.alpha)  # no clamp, no + 1

    first.__class__, second.__class__ = HalvesExperts, OtherExperts
    report = kiln.patch(model)
    (taken,) = [r for r in report.replaced if r.path == "model.layers.0.mlp.experts"]
    assert taken.op == "clamped_swiglu" and "halves" in taken.kind
    (left,) = [entry for entry in report.left if entry.path == "model.layers.1.mlp.experts"]
    assert "does not compute GPT-OSS's clamped gate" in left.reason


def test_compiled_gpt_oss_leaves_the_gate_to_inductor():
    model = _gpt_oss()
    expected, actual, graphs = patched_and_compiled(model, logits_of(_ids()))
    assert graphs and not calls_of(graphs, torch.ops.kiln.clamped_swiglu.default)
    assert calls_of(graphs, torch.ops.kiln.fused_add_rms_norm.default)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    kiln.unpatch(model)


def test_a_deep_copy_gates_with_its_own_activation(monkeypatch):
    model = _model("qwen3_moe")
    kiln.patch(model)
    twin = copy.deepcopy(model)
    for original, copied in zip(model.model.layers, twin.model.layers):
        ours, theirs = original.mlp.experts.__dict__["_apply_gate"], copied.mlp.experts.__dict__["_apply_gate"]
        assert ours is not theirs
    calls = _count_swiglu(monkeypatch)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(twin(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert len(calls) == 4  # the copy's layers call kiln too


def test_gradients_flow_through_the_packed_gate():
    model = _model("mixtral").train()
    reference = copy.deepcopy(model)
    kiln.patch(model)
    ids = _ids()
    model(ids).logits.square().mean().backward()
    reference(ids).logits.square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_compiled_patched_moe_leaves_the_gate_to_inductor_in_one_graph(monkeypatch):
    """Under torch.compile the experts' gate is the class's own (Inductor fuses it with what
    surrounds it), in one graph with the rest of the patch; called eagerly, the same patched
    model still gates through kiln."""
    model = _model("qwen3_moe")
    ids = _ids()
    expected, actual, graphs = patched_and_compiled(model, logits_of(ids))
    assert len(graphs) == 1 and not calls_of(graphs, torch.ops.kiln.swiglu.default)
    silu = (torch.nn.functional.silu, torch.ops.aten.silu.default)
    assert len([n for gm in graphs for n in gm.graph.nodes if n.target in silu]) == 2
    assert calls_of(graphs, torch.ops.kiln.fused_add_rms_norm.default)  # the rest of the patch is there
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    calls = _count_swiglu(monkeypatch)
    with torch.no_grad():
        model(ids)
    assert len(calls) == 2
    kiln.unpatch(model)


def test_unpatch_leaves_a_gate_set_after_the_patch_with_a_warning():
    model = _model("qwen3_moe")
    kiln.patch(model)
    experts = model.model.layers[0].mlp.experts
    theirs = experts.__dict__["_apply_gate"] = lambda gate_up_out: gate_up_out
    with pytest.warns(UserWarning, match=r"mlp\.experts: its _apply_gate was replaced after kiln\.patch"):
        kiln.unpatch(model)
    assert experts.__dict__["_apply_gate"] is theirs
    assert "_apply_gate" not in model.model.layers[1].mlp.experts.__dict__
