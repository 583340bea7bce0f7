"""kiln.patch on tiny random transformers models on a GPU: bf16 patched vs unpatched, and
the patched model under torch.compile(fullgraph=True)."""

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from test_patch_cpu import ARCHS, HEAD_NORMS, MLP_OP, _Counter, _ids, _model, rotations_per_layer, seams  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_cuda_patched_is_as_close_to_fp32_as_the_original(arch, monkeypatch):
    ids = _ids().cuda()
    with torch.no_grad():
        truth = _model(arch, torch.float32).cuda()(ids).logits.double()
        model = _model(arch, torch.bfloat16).cuda()
        original = model(ids).logits
        report = kiln.patch(model)
        rope = "head_norm_rope" if arch in HEAD_NORMS else "rope"
        assert {r.op for r in report.replaced} == {"rms_norm", MLP_OP[arch], rope, "fused_add_rms_norm"}
        assert report.left == []
        counter = _Counter(monkeypatch)  # after the patch, whose probes call the ops too
        patched = model(ids).logits
    # q and k reach kiln.rope as the attention makes them: transposed views of the projections.
    _, ropes, head_norm_ropes = rotations_per_layer(arch)
    assert counter.calls["rope"] == 2 * ropes and counter.calls["head_norm_rope"] == 2 * head_norm_ropes
    assert counter.calls[MLP_OP[arch]] == 2 and counter.calls["fused_add_rms_norm"] == 2 + seams(2)
    err_original = (original.double() - truth).abs().max().item()
    err_patched = (patched.double() - truth).abs().max().item()
    assert err_patched <= 1.5 * err_original + 1e-2, (err_patched, err_original)
    kiln.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, original)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "gemma", "qwen3", "gemma3", "phi3", "glm4"])
def test_patched_model_compiles_fullgraph(arch):
    torch._dynamo.reset()
    ids = _ids().cuda()
    model = _model(arch, torch.bfloat16).cuda()
    kiln.patch(model)
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, fullgraph=True)(ids).logits
    torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", sorted(HEAD_NORMS) + ["llama", "phi3", "glm4"])
def test_patched_model_replays_from_a_cuda_graph(arch, monkeypatch):
    """The fused q/k norms and rotation, and each layer's residual add and norm, are captured
    with the rest of the forward, and the replay gives what the patched model gives outside
    the graph."""
    ids = _ids().cuda()
    model = _model(arch, torch.bfloat16).cuda()
    kiln.patch(model)
    with torch.no_grad():
        eager = model(ids, use_cache=False).logits
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model(ids, use_cache=False)
        torch.cuda.current_stream().wait_stream(side)
        counter = _Counter(monkeypatch)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            # No cache: Gemma 3's sliding-window cache copies from the host when first filled.
            captured = model(ids, use_cache=False).logits
        heads = 2 if arch in HEAD_NORMS else 0
        assert counter.calls["head_norm_rope"] == heads and counter.calls["rope"] == 2 - heads
        assert counter.calls["fused_add_rms_norm"] == 2 + seams(2)
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
    scale = eager.abs().max().item()
    assert (captured - eager).abs().max().item() <= 1e-3 * scale
    kiln.unpatch(model)


@pytest.mark.gpu
@pytest.mark.parametrize("rope_interleave", [True, False])
def test_deepseek_v3_latent_attention_on_the_gpu_compiled_and_captured(rope_interleave):
    """DeepSeek-V3's latent attention RoPE (de-interleaved where rope_interleave is set) on its
    q_rot and k_rot views, in bf16: as close to fp32 as the original, the same under
    torch.compile(fullgraph=True) and replayed from a CUDA graph. Dense layers only, so a
    routing decision cannot flip between the runs compared."""
    from test_patch_rope_cpu import _deepseek_v3

    torch._dynamo.reset()
    ids = _ids().cuda()
    with torch.no_grad():
        truth = _deepseek_v3(rope_interleave, torch.float32, dense_layers=2).cuda()(ids).logits.double()
        model = _deepseek_v3(rope_interleave, torch.bfloat16, dense_layers=2).cuda()
        original = model(ids).logits
        report = kiln.patch(model)
        assert "rope" in {r.op for r in report.replaced}
        patched = model(ids, use_cache=False).logits
        compiled = torch.compile(model, fullgraph=True)(ids, use_cache=False).logits
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(ids, use_cache=False)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            captured = model(ids, use_cache=False).logits
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
    err_original = (original.double() - truth).abs().max().item()
    err_patched = (patched.double() - truth).abs().max().item()
    assert err_patched <= 1.5 * err_original + 1e-2, (err_patched, err_original)
    torch.testing.assert_close(compiled, patched, rtol=2e-2, atol=2e-2)
    assert (captured - patched).abs().max().item() <= 1e-3 * patched.abs().max().item()
    kiln.unpatch(model)


def _experts_in_bf16_patched_and_compiled(build, ids, monkeypatch):
    """A causal LM made by ``build(dtype)`` on the GPU: its fp32 logits (the truth), then in bf16
    before and after kiln.patch, and the patched model under torch.compile(fullgraph=True).
    Asserts the patched logits are as close to the truth as the original's and the compiled ones
    match the patched; returns (the patch's report, the kiln.swiglu calls of the eager patched
    forward, those of the compiled forward), each call by its input's shape."""
    from kiln import activation_ops

    torch._dynamo.reset()
    with torch.no_grad():
        truth = build(torch.float32).cuda()(ids).logits.double()
        model = build(torch.bfloat16).cuda()
        original = model(ids).logits
        report = kiln.patch(model)
        calls = []
        real = activation_ops.swiglu
        monkeypatch.setattr(activation_ops, "swiglu", lambda *a: calls.append(a[0].shape) or real(*a))
        patched = model(ids).logits
        eager_calls = list(calls)
        compiled = torch.compile(model, fullgraph=True)(ids).logits
    err_original = (original.double() - truth).abs().max().item()
    err_patched = (patched.double() - truth).abs().max().item()
    assert err_patched <= 1.5 * err_original + 1e-2, (err_patched, err_original)
    torch.testing.assert_close(compiled, patched, rtol=2e-2, atol=2e-2)
    kiln.unpatch(model)
    return report, eager_calls, calls[len(eager_calls):]


