"""kiln's layers for the `kernels` package's kernelize (kiln.hub): the mapping's structure,
each layer's forward against the forward it replaces, kernelize of a tiny Llama (CPU here,
with kiln's reference ops; the CUDA path gpu-marked). Skipped where `kernels` is missing.

transformers marks its layers for kernelize only with a kernels version it supports (5.23:
>= 0.18.2); with another, the test marks LlamaRMSNorm itself the way kernels documents for
third-party layers (replace_kernel_forward_from_hub), so the same kernelize path runs."""

import copy
import contextlib

import pytest
import torch

import kiln

kernels = pytest.importorskip("kernels", reason="the optional `kernels` package is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
from kernels import Mode, kernelize, use_kernel_mapping  # noqa: E402
from transformers import activations  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402


def test_mapping_structure():
    mapping = kiln.hub.kernel_mapping(devices=("cuda", "cpu"))
    assert set(mapping) == set(kiln.hub.LAYERS)
    for name, per_device in mapping.items():
        assert sorted(d.type for d in per_device) == ["cpu", "cuda"]
        inference = {Mode.INFERENCE, Mode.INFERENCE | Mode.TORCH_COMPILE}
        training = {Mode.TRAINING, Mode.TRAINING | Mode.TORCH_COMPILE}
        for device, modes in per_device.items():
            # RMSNormGated's op has no backward: inference only.
            assert set(modes) == (inference if name == "RMSNormGated" else inference | training)
            for repo in modes.values():
                assert repo.layer_name == name and repo.load() is kiln.hub.LAYERS[name]
            if device.type == "cuda":
                assert device.properties.min_capability == 75
    only = kiln.hub.kernel_mapping(layers=["RMSNorm"], torch_compile=False, training=False)
    assert list(only) == ["RMSNorm"] and list(only["RMSNorm"].values())[0].keys() == {Mode.INFERENCE}
    assert all(layer.can_torch_compile for layer in kiln.hub.LAYERS.values())
    assert [name for name, layer in kiln.hub.LAYERS.items() if not layer.has_backward] == ["RMSNormGated"]
    with pytest.raises(ValueError, match=r"kiln\.hub: layer_name: expected one of"):
        kiln.hub.kernel_mapping(layers=["Attention"])
    with pytest.raises(ValueError, match=r"kiln\.hub\.kernel_mapping: devices: expected 'cuda' or 'cpu', got 'mps'"):
        kiln.hub.kernel_mapping(devices=("mps",))


def _as_layer(module, name):
    """`module` with its forward swapped for kiln's layer's, as kernelize does."""
    clone = copy.deepcopy(module)
    clone.forward = kiln.hub.LAYERS[name].forward.__get__(clone)
    return clone


@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, torch.float32),
                                                (torch.bfloat16, torch.bfloat16),
                                                (torch.bfloat16, torch.float32)])
def test_rms_norm_layer_matches_llama(dtype, weight_dtype):
    norm = modeling_llama.LlamaRMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(48))
    norm = norm.to(weight_dtype)
    x = torch.randn(3, 5, 48).to(dtype)
    with torch.no_grad():
        expected, got = norm(x), _as_layer(norm, "RMSNorm")(x)
    assert got.dtype == expected.dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.float64])
