"""kiln.patch of gated activations whose gate and up come out of one projection (CPU):
diffusers' GEGLU and SwiGLU (up first) and transformers' packed MLPs (Phi-3's and GLM-4's
``gate_up_proj``, gate first) become one kiln.swiglu / kiln.geglu of the packed tensor. The
whole-model checks of Phi-3 and GLM-4 are in test_patch_cpu.py."""

import copy

import pytest
import torch

import kiln
from kiln import activation_ops

from graph_model import calls_of, patched_and_compiled

diffusers_attention = pytest.importorskip("diffusers.models.attention", reason="diffusers is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
from transformers.models.phi3.modeling_phi3 import Phi3MLP  # noqa: E402

DIM = 48


class _Calls:
    """(op, up given, up_first, approximate) of each kiln.swiglu / kiln.geglu call."""

    def __init__(self, monkeypatch):
        self.calls = []
        swiglu, geglu = activation_ops.swiglu, activation_ops.geglu

        def counted_swiglu(gate, up=None, up_first=False, out=None):
            self.calls.append(("swiglu", up is not None, up_first, None))
            return swiglu(gate, up, up_first, out)

        def counted_geglu(gate, up=None, approximate="tanh", up_first=False):
            self.calls.append(("geglu", up is not None, up_first, approximate))
            return geglu(gate, up, approximate, up_first)

        monkeypatch.setattr(activation_ops, "swiglu", counted_swiglu)
        monkeypatch.setattr(activation_ops, "geglu", counted_geglu)


def _feed_forward(activation, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return diffusers_attention.FeedForward(DIM, activation_fn=activation).eval().to(dtype)


def _x(dtype=torch.float32, shape=(2, 7), seed=1):
    return torch.randn(*shape, DIM, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _phi3_mlp(hidden_act, dtype=torch.float32):
    config = transformers.Phi3Config(hidden_size=DIM, intermediate_size=80, num_attention_heads=4,
                                     hidden_act=hidden_act, pad_token_id=0)
    torch.manual_seed(0)
    return Phi3MLP(config).eval().to(dtype)


@pytest.mark.parametrize("activation, op, approximate", [("geglu", "geglu", "none"), ("swiglu", "swiglu", None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1), (2, 7), (3, 129)])
def test_diffusers_gated_projection_is_one_kiln_call(activation, op, approximate, dtype, shape, monkeypatch):
    model = _feed_forward(activation, dtype)
    x = _x(dtype, shape)
    with torch.no_grad():
        expected = model(x)
        truth = _feed_forward(activation, torch.float64)(x.double())
    report = kiln.patch(model)
    assert [(r.path, r.op) for r in report.replaced] == [("net.0", op)] and report.left == []
    assert report.replaced[0].kind == f"{op}, one projection (up first)"
    calls = _Calls(monkeypatch)
    with torch.no_grad():
        actual = model(x)
    assert calls.calls == [(op, False, True, approximate)]
    assert actual.dtype == dtype and actual.shape == expected.shape
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    else:
        # kiln rounds the product once where diffusers rounds the activation first: as close to
        # the fp64 module as diffusers' own result, to a rounding of the output.
        err_kiln = (actual.double() - truth).abs().max().item()
        err_original = (expected.double() - truth).abs().max().item()
        assert err_kiln <= 1.5 * err_original + 1e-3, (err_kiln, err_original)
    assert kiln.unpatch(model) == 1
    with torch.no_grad():
        assert torch.equal(model(x), expected)


@pytest.mark.parametrize("hidden_act, op, approximate", [("silu", "swiglu", None),
                                                         ("gelu_pytorch_tanh", "geglu", "tanh"),
                                                         ("gelu", "geglu", "none")])
def test_packed_gate_up_mlp_is_one_kiln_call(hidden_act, op, approximate, monkeypatch):
    mlp = _phi3_mlp(hidden_act)
    x = _x()
    with torch.no_grad():
        expected = mlp(x)
    report = kiln.patch(mlp)
    tanh = " (tanh)" if approximate == "tanh" else ""
    assert [(r.path, r.kind, r.op) for r in report.replaced] == [("", f"mlp {op}{tanh}, one gate_up projection", op)]
    calls = _Calls(monkeypatch)
    with torch.no_grad():
        actual = mlp(x)
    assert calls.calls == [(op, False, False, approximate)]  # gate first
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    kiln.unpatch(mlp)


class _GateFirst(torch.nn.Module):
    """A diffusers-style gated projection written the other way round."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(DIM, 64)
        self.activation = torch.nn.SiLU()

    def forward(self, x):
        gate, up = self.proj(x).chunk(2, dim=-1)
        return self.activation(gate) * up


def test_the_order_of_the_halves_is_found_on_the_probe(monkeypatch):
    module = _GateFirst()
    x = _x()
    with torch.no_grad():
        expected = module(x)
    report = kiln.patch(module)
    assert report.replaced[0].kind == "swiglu, one projection (gate first)"
    calls = _Calls(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(module(x), expected, rtol=1e-5, atol=1e-5)
    assert calls.calls == [("swiglu", False, False, None)]


class _Relu(_GateFirst):
    def __init__(self):
        super().__init__()
        self.activation = torch.nn.ReLU()


class _Halves(_GateFirst):
    """Adds its halves: a packed projection, but no gated activation."""

    def forward(self, x):
        a, b = self.proj(x).chunk(2, dim=-1)
        return self.activation(a) + b


def test_other_computations_are_left_with_the_reason():
    assert kiln.patch(_Relu()).left[0].reason == "its activation (ReLU) is not SiLU or GELU on a probe"
    reason = kiln.patch(_Halves()).left[0].reason
    assert reason.startswith("does not compute up * act(gate) of proj(x)'s halves, gate first (on a torch.float32 "
                             "probe the replacement differs")
    # diffusers' "linear-silu" applies the activation to the whole projection: no halves.
    report = kiln.patch(_feed_forward("linear-silu"))
    assert report.replaced == [] and "gives torch.float32 (3, 5, 40) where the original gives" in report.left[0].reason
    # diffusers' GELU (its own pattern, kept) and ApproximateGELU (x * sigmoid(1.702 x)) are not candidates.
    assert [r.kind for r in kiln.patch(_feed_forward("gelu-approximate")).replaced] == ["gelu (tanh)"]
    report = kiln.patch(_feed_forward("geglu-approximate"))
    assert report.replaced == [] and report.left == []


class _FunctionalGate(torch.nn.Module):
    """Stable Audio 3's feed-forward form: ``proj_out(first * act(second))`` with the activation a
    function of torch's the forward calls (no activation module)."""

    def __init__(self, act, inner=40, up_first=True):
        super().__init__()
        self.act, self.up_first = act, up_first
        self.proj_in = torch.nn.Linear(DIM, 2 * inner)
        self.proj_out = torch.nn.Linear(inner, DIM)

    def forward(self, x):
        first, second = self.proj_in(x).chunk(2, dim=-1)
        up, gate = (first, second) if self.up_first else (second, first)
        return self.proj_out(up * self.act(gate))


@pytest.mark.parametrize("act, op, approximate", [
    (torch.nn.functional.silu, "swiglu", None),
    (lambda t: torch.nn.functional.gelu(t, approximate="tanh"), "geglu", "tanh"),
    (torch.nn.functional.gelu, "geglu", "none")], ids=["silu", "gelu-tanh", "gelu"])
@pytest.mark.parametrize("up_first", [True, False], ids=["up-first", "gate-first"])
def test_an_activation_the_forward_calls_is_found_on_the_probe(act, op, approximate, up_first, monkeypatch):
    module = _FunctionalGate(act, up_first=up_first)
    x = _x(shape=(3, 5))
    with torch.no_grad():
        expected = module(x)
    report = kiln.patch(module)
    assert report.replaced[0].op == op
    calls = _Calls(monkeypatch)
    with torch.no_grad():
        torch.testing.assert_close(module(x), expected, rtol=1e-5, atol=1e-5)
    assert calls.calls == [(op, False, up_first, approximate)]


def test_proj_in_and_proj_out_without_a_gate_are_left_with_the_reason():
    report = kiln.patch(_FunctionalGate(torch.relu))
    assert report.replaced == [] and report.left[0].reason.startswith(
        "does not compute proj_out(up * act(gate)) of proj_in(x)'s halves with SiLU or GELU, gate first")
    # Projections of other widths (no halves for proj_out) are no candidate.
    module = _FunctionalGate(torch.nn.functional.silu)
    module.proj_in = torch.nn.Linear(DIM, 60)
    assert kiln.patch(module).left == []


def test_inputs_kiln_does_not_take_run_the_original(monkeypatch):
    model = _feed_forward("geglu").double()
    kiln.patch(model)
    calls = _Calls(monkeypatch)
    x = _x(torch.float64)
    with torch.no_grad():
        actual = model(x)
        kiln.unpatch(model)
        expected = model(x)
    assert calls.calls == [] and torch.equal(actual, expected)


def test_ops_filter():
    report = kiln.patch(_feed_forward("geglu"), ops=["swiglu"])
    assert report.replaced == [] and report.left[0].reason == (
        "computes geglu, one projection (up first); geglu is not in ops")
    assert [r.op for r in kiln.patch(_feed_forward("swiglu"), ops=["swiglu"]).replaced] == ["swiglu"]


@pytest.mark.parametrize("activation", ["geglu", "swiglu"])
def test_training_through_the_packed_gate(activation):
    """kiln's swiglu and geglu have backward formulas for the packed form: the projection's
    and the input's gradients match the original's."""
    model = _feed_forward(activation)
    x = _x().requires_grad_(True)
    model(x).pow(2).mean().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    expected_x = x.grad.clone()
    model.zero_grad()
    x.grad = None
    kiln.patch(model)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(x).pow(2).mean().backward()
    assert f"kiln::{activation}_backward" in {event.name for event in prof.events()}
    torch.testing.assert_close(x.grad, expected_x, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-6, msg=name)
    kiln.unpatch(model)


def test_compiled_feed_forward_has_kiln_geglu_in_one_graph():
    model = _feed_forward("geglu")
    x = _x()

    def run(m):
        with torch.no_grad():
            return m(x)

    expected, actual, graphs = patched_and_compiled(model, run)
    assert len(graphs) == 1 and len(calls_of(graphs, torch.ops.kiln.geglu.default)) == 1
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    kiln.unpatch(model)


def test_a_deep_copy_computes_with_its_own_projection():
    model = _feed_forward("geglu")
    kiln.patch(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.net[0].proj.weight.mul_(-1.0)
    x = _x()
    with torch.no_grad():
        patched = twin(x)
        kiln.unpatch(twin)
        assert torch.equal(twin(x), patched)
        assert not torch.allclose(model(x), patched)


class _ClampedGateUp(torch.nn.Module):
    """GPT-OSS's and MiniMax's limited SwiGLU: gate and up clamped before the product."""

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Linear(DIM, 80)
        self.down_proj = torch.nn.Linear(40, DIM)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate.clamp(max=7.0)) * up.clamp(-7.0, 7.0))


class _DropoutInside(_ClampedGateUp):
    def __init__(self):
        super().__init__()
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.dropout(self.act_fn(gate) * up))


def test_what_a_unit_sized_probe_cannot_see_is_left():
    """A clamp past the values a unit-sized probe reaches (gelu_10's at 10, a limited SwiGLU's at
    7), and a dropout that only training mode applies, each leave the module as it is."""
    reason = kiln.patch(_phi3_mlp("gelu_10")).left[0].reason
    assert reason == "its activation_fn (ClippedGELUActivation) is not SiLU or GELU on a probe"
    reason = kiln.patch(_ClampedGateUp()).left[0].reason
    assert reason.startswith("does not compute down_proj(up * act(gate)) of gate_up_proj(x)'s halves")
    reason = kiln.patch(_DropoutInside().eval()).left[0].reason
    assert reason == ("it holds dropout besides its projections and activation, which its forward may apply where "
                      "kiln's would not")


@pytest.mark.parametrize("module", ["packed", "gated"])
@pytest.mark.parametrize("change", ["hook", "replaced"])
def test_an_activation_changed_after_the_patch_runs_as_changed(module, change, monkeypatch):
    """A hook on the activation, or another activation set in its place, after kiln.patch: the
    module computes with it, as the original would, instead of the probed one."""
    if module == "packed":
        mlp, attr = _phi3_mlp("silu"), "activation_fn"
    else:
        from transformers.models.llama.modeling_llama import LlamaMLP

        torch.manual_seed(0)
        mlp, attr = LlamaMLP(transformers.LlamaConfig(hidden_size=DIM, intermediate_size=80,
                                                      num_attention_heads=4)).eval(), "act_fn"
    x = _x()
    assert len(kiln.patch(mlp).replaced) == 1
    if change == "hook":
        getattr(mlp, attr).register_forward_hook(lambda m, args, out: out * 0.5)
    else:
        setattr(mlp, attr, torch.nn.ReLU())
    calls = _Calls(monkeypatch)
    with torch.no_grad():
        patched = mlp(x)
        kiln.unpatch(mlp)
        expected = mlp(x)
    assert calls.calls == [] and torch.equal(patched, expected)


def test_a_deep_copy_keeps_its_own_activation_mark(monkeypatch):
    """The copy's mark names the copy's activation: the copy still reaches kiln."""
    mlp = _phi3_mlp("silu")
    kiln.patch(mlp)
    twin = copy.deepcopy(mlp)
    calls = _Calls(monkeypatch)
    with torch.no_grad():
        twin(_x())
    assert calls.calls == [("swiglu", False, False, None)]


def test_the_probes_run_kilns_ops(monkeypatch):
    """What a probe compares with the original is kiln's call, not the fallback formula: for the
    packed gates and for the gated MLPs of two projections alike."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    calls = _Calls(monkeypatch)
    assert len(kiln.patch(_feed_forward("geglu")).replaced) == 1
    assert ("geglu", False, True, "none") in calls.calls
    calls.calls.clear()
    torch.manual_seed(0)
    llama = LlamaMLP(transformers.LlamaConfig(hidden_size=DIM, intermediate_size=80, num_attention_heads=4))
    assert len(kiln.patch(llama).replaced) == 1
    assert ("swiglu", True, False, None) in calls.calls


class _PackedActivation(torch.nn.Module):
    """An activation of a packed tensor with no projection of its own, as FLUX.2's Flux2SwiGLU
    (its projection fused into the feed-forward's first linear): ``act(x[..., :half]) *
    x[..., half:]`` (``up_first``: the halves the other way round)."""

    def __init__(self, act=None, up_first=False):
        super().__init__()
        self.gate_fn = act if act is not None else torch.nn.SiLU()
        self.up_first = up_first

    def forward(self, x):
        half = x.shape[-1] // 2
        first, second = x[..., :half], x[..., half:]
        return self.gate_fn(second) * first if self.up_first else self.gate_fn(first) * second


@pytest.mark.parametrize("act, up_first, op, kind", [
    (None, False, "swiglu", "swiglu, packed (gate first)"),
    (None, True, "swiglu", "swiglu, packed (up first)"),
    (torch.nn.GELU(approximate="tanh"), False, "geglu", "geglu (tanh), packed (gate first)")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_activation_without_a_projection_is_one_kiln_call(act, up_first, op, kind, dtype, monkeypatch):
    module = _PackedActivation(act, up_first)
    x = torch.randn(3, 5, 2 * 40, generator=torch.Generator().manual_seed(2)).to(dtype)
    expected = module(x)
    report = kiln.patch(module)
    assert [(r.kind, r.op) for r in report.replaced] == [(kind, op)]
    calls = _Calls(monkeypatch)
    actual = module(x)
    assert [c[:3] for c in calls.calls] == [(op, False, up_first)]
    torch.testing.assert_close(actual, expected, **({} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)))
    # An odd width goes to the module's own forward (which has no product of unequal halves).
    odd = torch.randn(2, 81, generator=torch.Generator().manual_seed(3)).to(dtype)
    calls.calls.clear()
    with pytest.raises(RuntimeError, match="must match"):
        module(odd)
    assert calls.calls == []
    kiln.unpatch(module)
    assert torch.equal(module(x), expected)


def test_a_packed_activation_with_parameters_or_another_formula_is_left():
    scaled = _PackedActivation()
    scaled.scale = torch.nn.Parameter(torch.ones(1))
    assert kiln.patch(scaled).replaced == []

    class Summed(_PackedActivation):
        def forward(self, x):
            half = x.shape[-1] // 2
            return self.gate_fn(x[..., :half]) + x[..., half:]

    report = kiln.patch(Summed())
    assert report.replaced == [] and "halves" in report.left[0].reason


def test_flux2_feed_forwards_and_single_blocks_gate_in_one_kiln_call(monkeypatch):
    """FLUX.2's Flux2SwiGLU (its double blocks' feed-forwards, its single blocks' mlp_act_fn):
    one kiln.swiglu of the packed projection each, the model's output unchanged."""
    diffusers = pytest.importorskip("diffusers")
    if not hasattr(diffusers, "Flux2Transformer2DModel"):
        pytest.skip("this diffusers has no FLUX.2 transformer")
    torch.manual_seed(0)
    model = diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=24, axes_dims_rope=(4, 4, 4, 4), timestep_guidance_channels=16).eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.zeros(1), torch.arange(3.0), torch.arange(4.0),
                                     indexing="ij"), -1).reshape(12, 4)
    inputs = dict(hidden_states=torch.randn(2, 12, 8, generator=g), encoder_hidden_states=torch.randn(2, 5, 24, generator=g),
                  timestep=torch.tensor([0.3, 0.7]), guidance=torch.tensor([3.5, 3.5]), img_ids=ids,
                  txt_ids=torch.zeros(5, 4), return_dict=False)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        gated = sorted(r.path for r in report.replaced if r.op == "swiglu")
        assert gated == ["single_transformer_blocks.0.attn.mlp_act_fn", "single_transformer_blocks.1.attn.mlp_act_fn",
                         "transformer_blocks.0.ff.act_fn", "transformer_blocks.0.ff_context.act_fn"]
        calls = _Calls(monkeypatch)
        actual = model(**inputs)[0]
    assert [c[0] for c in calls.calls] == ["swiglu"] * 4
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
