"""kiln.rms_norm_gated on the CPU (kiln's reference implementation) against fp64 math, its bad
inputs, and kiln.patch of transformers' gated RMSNorms into one call: the linear attentions'
(Qwen3-Next, Qwen3.5, Kimi Linear: normalised, then gated) and Mamba-2's (gated, then
normalised, over groups)."""

import importlib
import inspect

import pytest
import torch

import kiln
from linear_attention_models import assert_patched_logits_match, randomise_gated_norms, tiny_model
from reference import assert_close_to, rms_norm_gated_fp64

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def fresh(*shape, dtype=torch.float32, gen, scale=1.0, offset=0.0):
    return (torch.randn(*shape, generator=gen) * scale + offset).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 128, 1000])
@pytest.mark.parametrize("rows", [1, 37])
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_matches_fp64(dtype, hidden, rows, activation, norm_before_gate):
    gen = torch.Generator().manual_seed(hidden * 100 + rows)
    x = fresh(rows, hidden, dtype=dtype, gen=gen, offset=0.2)
    gate = fresh(rows, hidden, dtype=dtype, gen=gen, scale=3.0)
    w = fresh(hidden, dtype=dtype, gen=gen, scale=0.3, offset=1.0)
    for weight in (w, None):
        out = kiln.rms_norm_gated(x, gate, weight, 1e-5, activation, norm_before_gate)
        assert out.dtype == dtype and out.is_contiguous()
        assert_close_to(out, rms_norm_gated_fp64(x, gate, weight, 1e-5, activation, norm_before_gate), dtype)


def test_strided_operands_and_float64():
    """A gate sliced out of a wider projection, x as a [B, T, H, D] view; float64 computes in
    float64 (gradcheck's dtype) and matches to its precision."""
    gen = torch.Generator().manual_seed(1)
    projection = fresh(2, 5, 4, 96, gen=gen)
    x, gate = fresh(2, 5, 4, 32, gen=gen), projection[..., 64:]
    w = fresh(32, gen=gen, offset=1.0)
    assert_close_to(kiln.rms_norm_gated(x, gate, w), rms_norm_gated_fp64(x, gate, w, 1e-6), torch.float32)
    x64, g64, w64 = x.double(), gate.double(), w.double()
    out = kiln.rms_norm_gated(x64, g64, w64, 1e-6, "sigmoid")
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, rms_norm_gated_fp64(x64, g64, w64, 1e-6, "sigmoid"), rtol=1e-12, atol=1e-12)


def test_bad_inputs_name_the_op_argument_and_what_was_given():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_gated: gate: expected shape \[3, 8\] \(as x\), got \[3, 4\]"):
        kiln.rms_norm_gated(x, torch.randn(3, 4))
    with pytest.raises(TypeError, match=r"kiln\.rms_norm_gated: gate: expected dtype float32 \(as x\), got bfloat16"):
        kiln.rms_norm_gated(x, x.bfloat16())
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_gated: gate: expected device cpu \(as x\), got meta"):
        kiln.rms_norm_gated(x, torch.empty(3, 8, device="meta"))
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_gated: weight: expected shape \[8\]"):
        kiln.rms_norm_gated(x, x, torch.randn(7))
    with pytest.raises(ValueError, match=r'kiln\.rms_norm_gated: activation: expected "silu" or "sigmoid", got "gelu"'):
        kiln.rms_norm_gated(x, x, None, 1e-6, "gelu")
    with pytest.raises(TypeError, match=r"kiln\.rms_norm_gated: x: expected"):
        kiln.rms_norm_gated(x.int(), x.int())


def test_fake_gives_the_output_and_refuses_what_the_op_refuses():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(6, 2, 16, dtype=torch.bfloat16)
        out = torch.ops.kiln.rms_norm_gated(x, torch.empty_like(x), torch.empty(16, dtype=torch.bfloat16))
        assert out.shape == x.shape and out.dtype == x.dtype
        with pytest.raises(ValueError, match="kiln.rms_norm_gated: gate: expected shape"):
            torch.ops.kiln.rms_norm_gated(x, torch.empty(6, 16, dtype=torch.bfloat16))


def _transformers_class(module, name):
    try:
        return getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    except (ImportError, AttributeError):
        pytest.skip(f"transformers has no {name}")


GATED = [("qwen3_next", "Qwen3NextRMSNormGated", "silu"), ("qwen3_5", "Qwen3_5RMSNormGated", "silu"),
         ("kimi_linear", "KimiLinearRMSNormGated", "sigmoid")]


@pytest.mark.parametrize("module,name,activation", GATED)
@pytest.mark.parametrize("dtype", DTYPES)
def test_patch_replaces_transformers_gated_norms(module, name, activation, dtype, monkeypatch):
    norm = _transformers_class(module, name)(128, eps=1e-6).to(dtype)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        norm.weight.copy_(fresh(128, gen=gen, scale=0.3, offset=1.0))
    x, gate = fresh(37, 128, dtype=dtype, gen=gen), fresh(37, 128, dtype=dtype, gen=gen, scale=2.0)
    with torch.no_grad():
        expected = norm(x, gate)
    report = kiln.patch(norm)
    assert [(r.path, r.op) for r in report.replaced] == [("", "rms_norm_gated")]
    assert activation in report.replaced[0].kind
    calls = []
    real = kiln.norm_ops.rms_norm_gated
    monkeypatch.setattr(kiln.norm_ops, "rms_norm_gated", lambda *a: calls.append(a[-2:]) or real(*a))
    with torch.no_grad():
        actual = norm(x, gate=gate)
    assert calls == [(activation, True)]
    # The module rounds up to three times (normalised, weighted, gated); kiln once.
    assert actual.dtype == dtype
    torch.testing.assert_close(actual, expected, rtol=2 * torch.finfo(dtype).eps, atol=2 * torch.finfo(dtype).eps)
    assert kiln.unpatch(norm) == 1


