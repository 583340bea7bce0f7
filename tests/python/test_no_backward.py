"""The ops without a backward, on the CPU and the GPU alike: a call that autograd records
gives outputs whose backward raises, naming the op and the inputs that wanted a gradient
(never a silent zero or partial gradient); an in-place or out= form is refused at once where
autograd records; without grad the outputs carry no graph; and every in-place or out= form
moves the written tensors' version counters once, as torch's own in-place ops do, so autograd
notices a saved tensor overwritten by a kiln kernel."""

import pytest
import torch

import kiln
from conftest import HAS_GPU

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def rand(device, *shape, grad=False):
    return torch.randn(*shape, device=device).requires_grad_(grad)


def functional_calls(device, grad_arg):
    """(op, argument names that want grad, call) for each functional op without a backward;
    `grad_arg` picks which of its tensor inputs requires grad."""
    def g(name, *shape):
        return rand(device, *shape, grad=name in grad_arg)

    h, y, gate = g("h", 2, 3, 16), g("y", 2, 3, 16), g("gate", 2, 1, 16)
    scale, shift = g("scale", 2, 1, 16), g("shift", 2, 1, 16)
    q, k = g("q", 1, 2, 5, 8), g("k", 1, 1, 5, 8)
    cos, sin = rand(device, 5, 8), rand(device, 5, 8)
    qv, kv = g("q", 1, 6, 24), g("k", 1, 6, 24)
    qw, kw = g("q_weight", 24), g("k_weight", 24)
    return {
        "gated_residual": lambda: kiln.gated_residual(h, y, gate),
        "gated_adaln": lambda: kiln.gated_adaln(h, y, gate, scale, shift),
        "head_norm_rope": lambda: kiln.head_norm_rope(q, k, None, None, cos, sin),
        "rope_3d": lambda: kiln.rope_3d(qv, kv, 1, 2, 3),
        "rms_norm_rope": lambda: kiln.rms_norm_rope(qv, kv, qw, kw, grid=(1, 2, 3)),
        "rms_norm_gated": lambda: kiln.rms_norm_gated(g("x", 6, 24), g("gate", 6, 24), g("weight", 24)),
    }


