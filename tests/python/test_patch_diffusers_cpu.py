"""kiln.patch / kiln.unpatch on diffusers modules and a tiny random LTX-Video transformer.

Tolerances: kiln computes each op in fp32 and rounds once to the output dtype. Where the
original rounds once too (a norm with no weight, LayerNorm, GELU, diffusers' RMSNorm with
an fp32 weight) the two differ only in fp32 summation order: 1e-5 in fp32, and at most one
ulp of the output in bf16 (a value near a rounding boundary may round the other way).
diffusers' RMSNorm with a half weight rounds the normalised value to the weight's dtype
before multiplying, kiln after: again within an ulp, so two ulps (2 * eps) in bf16.
"""

import pytest
import torch

import kiln
from kiln import activation_ops, norm_ops, ops as kiln_ops

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
from diffusers.models.activations import GELU  # noqa: E402
from diffusers.models.normalization import RMSNorm  # noqa: E402


def _close_in(dtype):
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-5)
    eps = torch.finfo(dtype).eps
    return dict(rtol=2 * eps, atol=2 * eps)


class _Counter:
    """Counts the calls of the kiln op wrappers the patched forwards use. On a GPU the tanh
    GELU after a projection runs in the projection's cuBLASLt epilogue
    (``torch._addmm_activation``), counted as a gelu."""

    def __init__(self, monkeypatch):
        self.calls = {"rms_norm": 0, "layer_norm": 0, "gelu": 0}
        for module, name, counted_as in ((kiln_ops, "rms_norm", "rms_norm"), (norm_ops, "layer_norm", "layer_norm"),
                                         (activation_ops, "gelu", "gelu"), (torch, "_addmm_activation", "gelu")):
            monkeypatch.setattr(module, name, self._wrap(counted_as, getattr(module, name)))

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            self.calls[name] += 1
            return fn(*args, **kwargs)

        return counted


def _randomise(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return module


def _input(shape, dtype, seed=1):
    # A nonzero mean, as activations have, so a LayerNorm's mean subtraction matters.
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) + 0.5).to(dtype)


def _patched_vs_original(module, x, monkeypatch):
    with torch.no_grad():
        expected = module(x)
        report = kiln.patch(module)
        counter = _Counter(monkeypatch)
        actual = module(x)
        assert kiln.unpatch(module) == len(report.replaced)
        restored = module(x)
    assert torch.equal(restored, expected)  # unpatch: bit for bit the original again
    assert "forward" not in module.__dict__
    return report, counter, expected, actual


