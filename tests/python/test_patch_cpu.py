"""kiln.patch / kiln.unpatch on tiny random transformers models and on single modules (CPU).

Model tolerances: the patched model differs from the original only where kiln rounds once
where the original rounds twice (Llama's norm rounds before its weight multiply, SiLU
before the up multiply) and in fp32 summation order. In fp32 that is ~1e-6 relative per
op, so logits agree to 1e-4. In bf16 each op is within an ulp, and the differences
compound through the layers, so the bf16 check is against the truth instead: the patched
bf16 model must be about as close to the fp32 model as transformers' own bf16 model is.
"""


import pytest
import torch

import kiln
from kiln import ops as kiln_ops, activation_ops, norm_ops, rope_ops

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

VOCAB = 128


def _config(arch):
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64)
    if arch == "llama":
        return transformers.LlamaForCausalLM, transformers.LlamaConfig(**common)
    if arch == "mistral":
        return transformers.MistralForCausalLM, transformers.MistralConfig(**common, sliding_window=None)
    if arch == "qwen2":
        return transformers.Qwen2ForCausalLM, transformers.Qwen2Config(**common)
    if arch == "qwen3":
        return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(**common, head_dim=16)
    if arch == "gemma":
        return transformers.GemmaForCausalLM, transformers.GemmaConfig(**common, head_dim=16)
    if arch == "gemma3":
        return transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(**common, head_dim=16)
    if arch == "phi3":
        # One packed gate_up projection, one qkv projection, RoPE on half of each head (Phi-4-mini
        # rotates three quarters), dropout around each block's output.
        return transformers.Phi3ForCausalLM, transformers.Phi3Config(**common, pad_token_id=0,
                                                                     partial_rotary_factor=0.5)
    if arch == "glm4":
        # One packed gate_up projection, interleaved RoPE on half of each head, four norms a layer.
        return transformers.Glm4ForCausalLM, transformers.Glm4Config(**common, head_dim=16, pad_token_id=0)
    raise AssertionError(arch)


