"""kiln._C.direct, the eager entries the Python spellings use: the same results, errors,
autograd and in-place effects as torch.ops.kiln.*, and the torch.ops path whenever an
argument or a mode asks for __torch_function__ (CPU kernels; the CUDA ones go through the
same dispatcher, and the GPU tests call every op through these entries)."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

import kiln
from kiln import _C

direct = _C.direct


def fresh(*shape, gen, requires_grad=False):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).float().requires_grad_(
        requires_grad)


def calls(gen):
    """(name, direct entry, torch.ops overload, arguments, indices of outputs written in place)
    for every entry, on fresh random inputs."""
    x, r, w = fresh(3, 40, gen=gen), fresh(3, 40, gen=gen), fresh(40, gen=gen)
    gate, up = fresh(3, 40, gen=gen), fresh(3, 40, gen=gen)
    h, y = fresh(2, 3, 40, gen=gen), fresh(2, 3, 40, gen=gen)
    g1, s1, t1 = fresh(2, 1, 40, gen=gen), fresh(2, 3, 40, gen=gen), fresh(2, 3, 40, gen=gen)
    q, k = fresh(1, 4, 5, 16, gen=gen), fresh(1, 2, 5, 16, gen=gen)
    cos, sin = fresh(1, 5, 16, gen=gen), fresh(1, 5, 16, gen=gen)
    ops = torch.ops.kiln
    return [
        ("rms_norm", direct.rms_norm, ops.rms_norm.default, (x, w, 1e-6), ()),
        ("rms_norm_out", direct.rms_norm_out, ops.rms_norm.out,
         (x, None, 1e-5, torch.full_like(x, float("nan"))), (3,)),
        ("fused_add_rms_norm", direct.fused_add_rms_norm, ops.fused_add_rms_norm.default,
         (x, r, w, 1e-6), ()),
        ("fused_add_rms_norm_", direct.fused_add_rms_norm_, ops.fused_add_rms_norm_.default,
         (x.clone(), r.clone(), None, 1e-6), (0, 1)),
        ("layer_norm", direct.layer_norm, ops.layer_norm.default, (x, w, r[0], 1e-5), ()),
        ("adaln", direct.adaln, ops.adaln.default,
         (h, s1, t1, None, 1e-6, "layer", None, None), ()),
        ("gated_adaln", direct.gated_adaln, ops.gated_adaln.default,
         (h, y, g1, s1, t1, w, 1e-6, "rms", None, None, None), ()),
        ("rms_norm_gated", direct.rms_norm_gated, ops.rms_norm_gated.default,
         (h, y, w, 1e-6, "sigmoid", False), ()),
        ("swiglu", direct.swiglu, ops.swiglu.default, (gate, up, False), ()),
        ("swiglu_out", direct.swiglu_out, ops.swiglu.out,
         (torch.cat([gate, up], -1), None, True, torch.full_like(gate, float("nan"))), (3,)),
        ("geglu", direct.geglu, ops.geglu.default, (gate, None, "none", False), ()),
        ("clamped_swiglu", direct.clamped_swiglu, ops.clamped_swiglu.default, (gate, 1.702, 7.0, True), ()),
        ("gelu", direct.gelu, ops.gelu.default, (gate, w, "tanh"), ()),
        ("gelu_out", direct.gelu_out, ops.gelu.out,
         (gate, w, "none", torch.full_like(gate, float("nan"))), (3,)),
        ("gated_residual", direct.gated_residual, ops.gated_residual.default, (h, y, g1), ()),
        ("gated_residual_", direct.gated_residual_, ops.gated_residual_.default,
         (h.clone(), y, g1), (0,)),
        ("rope", direct.rope, ops.rope.default, (q, k, cos, sin, False, -1, "bhsd", -1, False), ()),
        ("rope deinterleaved", direct.rope, ops.rope.default, (q, k, cos, sin, False, -1, "bhsd", -1, True), ()),
        ("rope_", direct.rope_, ops.rope_.default,
         (q.clone(), k.clone(), cos, sin, True, 8, "bhsd", -1, False), (0, 1)),
        ("head_norm_rope", direct.head_norm_rope, ops.head_norm_rope.default,
         (q, k, w[:16], None, cos, sin, 1e-6, False, -1, "bhsd", -1), ()),
        ("head_norm_rope_", direct.head_norm_rope_, ops.head_norm_rope_.default,
         (q.clone(), k.clone(), None, w[16:32], cos, sin, 1e-5, True, 8, "bhsd", -1), (0, 1)),
    ]


def call_overload(overload, args):
    """torch.ops' call: keyword-only arguments (out=) by name."""
    schema = overload._schema.arguments
    positional = [a for a, arg in zip(args, schema) if not arg.kwarg_only]
    named = {arg.name: a for a, arg in zip(args, schema) if arg.kwarg_only}
    return overload(*positional, **named)


def run(call, args, written):
    """Calls with copies of the written arguments; returns the result and those copies."""
    args = tuple(a.clone() if i in written else a for i, a in enumerate(args))
    return call(*args), [args[i] for i in written]


def flat(result):
    if result is None:
        return []
    return list(result) if isinstance(result, (tuple, list)) else [result]


