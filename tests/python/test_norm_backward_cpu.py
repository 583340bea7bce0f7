"""Training support of the norm ops on the CPU path (runs everywhere, no GPU):
torch.autograd.gradcheck through the registered autograd formulas in fp64, the backward ops'
CPU references in fp32/fp16/bf16 against fp64 autograd of the plain formulas, opcheck on
contiguous, permuted and sliced inputs, torch.compile with symbolic shapes, a small module's
loss.backward(), and bad inputs."""

import pytest
import torch

import kiln
from norm_backward_reference import (
    adaln_grads,
    assert_grad_close,
    fused_add_rms_norm_grads,
    layer_norm_grads,
    rms_norm_grads,
)
from reference import adaln_fp64, layer_norm_fp64, rms_norm_fp64

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# A larger eps than the models' keeps the numerical Jacobian of a 1-element row smooth.
GRADCHECK_EPS = 1e-2


def rand(*shape, gen, dtype=torch.float64, offset=0.0, scale=1.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + offset).to(dtype)


def leaf(t):
    return None if t is None else t.requires_grad_(True)


def gradcheck(fn, tensors):
    """gradcheck over the tensors that are not None (fn takes them all, None included)."""
    present = [i for i, t in enumerate(tensors) if t is not None]

    def call(*args):
        full = list(tensors)
        for i, a in zip(present, args):
            full[i] = a
        return fn(*full)

    assert torch.autograd.gradcheck(call, tuple(tensors[i] for i in present))


# ---- gradcheck (fp64) through the ops' C++ autograd kernels


@pytest.mark.parametrize("hidden", [1, 7, 8])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("with_weight", [True, False])
def test_gradcheck_rms_norm(hidden, rows, with_weight):
    gen = torch.Generator().manual_seed(hidden * 10 + rows)
    x = leaf(rand(rows, hidden, gen=gen))
    w = leaf(rand(hidden, gen=gen, offset=1.0)) if with_weight else None
    gradcheck(lambda x, w: kiln.rms_norm(x, w, GRADCHECK_EPS), [x, w])


@pytest.mark.parametrize("hidden", [1, 7, 8])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("with_weight", [True, False])
def test_gradcheck_fused_add_rms_norm(hidden, rows, with_weight):
    gen = torch.Generator().manual_seed(hidden * 10 + rows + 1)
    x, r = leaf(rand(rows, hidden, gen=gen)), leaf(rand(rows, hidden, gen=gen, offset=0.5))
    w = leaf(rand(hidden, gen=gen, offset=1.0)) if with_weight else None
    gradcheck(lambda x, r, w: kiln.fused_add_rms_norm(x, r, w, GRADCHECK_EPS), [x, r, w])
    # Only the normalised output used: the residual output's gradient is None, not zeros.
    gradcheck(lambda x, r, w: kiln.fused_add_rms_norm(x, r, w, GRADCHECK_EPS)[0], [x, r, w])


@pytest.mark.parametrize("hidden", [1, 7, 8])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
def test_gradcheck_layer_norm(hidden, rows, affine):
    gen = torch.Generator().manual_seed(hidden * 10 + rows + 2)
    x = leaf(rand(rows, hidden, gen=gen, offset=1.0))
    w = leaf(rand(hidden, gen=gen, offset=1.0)) if affine in ("weight", "both") else None
    b = leaf(rand(hidden, gen=gen)) if affine in ("bias", "both") else None
    gradcheck(lambda x, w, b: kiln.layer_norm(x, w, b, GRADCHECK_EPS), [x, w, b])


MODULATIONS = [("sample", "sample"), ("token", "token"), ("sample", "token"), ("token", "sample")]


def modulation(b, t, d, kind, gen, dtype=torch.float64):
    return rand(b, t if kind == "token" else 1, d, gen=gen, dtype=dtype, scale=0.5)