def _model(arch, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cls, config = _config(arch)
    model = cls(config).eval()
    # Norm weights start as ones (zeros in Gemma): make them random so the weight matters.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model.to(dtype)


def _ids(seed=1):
    return torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


# Qwen3 and Gemma 3 also have a q_norm and a k_norm per layer (Gemma 3 four norms around
# its attention and MLP besides).
NORMS_PER_LAYER = {"llama": 2, "mistral": 2, "qwen2": 2, "qwen3": 4, "gemma": 2, "gemma3": 6, "phi3": 2, "glm4": 4}
MLP_OP = {"llama": "swiglu", "mistral": "swiglu", "qwen2": "swiglu", "qwen3": "swiglu", "gemma": "geglu",
          "gemma3": "geglu", "phi3": "swiglu", "glm4": "swiglu"}
ARCHS = list(NORMS_PER_LAYER)
# Whose per-head q/k norms and rotation run as one head_norm_rope where no graph is recorded.
HEAD_NORMS = {"qwen3", "gemma3"}
# The norm each decoder layer's forward calls on the sum of the residual add just before it
# (one fused_add_rms_norm a layer).
FUSED_ADD_NORM = {"llama": "post_attention_layernorm", "mistral": "post_attention_layernorm",
                  "qwen2": "post_attention_layernorm", "qwen3": "post_attention_layernorm",
                  "gemma": "post_attention_layernorm", "gemma3": "pre_feedforward_layernorm",
                  "phi3": "post_attention_layernorm", "glm4": "post_attention_layernorm"}


def rotations_per_layer(arch):
    """(rms_norm calls, kiln.rope calls, head_norm_rope calls) a layer makes without autograd
    (and one fused_add_rms_norm call besides; without autograd each layer but the first also
    takes its input norm from the layer before, which computes it with its last residual add
    in one more fused_add_rms_norm: see seams)."""
    if arch in HEAD_NORMS:
        return NORMS_PER_LAYER[arch] - 3, 0, 1
    return NORMS_PER_LAYER[arch] - 1, 1, 0


def seams(layers):
    """fused_add_rms_norm calls at the seams between consecutive layers, without autograd."""
    return layers - 1


class _Counter:
    """Counts the calls of the kiln op wrappers the patched forwards use."""

    def __init__(self, monkeypatch):
        self.calls = {"rms_norm": 0, "swiglu": 0, "geglu": 0, "rope": 0, "head_norm_rope": 0, "fused_add_rms_norm": 0}
        for module, name in ((kiln_ops, "rms_norm"), (activation_ops, "swiglu"), (activation_ops, "geglu"),
                             (rope_ops, "rope"), (rope_ops, "head_norm_rope"), (norm_ops, "fused_add_rms_norm")):
            monkeypatch.setattr(module, name, self._wrap(name, getattr(module, name)))

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            self.calls[name] += 1
            return fn(*args, **kwargs)

        return counted


@pytest.mark.parametrize("arch", ARCHS)
def test_report_lists_norms_mlps_and_ropes(arch):
    model = _model(arch)
    report = kiln.patch(model)
    norms = [r for r in report.replaced if r.op == "rms_norm"]
    mlps = [r for r in report.replaced if r.op == MLP_OP[arch]]
    ropes = [r for r in report.replaced if r.op == ("head_norm_rope" if arch in HEAD_NORMS else "rope")]
    assert len(norms) == 2 * NORMS_PER_LAYER[arch] + 1
    assert sorted(r.path for r in mlps) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert sorted(r.path for r in ropes) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    layers = [r for r in report.replaced if r.op == "fused_add_rms_norm"]
    assert sorted(r.path for r in layers) == ["model.layers.0", "model.layers.1"]
    assert all(r.kind == "residual add + rms_norm (in the layer's forward)" for r in layers)
    assert len(report.replaced) == len(norms) + len(mlps) + len(ropes) + len(layers)
    assert "model.norm" in {r.path for r in norms}
    expected_kind = "Gemma" if arch.startswith("gemma") else "Llama"
    assert all(expected_kind in r.kind for r in norms)
    assert all(("per-head q/k rms_norm" in r.kind) == (arch in HEAD_NORMS) for r in ropes)
    assert report.left == []
    text = str(report)
    assert "model.layers.1.post_attention_layernorm" in text and MLP_OP[arch] in text


@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_patched_agrees_and_uses_kiln(arch, monkeypatch):
    model = _model(arch)
    ids = _ids()
    expected = _logits(model, ids)
    kiln.patch(model)
    counter = _Counter(monkeypatch)
    actual = _logits(model, ids)
    layers = 2
    norms, ropes, head_norm_ropes = rotations_per_layer(arch)
    assert counter.calls["rms_norm"] == layers * norms + 1 - seams(layers)
    assert counter.calls[MLP_OP[arch]] == layers
    assert counter.calls["rope"] == layers * ropes  # q and k of a layer in one call
    assert counter.calls["head_norm_rope"] == layers * head_norm_ropes
    assert counter.calls["fused_add_rms_norm"] == layers + seams(layers)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_patched_is_as_close_to_fp32_as_the_original(arch, monkeypatch):
    truth = _logits(_model(arch, torch.float32), _ids()).double()
    model = _model(arch, torch.bfloat16)
    original = _logits(model, _ids())
    kiln.patch(model)
    counter = _Counter(monkeypatch)
    patched = _logits(model, _ids())
    assert counter.calls["rms_norm"] > 0 and counter.calls[MLP_OP[arch]] > 0
    assert counter.calls["rope" if arch not in HEAD_NORMS else "head_norm_rope"] > 0
    assert counter.calls["fused_add_rms_norm"] == 2 + seams(2)
    assert patched.dtype == torch.bfloat16
    err_original = (original.double() - truth).abs().max().item()
    err_patched = (patched.double() - truth).abs().max().item()
    assert err_patched <= 1.5 * err_original + 1e-2, (err_patched, err_original)
    # And directly: a few bf16 ulps of the logits' scale.
    assert (patched.double() - original.double()).abs().max().item() <= 0.05 * truth.abs().max().item()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unpatch_restores_bit_identical(arch, dtype):
    model = _model(arch, dtype)
    ids = _ids()
    before = _logits(model, ids)
    report = kiln.patch(model)
    assert kiln.unpatch(model) == len(report.replaced)
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert torch.equal(_logits(model, ids), before)
    assert kiln.unpatch(model) == 0


def test_patch_twice_is_idempotent():
    model = _model("llama", torch.bfloat16)
    ids = _ids()
    before = _logits(model, ids)
    first = kiln.patch(model)
    forwards = {name: m.__dict__.get("forward") for name, m in model.named_modules()}
    once = _logits(model, ids)
    second = kiln.patch(model)
    assert second.replaced == first.replaced and second.left == first.left
    assert {name: m.__dict__.get("forward") for name, m in model.named_modules()} == forwards
    assert torch.equal(_logits(model, ids), once)
    kiln.unpatch(model)
    assert torch.equal(_logits(model, ids), before)


@pytest.mark.parametrize("arch", ARCHS)
def test_patch_leaves_the_global_generator_as_it_was(arch):
    """The probes' stand-in modules draw their initial weights from torch's global generator;
    a seeded run after the patch (its inputs, an adapter's initial weights) draws what it would
    without kiln."""
    model = _model(arch)
    torch.manual_seed(7)
    expected = torch.randn(8)
    torch.manual_seed(7)
    assert kiln.patch(model).replaced
    assert torch.equal(torch.randn(8), expected)


def test_ops_filter_and_bad_ops():
    model = _model("llama")
    report = kiln.patch(model, ops=["rms_norm"])
    assert {r.op for r in report.replaced} == {"rms_norm", "fused_add_rms_norm"}
    left = {l.path: l.reason for l in report.left}
    assert sorted(left) == ["model.layers.0.mlp", "model.layers.0.self_attn", "model.layers.1.mlp",
                            "model.layers.1.self_attn"]
    assert all(reason.endswith("swiglu is not in ops") for path, reason in left.items() if path.endswith("mlp"))
    assert all(reason.endswith("rope is not in ops") for path, reason in left.items() if path.endswith("attn"))
    with pytest.raises(ValueError, match=r"kiln.patch: ops: expected names among .*got \['layernorm'\]"):
        kiln.patch(model, ops=["layernorm"])
    with pytest.raises(TypeError, match="kiln.patch: model: expected a torch.nn.Module"):
        kiln.patch("model")


@pytest.mark.parametrize("arch", ["llama", "gemma", "qwen3", "gemma3", "phi3", "glm4"])
def test_training_through_the_patched_model(arch):
    """The norms and gated MLPs use ops with backward formulas: with grad enabled the patched
    model runs kiln's ops and their backward ops, and the loss and every parameter's
    gradient match the original's (Qwen3's and Gemma 3's q/k norms included: head_norm_rope
    has no backward, so a forward that records a graph calls the norms and kiln.rope)."""
    model = _model(arch)
    ids = _ids()
    expected_loss = model(ids).logits.float().pow(2).mean()
    expected_loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    kiln.patch(model)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss = model(ids).logits.float().pow(2).mean()
        loss.backward()
    names = {event.name for event in prof.events()}
    assert "kiln::rms_norm_backward" in names and "kiln::fused_add_rms_norm_backward" in names
    assert f"kiln::{MLP_OP[arch]}_backward" in names
    assert "kiln::rope_backward" in names
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)
    kiln.unpatch(model)


