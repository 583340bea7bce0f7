"""clamped_swiglu (GPT-OSS's expert gate) on the CPU, kiln's registered reference: against
fp64 math and transformers' own formula, both packings, values across both clamps; its
gradient against fp64 autograd; the fakes under torch.compile; bad inputs, named errors."""

import pytest
import torch

import kiln
from activation_reference import clamped_swiglu_fp64, gpt_oss_gate_up
from reference import assert_close_to
from test_activation_cpu import DTYPES, ROWS, WIDTHS  # the activations' grid


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("interleaved", [True, False])
def test_matches_fp64(dtype, width, rows, interleaved):
    gate_up = gpt_oss_gate_up((rows, 2 * width), dtype)
    out = kiln.clamped_swiglu(gate_up, interleaved=interleaved)
    assert out.dtype == dtype and out.shape == (rows, width) and out.is_contiguous()
    assert_close_to(out, clamped_swiglu_fp64(gate_up, interleaved=interleaved), dtype)


def test_scalars_reach_the_math():
    gate_up = gpt_oss_gate_up((4, 2, 64), torch.float32, limit=3.0)
    out = kiln.clamped_swiglu(gate_up, alpha=0.5, limit=3.0)
    assert_close_to(out, clamped_swiglu_fp64(gate_up, 0.5, 3.0), torch.float32)
    assert not torch.allclose(out, kiln.clamped_swiglu(gate_up))


def test_matches_transformers_gpt_oss_experts():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no GPT-OSS")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    config = transformers.GptOssConfig(hidden_size=32, intermediate_size=48, num_local_experts=2)
    experts = GptOssExperts(config)
    gate_up = gpt_oss_gate_up((5, 96), torch.float64)
    expected = experts._apply_gate(gate_up)
    out = kiln.clamped_swiglu(gate_up, experts.alpha, experts.limit)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_nan_passes_through_the_clamps():
    gate_up = torch.tensor([[float("nan"), 1.0, 1.0, float("nan"), 9.0, -9.0]])
    out = kiln.clamped_swiglu(gate_up)
    assert torch.isnan(out[0, 0]) and torch.isnan(out[0, 1]) and not torch.isnan(out[0, 2])


@pytest.mark.parametrize("interleaved", [True, False])
def test_gradient_matches_fp64_autograd(interleaved):
    gate_up = gpt_oss_gate_up((6, 2 * 37), torch.float64).requires_grad_()
    out = kiln.clamped_swiglu(gate_up, 1.3, 7.0, interleaved)
    dy = torch.randn_like(out)
    (grad,) = torch.autograd.grad(out, gate_up, dy)
    reference = gate_up.detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad(clamped_swiglu_fp64(reference, 1.3, 7.0, interleaved), reference, dy)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
    # Beyond the limits the clamps pass no gradient; at them they do (torch.clamp's rule).
    assert (expected == 0).any() and (expected != 0).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_op_rounds_once(dtype):
    gate_up = gpt_oss_gate_up((3, 2 * 40), dtype)
    dy = torch.randn(3, 40).to(dtype)
    grad = torch.ops.kiln.clamped_swiglu_backward(dy, gate_up, 1.702, 7.0, True)
    reference = gate_up.double().requires_grad_()
    (expected,) = torch.autograd.grad(clamped_swiglu_fp64(reference), reference, dy.double())
    assert grad.dtype == dtype and grad.shape == gate_up.shape
    assert_close_to(grad, expected, dtype)


def test_opcheck():
    gate_up = gpt_oss_gate_up((2, 3, 16), torch.float32)
    torch.library.opcheck(torch.ops.kiln.clamped_swiglu.default, (gate_up, 1.702, 7.0, True))
    torch.library.opcheck(torch.ops.kiln.clamped_swiglu.default, (gate_up, 1.0, 5.0, False))
    dy = torch.randn(2, 3, 8)
    torch.library.opcheck(torch.ops.kiln.clamped_swiglu_backward.default, (dy, gate_up, 1.702, 7.0, True))
    torch.library.opcheck(torch.ops.kiln.clamped_swiglu_backward.default, (dy, gate_up, 1.0, 5.0, False))


def test_compiles_with_the_fake():
    gate_up = gpt_oss_gate_up((4, 64), torch.float32)
    compiled = torch.compile(lambda x: kiln.clamped_swiglu(x) * 2, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(gate_up), kiln.clamped_swiglu(gate_up) * 2)
    meta = torch.ops.kiln.clamped_swiglu(torch.empty(2, 5, 12, device="meta"))
    assert meta.shape == (2, 5, 6)


@pytest.mark.parametrize("call,message", [
    (lambda: kiln.clamped_swiglu(torch.randn(3, 5)),
     r"kiln\.clamped_swiglu: gate_up: expected a packed last dimension 2\*I .*got \[3, 5\]"),
    (lambda: kiln.clamped_swiglu(torch.randn(3, 4), limit=0.0),
     r"kiln\.clamped_swiglu: limit: expected a finite number > 0, got 0"),
    (lambda: kiln.clamped_swiglu(torch.randn(3, 4), alpha=float("inf")),
     r"kiln\.clamped_swiglu: alpha: expected a finite number, got inf"),
    (lambda: kiln.clamped_swiglu(torch.randn(())),
     r"kiln\.clamped_swiglu: gate_up: expected at least 1 dimension"),
    (lambda: torch.ops.kiln.clamped_swiglu_backward(torch.randn(3, 4), torch.randn(3, 4), 1.702, 7.0, True),
     r"kiln\.clamped_swiglu_backward: grad_out: expected shape \[3, 2\]"),
    (lambda: torch.ops.kiln.clamped_swiglu_backward(torch.randn(3, 2, dtype=torch.float64),
                                                    torch.randn(3, 4), 1.702, 7.0, True),
     r"kiln\.clamped_swiglu_backward: grad_out: expected dtype"),
])
def test_bad_inputs_are_named(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_integer_input_is_refused():
    with pytest.raises(TypeError, match=r"kiln\.clamped_swiglu: gate_up: expected"):
        kiln.clamped_swiglu(torch.ones(2, 4, dtype=torch.int32))