@pytest.mark.parametrize("hidden", [7, 8])
@pytest.mark.parametrize("shape", [(1, 1), (2, 3)])
@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("kinds", MODULATIONS)
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("tables", [False, True])
def test_gradcheck_adaln(hidden, shape, norm, kinds, with_weight, tables):
    gen = torch.Generator().manual_seed(hidden + 7 * shape[1])
    b, t = shape
    x = leaf(rand(b, t, hidden, gen=gen, offset=0.5))
    scale = leaf(modulation(b, t, hidden, kinds[0], gen))
    shift = leaf(modulation(b, t, hidden, kinds[1], gen))
    w = leaf(rand(hidden, gen=gen, offset=1.0)) if with_weight else None
    ts = leaf(rand(hidden, gen=gen, scale=0.3)) if tables else None
    tsh = leaf(rand(hidden, gen=gen, scale=0.3)) if tables else None
    gradcheck(
        lambda x, s, sh, w, ts, tsh: kiln.adaln(x, s, sh, w, GRADCHECK_EPS, norm, ts, tsh),
        [x, scale, shift, w, ts, tsh],
    )


def test_needs_input_grad_leaves_the_rest_alone():
    gen = torch.Generator().manual_seed(3)
    x = rand(4, 8, gen=gen)
    w = leaf(rand(8, gen=gen))
    kiln.rms_norm(x, w, 1e-6).sum().backward()
    assert x.grad is None and w.grad is not None
    ref = rms_norm_grads(torch.ones(4, 8, dtype=torch.float64), x, w, 1e-6)[1]
    torch.testing.assert_close(w.grad, ref)


# ---- the backward ops' CPU references in the kernel dtypes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 64, 4545])
@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_and_fused_add_backward(dtype, hidden, rows, with_weight):
    gen = torch.Generator().manual_seed(hidden + rows)
    x, dy, dr = (rand(rows, hidden, gen=gen, dtype=dtype) for _ in range(3))
    w = rand(hidden, gen=gen, dtype=dtype, offset=1.0) if with_weight else None
    dx, dw = torch.ops.kiln.rms_norm_backward(dy, x, w, 1e-6)
    ref_dx, ref_dw = rms_norm_grads(dy, x, w, 1e-6)
    assert_grad_close(dx, ref_dx, dtype, "dx")
    if with_weight:
        assert_grad_close(dw, ref_dw, dtype, "dweight")
    else:
        assert dw is None

    dsum, dw = torch.ops.kiln.fused_add_rms_norm_backward(dy, dr, x, w, 1e-6)
    ref_dsum, ref_dw = fused_add_rms_norm_grads(dy, dr, x, w, 1e-6)
    assert_grad_close(dsum, ref_dsum, dtype, "dresidual")
    assert (dw is None) == (not with_weight)
    if with_weight:
        assert_grad_close(dw, ref_dw, dtype, "dweight")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 64, 4545])
@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("affine", ["none", "weight", "both"])
def test_layer_norm_backward(dtype, hidden, rows, affine):
    gen = torch.Generator().manual_seed(hidden * 3 + rows)
    x = rand(rows, hidden, gen=gen, dtype=dtype, offset=2.0)
    dy = rand(rows, hidden, gen=gen, dtype=dtype)
    w = rand(hidden, gen=gen, dtype=dtype, offset=1.0) if affine != "none" else None
    b = rand(hidden, gen=gen, dtype=dtype) if affine == "both" else None
    grads = torch.ops.kiln.layer_norm_backward(dy, x, w, b, 1e-5)
    refs = layer_norm_grads(dy, x, w, b, 1e-5)
    for name, got, ref, given in zip(("dx", "dweight", "dbias"), grads, refs, (x, w, b)):
        if given is None:
            assert got is None, name
        else:
            assert_grad_close(got, ref, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [7, 64, 2048])