# ---- single modules -------------------------------------------------------------------


def _close_in(dtype):
    return dict(rtol=2 * torch.finfo(dtype).eps, atol=2 * torch.finfo(dtype).eps) if dtype != torch.float32 \
        else dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("affine", [True, False])
def test_torch_rms_norm(dtype, eps, affine):
    norm = torch.nn.RMSNorm(37, eps=eps, elementwise_affine=affine, dtype=dtype)
    if affine:
        with torch.no_grad():
            norm.weight.copy_(torch.randn(37))
    x = torch.randn(4, 3, 37).to(dtype)
    with torch.no_grad():
        expected = norm(x)
        report = kiln.patch(norm)
        assert [(r.path, r.kind) for r in report.replaced] == [("", "rms_norm")]
        actual = norm(x)
    assert actual.dtype == dtype
    torch.testing.assert_close(actual, expected, **_close_in(dtype))


def test_llama_norm_fp32_weight_bf16_input():
    """The mixed case: transformers' rule gives an fp32 output, normalised and rounded to
    bf16 first; the patch reproduces both (kiln normalises, torch multiplies)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(48, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    x = torch.randn(5, 48).to(torch.bfloat16)
    with torch.no_grad():
        expected = norm(x)
        kiln.patch(norm)
        actual = norm(x)
    assert expected.dtype == actual.dtype == torch.float32
    # The only difference: the bf16 rounding of the normalised value may fall the other way.
    bound = norm.weight.abs().max().item() * torch.finfo(torch.bfloat16).eps * 4
    assert (actual - expected).abs().max().item() <= bound


class _Fp32MultiplyNorm(torch.nn.Module):
    """Inkling 2's RMSNorm form: normalised in fp32, multiplied by the weight in the promoted
    dtype, rounded once to x's dtype (fp32 rows with a bf16 weight: all in fp32)."""

    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = 1e-6

    def forward(self, hidden_states):
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight * x).to(hidden_states.dtype)


