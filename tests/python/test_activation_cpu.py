"""The activation ops' CPU implementations (kiln's registered references) against fp64
math, both input forms, both GELU forms, every broadcast of the gate; the fakes and
torch.compile; and bad inputs, which must be clear errors."""

import pytest
import torch

import kiln
from activation_reference import (bias_gelu_fp64, fresh, gated_residual_fp64, geglu_fp64,
                                  swiglu_fp64)
from reference import assert_close_to

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
WIDTHS = [1, 7, 768, 1023]
ROWS = [1, 33]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("packed,up_first", [(False, False), (True, False), (True, True)])
def test_swiglu(dtype, width, rows, packed, up_first):
    if packed:
        gate, up = fresh((rows, 2 * width), dtype), None
    else:
        gate, up = fresh((rows, width), dtype), fresh((rows, width), dtype)
    out = kiln.swiglu(gate, up, up_first=up_first)
    assert out.dtype == dtype and out.shape == (rows, width) and out.is_contiguous()
    assert_close_to(out, swiglu_fp64(gate, up, up_first), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("packed,up_first", [(False, False), (True, False), (True, True)])
def test_geglu(dtype, width, approximate, packed, up_first):
    rows = 5
    if packed:
        gate, up = fresh((rows, 2 * width), dtype), None
    else:
        gate, up = fresh((rows, width), dtype), fresh((rows, width), dtype)
    out = kiln.geglu(gate, up, approximate=approximate, up_first=up_first)
    assert out.dtype == dtype and out.shape == (rows, width)
    assert_close_to(out, geglu_fp64(gate, up, approximate, up_first), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gelu(dtype, width, rows, approximate, with_bias):
    x = fresh((rows, width), dtype)
    bias = fresh((width,), dtype, scale=0.5) if with_bias else None
    out = kiln.gelu(x, bias, approximate=approximate)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close_to(out, bias_gelu_fp64(x, bias, approximate), dtype)


def test_gelu_default_is_tanh_and_matches_torch_formulas():
    x = fresh((64, 96), torch.float32)
    torch.testing.assert_close(kiln.gelu(x), torch.nn.functional.gelu(x, approximate="tanh"))
    torch.testing.assert_close(kiln.gelu(x, approximate="none"), torch.nn.functional.gelu(x))
    g, u = fresh((8, 32), torch.float32), fresh((8, 32), torch.float32)
    torch.testing.assert_close(kiln.swiglu(g, u), torch.nn.functional.silu(g) * u)


GATE_SHAPES = {  # h is [2, 5, width]
    "per token": lambda w: (2, 5, w),
    "per sample": lambda w: (2, 1, w),
    "shared 3-d": lambda w: (1, 1, w),
    "shared 1-d": lambda w: (w,),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("gate_shape", list(GATE_SHAPES))
@pytest.mark.parametrize("in_place", [False, True])
def test_gated_residual(dtype, width, gate_shape, in_place):
    h, y = fresh((2, 5, width), dtype), fresh((2, 5, width), dtype)
    gate = fresh(GATE_SHAPES[gate_shape](width), dtype)
    ref = gated_residual_fp64(h, y, gate)
    if in_place:
        storage = h.data_ptr()
        returned = kiln.gated_residual_(h, y, gate)
        assert returned is h and h.data_ptr() == storage
        out = h
    else:
        h_before = h.clone()
        out = kiln.gated_residual(h, y, gate)
        assert torch.equal(h, h_before), "the out-of-place op changed h"
    assert out.dtype == dtype and out.shape == (2, 5, width)
    assert_close_to(out, ref, dtype)


def test_output_dtype_is_the_inputs_dtype():
    for dtype in DTYPES:
        x = fresh((3, 8), dtype)
        assert kiln.swiglu(x, x).dtype == dtype
        assert kiln.geglu(x, x).dtype == dtype
        assert kiln.gelu(x).dtype == dtype
        assert kiln.gated_residual(x, x, x).dtype == dtype


def test_leading_shapes_and_non_contiguous_inputs():
    base = fresh((4, 6, 64), torch.float32)
    t = base.transpose(0, 1)  # rows do not collapse into one stride
    out = kiln.swiglu(t, t * 0.5)
    assert out.shape == (6, 4, 64)
    assert_close_to(out, swiglu_fp64(t, t * 0.5), torch.float32)
    packed = fresh((5, 3, 128), torch.float32)
    assert kiln.swiglu(packed).shape == (5, 3, 64)
    sliced = fresh((5, 200), torch.float32)[:, 8:136]  # rows 200 apart
    assert_close_to(kiln.gelu(sliced), bias_gelu_fp64(sliced), torch.float32)


def test_zero_rows():
    assert kiln.swiglu(torch.randn(0, 3, 16)).shape == (0, 3, 8)
    assert kiln.gelu(torch.randn(0, 16)).shape == (0, 16)
    assert kiln.gated_residual(torch.randn(0, 4, 16), torch.randn(0, 4, 16),
                               torch.randn(0, 1, 16)).shape == (0, 4, 16)


# ---- bad inputs -------------------------------------------------------------------------

def test_odd_packed_width():
    with pytest.raises(ValueError, match=r"kiln.swiglu: gate: expected a packed last dimension 2\*I .*got \[4, 7\]"):
        kiln.swiglu(torch.randn(4, 7))
    with pytest.raises(ValueError, match=r"kiln.geglu: gate: expected a packed last dimension"):
        kiln.geglu(torch.randn(4, 9))


def test_shape_mismatches():
    with pytest.raises(ValueError, match=r"kiln.swiglu: up: expected shape \[4, 8\] \(as gate\), got \[4, 9\]"):
        kiln.swiglu(torch.randn(4, 8), torch.randn(4, 9))
    with pytest.raises(ValueError, match=r"kiln.geglu: up: expected shape \[4, 8\] \(as gate\), got \[8\]"):
        kiln.geglu(torch.randn(4, 8), torch.randn(8))
    with pytest.raises(ValueError, match=r"kiln.gelu: bias: expected shape \[8\] \(x's last dimension\), got \[4, 8\]"):
        kiln.gelu(torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"kiln.gated_residual: y: expected shape \[2, 3, 8\] \(as h\), got \[2, 1, 8\]"):
        kiln.gated_residual(torch.randn(2, 3, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8))
    for bad in [(2, 3, 1), (3, 1, 8), (2, 3, 4), (1, 2, 3, 8)]:
        with pytest.raises(ValueError, match=r"kiln.gated_residual: gate: expected a shape that broadcasts over h \[2, 3, 8\]"):
            kiln.gated_residual(torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(bad))
    with pytest.raises(ValueError, match=r"kiln.gelu: x: expected at least 1 dimension"):
        kiln.gelu(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"kiln.swiglu: gate: expected a last dimension > 0, got \[3, 0\]"):
        kiln.swiglu(torch.randn(3, 0), torch.randn(3, 0))


def test_dtype_errors():
    # float64 runs on the CPU (the gradcheck path; see test_autograd_pointwise_cpu.py)
    with pytest.raises(TypeError, match=r"kiln.swiglu: gate: expected dtype float32, float16, bfloat16 or \(on the CPU\) float64, got int32"):
        kiln.swiglu(torch.ones(2, 8, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"kiln.swiglu: up: expected dtype bfloat16 \(as gate\), got float32"):
        kiln.swiglu(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(2, 8))
    with pytest.raises(TypeError, match=r"kiln.gelu: bias: expected dtype float16 \(as x\), got float32"):
        kiln.gelu(torch.randn(2, 8, dtype=torch.half), torch.randn(8))
    with pytest.raises(TypeError, match=r"kiln.gated_residual: gate: expected dtype float32 \(as h\), got bfloat16"):
        kiln.gated_residual(torch.randn(2, 8), torch.randn(2, 8), torch.randn(2, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"kiln.gated_residual: h: .*got int64"):
        kiln.gated_residual(torch.ones(2, 8, dtype=torch.long), torch.randn(2, 8), torch.randn(2, 8))


def test_bad_approximate():
    with pytest.raises(ValueError, match=r"kiln.gelu: approximate: expected 'tanh' or 'none', got 'erf'"):
        kiln.gelu(torch.randn(2, 8), approximate="erf")
    with pytest.raises(ValueError, match=r"kiln.geglu: approximate: expected 'tanh' or 'none', got 'fast'"):
        kiln.geglu(torch.randn(2, 8), approximate="fast")


def test_in_place_into_overlapping_memory():
    h = torch.randn(1, 8).expand(4, 8)
    with pytest.raises(ValueError, match=r"kiln.gated_residual_: h: expected a tensor whose elements have distinct memory"):
        kiln.gated_residual_(h, torch.randn(4, 8), torch.randn(4, 8))
    buffer = torch.randn(5, 8)
    with pytest.raises(ValueError, match=r"kiln.gated_residual_: y: expected no partial overlap with h"):
        kiln.gated_residual_(buffer[:4], buffer[1:], torch.randn(4, 8))
    # Full overlap is fine: each element is read before it is written.
    h = fresh((4, 8), torch.float32)
    ref = gated_residual_fp64(h, h, h)
    kiln.gated_residual_(h, h, h)
    assert_close_to(h, ref, torch.float32)


# ---- fakes and compile ------------------------------------------------------------------

def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        packed = torch.empty(2, 5, 64, dtype=torch.bfloat16)
        assert torch.ops.kiln.swiglu(packed).shape == (2, 5, 32)
        assert torch.ops.kiln.geglu(packed, packed, "none").shape == (2, 5, 64)
        out = torch.ops.kiln.gelu(packed, torch.empty(64, dtype=torch.bfloat16))
        assert out.shape == (2, 5, 64) and out.dtype == torch.bfloat16
        gate = torch.empty(2, 1, 64, dtype=torch.bfloat16)
        assert torch.ops.kiln.gated_residual(packed, packed, gate).shape == (2, 5, 64)


def test_compile_fullgraph_cpu():
    def mlp(x, w_gate_up, w_down, h, gate):
        y = kiln.swiglu(x @ w_gate_up) @ w_down
        return kiln.gated_residual(h, kiln.gelu(y), gate)

    compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(5)
    x, w1, w2 = (torch.randn(*s, generator=gen) for s in ((2, 3, 16), (16, 64), (32, 16)))
    h, gate = torch.randn(2, 3, 16, generator=gen), torch.randn(2, 1, 16, generator=gen)
    out = compiled(x, w1, w2, h, gate)
    # Compiling changes nothing: the same ops, the same fp32 results as eager.
    torch.testing.assert_close(out, mlp(x, w1, w2, h, gate), rtol=0, atol=0)
    # Against fp64 math the fp32 matmuls between the ops (sums of 16-32 rounded products)
    # add error beyond one rounding of the ops themselves: a few 1e-6 relative.
    y = swiglu_fp64(x @ w1).float() @ w2
    ref = gated_residual_fp64(h, bias_gelu_fp64(y), gate)
    err = ((out.double() - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
    assert err < 1e-4, err


def test_opcheck_cpu():
    ops = torch.ops.kiln
    utils = ("test_schema", "test_faketensor")
    x, up = torch.randn(4, 16), torch.randn(4, 16)
    torch.library.opcheck(ops.swiglu.default, (x, up, False), test_utils=utils)
    torch.library.opcheck(ops.swiglu.default, (x, None, True), test_utils=utils)
    torch.library.opcheck(ops.geglu.default, (x, None, "none", False), test_utils=utils)
    torch.library.opcheck(ops.gelu.default, (x, torch.randn(16), "tanh"), test_utils=utils)
    h = torch.randn(2, 2, 16)
    torch.library.opcheck(ops.gated_residual.default, (h, h.clone(), torch.randn(2, 1, 16)),
                          test_utils=utils)
    torch.library.opcheck(ops.gated_residual_.default, (h.clone(), h, torch.randn(2, 1, 16)),
                          test_utils=utils)


# ---- offline compiles -------------------------------------------------------------------

FLAGS = {  # op -> problem flag sets (templates/elementwise_family.h)
    "swiglu": [0, 1],
    "geglu": [1, 2],
    "gelu": [1, 3, 4, 6],
    "gated_residual": [1, 8, 24, 64],
}


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("op", list(FLAGS))
def test_nvrtc_compiles(arch, dtype, op):
    for flags in FLAGS[op]:
        for width in (14336, 4545):
            result = kiln.compile(op, dtype, width, arch=arch, flags=flags, format="ptx")
            ptx = result["binary"].decode()
            assert f".target {arch}" in ptx
            assert f".entry {result['lowered_name']}" in ptx
            assert "local_depot" not in ptx, "the kernel spills to local memory"
            assert f"<{'float' if dtype == 'fp32' else 'kiln::' + dtype.replace('fp', 'f')}, {width}," \
                in result["name_expression"]


def test_shared_gate_is_its_own_problem_on_the_per_token_kernel():
    """Flag 64 (a gate row shared by every row) keys its own tunes; the kernel is the per-token
    gate's, whose row stride is a launch parameter."""
    shared = kiln.compile("gated_residual", "bf16", 3072, arch="sm_90", flags=64)
    per_token = kiln.compile("gated_residual", "bf16", 3072, arch="sm_90", flags=0)
    assert shared["name_expression"] == per_token["name_expression"]
    with pytest.raises(ValueError, match=r"kiln.gated_residual: flags: expected a gate per "
                                         r"sample \(8\) or shared by every row \(64\), not both, got 72"):
        kiln.compile("gated_residual", "bf16", 3072, arch="sm_90", flags=72)
    with pytest.raises(ValueError, match=r"kiln.gated_residual: flags: expected no flat layout"):
        kiln.compile("gated_residual", "bf16", 3072, arch="sm_90", flags=65)


def test_compile_with_explicit_config():
    config = {"vec_bytes": 16, "threads_per_row": 1, "cta_threads": 512, "unroll": 4, "max_ctas": 0}
    result = kiln.compile("swiglu", "bf16", 8192, arch="sm_80", flags=1, config=config)
    assert "8192, 16, 512, 4, true, false, kiln::SiluMul" in result["name_expression"]
    with pytest.raises(ValueError, match="unroll 3"):
        kiln.compile("swiglu", "bf16", 8192, arch="sm_80", config=dict(config, unroll=3))
    with pytest.raises(ValueError, match="kiln.gelu: flags"):
        kiln.compile("gelu", "bf16", 8192, arch="sm_80", flags=5)
