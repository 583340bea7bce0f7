"""torch.library.opcheck for every kiln op and variant (functional, in-place, out=) on
contiguous, permuted and sliced inputs: the schema matches what the implementation mutates
and returns, the fake agrees with the real implementation (shapes, dtypes, strides), and
AOT autograd traces it with dynamic shapes. CPU here; the same cases on CUDA are gpu-marked."""

import re
from pathlib import Path

import pytest
import torch

import kiln  # noqa: F401  (registers the ops and fakes)
from kiln._inductor import kiln_overloads

ops = torch.ops.kiln
LAYOUTS = ("contiguous", "permuted", "sliced")
# test_autograd_registration is left out: no input here requires grad, so it would check
# nothing. The autograd kernels (a backward, or one that refuses to record) are tested with
# inputs that do: test_autograd_*.py, test_norm_backward_*.py and test_no_backward.py.
UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def lay(t, layout):
    """`t`'s values in the given memory layout: contiguous; permuted (the storage of the
    reversed dims, so even the last dim is strided); sliced (a view into a larger tensor,
    offset by one element in every dim: misaligned rows with a longer row stride)."""
    if layout == "contiguous" or t.dim() == 0:
        return t.contiguous()
    if layout == "permuted":
        order = list(reversed(range(t.dim())))
        return t.permute(order).contiguous().permute(order)
    big = torch.empty([s + 1 for s in t.shape], dtype=t.dtype, device=t.device)
    view = big[(slice(1, None),) * t.dim()]
    view.copy_(t)
    return view


def cases(device, layout):
    """(name, overload, args, kwargs) for every op: activations (the op's main tensors) in
    `layout`; small parameters contiguous, or a misaligned slice when `layout` is sliced."""
    gen = torch.Generator().manual_seed(7)

    def act(*shape):
        return lay(torch.randn(*shape, generator=gen).to(device), layout)

    def param(n):
        t = torch.randn(n + 1, generator=gen).to(device)
        return t[1:] if layout == "sliced" else t[:n].contiguous()

    d = 32
    x, r = act(2, 3, d), act(2, 3, d)
    w, b = param(d), param(d)
    ada_sample, ada_token = act(2, 1, d), act(2, 3, d)
    packed, gate, up = act(2, 3, 2 * d), act(2, 3, d), act(2, 3, d)
    q, k = act(2, 4, 5, 16), act(2, 2, 5, 16)
    cos, sin = torch.randn(5, 16, generator=gen).to(device), torch.randn(5, 16, generator=gen).to(device)
    q_bshd, k_bshd = act(2, 5, 4, 16), act(2, 5, 2, 16)
    v, u = act(2, 12, 36), act(2, 12, 36)
    wv = param(36)
    table_cos = torch.randn(2, 12, 36, generator=gen).to(device)
    table_sin = torch.randn(2, 12, 36, generator=gen).to(device)
    out_norm = lay(torch.full((2, 3, d), float("nan")).to(device), layout)
    out_glu = lay(torch.full((2, 3, d), float("nan")).to(device), layout)
    return [
        ("rms_norm", ops.rms_norm.default, (x, w, 1e-6), {}),
        ("rms_norm no weight", ops.rms_norm.default, (x, None, 1e-6), {}),
        ("rms_norm.out", ops.rms_norm.out, (x, w, 1e-6), {"out": out_norm}),
        ("fused_add_rms_norm", ops.fused_add_rms_norm.default, (x, r, w, 1e-6), {}),
        ("fused_add_rms_norm_", ops.fused_add_rms_norm_.default, (x.clone(), r.clone(), w, 1e-6), {}),
        ("layer_norm", ops.layer_norm.default, (x, w, b, 1e-5), {}),
        ("layer_norm no affine", ops.layer_norm.default, (x, None, None, 1e-5), {}),
        ("adaln", ops.adaln.default, (x, ada_sample, ada_token, w, 1e-6, "rms", w, b), {}),
        ("adaln layer", ops.adaln.default, (x, ada_token, ada_sample, None, 1e-6, "layer", None, None), {}),
        ("gated_adaln", ops.gated_adaln.default,
         (x, r, ada_sample, ada_token, ada_sample, None, 1e-6, "rms", None, None, None), {}),
        ("rms_norm_gated", ops.rms_norm_gated.default, (x, r, w, 1e-6, "silu"), {}),
        ("rms_norm_gated sigmoid no weight", ops.rms_norm_gated.default, (x, r, None, 1e-5, "sigmoid"), {}),
        ("rms_norm_gated gate first", ops.rms_norm_gated.default, (x, r, w, 1e-5, "silu", False), {}),
        ("swiglu", ops.swiglu.default, (gate, up, False), {}),
        ("swiglu packed", ops.swiglu.default, (packed, None, True), {}),
        ("swiglu.out", ops.swiglu.out, (packed, None, False), {"out": out_glu}),
        ("geglu", ops.geglu.default, (gate, up, "none", False), {}),
        ("clamped_swiglu", ops.clamped_swiglu.default, (packed, 1.702, 7.0, True), {}),
        ("clamped_swiglu halves", ops.clamped_swiglu.default, (packed, 1.0, 3.0, False), {}),
        ("geglu packed", ops.geglu.default, (packed, None, "tanh", False), {}),
        ("gelu", ops.gelu.default, (x, b, "tanh"), {}),
        ("gelu no bias", ops.gelu.default, (x, None, "none"), {}),
        ("gelu.out", ops.gelu.out, (x, b, "tanh"), {"out": torch.empty_like(x)}),
        ("gated_residual", ops.gated_residual.default, (x, r, ada_sample), {}),
        ("gated_residual_", ops.gated_residual_.default, (x.clone(), r, ada_token), {}),
        ("rope", ops.rope.default, (q, k, cos, sin, False, -1, "bhsd", -1), {}),
        ("rope interleaved bshd", ops.rope.default, (q_bshd, k_bshd, cos, sin, True, 8, "bshd", -1), {}),
        ("rope_", ops.rope_.default, (q.clone(), k.clone(), cos, sin, False, -1, "bhsd", -1), {}),
        ("rope_3d", ops.rope_3d.default, (v, u, [2, 2, 3], [0.32, 32.0, 32.0]), {}),
        ("rms_norm_rope grid", ops.rms_norm_rope.default,
         (v, u, wv, wv, 1e-5, None, None, [2, 2, 3], [0.32, 32.0, 32.0]), {}),
        ("rms_norm_rope table", ops.rms_norm_rope.default, (v, u, wv, wv, 1e-5, table_cos, table_sin), {}),
        ("head_norm_rope", ops.head_norm_rope.default,
         (q, k, w[:16], None, cos, sin, 1e-6, False, -1, "bhsd", -1), {}),
        ("head_norm_rope interleaved bshd", ops.head_norm_rope.default,
         (q_bshd, k_bshd, w[:16], w[16:], cos, sin, 1e-5, True, 8, "bshd", -1), {}),
        ("head_norm_rope_", ops.head_norm_rope_.default,
         (q.clone(), k.clone(), None, w[:16], cos, sin, 1e-6, True, -1, "bhsd", -1), {}),
    ]