FUNCTIONAL = [("gated_residual", "y"), ("gated_adaln", "h"), ("gated_adaln", "scale"),
              ("head_norm_rope", "k"), ("rope_3d", "q"), ("rms_norm_rope", "k_weight"),
              ("rms_norm_gated", "gate"), ("rms_norm_gated", "weight")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,arg", FUNCTIONAL)
def test_backward_through_a_recorded_call_raises_naming_op_and_input(device, op, arg):
    out = functional_calls(device, {arg})[op]()
    first = out[0] if isinstance(out, tuple) else out
    assert first.requires_grad
    with pytest.raises(RuntimeError, match=rf"kiln\.{op} has no backward: no gradient flows "
                                           rf"through it to {arg}\. Call it under torch\.no_grad"):
        first.float().sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,arg", FUNCTIONAL)
def test_without_recording_outputs_carry_no_graph(device, op, arg):
    with torch.no_grad():
        out = functional_calls(device, {arg})[op]()
    for t in out if isinstance(out, tuple) else (out,):
        assert not t.requires_grad and t.grad_fn is None
    # Nothing requires grad: grad mode on, still no graph.
    out = functional_calls(device, set())[op]()
    for t in out if isinstance(out, tuple) else (out,):
        assert not t.requires_grad and t.grad_fn is None


@pytest.mark.parametrize("device", DEVICES)
def test_recorded_call_matches_the_unrecorded_one(device):
    """Recording changes nothing in the values: the op runs below autograd either way (the CPU
    reference's own ops record nothing)."""
    torch.manual_seed(0)
    h, y, gate = rand(device, 2, 3, 16), rand(device, 2, 3, 16, grad=True), rand(device, 2, 1, 16)
    recorded = kiln.gated_residual(h, y, gate)
    assert type(recorded.grad_fn).__name__ == "Error"
    with torch.no_grad():
        plain = kiln.gated_residual(h, y, gate)
    assert torch.equal(recorded.detach(), plain)


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_through_a_backward_op_raises(device):
    q = rand(device, 1, 2, 4, 8, grad=True)
    k = rand(device, 1, 2, 4, 8, grad=True)
    cos, sin = rand(device, 4, 8), rand(device, 4, 8)
    a, b = kiln.rope(q, k, cos, sin)
    dq, _ = torch.autograd.grad((a * a).sum() + (b * b).sum(), (q, k), create_graph=True)
    with pytest.raises(RuntimeError, match=r"kiln\.rope_backward has no backward: .* to grad_q, "
                                           r"grad_k\. .*double backward through kiln's ops is "
                                           r"not supported"):
        torch.autograd.grad(dq.sum(), q)


def inplace_calls(device, grad_arg=frozenset()):
    """(op, the written arguments, call) for each in-place and out= form."""
    def g(name, *shape):
        return rand(device, *shape, grad=name in grad_arg)

    x, residual, w = g("x", 3, 16), g("residual", 3, 16), g("weight", 16)
    h, y, gate = g("h", 2, 3, 16), g("y", 2, 3, 16), g("gate", 2, 1, 16)
    q, k = g("q", 1, 2, 5, 8), g("k", 1, 1, 5, 8)
    cos, sin = rand(device, 5, 8), rand(device, 5, 8)
    up, out, out_half = g("up", 3, 16), rand(device, 3, 16), rand(device, 3, 16)
    return [
        ("fused_add_rms_norm_", (x, residual), lambda: kiln.fused_add_rms_norm_(x, residual, w)),
        ("gated_residual_", (h,), lambda: kiln.gated_residual_(h, y, gate)),
        ("rope_", (q, k), lambda: kiln.rope_(q, k, cos, sin)),
        ("head_norm_rope_", (q, k), lambda: kiln.head_norm_rope_(q, k, None, None, cos, sin)),
        ("rms_norm.out", (out,), lambda: kiln.rms_norm(x, w, out=out)),
        ("swiglu.out", (out_half,), lambda: kiln.swiglu(x, up, out=out_half)),
        ("gelu.out", (out,), lambda: kiln.gelu(x, w, out=out)),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index", range(7))
@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_written_tensors_move_their_version_once(device, index, mode):
    """Inference mode included: an ordinary tensor written there still moves its version (only
    tensors made in inference mode have none)."""
    op, written, call = inplace_calls(device)[index]
    before = [t._version for t in written]
    context = {"grad": torch.enable_grad, "no_grad": torch.no_grad,
               "inference_mode": torch.inference_mode}[mode]
    with context():
        call()
    assert [t._version for t in written] == [v + 1 for v in before], op


@pytest.mark.parametrize("device", DEVICES)
def test_a_saved_tensor_overwritten_in_place_is_caught_by_autograd(device):
    """mul saves `a` for w's gradient; a kiln in-place op that overwrites `a` must make that
    backward fail rather than use the new values."""
    w = rand(device, 16, grad=True)
    a = rand(device, 2, 3, 16)
    product = a * w
    kiln.gated_residual_(a, rand(device, 2, 3, 16), rand(device, 2, 1, 16))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        product.sum().backward()


WRITTEN = {"fused_add_rms_norm_": "x, residual", "gated_residual_": "h", "rope_": "q, k",
           "head_norm_rope_": "q, k", "rms_norm.out": "out", "swiglu.out": "out",
           "gelu.out": "out"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index,arg", [(0, "weight"), (1, "gate"), (4, "weight"), (5, "up"), (6, "x")])
def test_in_place_forms_refuse_a_recorded_call(device, index, arg):
    """Only an input the op does not write requires grad: no_grad is the way out."""
    op, written, call = inplace_calls(device, {arg})[index]
    values = [t.detach().clone() for t in written]
    with pytest.raises(RuntimeError, match=rf"kiln\.{op} writes {WRITTEN[op]} in place and has no "
                                           rf"backward, but autograd records this call \({arg} "
                                           rf"requires grad\): call it under torch\.no_grad\(\)"):
        call()
    for t, v in zip(written, values):
        assert torch.equal(t.detach(), v), "a refused call must write nothing"
    with torch.no_grad():
        call()  # the same call runs where nothing records


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index,arg,instead", [
    (0, "x", r"kiln\.fused_add_rms_norm has a backward"),
    (1, "h", r"h \+ y \* gate in torch ops has one"),
    (2, "q", r"kiln\.rope has a backward"),
    (3, "k", r"kiln\.rms_norm over each head, then kiln\.rope, have backward passes")])
def test_in_place_forms_refuse_to_write_a_tensor_in_a_graph(device, index, arg, instead):
    """The written tensor itself requires grad: no_grad would silently cut it from its graph,
    so the error offers only a form with a backward."""
    op, written, call = inplace_calls(device, {arg})[index]
    with pytest.raises(RuntimeError, match=rf"kiln\.{op} writes {WRITTEN[op]} in place and has no "
                                           rf"backward, but {arg} requires grad: writing in place "
                                           rf"would cut it from its graph; {instead}\.$"):
        call()


@pytest.mark.parametrize("device", DEVICES)
def test_a_forward_ad_tangent_is_refused_not_dropped(device):
    """As torch's own ops without a forward derivative: a tangent raises NotImplementedError
    naming the op and the argument, for forward_ad and torch.func.jvp alike."""
    import torch.autograd.forward_ad as fwAD

    h, y, gate = rand(device, 2, 3, 16), rand(device, 2, 3, 16), rand(device, 2, 1, 16)
    message = r"kiln\.{} has no forward-mode derivative, but {} a tangent"
    with fwAD.dual_level():
        dual = fwAD.make_dual(y, torch.ones_like(y))
        with pytest.raises(NotImplementedError, match=message.format("gated_residual", "y carries")):
            kiln.gated_residual(h, dual, gate)
        dual_h = fwAD.make_dual(h.clone(), torch.ones_like(h))
        with pytest.raises(NotImplementedError, match=message.format("gated_residual_", "h carries")):
            kiln.gated_residual_(dual_h, y, gate)
    with pytest.raises(NotImplementedError, match=message.format("gated_residual", "y carries")):
        torch.func.jvp(lambda t: kiln.gated_residual(h, t, gate), (y,), (torch.ones_like(y),))


def test_under_compile_a_recorded_call_fails_while_compiling():
    """AOTAutograd traces the backward while compiling, so there the error comes at compile
    time (as for torch's own ops without a derivative); under no_grad the compiled call runs
    and agrees with eager."""
    def f(h, y, gate):
        return kiln.gated_residual(h, y, gate)

    h, y, gate = rand("cpu", 2, 3, 16), rand("cpu", 2, 3, 16, grad=True), rand("cpu", 2, 1, 16)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"kiln\.gated_residual has no backward"):
        torch.compile(f, backend="aot_eager", fullgraph=True)(h, y, gate)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(h, y, gate)
        assert torch.equal(compiled, f(h, y, gate))