@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("kinds", MODULATIONS)
@pytest.mark.parametrize("tables", [False, True])
def test_adaln_backward(dtype, hidden, norm, kinds, tables):
    gen = torch.Generator().manual_seed(hidden + len(norm) + tables)
    b, t = 2, 5
    x = rand(b, t, hidden, gen=gen, dtype=dtype, offset=1.0)
    dy = rand(b, t, hidden, gen=gen, dtype=dtype)
    scale = modulation(b, t, hidden, kinds[0], gen, dtype)
    shift = modulation(b, t, hidden, kinds[1], gen, dtype)
    w = rand(hidden, gen=gen, dtype=dtype, offset=1.0) if norm == "rms" else None
    ts = rand(hidden, gen=gen, dtype=dtype, scale=0.3) if tables else None
    tsh = rand(hidden, gen=gen, dtype=dtype, scale=0.3) if tables else None
    shift_per_token = kinds[1] == "token"
    dx, dscale, dshift, dw, dts, dtsh = torch.ops.kiln.adaln_backward(
        dy, x, scale, w, 1e-6, norm, ts, shift_per_token, table_scale_grad=tables, table_shift_grad=tables
    )
    ref_dx, ref_dscale, ref_dshift, ref_dw, ref_dts, ref_dtsh = adaln_grads(dy, x, scale, shift, w, 1e-6, norm, ts, tsh)
    if tables:
        assert_grad_close(dts, ref_dts, dtype, "dtable_scale")
        assert_grad_close(dtsh, ref_dtsh, dtype, "dtable_shift")
    else:
        assert dts is None and dtsh is None
    assert_grad_close(dx, ref_dx, dtype, "dx")
    assert_grad_close(dscale, ref_dscale, dtype, "dscale")
    if shift_per_token:
        assert dshift is None  # it is dy itself
        torch.testing.assert_close(dy.double(), ref_dshift)
    else:
        assert_grad_close(dshift, ref_dshift, dtype, "dshift")
    if w is None:
        assert dw is None
    else:
        assert_grad_close(dw, ref_dw, dtype, "dweight")


# ---- only the gradients asked for


def test_backward_ops_return_only_the_gradients_asked_for():
    gen = torch.Generator().manual_seed(31)
    x, dy, dr = (rand(6, 16, gen=gen, dtype=torch.float32) for _ in range(3))
    w, bias = rand(16, gen=gen, dtype=torch.float32, offset=1.0), rand(16, gen=gen, dtype=torch.float32)
    ops = torch.ops.kiln
    full_dx, _ = ops.rms_norm_backward(dy, x, w, 1e-6)
    dx, dw = ops.rms_norm_backward(dy, x, w, 1e-6, weight_grad=False)
    assert dw is None
    torch.testing.assert_close(dx, full_dx, rtol=0, atol=0)  # the weight still multiplies
    assert ops.fused_add_rms_norm_backward(dy, dr, x, w, 1e-6, weight_grad=False)[1] is None
    refs = layer_norm_grads(dy, x, w, bias, 1e-5)
    for weight_grad in (False, True):
        for bias_grad in (False, True):
            dx, dw, db = ops.layer_norm_backward(dy, x, w, bias, 1e-5, weight_grad, bias_grad)
            assert_grad_close(dx, refs[0], torch.float32, "dx")
            assert (dw is None) == (not weight_grad) and (db is None) == (not bias_grad)
            if weight_grad:
                assert_grad_close(dw, refs[1], torch.float32, "dweight")
            if bias_grad:
                assert_grad_close(db, refs[2], torch.float32, "dbias")

    x3, dy3 = x.reshape(2, 3, 16), dy.reshape(2, 3, 16)
    shift = rand(2, 1, 16, gen=gen, dtype=torch.float32)
    ts, tsh = rand(16, gen=gen, dtype=torch.float32), rand(16, gen=gen, dtype=torch.float32)
    for scale in (rand(2, 1, 16, gen=gen, dtype=torch.float32), dr.reshape(2, 3, 16)):
        refs = adaln_grads(dy3, x3, scale, shift, w, 1e-6, "layer", ts, tsh)
        for mask in [(False,) * 5, (True, False, False, True, False), (False, True, True, False, True), (True,) * 5]:
            got = ops.adaln_backward(dy3, x3, scale, w, 1e-6, "layer", ts, False, *mask)
            assert_grad_close(got[0], refs[0], torch.float32, "dx")
            for name, g, ref, wanted in zip(("dscale", "dshift", "dweight", "dtable_scale", "dtable_shift"), got[1:], refs[1:], mask):
                if wanted:
                    assert_grad_close(g, ref, torch.float32, name)
                else:
                    assert g is None, name


class BackwardCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the kiln backward ops called and their arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "kiln" and "backward" in func.__name__:
            self.calls.append((func.__name__.split(".")[0], args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def asked(calls, name, argument):
    """The value the one call of backward op `name` got for its schema argument `argument`."""
    (op, args, kwargs), = [c for c in calls if c[0] == name]
    schema = getattr(torch.ops.kiln, name).default._schema
    position = [a.name for a in schema.arguments].index(argument)
    if argument in kwargs:
        return kwargs[argument]
    return args[position] if position < len(args) else schema.arguments[position].default_value


def test_autograd_asks_only_for_the_gradients_it_needs():
    """A frozen parameter (LoRA) gets no gradient and costs none: the backward op is told not
    to compute it."""
    gen = torch.Generator().manual_seed(32)
    x = rand(4, 8, gen=gen, dtype=torch.float32).requires_grad_(True)
    w = rand(8, gen=gen, dtype=torch.float32, offset=1.0)
    bias = rand(8, gen=gen, dtype=torch.float32).requires_grad_(True)
    with BackwardCalls() as mode:
        kiln.rms_norm(x, w, 1e-6).sum().backward()
    assert asked(mode.calls, "rms_norm_backward", "weight_grad") is False and w.grad is None
    with BackwardCalls() as mode:
        kiln.layer_norm(x, w, bias, 1e-5).sum().backward()
    assert asked(mode.calls, "layer_norm_backward", "weight_grad") is False
    assert asked(mode.calls, "layer_norm_backward", "bias_grad") is True and bias.grad is not None
    r = rand(4, 8, gen=gen, dtype=torch.float32)
    with BackwardCalls() as mode:
        sum(t.sum() for t in kiln.fused_add_rms_norm(x, r, w, 1e-6)).backward()
    assert asked(mode.calls, "fused_add_rms_norm_backward", "weight_grad") is False

    x3 = x.detach().reshape(2, 2, 8).requires_grad_(True)
    temb = rand(2, 2, 2, 8, gen=gen, dtype=torch.float32, scale=0.3)
    table = rand(2, 8, gen=gen, dtype=torch.float32, scale=0.3)
    names = ("scale_grad", "shift_grad", "weight_grad", "table_scale_grad", "table_shift_grad")
    # (temb, table, weight require grad) -> what the op is asked for
    cases = {
        (False, False, False): (False, False, False, False, False),
        (True, False, False): (True, False, False, False, False),  # per-token shift: dy itself
        (False, True, False): (False, False, False, True, True),
        (True, True, True): (True, False, True, True, True),
    }
    for (temb_grad, table_grad, weight_grad), expected in cases.items():
        t = temb.clone().requires_grad_(temb_grad)
        tb = table.clone().requires_grad_(table_grad)
        wt = w.clone().requires_grad_(weight_grad)
        x3.grad = None
        with BackwardCalls() as mode:
            out = kiln.adaln(x3, t[:, :, 1], t[:, :, 0], wt, 1e-6, "rms", tb[1], tb[0])
            out.square().sum().backward()
        assert tuple(asked(mode.calls, "adaln_backward", n) for n in names) == expected, (temb_grad, table_grad)
        refs = adaln_grads(2 * out.detach(), x3, t[:, :, 1], t[:, :, 0], wt, 1e-6, "rms", tb[1], tb[0])
        assert_grad_close(x3.grad, refs[0], torch.float32, "dx")
        assert (t.grad is not None) == temb_grad and (tb.grad is not None) == table_grad
        assert (wt.grad is not None) == weight_grad
        if temb_grad:
            assert_grad_close(t.grad[:, :, 1], refs[1], torch.float32, "dscale")
            assert_grad_close(t.grad[:, :, 0], refs[2], torch.float32, "dshift")
        if table_grad:
            assert_grad_close(tb.grad[1], refs[4], torch.float32, "dtable_scale")
            assert_grad_close(tb.grad[0], refs[5], torch.float32, "dtable_shift")
        if weight_grad:
            assert_grad_close(wt.grad, refs[3], torch.float32, "dweight")


def test_one_token_a_sample_takes_operands_per_token():
    """x [B, 1, D]: a [B, 1, D] scale or shift is per token as much as per sample, and its
    gradient is the token's own: the op is not asked to sum dy for the shift (its gradient is
    dy itself), and the scale's comes out per token."""
    gen = torch.Generator().manual_seed(33)
    x = rand(3, 1, 8, gen=gen, dtype=torch.float32).requires_grad_(True)
    scale = rand(3, 1, 8, gen=gen, dtype=torch.float32, scale=0.3).requires_grad_(True)
    shift = rand(3, 1, 8, gen=gen, dtype=torch.float32, scale=0.3).requires_grad_(True)
    with BackwardCalls() as mode:
        out = kiln.adaln(x, scale, shift, None, 1e-6, "layer")
        out.square().sum().backward()
    assert asked(mode.calls, "adaln_backward", "shift_per_token") is True
    assert asked(mode.calls, "adaln_backward", "shift_grad") is False
    refs = adaln_grads(2 * out.detach(), x, scale, shift, None, 1e-6, "layer", None, None)
    for grad, ref, name in ((x.grad, refs[0], "dx"), (scale.grad, refs[1], "dscale"), (shift.grad, refs[2], "dshift")):
        assert_grad_close(grad, ref, torch.float32, name)


# ---- opcheck: schema, fakes, and the autograd registration under AOT dispatch


def layouts(rows, hidden, gen):
    """The same values as contiguous, permuted (hidden not the unit stride) and sliced
    tensors."""
    base = rand(rows, hidden, gen=gen, dtype=torch.float32)
    permuted = base.t().contiguous().t()
    sliced = torch.cat([base, base], dim=1)[:, 3 : 3 + hidden]
    assert not permuted.is_contiguous() and not sliced.is_contiguous()
    return {"contiguous": base, "permuted": permuted, "sliced": sliced}


@pytest.mark.parametrize("layout", ["contiguous", "permuted", "sliced"])
def test_opcheck_backward_ops(layout):
    gen = torch.Generator().manual_seed(11)
    x = layouts(6, 16, gen)[layout]
    dy = layouts(6, 16, gen)[layout]
    dr = layouts(6, 16, gen)[layout]
    w, bias = rand(16, gen=gen, dtype=torch.float32), rand(16, gen=gen, dtype=torch.float32)
    ops = torch.ops.kiln
    for weight in (w, None):
        torch.library.opcheck(ops.rms_norm_backward.default, (dy, x, weight, 1e-6))
        torch.library.opcheck(ops.fused_add_rms_norm_backward.default, (dy, dr, x, weight, 1e-6))
        torch.library.opcheck(ops.layer_norm_backward.default, (dy, x, weight, bias, 1e-5))
        torch.library.opcheck(ops.layer_norm_backward.default, (dy, x, weight, None, 1e-5))
    x3, dy3 = x.reshape(2, 3, 16), dy.reshape(2, 3, 16)
    for scale in (rand(2, 1, 16, gen=gen, dtype=torch.float32), dr.reshape(2, 3, 16)):
        for shift_per_token in (False, True):
            torch.library.opcheck(
                ops.adaln_backward.default, (dy3, x3, scale, w, 1e-6, "layer", w, shift_per_token)
            )
            torch.library.opcheck(
                ops.adaln_backward.default, (dy3, x3, scale, None, 1e-6, "rms", None, shift_per_token)
            )
            torch.library.opcheck(
                ops.adaln_backward.default,
                (dy3, x3, scale, w, 1e-6, "rms", w, shift_per_token, False, True, False, True, True),
            )
    torch.library.opcheck(ops.rms_norm_backward.default, (dy, x, w, 1e-6, False))
    torch.library.opcheck(ops.layer_norm_backward.default, (dy, x, w, bias, 1e-5, False, True))


@pytest.mark.parametrize("layout", ["contiguous", "permuted", "sliced"])
def test_opcheck_forward_ops_with_autograd(layout):
    gen = torch.Generator().manual_seed(12)
    x = layouts(6, 16, gen)[layout].requires_grad_(True)
    r = layouts(6, 16, gen)[layout].requires_grad_(True)
    w = rand(16, gen=gen, dtype=torch.float32).requires_grad_(True)
    bias = rand(16, gen=gen, dtype=torch.float32).requires_grad_(True)
    ops = torch.ops.kiln
    torch.library.opcheck(ops.rms_norm.default, (x, w, 1e-6))
    torch.library.opcheck(ops.rms_norm.default, (x, None, 1e-6))
    torch.library.opcheck(ops.fused_add_rms_norm.default, (x, r, w, 1e-6))
    torch.library.opcheck(ops.layer_norm.default, (x, w, bias, 1e-5))
    x3 = x.reshape(2, 3, 16)
    scale = rand(2, 1, 16, gen=gen, dtype=torch.float32).requires_grad_(True)
    shift = layouts(6, 16, gen)[layout].reshape(2, 3, 16).requires_grad_(True)
    torch.library.opcheck(ops.adaln.default, (x3, scale, shift, w, 1e-6, "rms", None, None))
    torch.library.opcheck(ops.adaln.default, (x3, scale, shift, None, 1e-6, "layer", w, bias))


# ---- torch.compile (symbolic shapes) and a module trained through kiln's ops


def test_compile_dynamic_backward_matches_eager():
    def loss_fn(x, r, w, bias, scale, shift):
        h, s = kiln.fused_add_rms_norm(x, r, w, 1e-6)
        h = kiln.layer_norm(h + s, w, bias, 1e-5)
        return kiln.adaln(h, scale, shift, w, 1e-6, "rms").square().mean()

    compiled = torch.compile(loss_fn, backend="aot_eager", dynamic=True, fullgraph=True)
    gen = torch.Generator().manual_seed(5)
    for tokens in (3, 5, 9):
        inputs = [
            rand(2, tokens, 32, gen=gen, dtype=torch.float32),
            rand(2, tokens, 32, gen=gen, dtype=torch.float32),
            rand(32, gen=gen, dtype=torch.float32, offset=1.0),
            rand(32, gen=gen, dtype=torch.float32),
            rand(2, 1, 32, gen=gen, dtype=torch.float32, scale=0.5),
            rand(2, tokens, 32, gen=gen, dtype=torch.float32, scale=0.5),
        ]
        eager = [t.clone().requires_grad_(True) for t in inputs]
        traced = [t.clone().requires_grad_(True) for t in inputs]
        loss_fn(*eager).backward()
        compiled(*traced).backward()
        for a, b in zip(eager, traced):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)


class Block(torch.nn.Module):
    """A DiT-like block: layer norm, a projection, AdaLN modulation, an RMS-normed residual
    stream. `ops` is kiln or the fp64 references."""

    def __init__(self, hidden, dtype):
        super().__init__()
        gen = torch.Generator().manual_seed(21)
        self.proj = torch.nn.Linear(hidden, hidden, dtype=dtype)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(hidden, hidden, generator=gen) / hidden**0.5)
            self.proj.bias.copy_(torch.randn(hidden, generator=gen) * 0.1)
        self.ln_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden, generator=gen).to(dtype))
        self.ln_bias = torch.nn.Parameter(0.1 * torch.randn(hidden, generator=gen).to(dtype))
        self.rms_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden, generator=gen).to(dtype))
        self.table = torch.nn.Parameter(0.1 * torch.randn(2, hidden, generator=gen).to(dtype))

    def forward(self, x, temb, reference=False):
        scale, shift = temb[:, :, 0], temb[:, :, 1]
        if reference:
            h = layer_norm_fp64(x, self.ln_weight, self.ln_bias, 1e-5)
            h = self.proj(h)
            h = adaln_fp64(h, scale, shift, None, 1e-6, "layer", self.table[0], self.table[1])
            r = x + h
            return rms_norm_fp64(r, self.rms_weight, 1e-6), r
        h = kiln.layer_norm(x, self.ln_weight, self.ln_bias, 1e-5)
        h = self.proj(h)
        h = kiln.adaln(h, scale, shift, None, 1e-6, "layer", self.table[0], self.table[1])
        return kiln.fused_add_rms_norm(h, x, self.rms_weight, 1e-6)