def _norm_of_form(form, hidden, weight_dtype):
    if form == "llama":
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        norm = LlamaRMSNorm(hidden, eps=1e-6)
    else:
        norm = _Fp32MultiplyNorm(hidden)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=torch.Generator().manual_seed(3)))
    return norm.to(weight_dtype)


@pytest.mark.parametrize("form", ["plain", "llama"])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden", [37, 64])
def test_fp32_rows_with_a_half_weight_are_one_fp32_call(form, weight_dtype, hidden, monkeypatch):
    """A model with an fp32 residual stream and half weights (Inkling 2's decoder norms): every
    rule multiplies in fp32 there, so the patch makes one fp32 kiln call with the weight's exact
    fp32 copy, kept between calls and made again when the weight changes in place."""
    norm = _norm_of_form(form, hidden, weight_dtype)
    x = torch.randn(5, 3, hidden, generator=torch.Generator().manual_seed(4)) + 0.5
    with torch.no_grad():
        expected = norm(x)
        report = kiln.patch(norm)
        assert [r.op for r in report.replaced] == ["rms_norm"]
        calls = []
        real = kiln_ops.rms_norm
        monkeypatch.setattr(kiln_ops, "rms_norm", lambda x, weight, eps: calls.append(
            (x.dtype, None if weight is None else weight.dtype)) or real(x, weight, eps))
        actual = norm(x)
        assert calls == [(torch.float32, torch.float32)]
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
        assert actual.dtype == expected.dtype == torch.float32
        _change_in_place(norm.weight)
        changed = norm(x)
        kiln.unpatch(norm)
        torch.testing.assert_close(changed, norm(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["plain", "llama"])
def test_fp32_rows_with_a_half_weight_train_the_weight(form):
    """Training: the fp32 copy is made inside the graph, so the half weight gets its gradient
    (rounded once to its dtype, as the original's)."""
    norm = _norm_of_form(form, 48, torch.bfloat16)
    x = torch.randn(6, 48, generator=torch.Generator().manual_seed(5))
    grad = torch.randn(6, 48, generator=torch.Generator().manual_seed(6))

    def gradients():
        xs = x.clone().requires_grad_()
        norm.weight.grad = None
        norm(xs).backward(grad)
        return xs.grad, norm.weight.grad

    expected = gradients()
    kiln.patch(norm)
    actual = gradients()
    kiln.unpatch(norm)
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-5, atol=1e-5)
    assert actual[1].dtype == torch.bfloat16
    torch.testing.assert_close(actual[1], expected[1], rtol=2 * 2**-8, atol=2 * 2**-8)


def _change_in_place(weight):
    weight.mul_(-2.0)  # the version counter moves


def _give_new_data(weight):
    # New storage for the same tensor (model loaders and adapter merges do this); no version
    # counter moves, the address does.
    version = weight._version
    weight.data = torch.randn(weight.shape).to(weight.dtype)
    assert weight._version == version


@pytest.mark.parametrize("change", [_change_in_place, _give_new_data], ids=["in_place", "new_data"])
def test_gemma_offset_weight_follows_weight_changes(change):
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    norm = GemmaRMSNorm(40, eps=1e-6).to(torch.bfloat16)
    x = torch.randn(3, 40).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(40))
        kiln.patch(norm)
        first = norm(x)
        change(norm.weight)  # the kept 1 + weight must be remade
        second = norm(x)
        kiln.unpatch(norm)
        expected = norm(x)
    assert not torch.allclose(first.float(), second.float())
    # (1 + weight) is rounded to bf16 for kiln: within two ulps of the output.
    torch.testing.assert_close(second, expected, rtol=4 * 2**-8, atol=4 * 2**-8)