def test_a_call_that_wants_a_gradient_runs_the_original(monkeypatch):
    norm = _transformers_class("qwen3_next", "Qwen3NextRMSNormGated")(16)
    kiln.patch(norm)
    monkeypatch.setattr(kiln.norm_ops, "rms_norm_gated", lambda *a: pytest.fail("kiln op called"))
    x = torch.randn(4, 16, requires_grad=True)
    norm(x, torch.randn(4, 16)).sum().backward()
    assert x.grad is not None and norm.weight.grad is not None


@pytest.mark.parametrize("dtype", DTYPES)
def test_patch_replaces_mamba2_gated_norms(dtype, monkeypatch):
    """Mamba-2's gated norm multiplies x by silu(gate) before it normalises, over groups of
    group_size channels in later transformers (each group a row of the kernel, the weight after)."""
    cls = _transformers_class("mamba2", "MambaRMSNormGated")
    groups = "group_size" in inspect.signature(cls.__init__).parameters
    modules = {"whole": cls(64, group_size=64) if groups else cls(64)}
    if groups:
        modules["grouped"] = cls(64, group_size=16)
    gen = torch.Generator().manual_seed(4)
    model = torch.nn.ModuleDict(modules).to(dtype)
    for module in model.values():
        with torch.no_grad():
            module.weight.copy_(fresh(64, gen=gen, scale=0.3, offset=1.0))
    x, gate = fresh(2, 5, 64, dtype=dtype, gen=gen), fresh(2, 5, 64, dtype=dtype, gen=gen, scale=2.0)
    with torch.no_grad():
        expected = {name: module(x, gate) for name, module in model.items()}
    report = kiln.patch(model)
    kinds = {r.path: r.kind for r in report.replaced}
    assert kinds["whole"] == "rms_norm_gated (silu of the gate, before the norm)"
    if groups:
        assert kinds["grouped"] == "rms_norm_gated (silu of the gate, before the norm, over groups of 16)"
    calls = []
    real = kiln.norm_ops.rms_norm_gated
    monkeypatch.setattr(kiln.norm_ops, "rms_norm_gated", lambda *a: calls.append(a[-1]) or real(*a))
    tol = 2 * torch.finfo(dtype).eps
    with torch.no_grad():
        for name, module in model.items():
            torch.testing.assert_close(module(x, gate), expected[name], rtol=tol, atol=tol)
    assert calls == [False] * len(modules)


def test_a_norm_that_is_neither_gated_form_is_left_with_the_reason():
    class GateAdded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(32))
            self.variance_epsilon = 1e-6

        def forward(self, hidden_states, gate):
            h = hidden_states + gate
            return self.weight * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)

    report = kiln.patch(torch.nn.ModuleDict({"norm": GateAdded()}))
    assert not report.replaced
    assert "does not compute rms_norm(x) * weight * act(gate) nor rms_norm(x * act(gate)) * weight" \
        in report.left[0].reason


def test_patched_mamba2_model_gives_the_same_logits():
    """A whole (tiny) Mamba-2 model, its gated norms grouped where this transformers groups them,
    gives the same logits patched as unpatched in fp32."""
    try:
        from transformers import Mamba2Config, Mamba2ForCausalLM
    except ImportError:
        pytest.skip("transformers has no Mamba-2")
    config = Mamba2Config(hidden_size=64, num_heads=8, head_dim=16, expand=2, n_groups=2, state_size=16,
                          num_hidden_layers=2, vocab_size=100, chunk_size=8)
    torch.manual_seed(0)
    model = Mamba2ForCausalLM(config).eval()
    randomise_gated_norms(model)
    assert_patched_logits_match(model, torch.randint(0, 100, (2, 11)), gated_norms=2)


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5"])
def test_patched_linear_attention_model_gives_the_same_logits(name):
    """A whole (tiny) Qwen3-Next or Qwen3.5 text model, linear-attention layers included, gives
    the same logits patched as unpatched in fp32, with its one gated norm replaced."""
    assert_patched_logits_match(tiny_model(name), torch.randint(0, 100, (2, 7)), gated_norms=1)


@pytest.mark.parametrize("module,name,activation", [GATED[0], GATED[2], ("mamba2", "MambaRMSNormGated", "mamba")])
def test_the_bench_restates_the_modules_it_falls_back_to(module, name, activation):
    """bench/rms_norm_gated.py times transformers' module, or its restatement where transformers
    lacks it: the restatement computes the module's bits."""
    from bench_scripts import load_bench

    restated = load_bench("rms_norm_gated").Restated(128, activation).to(torch.bfloat16)
    cls = _transformers_class(module, name)
    grouped = "group_size" in inspect.signature(cls.__init__).parameters
    original = (cls(128, group_size=128, eps=1e-6) if grouped else cls(128, eps=1e-6)).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        weight = fresh(128, gen=gen, scale=0.3, offset=1.0).to(torch.bfloat16)
        restated.weight.copy_(weight)
        original.weight.copy_(weight)
        x, gate = fresh(9, 128, dtype=torch.bfloat16, gen=gen), fresh(9, 128, dtype=torch.bfloat16, gen=gen)
        assert torch.equal(restated(x, gate), original(x, gate))