def test_module_loss_backward_matches_reference():
    hidden = 24
    gen = torch.Generator().manual_seed(8)
    x = rand(2, 5, hidden, gen=gen, dtype=torch.float32)
    temb = rand(2, 1, 2, hidden, gen=gen, dtype=torch.float32, scale=0.3)
    target = rand(2, 5, hidden, gen=gen, dtype=torch.float32)

    block = Block(hidden, torch.float32)
    xk, tk = x.clone().requires_grad_(True), temb.clone().requires_grad_(True)
    out, r = block(xk, tk)
    ((out - target).square().mean() + r.square().mean()).backward()

    ref_block = Block(hidden, torch.float64)
    ref_block.load_state_dict({k: v.double() for k, v in block.state_dict().items()})
    xr, tr = x.double().requires_grad_(True), temb.double().requires_grad_(True)
    out_ref, r_ref = ref_block(xr, tr, reference=True)
    ((out_ref - target.double()).square().mean() + r_ref.square().mean()).backward()

    for (name, p), (_, p_ref) in zip(block.named_parameters(), ref_block.named_parameters()):
        torch.testing.assert_close(p.grad.double(), p_ref.grad, rtol=1e-4, atol=1e-6, msg=name)
    torch.testing.assert_close(xk.grad.double(), xr.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(tk.grad.double(), tr.grad, rtol=1e-4, atol=1e-6)


# ---- bad inputs


def test_backward_bad_inputs():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"kiln.rms_norm_backward: dy: expected shape \[2, 8\] \(as x\), got \[2, 7\]"):
        torch.ops.kiln.rms_norm_backward(torch.randn(2, 7), x, None, 1e-6)
    with pytest.raises(TypeError, match=r"kiln.rms_norm_backward: dy: expected dtype float32 \(as x\), got bfloat16"):
        torch.ops.kiln.rms_norm_backward(x.bfloat16(), x, None, 1e-6)
    with pytest.raises(TypeError, match=r"kiln.layer_norm_backward: x: expected dtype float32, float16, bfloat16 or float64, got int64"):
        torch.ops.kiln.layer_norm_backward(x.long(), x.long(), None, None, 1e-5)
    with pytest.raises(ValueError, match=r"kiln.layer_norm_backward: bias: expected shape \[8\] \(x's last dimension\), got \[4\]"):
        torch.ops.kiln.layer_norm_backward(x, x, None, torch.randn(4), 1e-5)
    with pytest.raises(ValueError, match=r"kiln.fused_add_rms_norm_backward: dr: expected shape \[2, 8\] \(as r\), got \[8\]"):
        torch.ops.kiln.fused_add_rms_norm_backward(x, torch.randn(8), x, None, 1e-6)
    with pytest.raises(TypeError, match=r"kiln.fused_add_rms_norm_backward: weight: expected dtype float32 \(as x\), got float16"):
        torch.ops.kiln.fused_add_rms_norm_backward(x, x, x, torch.randn(8).half(), 1e-6)
    x3 = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"kiln.adaln_backward: scale: expected shape \[2, 1, 8\] \(per sample\) or \[2, 5, 8\] \(per token\) for x of shape \[2, 5, 8\], got \[2, 3, 8\]"):
        torch.ops.kiln.adaln_backward(x3, x3, torch.randn(2, 3, 8), None, 1e-6, "rms", None, False)
    with pytest.raises(ValueError, match=r"kiln.adaln_backward: norm: expected \"rms\" or \"layer\", got \"group\""):
        torch.ops.kiln.adaln_backward(x3, x3, torch.randn(2, 1, 8), None, 1e-6, "group", None, False)
    with pytest.raises(ValueError, match=r"kiln.adaln_backward: x: expected shape \[B, T, D\] with D > 0, got \[2, 8\]"):
        torch.ops.kiln.adaln_backward(x, x, torch.randn(2, 1, 8), None, 1e-6, "rms", None, False)
    with pytest.raises(ValueError, match=r"kiln.adaln_backward: table_scale: expected shape \[8\]"):
        torch.ops.kiln.adaln_backward(x3, x3, torch.randn(2, 1, 8), None, 1e-6, "rms", torch.randn(7), False)