# ---- diffusers' RMSNorm ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [37, 64])
def test_diffusers_rms_norm_with_weight(dtype, hidden, monkeypatch):
    norm = _randomise(RMSNorm(hidden, eps=1e-6)).to(dtype)
    report, counter, expected, actual = _patched_vs_original(norm, _input((2, 5, hidden), dtype), monkeypatch)
    assert [(r.path, r.op) for r in report.replaced] == [("", "rms_norm")]
    assert "diffusers" in report.replaced[0].kind
    assert counter.calls["rms_norm"] == 1
    assert actual.dtype == expected.dtype == dtype
    torch.testing.assert_close(actual, expected, **_close_in(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_diffusers_rms_norm_without_weight(dtype, monkeypatch):
    norm = RMSNorm(48, eps=1e-6, elementwise_affine=False)
    report, counter, expected, actual = _patched_vs_original(norm, _input((3, 48), dtype), monkeypatch)
    assert [(r.path, r.kind, r.op) for r in report.replaced] == [("", "rms_norm", "rms_norm")]
    assert counter.calls["rms_norm"] == 1
    assert actual.dtype == dtype
    torch.testing.assert_close(actual, expected, **_close_in(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_diffusers_rms_norm_of_unknown_width(dtype, monkeypatch):
    """Mochi's norms are RMSNorm(0, eps, False): no weight, so the width is the input's alone;
    the probe picks one and the patched norm takes any."""
    norm = RMSNorm(0, eps=1e-5, elementwise_affine=False)
    report, counter, expected, actual = _patched_vs_original(norm, _input((3, 5, 96), dtype), monkeypatch)
    assert [(r.path, r.op) for r in report.replaced] == [("", "rms_norm")]
    assert counter.calls["rms_norm"] == 1
    torch.testing.assert_close(actual, expected, **_close_in(dtype))


@pytest.mark.parametrize("weight_dtype,x_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                                                  (torch.bfloat16, torch.float16)])
def test_diffusers_rms_norm_mixed_dtypes(weight_dtype, x_dtype, monkeypatch):
    """diffusers' rule: a half weight gives its own dtype whatever the input's; an fp32
    weight gives fp32. kiln normalises in fp32; the rounding and multiply are the original's."""
    norm = _randomise(RMSNorm(40, eps=1e-5)).to(weight_dtype)
    report, counter, expected, actual = _patched_vs_original(norm, _input((4, 40), x_dtype), monkeypatch)
    assert "diffusers" in report.replaced[0].kind
    assert counter.calls["rms_norm"] == 1
    assert actual.dtype == expected.dtype == weight_dtype
    # One rounding to the output dtype, of values equal to fp32 order: within an ulp.
    torch.testing.assert_close(actual, expected, **_close_in(weight_dtype))


def test_diffusers_rms_norm_with_bias_is_left():
    norm = _randomise(RMSNorm(32, eps=1e-6, bias=True))
    report = kiln.patch(norm)
    assert report.replaced == []
    assert len(report.left) == 1 and report.left[0].reason.startswith("does not compute a LayerNorm")


# ---- LayerNorm ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [33, 64])
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm(dtype, hidden, affine, monkeypatch):
    norm = torch.nn.LayerNorm(hidden, eps=1e-6, elementwise_affine=affine)
    if affine:
        _randomise(norm)
    norm = norm.to(dtype)
    report, counter, expected, actual = _patched_vs_original(norm, _input((2, 7, hidden), dtype), monkeypatch)
    assert [(r.path, r.kind, r.op) for r in report.replaced] == [("", "layer_norm", "layer_norm")]
    assert counter.calls["layer_norm"] == 1
    assert actual.dtype == dtype
    torch.testing.assert_close(actual, expected, **_close_in(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_diffusers_fp32_layer_norm(dtype, monkeypatch):
    """diffusers' FP32LayerNorm computes in fp32 and casts back: kiln's fp32 math rounded
    once to x's dtype is the same computation."""
    from diffusers.models.normalization import FP32LayerNorm

    norm = _randomise(FP32LayerNorm(40, eps=1e-6)).to(dtype)
    report, counter, expected, actual = _patched_vs_original(norm, _input((3, 40), dtype), monkeypatch)
    assert [(r.kind, r.op) for r in report.replaced] == [("layer_norm", "layer_norm")]
    assert counter.calls["layer_norm"] == 1
    assert actual.dtype == dtype
    torch.testing.assert_close(actual, expected, **_close_in(dtype))


def test_layer_norm_over_two_dims_is_left():
    report = kiln.patch(torch.nn.LayerNorm((4, 8), elementwise_affine=False))
    assert report.replaced == []
    assert "last 2 dimensions" in report.left[0].reason


def test_layer_norm_filter():
    model = torch.nn.Sequential(torch.nn.LayerNorm(16, elementwise_affine=False), RMSNorm(16, eps=1e-6))
    report = kiln.patch(model, ops=["rms_norm"])
    assert [r.path for r in report.replaced] == ["1"]
    assert [(l.path, l.reason) for l in report.left] == [("0", "computes layer_norm; layer_norm is not in ops")]


# ---- GELU -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("bias", [True, False])
def test_diffusers_gelu(dtype, approximate, bias, monkeypatch):
    module = _randomise(GELU(24, 41, approximate=approximate, bias=bias)).to(dtype)
    report, counter, expected, actual = _patched_vs_original(module, _input((3, 5, 24), dtype), monkeypatch)
    assert [(r.path, r.op) for r in report.replaced] == [("", "gelu")]
    assert report.replaced[0].kind == ("gelu (tanh)" if approximate == "tanh" else "gelu")
    assert counter.calls["gelu"] == 1
    assert actual.dtype == dtype
    # Both apply GELU to the same projection output, in fp32, rounded once.
    torch.testing.assert_close(actual, expected, **_close_in(dtype))


def test_gelu_with_grad_keeps_the_original():
    module = _randomise(GELU(8, 12, approximate="tanh"))
    x = _input((2, 8), torch.float32)
    expected = module(x)
    kiln.patch(module)
    actual = module(x)
    assert actual.requires_grad and torch.equal(actual, expected)
    actual.sum().backward()
    assert module.proj.weight.grad is not None


def test_gelu_like_module_computing_something_else_is_left():
    class NotGelu(GELU):
        def forward(self, hidden_states):
            return torch.relu(self.proj(hidden_states))

    report = kiln.patch(NotGelu(8, 8, approximate="none"))
    assert report.replaced == []
    assert report.left[0].reason.startswith("does not compute F.gelu(proj(x), approximate='none')")


# ---- a tiny LTX-Video transformer -----------------------------------------------------


def _ltx(dtype, device="cpu"):
    torch.manual_seed(0)
    model = diffusers.LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
        num_layers=2, caption_channels=24).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # norm weights start as ones: make them matter
                p.add_(0.2 * torch.randn_like(p))
    return model.to(device=device, dtype=dtype)


def _ltx_inputs(dtype, device="cpu"):
    g = torch.Generator().manual_seed(3)
    frames, height, width = 2, 2, 3
    return dict(
        hidden_states=torch.randn(2, frames * height * width, 8, generator=g).to(device, dtype),
        encoder_hidden_states=torch.randn(2, 5, 24, generator=g).to(device, dtype),
        timestep=torch.tensor([10, 500], device=device),
        encoder_attention_mask=torch.ones(2, 5, device=device),
        num_frames=frames, height=height, width=width, return_dict=False)


def _ltx_out(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def _ltx_check(dtype, monkeypatch, device="cpu"):
    # The module-level patterns only (test_patch_dit_cpu.py covers the attention and block ones).
    model = _ltx(dtype, device)
    inputs = _ltx_inputs(dtype, device)
    expected = _ltx_out(model, inputs)
    report = kiln.patch(model, ops=("rms_norm", "layer_norm", "gelu"))
    by_op = {}
    for r in report.replaced:
        by_op.setdefault(r.op, []).append(r.path)
    # Per block norm1, norm2 (no weight), and q/k norms of two attentions; plus norm_out.
    assert len(by_op["rms_norm"]) == 2 * 6
    assert by_op["layer_norm"] == ["norm_out"]
    assert sorted(by_op["gelu"]) == ["transformer_blocks.0.ff.net.0", "transformer_blocks.1.ff.net.0"]
    counter = _Counter(monkeypatch)
    actual = _ltx_out(model, inputs)
    assert counter.calls == {"rms_norm": 12, "layer_norm": 1, "gelu": 2}
    assert actual.dtype == expected.dtype == dtype
    kiln.unpatch(model)
    assert torch.equal(_ltx_out(model, inputs), expected)
    return expected, actual


def test_ltx_fp32_patched_agrees(monkeypatch):
    expected, actual = _ltx_check(torch.float32, monkeypatch)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def test_ltx_bf16_patched_agrees(monkeypatch):
    # Each op is within an ulp; through two blocks the differences compound: the output
    # must stay within a few bf16 ulps of its own scale.
    expected, actual = _ltx_check(torch.bfloat16, monkeypatch)
    scale = expected.double().abs().max().item()
    assert (actual.double() - expected.double()).abs().max().item() <= 8 * 2**-8 * scale


@pytest.mark.gpu
def test_ltx_bf16_patched_agrees_cuda(monkeypatch):
    expected, actual = _ltx_check(torch.bfloat16, monkeypatch, device="cuda")
    scale = expected.double().abs().max().item()
    assert (actual.double() - expected.double()).abs().max().item() <= 8 * 2**-8 * scale


@pytest.mark.gpu
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_diffusers_modules_bf16_cuda(approximate, monkeypatch):
    dtype = torch.bfloat16
    for module, x in ((RMSNorm(64, eps=1e-6), _input((4, 9, 64), dtype)),
                      (RMSNorm(64, eps=1e-6, elementwise_affine=False), _input((4, 9, 64), dtype)),
                      (torch.nn.LayerNorm(64, eps=1e-6, elementwise_affine=False), _input((4, 9, 64), dtype)),
                      (GELU(64, 96, approximate=approximate), _input((4, 9, 64), dtype))):
        module = _randomise(module).to("cuda", dtype)
        report, counter, expected, actual = _patched_vs_original(module, x.cuda(), monkeypatch)
        assert len(report.replaced) == 1 and sum(counter.calls.values()) == 1
        torch.testing.assert_close(actual, expected, **_close_in(dtype))