def test_every_entry_matches_torch_ops():
    gen = torch.Generator().manual_seed(1)
    for name, entry, overload, args, written in calls(gen):
        got, got_written = run(entry, args, written)
        want, want_written = run(lambda *a: call_overload(overload, a), args, written)
        assert len(flat(got)) == len(flat(want)), name
        for a, b in zip(flat(got) + got_written, flat(want) + want_written):
            assert torch.equal(a, b), name
        for tensor in got_written:
            assert not tensor.isnan().any(), name


def test_the_python_spellings_use_the_direct_entries():
    gen = torch.Generator().manual_seed(2)
    x, w = fresh(4, 24, gen=gen), fresh(24, gen=gen)
    assert torch.equal(kiln.rms_norm(x, w), direct.rms_norm(x, w, 1e-6))
    assert torch.equal(kiln.gelu(x, approximate="none"), direct.gelu(x, None, "none"))
    out = torch.empty(4, 12)
    assert kiln.swiglu(x, out=out) is out
    assert torch.equal(out, direct.swiglu(x, None, False))


def test_bad_arguments_name_the_op_and_the_argument():
    x = torch.randn(2, 8)
    cases = [
        (lambda: direct.gelu(x, 3, "tanh"), "kiln.gelu: argument 'bias': expected a Tensor, got int"),
        (lambda: direct.rms_norm(x, None, "1e-6"), "kiln.rms_norm: argument 'eps': expected a float, got str"),
        (lambda: direct.swiglu(x, None, 1), "kiln.swiglu: argument 'up_first': expected a bool, got int"),
        (lambda: direct.rope(x, x, x, x, False, 1.5, "bhsd", -1, False),
         "kiln.rope: argument 'rotary_dim': expected an int, got float"),
        (lambda: direct.gelu(x, None, 0), "kiln.gelu: argument 'approximate': expected a str, got int"),
        (lambda: direct.gelu([1.0], None, "tanh"), "kiln.gelu: argument 'x': expected a Tensor, got list"),
        (lambda: direct.gelu(x, None), "kiln.gelu: expected 3 arguments, got 2"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError) as error:
            call()
        assert str(error.value) == message
    # The kernels' own checks are unchanged: a ValueError naming op, argument and shapes.
    with pytest.raises(ValueError, match="kiln.rms_norm: weight"):
        kiln.rms_norm(x, torch.randn(5))


def test_autograd_through_the_direct_entries():
    gen = torch.Generator().manual_seed(3)
    x = fresh(3, 16, gen=gen, requires_grad=True)
    w = torch.nn.Parameter(fresh(16, gen=gen))
    kiln.rms_norm(x, w).sum().backward()
    direct_grads = x.grad.clone(), w.grad.clone()
    x.grad, w.grad = None, None
    torch.ops.kiln.rms_norm.default(x, w, 1e-6).sum().backward()
    assert torch.equal(direct_grads[0], x.grad) and torch.equal(direct_grads[1], w.grad)
    with torch.no_grad():
        assert kiln.rms_norm(x, w).grad_fn is None


def test_in_place_entries_bump_the_version_counter():
    h, y, gate = torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(2, 1, 8)
    before = h._version
    kiln.gated_residual_(h, y, gate)
    assert h._version > before


class Recorded(torch.Tensor):
    """A subclass that overrides __torch_function__ and records what it sees."""
    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_torch_function_overrides_see_the_op():
    x = torch.randn(3, 8).as_subclass(Recorded)
    Recorded.seen.clear()
    result = kiln.gelu(x)
    assert torch.ops.kiln.gelu.default in Recorded.seen
    assert type(result) is Recorded
    # A keyword-only out= tensor is passed by name on the torch.ops path.
    Recorded.seen.clear()
    inputs = torch.randn(3, 8)
    out = torch.empty(3, 8).as_subclass(Recorded)
    assert kiln.rms_norm(inputs, out=out) is out
    assert torch.ops.kiln.rms_norm.out in Recorded.seen
    assert torch.equal(out.as_subclass(torch.Tensor), kiln.rms_norm(inputs))


def test_torch_function_modes_see_the_op():
    class Mode(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(3, 8), torch.randn(8)
    with Mode() as mode:
        result = kiln.rms_norm(x, w)
    assert torch.ops.kiln.rms_norm.default in mode.seen
    assert torch.equal(result, kiln.rms_norm(x, w))


def test_parameters_and_fake_tensors_take_the_direct_entries():
    from torch._subclasses.fake_tensor import FakeTensorMode

    w = torch.nn.Parameter(torch.randn(8))
    x = torch.randn(3, 8)
    assert torch.equal(kiln.rms_norm(x, w), torch.ops.kiln.rms_norm.default(x, w, 1e-6))
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        result = kiln.gelu(fx)
        assert result.shape == (3, 8) and result.dtype == torch.float32


def test_torch_compile_traces_torch_ops_without_a_graph_break():
    def block(x, w):
        return kiln.gelu(kiln.rms_norm(x, w))

    x, w = torch.randn(4, 32), torch.randn(32)
    compiled = torch.compile(block, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, w), block(x, w))