def test_backward_fakes_reject_bad_inputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 8)
        with pytest.raises(ValueError, match=r"kiln.rms_norm_backward: dy: expected shape \[2, 8\]"):
            torch.ops.kiln.rms_norm_backward(torch.empty(2, 7), x, None, 1e-6)
        dx, dw, db = torch.ops.kiln.layer_norm_backward(torch.empty(2, 8), x, torch.empty(8), None, 1e-5)
        assert dx.shape == (2, 8) and dw.shape == (8,) and db is None
        x3 = torch.empty(2, 5, 8, dtype=torch.bfloat16)
        dx, dscale, dshift, dw, dts, dtsh = torch.ops.kiln.adaln_backward(
            x3, x3, torch.empty(2, 1, 8, dtype=torch.bfloat16), None, 1e-6, "rms", None, False
        )
        assert dscale.shape == (2, 1, 8) and dshift.shape == (2, 1, 8) and dw is None
        assert dx.dtype == torch.bfloat16 and dts is None and dtsh is None
        grads = torch.ops.kiln.adaln_backward(
            x3, x3, torch.empty(2, 5, 8, dtype=torch.bfloat16), None, 1e-6, "rms", None, True,
            scale_grad=False, table_scale_grad=True, table_shift_grad=True,
        )
        assert grads[1] is None and grads[2] is None and grads[3] is None
        assert grads[4].shape == (8,) and grads[5].shape == (8,) and grads[5].dtype == torch.bfloat16
        assert torch.ops.kiln.rms_norm_backward(torch.empty(2, 8), x, torch.empty(8), 1e-6, False)[1] is None


def test_cpu_float64_forward_matches_reference():
    gen = torch.Generator().manual_seed(4)
    x = rand(3, 9, gen=gen)
    w = rand(9, gen=gen)
    out = kiln.rms_norm(x, w)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, rms_norm_fp64(x, w, 1e-6), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(kiln.layer_norm(x, w, w), layer_norm_fp64(x, w, w, 1e-5), rtol=1e-12, atol=1e-12)