@pytest.mark.gpu
@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
def test_moe_experts_gate_on_the_gpu_and_compiled(implementation, monkeypatch):
    """A Qwen3-MoE's experts gated by one kiln.swiglu over every routed token's packed gate_up,
    in bf16 on the GPU: as close to fp32 as the original, and the same under
    torch.compile(fullgraph=True), where the gate is the class's own (Inductor's)."""
    from test_patch_experts_cpu import _ids as moe_ids, _model as moe_model

    report, calls, compiled_calls = _experts_in_bf16_patched_and_compiled(
        lambda dtype: moe_model("qwen3_moe", implementation, dtype), moe_ids().cuda(), monkeypatch)
    assert sum(r.kind.startswith("moe experts") for r in report.replaced) == 2
    assert len(calls) == 2
    assert compiled_calls == []  # none from the compiled forward


@pytest.mark.gpu
def test_llama4_experts_gate_on_the_gpu_and_compiled(monkeypatch):
    """Llama 4's experts (batched matmuls over one packed gate_up) gated by one kiln.swiglu and
    its RoPE (complex frequencies) as one kiln.rope, in bf16 on the GPU: as close to fp32 as the
    original, and the same under torch.compile(fullgraph=True)."""
    from test_patch_bmm_experts_cpu import _ids as llama4_ids, _model as llama4_model

    report, calls, _ = _experts_in_bf16_patched_and_compiled(llama4_model, llama4_ids().cuda(), monkeypatch)
    assert sum(r.kind.startswith("moe experts swiglu (batched") for r in report.replaced) == 1
    assert sum("apply_rotary_emb, q and k [bshd]" in r.kind for r in report.replaced) == 2
    assert (4, 18, 64) in calls


@pytest.mark.gpu
@pytest.mark.parametrize("activation, op", [("geglu", "geglu"), ("swiglu", "swiglu")])
@pytest.mark.parametrize("tokens", [1, 333])
def test_diffusers_gated_feed_forward_on_the_gpu(activation, op, tokens, monkeypatch):
    """diffusers' GEGLU / SwiGLU feed-forward (Stable Diffusion's, SDXL's, Mochi's) in bf16: one
    kiln call on the packed projection, as close to the fp32 module as diffusers' own result."""
    attention = pytest.importorskip("diffusers.models.attention", reason="diffusers is not installed")
    from kiln import activation_ops

    torch.manual_seed(0)
    model = attention.FeedForward(320, activation_fn=activation).cuda().eval()
    x = torch.randn(2, tokens, 320, device="cuda")
    with torch.no_grad():
        truth = model(x).double()
        model = model.bfloat16()
        original = model(x.bfloat16())
        assert [r.op for r in kiln.patch(model).replaced] == [op]
        calls = []
        real = getattr(activation_ops, op)
        monkeypatch.setattr(activation_ops, op, lambda *a, **k: calls.append(a[1:]) or real(*a, **k))
        patched = model(x.bfloat16())
    assert len(calls) == 1 and patched.dtype == torch.bfloat16
    err_original = (original.double() - truth).abs().max().item()
    err_patched = (patched.double() - truth).abs().max().item()
    assert err_patched <= 1.5 * err_original + 1e-3, (err_patched, err_original)


@pytest.mark.gpu
@pytest.mark.parametrize("rotary_dim", [4, 8])
def test_partial_rotation_head_norm_rope_on_the_gpu_and_compiled(rotary_dim, monkeypatch):
    """Qwen3-Next's prologue (per-head q/k norms, then the first rotary_dim columns rotated) in
    bf16 on the GPU: one kiln.head_norm_rope, as close to the fp32 module as the original,
    and the same under torch.compile(fullgraph=True)."""
    partial = pytest.importorskip("partial_head_norm_attention", reason="transformers has no Qwen3-Next")
    from kiln import rope_ops

    torch.manual_seed(0)
    torch._dynamo.reset()
    module = partial.PartialAttention().cuda()
    x = torch.randn(2, 37, 32, device="cuda")
    angles = torch.rand(2, 37, rotary_dim // 2, device="cuda") * 20.0
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    with torch.no_grad():
        truth = [t.double() for t in module(x, cos, sin)]
        module = module.bfloat16()
        args = (x.bfloat16(), cos.bfloat16(), sin.bfloat16())
        original = module(*args)
        report = kiln.patch(module)
        assert [r.op for r in report.replaced if r.path == ""] == ["head_norm_rope"]
        calls = []
        real = rope_ops.head_norm_rope
        monkeypatch.setattr(rope_ops, "head_norm_rope", lambda *a, **k: calls.append(1) or real(*a, **k))
        patched = module(*args)
        assert len(calls) == 1
        monkeypatch.undo()
        compiled = torch.compile(module, fullgraph=True)(*args)
    for o, p, c, t in zip(original, patched, compiled, truth):
        assert p.dtype == torch.bfloat16 and p.shape == o.shape
        err_original = (o.double() - t).abs().max().item()
        assert (p.double() - t).abs().max().item() <= 1.5 * err_original + 1e-2
        torch.testing.assert_close(c, p, rtol=2e-2, atol=2e-2)
    kiln.unpatch(module)