def test_rms_norm_layer_trains_through_kiln(weight_dtype):
    """Under autograd the layer still calls kiln (its op has a backward), and the gradients of
    the input and of the weight match the original forward's; a weight of another dtype is
    multiplied outside kiln, as the original does."""
    torch.manual_seed(3)
    norm = modeling_llama.LlamaRMSNorm(16, eps=1e-5).to(weight_dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(16))
    layer = _as_layer(norm, "RMSNorm")
    x = torch.randn(3, 16)
    grads = []
    for module in (norm, layer):
        module.zero_grad()
        xi = x.clone().requires_grad_()
        out = module(xi)
        out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype))
        grads.append((out.detach(), xi.grad, module.weight.grad))
    (e_out, e_dx, e_dw), (g_out, g_dx, g_dw) = grads
    for got, expected in ((g_out, e_out), (g_dx, e_dx), (g_dw, e_dw)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_rms_norm_layer_records_kiln_op_under_autograd():
    norm = modeling_llama.LlamaRMSNorm(16)
    x = torch.randn(2, 16, requires_grad=True)
    out = _as_layer(norm, "RMSNorm")(x)
    assert "RmsNormFunction" in out.grad_fn.name()  # kiln's op, with its C++ autograd kernel


@pytest.mark.parametrize("module,name,activation", [("qwen3_next", "Qwen3NextRMSNormGated", "silu"),
                                                  ("kimi_linear", "KimiLinearRMSNormGated", "sigmoid")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_gated_layer_matches_transformers(module, name, activation, dtype, monkeypatch):
    import importlib

    try:
        cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    except (ImportError, AttributeError):
        pytest.skip(f"transformers has no {name}")
    norm = cls(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(32))
    norm = norm.to(dtype)
    x, gate = torch.randn(3, 5, 32).to(dtype), (2 * torch.randn(3, 5, 32)).to(dtype)
    layer = _as_layer(norm, "RMSNormGated")
    calls = []
    real = kiln.norm_ops.rms_norm_gated
    monkeypatch.setattr(kiln.norm_ops, "rms_norm_gated", lambda *a: calls.append(a[4]) or real(*a))
    with torch.no_grad():
        expected, got = norm(x, gate), layer(x, gate)
    assert calls == [activation]
    tol = 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    # A call that wants a gradient runs the class forward: the op has no backward.
    weight_grad = norm.weight.requires_grad
    assert weight_grad
    layer(x, gate).float().sum().backward()
    assert calls == [activation] and layer.weight.grad is not None


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_rotary_layer_matches_apply_rotary_pos_emb(unsqueeze_dim):
    rotary = kernels.use_kernel_forward_from_hub("rotary_pos_emb")(
        lambda q, k, cos, sin, unsqueeze_dim=1: modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim))
    shape_q, shape_k = ((2, 4, 5, 16), (2, 2, 5, 16)) if unsqueeze_dim == 1 else ((2, 5, 4, 16), (2, 5, 2, 16))
    q, k = torch.randn(*shape_q), torch.randn(*shape_k)
    angles = torch.randn(2, 5, 8)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    expected = rotary(q, k, cos, sin, unsqueeze_dim)
    got = _as_layer(rotary, "rotary_pos_emb")(q, k, cos, sin, unsqueeze_dim)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    if unsqueeze_dim == 1:  # a layout kiln does not take (unsqueeze_dim 0) runs the original
        odd = _as_layer(rotary, "rotary_pos_emb")(q, k, cos[0], sin[0], 0)
        torch.testing.assert_close(odd[0], rotary(q, k, cos[0], sin[0], 0)[0])


@pytest.mark.parametrize("name,module", [("GeLU", activations.GELUActivation()),
                                         ("GeluTanh", activations.GELUTanh()),
                                         ("NewGELU", activations.NewGELUActivation())])
def test_gelu_layers_match_transformers(name, module):
    x = torch.randn(4, 33) * 3
    torch.testing.assert_close(_as_layer(module, name)(x), module(x), rtol=1e-5, atol=1e-5)


class _SiluAndMul(torch.nn.Module):
    def forward(self, x):
        d = x.shape[-1] // 2
        return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


class _GeluTanhAndMul(torch.nn.Module):
    def forward(self, x):
        d = x.shape[-1] // 2
        return torch.nn.functional.gelu(x[..., :d], approximate="tanh") * x[..., d:]


@pytest.mark.parametrize("name,module", [("SiluAndMul", _SiluAndMul()),
                                         ("GeluTanhAndMul", _GeluTanhAndMul())])
def test_and_mul_layers(name, module):
    x = torch.randn(3, 7, 64)
    torch.testing.assert_close(_as_layer(module, name)(x), module(x), rtol=1e-5, atol=1e-5)


@contextlib.contextmanager
def _llama_norms_marked():
    cls = modeling_llama.LlamaRMSNorm
    marked = hasattr(cls, "kernel_layer_name")
    if not marked:
        kernels.replace_kernel_forward_from_hub(cls, "RMSNorm")
    try:
        yield
    finally:
        if not marked:
            del cls.kernel_layer_name
            del cls.kernel_condition


def _tiny_llama(device, dtype):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=128, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, modeling_llama.LlamaRMSNorm):
                module.weight.copy_(1 + 0.3 * torch.randn_like(module.weight))
    return model.to(device, dtype)


def _kernelize_and_compare(device, dtype, tol):
    with _llama_norms_marked():
        original = _tiny_llama(device, dtype)
        model = copy.deepcopy(original)
        with use_kernel_mapping(kiln.hub.kernel_mapping(devices=(device,))):
            kernelize(model, mode=Mode.INFERENCE, device=device)
        norms = [m for m in model.modules() if isinstance(m, modeling_llama.LlamaRMSNorm)]
        assert len(norms) == 5  # two per layer and the final one
        assert all(m.forward.__func__ is kiln.hub.RMSNorm.forward for m in norms)
        ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1)).to(device)
        with torch.no_grad():
            expected, got = original(ids).logits, model(ids).logits
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
        # training uses kiln too (its layers have backward), with the original's gradients
        trained = copy.deepcopy(original).train()
        with use_kernel_mapping(kiln.hub.kernel_mapping(devices=(device,))):
            kernelize(trained, mode=Mode.TRAINING, device=device)
        assert all(m.forward.__func__ is kiln.hub.RMSNorm.forward
                   for m in trained.modules() if isinstance(m, modeling_llama.LlamaRMSNorm))
        reference = copy.deepcopy(original).train()
        for m in (trained, reference):
            m(ids, labels=ids).loss.backward()
        for (name, got), (_, expected) in zip(trained.named_parameters(),
                                              reference.named_parameters()):
            assert got.grad is not None, name
            torch.testing.assert_close(got.grad, expected.grad, rtol=tol, atol=tol, msg=name)


def test_kernelize_tiny_llama_cpu():
    _kernelize_and_compare("cpu", torch.float32, 1e-4)


@pytest.mark.gpu
def test_kernelize_tiny_llama_cuda():
    _kernelize_and_compare("cuda", torch.float32, 1e-4)
    assert any(k["op"] == "rms_norm" for k in kiln._C.loaded_kernels())


@pytest.mark.gpu
def test_kernelized_layer_under_compile_cuda():
    torch._dynamo.reset()
    norm = modeling_llama.LlamaRMSNorm(256).cuda().to(torch.bfloat16)
    layer = _as_layer(norm, "RMSNorm")
    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(4, 7, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), norm(x), rtol=1e-2, atol=1e-2)
