"""diffusers' GELU (``gelu(proj(x), approximate="tanh")``) patched on a GPU: the GELU runs in
the projection's cuBLASLt epilogue, on the fp32 accumulator plus bias, rounded once. Checked
against the fp64 formula on the same (rounded) parameters, over dtypes, odd and even widths,
one row and many; and every case where the epilogue would not compute what the module does
(hooks on the projection, autograd, the erf form, a projection that is not a plain Linear)
must keep the module's own projection."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
from diffusers.models.activations import GELU  # noqa: E402

from test_patch_dit_cpu import Counter  # noqa: E402
from test_patch_dit_cuda import _count_epilogues  # noqa: E402

# One rounding of the output, plus the fp32 accumulation over the inner width.
_REL = {torch.float32: 1e-5, torch.float16: 2**-10, torch.bfloat16: 2**-7}


def _module(n_in, n_out, dtype, approximate="tanh", seed=0):
    module = GELU(n_in, n_out, approximate=approximate)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        module.proj.weight.copy_(torch.randn(n_out, n_in, generator=g) / n_in**0.5)
        module.proj.bias.copy_(torch.randn(n_out, generator=g))
    return module.to("cuda", dtype)


def _reference(module, x):
    """The tanh GELU of the projection, in fp64 from the same rounded inputs."""
    w, b = module.proj.weight.double(), module.proj.bias.double()
    return torch.nn.functional.gelu(x.double() @ w.t() + b, approximate="tanh")


def _counts(counter):
    """(GEMM-epilogue calls, kiln.gelu calls)."""
    return counter.calls["gemm gelu epilogue"], counter.calls["gelu"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape, n_out", [((1, 64), 96), ((3, 5, 24), 41), ((2, 257, 2048), 8192)])
def test_tanh_gelu_runs_in_the_epilogue(dtype, shape, n_out, monkeypatch):
    module = _module(shape[-1], n_out, dtype)
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) + 0.5).to("cuda", dtype)
    with torch.no_grad():
        original = module(x)
        kiln.patch(module)
        counter = _count_epilogues(Counter(monkeypatch), monkeypatch)
        actual = module(x)
    assert _counts(counter) == (1, 0)
    assert actual.dtype == dtype and actual.shape == original.shape
    truth = _reference(module, x)
    scale = truth.abs().max().item()
    err = (actual.double() - truth).abs().max().item()
    assert err <= _REL[dtype] * scale, (err, scale)
    # The original rounds the projection before its GELU; the epilogue does not, so it is
    # no further from the truth than the original is (allowing one rounding of slack).
    err_original = (original.double() - truth).abs().max().item()
    assert err <= err_original + _REL[dtype] * scale, (err, err_original)


def _calls_after_patch(module, x, monkeypatch, grad=False):
    kiln.patch(module)
    counter = _count_epilogues(Counter(monkeypatch), monkeypatch)
    with torch.set_grad_enabled(grad):
        out = module(x)
    return _counts(counter), out


@pytest.mark.gpu
def test_a_hooked_projection_keeps_its_forward(monkeypatch):
    module = _module(32, 48, torch.bfloat16)
    seen = []
    module.proj.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape))
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(2)).to("cuda", torch.bfloat16)
    calls, out = _calls_after_patch(module, x, monkeypatch)
    assert calls == (0, 1) and seen == [x.shape]
    # An ulp or two of bf16 apart (kiln.gelu and torch's GELU round once each), measured
    # against the output's scale: near zero a relative bound alone is tighter than an ulp.
    expected = module.gelu(module.proj(x))
    torch.testing.assert_close(out, expected, atol=2**-8 * expected.abs().max().item(), rtol=2**-7)


@pytest.mark.gpu
def test_an_instance_forward_is_kept(monkeypatch):
    """accelerate's hooks replace the projection's forward on the instance."""
    module = _module(32, 48, torch.bfloat16)
    inner = module.proj.forward
    wrapped = []
    module.proj.forward = lambda t: wrapped.append(1) or inner(t)
    x = torch.randn(4, 32, device="cuda", dtype=torch.bfloat16)
    calls, _ = _calls_after_patch(module, x, monkeypatch)
    assert calls == (0, 1) and wrapped == [1]


@pytest.mark.gpu
def test_autograd_keeps_a_differentiable_path(monkeypatch):
    module = _module(32, 48, torch.float32)
    x = torch.randn(4, 32, device="cuda", requires_grad=True)
    calls, out = _calls_after_patch(module, x, monkeypatch, grad=True)
    assert calls == (0, 1)
    (grad,) = torch.autograd.grad(out.sum(), x)
    x64 = x.detach().double().requires_grad_(True)
    (expected,) = torch.autograd.grad(_reference(module, x64).sum(), x64)
    torch.testing.assert_close(grad.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_the_erf_form_and_other_projections_use_kiln_gelu(monkeypatch):
    x = torch.randn(4, 32, device="cuda", dtype=torch.bfloat16)
    calls, _ = _calls_after_patch(_module(32, 48, torch.bfloat16, approximate="none"), x, monkeypatch)
    assert calls == (0, 1)

    class ScaledLinear(torch.nn.Linear):
        def forward(self, t):
            return super().forward(t) * 0.5

    module = _module(32, 48, torch.bfloat16)
    scaled = ScaledLinear(32, 48).to("cuda", torch.bfloat16)
    scaled.load_state_dict(module.proj.state_dict())
    module.proj = scaled
    calls, out = _calls_after_patch(module, x, monkeypatch)
    assert calls == (0, 1)
    torch.testing.assert_close(out, module.gelu(scaled(x)), atol=0, rtol=2**-7)