def test_gemma_offset_weight_of_another_tensor_is_not_taken():
    """1 + weight is kept for the weight tensor it was made of: a weight replaced by another
    tensor of the same version (which may sit at the freed one's address, as the probes'
    weights do) gets its own."""
    from kiln.patching import forwards
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    norm = GemmaRMSNorm(40, eps=1e-6).to(torch.bfloat16)
    x = torch.randn(3, 40).to(torch.bfloat16)
    kiln.patch(norm)
    stale, kept = (torch.nn.Parameter(torch.randn(40).to(torch.bfloat16), requires_grad=False) for _ in range(2))
    with torch.no_grad():
        norm.weight = stale
        norm(x)  # keeps 1 + stale
        assert norm.__dict__[forwards.KEPT_WEIGHT][0] is stale
        norm.weight = kept
        assert kept._version == stale._version
        actual = norm(x)
        kiln.unpatch(norm)
        expected = norm(x)
    torch.testing.assert_close(actual, expected, rtol=4 * 2**-8, atol=4 * 2**-8)


def test_layer_norms_are_replaced():
    model = torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.LayerNorm(32, bias=False))
    x = torch.randn(3, 32) + 0.5
    with torch.no_grad():
        for norm in model:
            norm.weight.copy_(torch.randn(32))
        expected = model(x)
        report = kiln.patch(model)
        actual = model(x)
    assert [(r.path, r.op) for r in report.replaced] == [("0", "layer_norm"), ("1", "layer_norm")]
    assert report.left == []
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_norms_computing_something_else_are_left_with_a_reason():
    class Halved(torch.nn.LayerNorm):
        def forward(self, x):
            return 0.5 * super().forward(x)

    model = torch.nn.Sequential(Halved(32), Halved(32, bias=False))
    report = kiln.patch(model)
    assert report.replaced == []
    reasons = {l.path: l.reason for l in report.left}
    assert reasons["0"].startswith("does not compute a LayerNorm (it has a bias, so not an RMSNorm)")
    assert reasons["1"].startswith("does not compute an RMSNorm") and "nor a LayerNorm" in reasons["1"]
    assert all(l.cls == "Halved" for l in report.left)