CASE_NAMES = [name for name, *_ in cases("cpu", "contiguous")]


def run_opcheck(device, layout, name):
    (_, op, args, kwargs), = [c for c in cases(device, layout) if c[0] == name]
    torch.library.opcheck(op, args, kwargs, test_utils=UTILS)


# The backward ops are opchecked beside their gradients' tests, over the same three layouts.
BACKWARD_TEST_FILES = ("test_norm_backward_cpu.py", "test_autograd_pointwise_cpu.py",
                       "test_clamped_swiglu_cpu.py")


def opchecked_in_backward_tests():
    text = "".join((Path(__file__).parent / name).read_text() for name in BACKWARD_TEST_FILES)
    return set(re.findall(r"opcheck\(\s*(?:torch\.ops\.kiln|ops)\.(\w+_backward)\.default", text))


def test_every_registered_op_is_covered():
    names = {c[1]._schema.name.split("::")[1] + ("." + c[1]._overloadname if c[1]._overloadname != "default" else "")
             for c in cases("cpu", "contiguous")}
    names |= opchecked_in_backward_tests()
    registered = {op._schema.name.split("::")[1] + ("." + op._overloadname if op._overloadname != "default" else "")
                  for op in kiln_overloads()}
    assert registered, "no kiln op is registered"
    assert registered <= names, f"ops without an opcheck case: {sorted(registered - names)}"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_opcheck_cpu(name, layout):
    run_opcheck("cpu", layout, name)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_opcheck_cuda(name, layout, heuristic_tuning):
    run_opcheck("cuda", layout, name)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_out_variants_write_the_functional_result(layout):
    gen = torch.Generator().manual_seed(3)
    x = lay(torch.randn(3, 5, 40, generator=gen), layout)
    w = torch.randn(40, generator=gen)
    out = lay(torch.full((3, 5, 40), float("nan")), layout)
    assert kiln.rms_norm(x, w, out=out) is out
    torch.testing.assert_close(out, kiln.rms_norm(x, w), rtol=0, atol=0)
    packed = lay(torch.randn(3, 5, 80, generator=gen), layout)
    out = lay(torch.full((3, 5, 40), float("nan")), layout)
    assert kiln.swiglu(packed, out=out) is out
    torch.testing.assert_close(out, kiln.swiglu(packed), rtol=0, atol=0)


def test_out_variants_refuse_a_wrong_out():
    x, w = torch.randn(4, 16), torch.randn(16)
    with pytest.raises(TypeError, match=r"kiln\.rms_norm: out: expected float32"):
        kiln.rms_norm(x, w, out=torch.empty(4, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"kiln\.rms_norm: out: expected shape \[4, 16\], got \[4, 8\]"):
        kiln.rms_norm(x, w, out=torch.empty(4, 8))
    with pytest.raises(ValueError, match=r"kiln\.swiglu: out: expected shape \[4, 8\], got \[4, 16\]"):
        kiln.swiglu(x, out=torch.empty(4, 16))


def test_out_variants_under_compile_cpu():
    def f(x, w, out):
        kiln.rms_norm(x * 2, w, out=out)
        return out + 1

    x, w, out = torch.randn(6, 32), torch.randn(32), torch.empty(6, 32)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    expected = kiln.rms_norm(x * 2, w) + 1
    torch.testing.assert_close(compiled(x, w, out), expected)
    torch.testing.assert_close(out, expected - 1)