class _ScaledNorm(torch.nn.Module):
    """An RMSNorm whose scale is not named `weight` (Stable Audio 3's `gamma`), held as a
    parameter, a buffer or a plain tensor attribute; ones, as an untrained model's are."""

    def __init__(self, hidden, kept, name="gamma"):
        super().__init__()
        self.eps = 1e-6
        self.name = name
        if kept == "parameter":
            setattr(self, name, torch.nn.Parameter(torch.ones(hidden)))
        elif kept == "buffer":
            self.register_buffer(name, torch.ones(hidden))
        else:
            setattr(self, name, torch.ones(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * getattr(self, self.name)


@pytest.mark.parametrize("kept", ["parameter", "buffer", "attribute"])
def test_a_norm_scaled_by_gamma_reads_its_trained_values(kept, monkeypatch):
    """A norm of the probe's width scaled by its `gamma`: ones would agree with a norm of no weight
    on the probe, so the probe swaps gamma for random values; once patched, kiln reads gamma as it
    is at each call (trained after the patch, here)."""
    norm = _ScaledNorm(64, kept)
    report = kiln.patch(torch.nn.Sequential(norm))
    assert [(r.kind, r.op) for r in report.replaced] == [("rms_norm (scale named gamma)", "rms_norm")]
    with torch.no_grad():
        norm.gamma.copy_(1 + 0.5 * torch.randn(64, generator=torch.Generator().manual_seed(1)))
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(2))
    calls = []
    real = kiln_ops.rms_norm
    monkeypatch.setattr(kiln_ops, "rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.gamma
    torch.testing.assert_close(norm(x), expected, rtol=1e-5, atol=1e-5)
    assert calls == [1]


def test_a_norm_scaled_by_another_tensor_is_left():
    """A scale under any other name is not read by kiln's norms: the norm is left, saying why."""
    report = kiln.patch(torch.nn.Sequential(_ScaledNorm(64, "parameter", name="alpha")))
    assert report.replaced == []
    assert [l.reason for l in report.left] == [
        "it holds tensors besides a weight and a bias (alpha), which kiln's norms do not read"]


def test_a_group_norm_is_left_as_one():
    report = kiln.patch(torch.nn.Sequential(torch.nn.GroupNorm(4, 32), torch.nn.GroupNorm(1, 32, affine=False)))
    assert report.replaced == [] and [l.reason for l in report.left] == [
        "it normalises groups of channels (a GroupNorm); kiln's norms take the last dimension"] * 2


def test_mlp_with_another_activation_is_left():
    from transformers.models.llama.modeling_llama import LlamaMLP

    _, config = _config("llama")
    config.hidden_act = "relu"
    report = kiln.patch(LlamaMLP(config))
    assert report.replaced == []
    assert len(report.left) == 1 and "not SiLU or GELU" in report.left[0].reason


# ---- accelerate's hooks ---------------------------------------------------------------

try:
    import accelerate
    import accelerate.hooks as accelerate_hooks
except ImportError:
    accelerate = None
needs_accelerate = pytest.mark.skipif(accelerate is None, reason="accelerate is not installed")


class _CountingHook(accelerate_hooks.ModelHook if accelerate is not None else object):
    def __init__(self):
        self.calls = 0

    def pre_forward(self, module, *args, **kwargs):
        self.calls += 1
        return args, kwargs


@needs_accelerate
@pytest.mark.parametrize("order", ["hook_then_patch", "patch_then_hook"])
def test_patched_inside_an_accelerate_hook(order, monkeypatch):
    model = _model("llama")
    ids = _ids()
    expected = _logits(model, ids)
    norm = model.model.layers[0].input_layernorm
    hook = _CountingHook()
    if order == "hook_then_patch":
        accelerate_hooks.add_hook_to_module(norm, hook)
        kiln.patch(model)
    else:
        kiln.patch(model)
        accelerate_hooks.add_hook_to_module(norm, hook)
    counter = _Counter(monkeypatch)
    actual = _logits(model, ids)
    assert hook.calls == 1  # the hook still runs around the module
    assert norm._old_forward is norm.__dict__["_kiln_patch"].patched  # the patch is inside it
    assert counter.calls["rms_norm"] == 2 and counter.calls["fused_add_rms_norm"] == 3
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    assert kiln.unpatch(model) == 11
    assert "_kiln_patch" not in norm.__dict__ and norm._old_forward.__func__ is type(norm).forward
    assert torch.equal(_logits(model, ids), expected)
    assert hook.calls == 2
    accelerate_hooks.remove_hook_from_module(norm)
    assert "forward" not in norm.__dict__ or norm.forward.__func__ is type(norm).forward


@needs_accelerate
def test_hook_removed_after_patch_then_unpatch():
    model = _model("llama")
    ids = _ids()
    expected = _logits(model, ids)
    norm = model.model.norm
    accelerate_hooks.add_hook_to_module(norm, _CountingHook())
    kiln.patch(model)
    accelerate_hooks.remove_hook_from_module(norm)  # leaves the patched forward as forward
    assert norm.forward is norm.__dict__["_kiln_patch"].patched
    kiln.unpatch(model)
    assert "forward" not in norm.__dict__
    assert torch.equal(_logits(model, ids), expected)


@needs_accelerate
@pytest.mark.parametrize("order", ["offload_then_patch", "patch_then_offload"])
def test_cpu_offload_hooks(order, monkeypatch):
    """accelerate's cpu_offload: weights live on the meta device and the hooks bring them
    in for each forward (the same hooks enable_model_cpu_offload uses)."""
    model = _model("llama")
    ids = _ids()
    expected = _logits(model, ids)
    if order == "offload_then_patch":
        accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
        assert model.model.norm.weight.device.type == "meta"
        report = kiln.patch(model)
    else:
        report = kiln.patch(model)
        accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    assert len(report.replaced) == 11 and report.left == []
    counter = _Counter(monkeypatch)
    actual = _logits(model, ids)
    assert counter.calls["rms_norm"] == 5 and counter.calls["swiglu"] == 2 and counter.calls["rope"] == 2
    # A hooked norm (the offload brings its weight in) is called as a module after the add.
    assert counter.calls["fused_add_rms_norm"] == 0
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    kiln.unpatch(model)
    assert torch.equal(_logits(model, ids), expected)


@needs_accelerate
def test_a_deep_copy_under_accelerate_hooks_computes_with_its_own_weights(monkeypatch):
    """copy.deepcopy of a patched model whose modules carry accelerate's hooks (an EMA copy
    of an offloaded or dispatched model): the copy's hooks and patched forwards are its own."""
    import copy

    model = _model("llama")
    ids = _ids()
    accelerate_hooks.add_hook_to_module(model.model.layers[0].input_layernorm, _CountingHook())
    accelerate_hooks.add_hook_to_module(model.model.layers[1], _CountingHook())
    kiln.patch(model)
    before = _logits(model, ids)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.01)
    counter = _Counter(monkeypatch)
    actual = _logits(twin, ids)
    assert counter.calls["rms_norm"] > 0 and counter.calls["fused_add_rms_norm"] > 0
    hooks = twin.model.layers[1]._hf_hook, model.model.layers[1]._hf_hook
    assert hooks[0] is not hooks[1] and [h.calls for h in hooks] == [2, 1]  # the copy's began at 1
    assert torch.equal(_logits(model, ids), before) and not torch.allclose(actual, before)
    kiln.unpatch(twin)
    torch.testing.assert_close(actual, _logits(twin, ids), rtol=1e-4, atol=1e-4)


# ---- what a probe must not trip on ------------------------------------------------------


class _BufferWeightNorm(torch.nn.Module):
    """An RMSNorm whose weight is a buffer (a frozen, exported or quantised model's)."""

    def __init__(self, hidden):
        super().__init__()
        self.register_buffer("weight", torch.randn(hidden))
        self.eps = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def test_a_weight_kept_as_a_buffer_is_probed_where_it_is_kept():
    model = torch.nn.Sequential(_BufferWeightNorm(24))
    weight = model[0].weight
    x = torch.randn(3, 24)
    with torch.no_grad():
        expected = model(x)
        report = kiln.patch(model)
        actual = model(x)
    assert [(r.path, r.op) for r in report.replaced] == [("0", "rms_norm")]
    assert model[0]._buffers["weight"] is weight and "weight" not in model[0]._parameters
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_default_device_set_by_the_caller_does_not_reach_the_probes():
    model = _model("llama")
    torch.set_default_device("meta")
    try:
        report = kiln.patch(model)
    finally:
        torch.set_default_device(None)
    assert report.left == [] and len(report.replaced) == 11
    assert torch.empty(1).device.type == "cpu"


@pytest.mark.parametrize("module", ["llama_norm", "torch_rms_norm", "layer_norm", "mlp"])
def test_a_jagged_nested_batch_runs_the_original(module, monkeypatch):
    """kiln's ops take dense rows: a nested tensor of jagged sequences goes to the original
    forward, which handles it, rather than failing in kiln's op."""
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=24, intermediate_size=40, num_attention_heads=2)
    made = {"llama_norm": lambda: LlamaRMSNorm(24), "torch_rms_norm": lambda: torch.nn.RMSNorm(24),
            "layer_norm": lambda: torch.nn.LayerNorm(24), "mlp": lambda: LlamaMLP(config)}[module]()
    model = torch.nn.Sequential(made)
    nested = torch.nested.nested_tensor([torch.randn(3, 24), torch.randn(5, 24)], layout=torch.jagged)
    dense = torch.randn(4, 24)
    with torch.no_grad():
        expected = model(nested)
        assert len(kiln.patch(model).replaced) == 1
        counter = _Counter(monkeypatch)
        actual = model(nested)
        assert sum(counter.calls.values()) == 0
        assert actual.is_nested and torch.equal(actual.values(), expected.values())
        model(dense)  # a dense batch still reaches kiln
        assert sum(counter.calls.values()) == (0 if module == "layer_norm" else 1)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_a_deep_copy_of_a_patched_model_computes_with_its_own_weights(arch, monkeypatch):
    """An EMA or reference copy (copy.deepcopy) of a patched model: each patched forward of the
    copy is made for the copy, so changing the copy's weights changes the copy's output alone,
    and it still runs kiln's ops."""
    import copy

    model = _model(arch)
    ids = _ids()
    kiln.patch(model)
    before = _logits(model, ids)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if "norm" in name:
                p.mul_(-1.5)
    counter = _Counter(monkeypatch)
    actual = _logits(twin, ids)
    assert counter.calls["rms_norm"] > 0 and counter.calls["fused_add_rms_norm"] > 0
    assert torch.equal(_logits(model, ids), before)
    kiln.unpatch(twin)
    assert all("forward" not in m.__dict__ for m in twin.modules())
    torch.testing.assert_close(actual, _logits(twin, ids), rtol=1e-4, atol=1e-4)
